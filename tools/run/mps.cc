// chorus-run --mps (mps.h).
#include "tools/run/mps.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <optional>
#include <thread>

#include "tools/run/options.h"
#include "tools/run/supervisor.h"

namespace chorus::run {
namespace {

using Clock = std::chrono::steady_clock;

// Runs `program [arg]` (arg nullptr: none) with `input` on its stdin and its output to `log`
// (appended); its exit code, or -1 when it could not run or did not end within `seconds` (then
// killed).
int run_control(const std::string& program, const char* arg, const std::string& input,
                const std::string& log, double seconds) {
  int in[2];
  if (pipe2(in, O_CLOEXEC) != 0) return -1;
  const pid_t pid = fork();
  if (pid < 0) {
    close(in[0]);
    close(in[1]);
    return -1;
  }
  if (pid == 0) {  // only async-signal-safe calls until exec
    dup2(in[0], 0);
    const int out = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
    if (out >= 0) {
      dup2(out, 1);
      dup2(out, 2);
    }
    const char* argv[] = {program.c_str(), arg, nullptr};
    execv(program.c_str(), const_cast<char* const*>(argv));
    _exit(127);
  }
  close(in[0]);
  if (!input.empty()) (void)!write(in[1], input.data(), input.size());
  close(in[1]);
  const auto end = Clock::now() + std::chrono::duration<double>(seconds);
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (Clock::now() > end) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

bool exists(const std::string& path) {
  return access(path.c_str(), F_OK) == 0;
}

}  // namespace

bool MpsDaemon::start(std::string& error) {
  const char* given = std::getenv("CUDA_MPS_PIPE_DIRECTORY");
  if (given && *given && exists(std::string(given) + "/control")) {
    pipe_dir_ = given;
    say(fmt::format("--mps: using the MPS daemon already running ({}/control)", pipe_dir_));
    return true;
  }
  int code = 0;
  std::optional<std::string> control = resolve_program("nvidia-cuda-mps-control", error, code);
  if (!control) {
    error = "--mps: " + error + " (the MPS control daemon comes with the NVIDIA driver)";
    return false;
  }
  control_ = *control;
  const char* tmp = std::getenv("TMPDIR");
  std::string root = fmt::format("{}/chorus-mps-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (!mkdtemp(root.data())) {
    error = fmt::format("--mps: cannot make a directory for the daemon ({}): {}", root,
                        std::strerror(errno));
    return false;
  }
  root_ = root;
  pipe_dir_ = root + "/pipe";
  const std::string log_dir = root + "/log";
  mkdir(pipe_dir_.c_str(), 0700);
  mkdir(log_dir.c_str(), 0700);
  setenv("CUDA_MPS_PIPE_DIRECTORY", pipe_dir_.c_str(), 1);
  setenv("CUDA_MPS_LOG_DIRECTORY", log_dir.c_str(), 1);
  const std::string log = root + "/control.log";
  const int rc = run_control(control_, "-d", "", log, 20);
  const auto end = Clock::now() + std::chrono::seconds(10);
  while (rc == 0 && !exists(pipe_dir_ + "/control") && Clock::now() < end)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  if (rc != 0 || !exists(pipe_dir_ + "/control")) {
    error = fmt::format("--mps: {} -d {} (pipe directory {}; its logs in {})", control_,
                        rc == 0    ? "started, but no control pipe appeared within 10 s"
                        : rc == -1 ? "did not run, or did not end within 20 s"
                                   : fmt::format("failed with exit code {}", rc),
                        pipe_dir_, log_dir);
    return false;
  }
  say(fmt::format("--mps: started the MPS control daemon (pipe directory {})", pipe_dir_));
  return true;
}

MpsDaemon::~MpsDaemon() {
  if (root_.empty()) return;
  if (!control_.empty() && exists(pipe_dir_ + "/control")) {
    const int rc = run_control(control_, nullptr, "quit\n", root_ + "/control.log", 20);
    if (rc != 0)
      say(fmt::format("--mps: asking the MPS daemon to quit failed (pipe directory {}): {}",
                      pipe_dir_, rc == -1 ? "no answer within 20 s" : fmt::format("exit {}", rc)));
  }
  std::error_code ec;
  std::filesystem::remove_all(root_, ec);
}

}  // namespace chorus::run
