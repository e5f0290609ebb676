// The test harness around the chorus-run binary: fork/exec, pipes, poll with deadlines.
#include "tests/tools/launch_harness.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <stdexcept>

namespace chorus::test {
namespace {

std::string required_env(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v)
    throw std::runtime_error(std::string(name) + " is not set (run through meson test)");
  return v;
}

[[noreturn]] void exec_launcher(const std::vector<std::string>& args,
                                const std::vector<std::string>& env, int out_fd, int err_fd) {
  dup2(out_fd, STDOUT_FILENO);
  dup2(err_fd, STDERR_FILENO);
  unsetenv("CHORUS_JOB_SECRET");
  for (const auto& e : env) {
    auto eq = e.find('=');
    if (eq == std::string::npos) {
      unsetenv(e.c_str());
    } else {
      setenv(e.substr(0, eq).c_str(), e.substr(eq + 1).c_str(), 1);
    }
  }
  std::string path = std::getenv("CHORUS_RUN");
  std::vector<char*> argv{path.data()};
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  execv(path.c_str(), argv.data());
  _exit(127);
}

}  // namespace

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string helper() {
  return required_env("RUN_HELPER");
}

Launch::Launch(const std::vector<std::string>& args, const std::vector<std::string>& env) {
  required_env("CHORUS_RUN");
  int out[2], err[2];
  if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0)
    throw std::runtime_error("pipe failed");
  start_ = now_s();
  pid_ = fork();
  if (pid_ == 0) exec_launcher(args, env, out[1], err[1]);
  close(out[1]);
  close(err[1]);
  out_fd_ = out[0];
  err_fd_ = err[0];
  fcntl(out_fd_, F_SETFL, O_NONBLOCK);
  fcntl(err_fd_, F_SETFL, O_NONBLOCK);
}

Launch::~Launch() {
  if (pid_ > 0 && !result_.timed_out && result_.exit_code < 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  if (out_fd_ >= 0) close(out_fd_);
  if (err_fd_ >= 0) close(err_fd_);
}

// Waits up to `timeout_ms` for output; reads what is there. False once both pipes are closed.
bool Launch::pump(int timeout_ms) {
  pollfd fds[2] = {{out_fd_, POLLIN, 0}, {err_fd_, POLLIN, 0}};
  if (out_fd_ < 0 && err_fd_ < 0) return false;
  poll(fds, 2, timeout_ms);
  char buf[65536];
  for (auto [fd, text] : {std::pair{&out_fd_, &result_.out}, std::pair{&err_fd_, &result_.err}}) {
    while (*fd >= 0) {
      ssize_t n = read(*fd, buf, sizeof(buf));
      if (n > 0) {
        text->append(buf, static_cast<size_t>(n));
      } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
        break;
      } else {
        close(*fd);
        *fd = -1;
      }
    }
  }
  return true;
}

bool Launch::read_until(const std::function<bool(const std::string&)>& done, double timeout_s) {
  double deadline = now_s() + timeout_s;
  while (!done(result_.out)) {
    if (now_s() >= deadline || !pump(50)) return done(result_.out);
  }
  return true;
}

void Launch::signal(int sig) {
  kill(pid_, sig);
}

LaunchResult Launch::wait(double timeout_s) {
  double deadline = now_s() + timeout_s;
  while (now_s() < deadline && pump(50)) {
  }
  int status = 0;
  pid_t r = 0;
  while (now_s() < deadline && (r = waitpid(pid_, &status, WNOHANG)) == 0) pump(20);
  if (r != pid_) {
    result_.timed_out = true;
    kill(pid_, SIGKILL);  // its workers follow (PR_SET_PDEATHSIG)
    waitpid(pid_, &status, 0);
    return result_;
  }
  result_.seconds = now_s() - start_;
  result_.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result_;
}

LaunchResult run_launcher(const std::vector<std::string>& args, const std::vector<std::string>& env,
                          double timeout_s) {
  Launch launch(args, env);
  return launch.wait(timeout_s);
}

std::map<int, std::string> values_by_rank(const std::string& out, const std::string& key) {
  std::map<int, std::string> values;
  for (const auto& line : lines_of(out)) {
    auto close = line.find("] ");
    if (line.empty() || line[0] != '[' || close == std::string::npos) continue;
    std::string rest = line.substr(close + 2);
    if (rest.rfind(key + "=", 0) == 0)
      values[std::stoi(line.substr(1, close - 1))] = rest.substr(key.size() + 1);
  }
  return values;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    lines.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return lines;
}

}  // namespace chorus::test
