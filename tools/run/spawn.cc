// fork/exec of one worker, and how a worker's end is described.
#include "tools/run/spawn.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

namespace chorus::run {
namespace {

// Runs in the child between fork and exec: only async-signal-safe calls.
[[noreturn]] void exec_child(const char* path, char* const* argv, char* const* envp, int out_fd,
                             int err_fd, pid_t launcher, const cpu_set_t* cpus) {
  setpgid(0, 0);
  if (cpus && sched_setaffinity(0, sizeof *cpus, cpus) != 0) {
    const char* msg = "chorus-run: binding the worker to its CPUs (--bind) failed\n";
    (void)!write(STDERR_FILENO, msg, strlen(msg));
    _exit(127);
  }
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != launcher) _exit(127);  // the launcher died before prctl took effect
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGPIPE, SIGCHLD, SIGQUIT}) signal(sig, SIG_DFL);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  if (isatty(STDIN_FILENO)) {
    int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) dup2(devnull, STDIN_FILENO);
  }
  dup2(out_fd, STDOUT_FILENO);
  dup2(err_fd, STDERR_FILENO);
  execve(path, argv, envp);
  const char* reason = strerror(errno);
  const char* parts[] = {"chorus-run: exec of '", path, "' failed: ", reason, "\n"};
  for (const char* p : parts) (void)!write(STDERR_FILENO, p, strlen(p));
  _exit(127);
}

std::vector<char*> c_strings(const std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (const auto& s : strings) out.push_back(const_cast<char*>(s.c_str()));
  out.push_back(nullptr);
  return out;
}

}  // namespace

bool spawn_worker(const std::string& path, const std::vector<std::string>& argv,
                  const std::vector<std::string>& env, Worker& worker, std::string& error,
                  const cpu_set_t* cpus) {
  int out_pipe[2], err_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0) {
    error = fmt::format("pipe for rank {} failed: {}", worker.rank, strerror(errno));
    return false;
  }
  if (pipe2(err_pipe, O_CLOEXEC) != 0) {
    error = fmt::format("pipe for rank {} failed: {}", worker.rank, strerror(errno));
    close(out_pipe[0]);
    close(out_pipe[1]);
    return false;
  }
  auto c_argv = c_strings(argv);
  auto c_env = c_strings(env);
  pid_t launcher = getpid();
  pid_t pid = fork();
  if (pid == 0)
    exec_child(path.c_str(), c_argv.data(), c_env.data(), out_pipe[1], err_pipe[1], launcher, cpus);
  close(out_pipe[1]);
  close(err_pipe[1]);
  if (pid < 0) {
    error = fmt::format("fork for rank {} failed: {}", worker.rank, strerror(errno));
    close(out_pipe[0]);
    close(err_pipe[0]);
    return false;
  }
  setpgid(pid, pid);  // also here, so the group exists before we ever signal it
  fcntl(out_pipe[0], F_SETFL, O_NONBLOCK);
  fcntl(err_pipe[0], F_SETFL, O_NONBLOCK);
  worker.pid = pid;
  worker.out_fd = out_pipe[0];
  worker.err_fd = err_pipe[0];
  worker.reaped = false;
  worker.wait_status = 0;
  return true;
}

std::string signal_name(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev ? fmt::format("SIG{}", abbrev) : fmt::format("signal {}", sig);
}

std::string describe_status(int wait_status) {
  if (WIFEXITED(wait_status)) return fmt::format("exited with code {}", WEXITSTATUS(wait_status));
  if (WIFSIGNALED(wait_status)) {
    int sig = WTERMSIG(wait_status);
    return fmt::format("was killed by signal {} ({}){}", sig, signal_name(sig),
                       WCOREDUMP(wait_status) ? ", core dumped" : "");
  }
  return fmt::format("ended with wait status {:#x}", wait_status);
}

int exit_code_of(int wait_status) {
  if (WIFEXITED(wait_status)) return WEXITSTATUS(wait_status);
  if (WIFSIGNALED(wait_status)) return 128 + WTERMSIG(wait_status);
  return 1;
}

}  // namespace chorus::run
