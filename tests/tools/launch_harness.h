// Runs the built chorus-run binary as a child for the tests, capturing stdout and stderr, with
// deadlines on every wait (a stuck launcher is SIGKILLed; its workers die with it).
#pragma once

#include <sys/types.h>

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace chorus::test {

struct LaunchResult {
  int exit_code = -1;  // the launcher's exit code; 128+signal when killed; -1 if it timed out
  std::string out;
  std::string err;
  double seconds = 0;  // from start to exit
  bool timed_out = false;
};

class Launch {
 public:
  // Starts `$CHORUS_RUN args...`. `env` entries "KEY=value" are set, "KEY" alone is unset;
  // CHORUS_JOB_SECRET is unset unless given.
  explicit Launch(const std::vector<std::string>& args, const std::vector<std::string>& env = {});
  ~Launch();
  Launch(const Launch&) = delete;
  Launch& operator=(const Launch&) = delete;

  // Reads output until `done(out)` holds or `timeout_s` passes; returns whether it held.
  bool read_until(const std::function<bool(const std::string&)>& done, double timeout_s);
  void signal(int sig);
  // Reads to end of output and reaps the launcher; after `timeout_s` kills it.
  LaunchResult wait(double timeout_s);

 private:
  bool pump(int timeout_ms);
  pid_t pid_ = -1;
  int out_fd_ = -1;
  int err_fd_ = -1;
  double start_ = 0;
  LaunchResult result_;
};

// Runs to the end: Launch(args, env).wait(timeout_s).
LaunchResult run_launcher(const std::vector<std::string>& args,
                          const std::vector<std::string>& env = {}, double timeout_s = 20);

// Path of the helper worker ($RUN_HELPER).
std::string helper();

// From "[R] KEY=value" lines: rank -> value.
std::map<int, std::string> values_by_rank(const std::string& out, const std::string& key);

// Lines of `text` (a final line without newline included).
std::vector<std::string> lines_of(const std::string& text);

double now_s();

}  // namespace chorus::test
