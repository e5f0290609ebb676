// Runs one attempt of the job on this node: starts the workers, relays their output, watches
// them, and stops them all (SIGTERM, then SIGKILL after the grace) when one fails or the launcher
// is told to stop. With --elastic a failed worker stops nobody while others still run.
// Single-threaded: one poll() loop over the output pipes and a self-pipe that the signal handlers
// write to. Every wait in it has a deadline.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "tools/run/job.h"
#include "tools/run/options.h"
#include "tools/run/output.h"
#include "tools/run/spawn.h"

namespace chorus::run {

enum class AttemptEnd { kSuccess, kWorkerFailed, kInterrupted, kSpawnFailed };

struct AttemptResult {
  AttemptEnd end = AttemptEnd::kSuccess;
  int exit_code = 0;
  std::string cause;  // "rank 1 was killed by signal 9 (SIGKILL)", "received SIGINT"
};

// Catches SIGINT, SIGTERM, SIGHUP (to forward them) and SIGCHLD; ignores SIGPIPE. Call once.
bool install_signal_handlers(std::string& error);
// The last SIGINT/SIGTERM/SIGHUP the launcher received, or 0.
int received_stop_signal();
// Writes "chorus-run: <message>\n" to stderr in one piece.
void say(const std::string& message);

class Supervisor {
 public:
  Supervisor(const RunOptions& options, const Job& job);
  // Blocks until every worker of the attempt has ended (or was given up on after SIGKILL).
  AttemptResult run_attempt(int restart_count);

 private:
  using Clock = std::chrono::steady_clock;
  enum class State { kRunning, kStopping, kKilling };

  struct Slot {
    Worker worker;
    LinePrefixer out;
    LinePrefixer err;
  };

  void spawn_all(int restart_count);
  void handle_signals();
  void reap();
  // `ended`: the workers found ended in the same look (reap), failures first.
  void on_worker_end(Slot& slot, const std::vector<Slot*>& ended);
  void respawn(Slot& slot);
  void begin_stop(int sig);
  void check_deadlines();
  bool finished();
  void poll_once();
  // Reads what `fd` holds now (at most `max_reads` chunks); closes it at end of stream.
  void read_stream(Slot& slot, bool is_err, int max_reads);
  void drain(Slot& slot);
  std::string live_ranks(const Slot* except) const;
  int live_count() const;

  const RunOptions& options_;
  const Job& job_;
  OutputSink out_sink_;
  OutputSink err_sink_;
  std::vector<Slot> slots_;
  State state_ = State::kRunning;
  AttemptResult result_;
  int signals_seen_ = 0;  // stop signals handled so far; one arriving between attempts still counts
  int stop_signal_ = 0;   // what the workers were told to stop with
  Clock::time_point stop_started_;
  Clock::time_point deadline_;        // grace end (kStopping) or SIGKILL bound (kKilling)
  Clock::time_point drain_deadline_;  // set when the last worker is reaped
  bool draining_ = false;
  int worker_restarts_ = 0;    // --elastic: dead workers restarted into the running job
  bool reap_delayed_ = false;  // the test hook's wait happened (once an attempt)
};

}  // namespace chorus::run
