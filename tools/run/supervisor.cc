// The launcher's event loop for one attempt: spawn, relay output, reap, stop with a bounded grace.
#include "tools/run/supervisor.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include <fmt/format.h>

namespace chorus::run {
namespace {

int g_wake_pipe[2] = {-1, -1};
volatile sig_atomic_t g_stop_signal = 0;
volatile sig_atomic_t g_stop_count = 0;

constexpr auto kKillBound = std::chrono::seconds(10);  // how long SIGKILL may take to land
constexpr auto kDrainBound = std::chrono::seconds(2);  // output left after the last worker ended
constexpr int kPollCapMs = 1000;
constexpr size_t kReadChunk = 64 * 1024;
constexpr int kDrainReads = 256;  // what an ended worker left in its pipe: up to 16 MiB at once

void on_signal(int sig) {
  int saved = errno;
  if (sig != SIGCHLD) {
    g_stop_signal = sig;
    g_stop_count = g_stop_count + 1;
  }
  char byte = 0;
  (void)!write(g_wake_pipe[1], &byte, 1);
  errno = saved;
}

bool succeeded(int wait_status) {
  return WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0;
}

}  // namespace

bool install_signal_handlers(std::string& error) {
  if (pipe2(g_wake_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
    error = fmt::format("self-pipe for signals failed: {}", strerror(errno));
    return false;
  }
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaction(sig, &sa, nullptr);
  sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
  sigaction(SIGCHLD, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);
  return true;
}

int received_stop_signal() {
  return g_stop_signal;
}

void say(const std::string& message) {
  static OutputSink sink(STDERR_FILENO);
  sink.write("chorus-run: " + message + "\n");
}

Supervisor::Supervisor(const RunOptions& options, const Job& job)
    : options_(options), job_(job), out_sink_(STDOUT_FILENO), err_sink_(STDERR_FILENO) {}

AttemptResult Supervisor::run_attempt(int restart_count) {
  slots_.clear();
  state_ = State::kRunning;
  result_ = AttemptResult{};
  draining_ = false;
  reap_delayed_ = false;
  spawn_all(restart_count);
  while (true) {
    handle_signals();
    reap();
    check_deadlines();
    if (finished()) break;
    poll_once();
  }
  for (auto& slot : slots_) {
    std::string out, err;
    slot.out.finish(out);  // no-ops for streams that already ended
    slot.err.finish(err);
    out_sink_.write(out);
    err_sink_.write(err);
    for (int* fd : {&slot.worker.out_fd, &slot.worker.err_fd}) {
      if (*fd >= 0) close(*fd);
      *fd = -1;
    }
  }
  return result_;
}

void Supervisor::spawn_all(int restart_count) {
  const int n = options_.nproc_per_node;
  slots_.reserve(n);
  for (int local = 0; local < n; ++local) {
    int rank = options_.node_rank * n + local;
    std::string prefix = options_.prefix ? fmt::format("[{}] ", rank) : "";
    slots_.push_back(Slot{Worker{}, LinePrefixer(prefix), LinePrefixer(prefix)});
    Worker& w = slots_.back().worker;
    w.local_rank = local;
    w.rank = rank;
    std::string error;
    auto env = worker_environment(options_, job_, local, restart_count);
    const Binding& bind = job_.bindings.at(size_t(local));
    if (!spawn_worker(options_.program_path, options_.argv, env, w, error,
                      bind.bound ? &bind.cpus : nullptr)) {
      say(error);
      slots_.pop_back();
      result_ = {AttemptEnd::kSpawnFailed, 1, fmt::format("rank {} could not be started", rank)};
      begin_stop(SIGTERM);
      return;
    }
  }
}

// --elastic --max-restarts: a new process in a dead worker's slot, told to rejoin the running job
// (CHORUS_ELASTIC_REJOIN: which restart it is). What the old one printed is flushed first.
void Supervisor::respawn(Slot& slot) {
  std::string out, err;
  slot.out.finish(out);
  slot.err.finish(err);
  out_sink_.write(out);
  err_sink_.write(err);
  Worker& old = slot.worker;
  for (int* fd : {&old.out_fd, &old.err_fd}) {
    if (*fd >= 0) close(*fd);
    *fd = -1;
  }
  Worker w;
  w.local_rank = old.local_rank;
  w.rank = old.rank;
  auto env = worker_environment(options_, job_, w.local_rank, 0);
  env.push_back(fmt::format("CHORUS_ELASTIC_REJOIN={}", worker_restarts_));
  const Binding& bind = job_.bindings.at(size_t(w.local_rank));
  std::string error;
  if (!spawn_worker(options_.program_path, options_.argv, env, w, error,
                    bind.bound ? &bind.cpus : nullptr)) {
    say(fmt::format("{}; the others go on without rank {}", error, w.rank));
    return;
  }
  slot.worker = w;
}

void Supervisor::handle_signals() {
  char buf[64];
  while (read(g_wake_pipe[0], buf, sizeof(buf)) > 0) {
  }
  if (g_stop_count == signals_seen_) return;
  signals_seen_ = g_stop_count;
  int sig = g_stop_signal;
  if (state_ == State::kRunning) {
    std::string live = live_ranks(nullptr);
    say(fmt::format("received {}; {}", signal_name(sig),
                    live.empty() ? "no ranks running" : "forwarding it to ranks " + live));
    result_ = {AttemptEnd::kInterrupted, 128 + sig, "received " + signal_name(sig)};
    begin_stop(sig);
  } else if (state_ == State::kStopping) {
    say(fmt::format(
        "received {} while stopping the workers; not waiting for the rest of the grace period",
        signal_name(sig)));
    deadline_ = Clock::now();
  }
}

void Supervisor::reap() {
  if (options_.reap_delay_ms > 0 && !reap_delayed_) {  // the test hook (options.h)
    siginfo_t info{};
    if (waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid != 0) {
      reap_delayed_ = true;
      std::this_thread::sleep_for(std::chrono::milliseconds(options_.reap_delay_ms));
    }
  }
  // Every worker that ended since the last look. In what order they ended is not known: a
  // loaded machine may find a killed worker and the survivors that shrank and finished after it
  // in one look. So the failures go first, while the others that ended in the same look still
  // count as running (they were, when it failed): --elastic then says they went on, instead of
  // taking the failed one for the last rank standing and the job for failed.
  std::vector<Slot*> ended;
  for (auto& slot : slots_) {
    Worker& w = slot.worker;
    if (w.reaped) continue;
    int status = 0;
    pid_t r = waitpid(w.pid, &status, WNOHANG);
    if (r == 0 || (r < 0 && errno == EINTR)) continue;
    w.wait_status = r == w.pid ? status : 0;
    ended.push_back(&slot);
  }
  std::stable_partition(ended.begin(), ended.end(),
                        [](const Slot* s) { return !succeeded(s->worker.wait_status); });
  for (Slot* slot : ended) {
    slot->worker.reaped = true;
    drain(*slot);
    on_worker_end(*slot, ended);
  }
  if (!draining_ && live_count() == 0) {
    draining_ = true;
    drain_deadline_ = Clock::now() + kDrainBound;
  }
}

void Supervisor::on_worker_end(Slot& slot, const std::vector<Slot*>& ended) {
  const Worker& w = slot.worker;
  if (succeeded(w.wait_status) || state_ != State::kRunning) return;
  std::string how = describe_status(w.wait_status);
  std::string live = live_ranks(&slot);
  // A restart needs a worker that is still running to rejoin, not one that ended in this look.
  const bool running = std::any_of(slots_.begin(), slots_.end(), [&](const Slot& s) {
    return !s.worker.reaped && std::find(ended.begin(), ended.end(), &s) == ended.end();
  });
  if (options_.elastic && !live.empty()) {  // the survivors shrink and go on, or fail themselves
    if (running && worker_restarts_ < options_.max_restarts) {  // and a new worker rejoins them
      ++worker_restarts_;
      say(
          fmt::format("rank {} (pid {}) {}; --elastic: ranks {} go on; restarting rank {} to "
                      "rejoin them (restart {} of {})",
                      w.rank, w.pid, how, live, w.rank, worker_restarts_, options_.max_restarts));
      respawn(slot);
      return;
    }
    say(fmt::format("rank {} (pid {}) {}; --elastic: ranks {} go on", w.rank, w.pid, how, live));
    return;
  }
  say(fmt::format("rank {} (pid {}) {}; {}", w.rank, w.pid, how,
                  live.empty() ? "no other ranks running" : "stopping ranks " + live));
  result_ = {AttemptEnd::kWorkerFailed, exit_code_of(w.wait_status),
             fmt::format("rank {} {}", w.rank, how)};
  begin_stop(SIGTERM);
}

void Supervisor::begin_stop(int sig) {
  if (state_ != State::kRunning) return;
  state_ = State::kStopping;
  stop_signal_ = sig;
  stop_started_ = Clock::now();
  deadline_ = stop_started_ + std::chrono::duration_cast<Clock::duration>(
                                  std::chrono::duration<double>(options_.grace_s));
  for (auto& slot : slots_) {
    if (!slot.worker.reaped) killpg(slot.worker.pid, sig);
  }
}

void Supervisor::check_deadlines() {
  if (state_ == State::kRunning || live_count() == 0 || Clock::now() < deadline_) return;
  if (state_ == State::kStopping) {
    for (auto& slot : slots_) {
      const Worker& w = slot.worker;
      if (w.reaped) continue;
      say(fmt::format("rank {} (pid {}) still running {:.1f} s after {}; sending SIGKILL", w.rank,
                      w.pid, std::chrono::duration<double>(Clock::now() - stop_started_).count(),
                      signal_name(stop_signal_)));
      killpg(w.pid, SIGKILL);
    }
    state_ = State::kKilling;
    deadline_ = Clock::now() + kKillBound;
    return;
  }
  for (auto& slot : slots_) {  // kKilling and the bound passed: stop waiting for them
    Worker& w = slot.worker;
    if (w.reaped) continue;
    say(fmt::format("rank {} (pid {}) did not end within {} s of SIGKILL; giving up on it", w.rank,
                    w.pid, std::chrono::duration_cast<std::chrono::seconds>(kKillBound).count()));
    w.reaped = true;
    w.wait_status = 0;
  }
}

bool Supervisor::finished() {
  if (live_count() > 0) return false;
  if (Clock::now() >= drain_deadline_) return true;
  return std::all_of(slots_.begin(), slots_.end(),
                     [](const Slot& s) { return s.worker.out_fd < 0 && s.worker.err_fd < 0; });
}

void Supervisor::poll_once() {
  std::vector<pollfd> fds;
  std::vector<std::pair<Slot*, bool>> owners;  // (slot, is_err) per entry after the first
  fds.push_back({g_wake_pipe[0], POLLIN, 0});
  for (auto& slot : slots_) {
    if (slot.worker.out_fd >= 0) {
      fds.push_back({slot.worker.out_fd, POLLIN, 0});
      owners.emplace_back(&slot, false);
    }
    if (slot.worker.err_fd >= 0) {
      fds.push_back({slot.worker.err_fd, POLLIN, 0});
      owners.emplace_back(&slot, true);
    }
  }
  auto now = Clock::now();
  auto until =
      live_count() > 0
          ? (state_ == State::kRunning ? now + std::chrono::milliseconds(kPollCapMs) : deadline_)
          : drain_deadline_;
  auto wait_ms = std::chrono::duration_cast<std::chrono::milliseconds>(until - now).count() + 1;
  int timeout = static_cast<int>(std::clamp<int64_t>(wait_ms, 0, kPollCapMs));
  if (poll(fds.data(), fds.size(), timeout) <= 0) return;
  for (size_t i = 1; i < fds.size(); ++i) {
    if (fds[i].revents) read_stream(*owners[i - 1].first, owners[i - 1].second, 4);
  }
}

void Supervisor::read_stream(Slot& slot, bool is_err, int max_reads) {
  int& fd = is_err ? slot.worker.err_fd : slot.worker.out_fd;
  LinePrefixer& prefixer = is_err ? slot.err : slot.out;
  static char buf[kReadChunk];
  std::string text;
  for (int i = 0; fd >= 0 && i < max_reads; ++i) {
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n > 0) {
      prefixer.feed(buf, static_cast<size_t>(n), text);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) break;
    prefixer.finish(text);  // end of stream (or a read error, treated the same)
    close(fd);
    fd = -1;
  }
  (is_err ? err_sink_ : out_sink_).write(text);
}

void Supervisor::drain(Slot& slot) {
  read_stream(slot, false, kDrainReads);
  read_stream(slot, true, kDrainReads);
}

std::string Supervisor::live_ranks(const Slot* except) const {
  std::string list;
  for (const auto& slot : slots_) {
    if (&slot == except || slot.worker.reaped) continue;
    if (!list.empty()) list += ',';
    list += std::to_string(slot.worker.rank);
  }
  return list;
}

int Supervisor::live_count() const {
  return static_cast<int>(
      std::count_if(slots_.begin(), slots_.end(), [](const Slot& s) { return !s.worker.reaped; }));
}

}  // namespace chorus::run
