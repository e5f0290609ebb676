// Starting one worker process: fork/exec with its environment, its own process group, and pipes
// for stdout and stderr.
#pragma once

#include <sched.h>

#include <sys/types.h>

#include <string>
#include <vector>

namespace chorus::run {

struct Worker {
  int local_rank = 0;
  int rank = 0;
  pid_t pid = -1;   // also the worker's process group id
  int out_fd = -1;  // read end of the worker's stdout pipe (non-blocking), -1 once closed
  int err_fd = -1;  // same for stderr
  bool reaped = false;
  int wait_status = 0;  // valid once reaped
};

// Forks and execs `path` with `argv` and `env` (each "KEY=value"). The child gets its own process
// group (so signals reach its descendants too), dies with SIGKILL if the launcher dies, has
// default signal handling, and reads /dev/null when the launcher's stdin is a terminal. On
// failure returns false with `error` set; nothing is left running.
// cpus (may be null): the CPUs the worker is bound to before exec.
bool spawn_worker(const std::string& path, const std::vector<std::string>& argv,
                  const std::vector<std::string>& env, Worker& worker, std::string& error,
                  const cpu_set_t* cpus = nullptr);

// "exited with code 3", "was killed by signal 9 (SIGKILL)".
std::string describe_status(int wait_status);
// The launcher's exit code for a worker's wait status: its code, or 128 + signal.
int exit_code_of(int wait_status);
// "SIGTERM" for 15.
std::string signal_name(int sig);

}  // namespace chorus::run
