// Job set-up and the routing of health news to communicators.
#include "collectives/job.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>

#include "collectives/comm.h"
#include "common/env.h"
#include "common/log.h"
#include "common/thread.h"

namespace chorus {

Result<std::shared_ptr<Job>> Job::create(transport::Rendezvous rdzv, Deadline deadline) {
  std::shared_ptr<Job> job(new Job(), &Job::release);
  job->rank_ = rdzv.rank;
  job->size_ = rdzv.size;
  job->secret_ = rdzv.secret;
  job->method_ = rdzv.method;
  job->store_host_rank_ = rdzv.store_host_rank;
  job->server_ = std::move(rdzv.server);
  CHORUS_ASSIGN_OR_RETURN(job->watch_hold_ms_,
                          env_int_in("CHORUS_TEST_WATCH_HOLD_MS", 0, 0, 10000));
  CHORUS_ASSIGN_OR_RETURN(job->failover_late_ms_,
                          env_int_in("CHORUS_TEST_FAILOVER_LATE_MS", 0, 0, 10000));
  CHORUS_ASSIGN_OR_RETURN(job->await_lag_ms_,
                          env_int_in("CHORUS_TEST_AWAIT_STORE_LAG_MS", 0, 0, 10000));
  set_log_rank(rdzv.rank);
  log_info("bootstrap: rank {} of {} ({}), store at {}", rdzv.rank, rdzv.size, rdzv.method,
           rdzv.store.to_string());
  if (rdzv.secret_is_public)
    log_info(
        "bootstrap: the job secret is derived from {}, which is not secret: it keeps other jobs "
        "apart, but anyone "
        "who can reach {} can join this job, rewrite its link addresses or stop it. Set "
        "CHORUS_JOB_SECRET to the "
        "same 32 random hex digits on every rank (chorus-run does this) to keep strangers out",
        rdzv.secret_origin, rdzv.store.to_string());
  else
    log_info("bootstrap: the job secret comes from {}", rdzv.secret_origin);
  if (rdzv.client) {
    job->store_ = std::move(rdzv.client);
  } else {
    CHORUS_ASSIGN_OR_RETURN(
        job->store_,
        transport::StoreClient::connect(rdzv.store, rdzv.secret, rdzv.rank, rdzv.size, deadline));
  }
  // Every rank's standby port is in the store before the start barrier ends, so that each
  // can read them all right after it.
  CHORUS_TRY(job->joining_failure(job->open_standby()));
  if (!rdzv.joining) {  // a newcomer finds the job running: no barrier, nobody to read yet
    CHORUS_TRY(job->joining_failure(job->store_->join(deadline)));
    std::vector<int> all(static_cast<size_t>(job->size_));
    for (int r = 0; r < job->size_; ++r) all[static_cast<size_t>(r)] = r;
    job->learn_standby(all);
  }
  CHORUS_ASSIGN_OR_RETURN(job->watch_, job->connect_watch(rdzv.store, deadline));
  return job;
}

// Before the job runs, a store connection that failed means the store's host ended before every
// rank had joined (rank 0 under every launcher). Said so, naming that rank: "connection closed by
// the bootstrap store" alone sent users looking at the network.
Status Job::joining_failure(Status s) const {
  if (s.is_ok() || s.code() == Code::kTimeout || server_ || !store_->connection_failed()) return s;
  const transport::ServerInfo info = store_->server_info();
  const std::string pid = info.pid > 0 ? fmt::format(" (pid {})", info.pid) : "";
  const std::string host =
      store_host_rank_ >= 0
          ? fmt::format("rank {}, which hosted the bootstrap store{},", store_host_rank_, pid)
          : fmt::format("the process that hosted the bootstrap store{}", pid);
  return make_error(Code::kRemoteError,
                    "bootstrap: {} ended while rank {} was joining, before every rank had "
                    "joined; its own output says why ({})",
                    host, rank_, s.message());
}

Result<std::unique_ptr<transport::WatchClient>> Job::connect_watch(const SockAddr& store,
                                                                   Deadline deadline, bool once) {
  std::weak_ptr<Job> weak = weak_from_this();
  return transport::WatchClient::connect(
      store, secret_, rank_, size_,
      [weak](const transport::WatchEvent& e) {
        if (auto j = weak.lock()) {
          j->on_event(e);
          // The test hook: the job held here a while after the news, as a loaded machine may.
          if (j->watch_hold_ms_ > 0) usleep(static_cast<useconds_t>(j->watch_hold_ms_) * 1000);
        }
      },
      [weak](uint64_t uid) {
        auto j = weak.lock();
        return j ? j->answer(uid) : std::string("exiting");
      },
      deadline, once);
}

bool Job::on_own_thread() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (std::this_thread::get_id() == failover_thread_.get_id()) return true;
  if (watch_ && watch_->on_reader_thread()) return true;
  for (auto& w : old_watches_)
    if (w->on_reader_thread()) return true;
  return false;
}

void Job::release(Job* job) {
  if (!job->on_own_thread()) {
    delete job;
    return;
  }
  auto t = start_thread("job teardown", [job] { delete job; });
  if (t.is_ok()) {
    t.value().detach();
    return;
  }
  log_error(
      "bootstrap: cannot tear the job down off its watch thread ({}); its resources stay until "
      "exit",
      t.status().message());
}

Job::~Job() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ending_ = true;  // a failover running now gives up at its next step
    if (waiting_fd_ >= 0) ::shutdown(waiting_fd_, SHUT_RDWR);
  }
  cv_.notify_all();
  if (failover_thread_.joinable()) failover_thread_.join();
  watch_.reset();  // goodbye first, so nobody reads our exit as a death
  old_watches_.clear();
  store_.reset();
  server_.reset();
}

void Job::goodbye_if_unused() {
  if (!live_comms().empty()) return;
  if (transport::WatchClient* w = watch()) w->goodbye();
}

transport::WatchClient* Job::watch() {
  std::lock_guard<std::mutex> lock(mu_);
  return watch_.get();
}

bool Job::hosts_store() const {
  std::lock_guard<std::mutex> lock(mu_);
  return server_ != nullptr;
}

void Job::add(const std::shared_ptr<CommImpl>& c) {
  std::string early;
  std::map<int, std::string> dead;
  {
    std::lock_guard<std::mutex> lock(mu_);
    comms_.push_back(c);
    auto it = early_errors_.find(c->uid());
    if (it != early_errors_.end()) early = it->second.second;
    dead = dead_;
  }
  if (!early.empty()) c->on_remote_error(early);
  for (auto& [rank, text] : dead) c->on_peer_dead(rank, text);
}

void Job::remove(const CommImpl* c) {
  std::lock_guard<std::mutex> lock(mu_);
  std::erase_if(comms_, [c](const std::weak_ptr<CommImpl>& w) {
    auto p = w.lock();
    return !p || p.get() == c;
  });
}

std::vector<std::shared_ptr<CommImpl>> Job::live_comms() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::shared_ptr<CommImpl>> out;
  for (auto& w : comms_)
    if (auto p = w.lock()) out.push_back(p);
  return out;
}

// Which rank hosted the store: rank 0 under every launcher; with a unique id, whichever rank
// runs in the process that the store's handshake named (pid and host).
int Job::store_host_rank() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (store_host_rank_ >= 0) return store_host_rank_;
  }
  const auto& info = store_->server_info();
  for (auto& c : live_comms()) {
    int r = c->job_rank_of(info.pid, info.host);
    if (r >= 0) return r;
  }
  return -1;
}

Status Job::creation_news(uint64_t comm_uid, const std::vector<int>& members) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = early_errors_.find(comm_uid);
  if (it != early_errors_.end()) {
    const std::string& text = it->second.second;
    auto bar = text.find('|');
    return Status(Code::kRemoteError, bar == std::string::npos ? text : text.substr(bar + 1));
  }
  for (int r : members)
    if (auto d = dead_.find(r); d != dead_.end()) return Status(Code::kRemoteError, d->second);
  if (watch_ && watch_->store_gone() && store_host_rank_ >= 0 && store_host_rank_ != rank_)
    return make_error(Code::kRemoteError,
                      "the bootstrap store closed: rank {}, which hosted it, has ended",
                      store_host_rank_);
  return Status::ok();
}

void Job::publish_creation_failure(uint64_t comm_uid, const Status& why) {
  if (!watch_ || why.code() == Code::kRemoteError)
    return;  // news from elsewhere: the others have it
  broadcast_error(comm_uid, fmt::format("{}|rank {} failed while creating the communicator: {}",
                                        static_cast<int>(why.code()), rank_, why.message()));
}

void Job::stop_creation(uint64_t comm_uid, const Status& why) {
  const std::string text = fmt::format("{}|rank {} stopped making the communicator: {}",
                                       static_cast<int>(why.code()), rank_, why.message());
  {
    std::lock_guard<std::mutex> lock(mu_);
    early_errors_.emplace(comm_uid, std::make_pair(rank_, text));
  }
  if (watch_) broadcast_error(comm_uid, text);
}

std::string Job::store_gone_text() {
  transport::WatchClient* w = watch();
  if (!w || !w->store_gone()) return "";
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!failover_error_.empty()) return failover_error_;
  }
  const int host = store_host_rank();
  return host >= 0 ? fmt::format("the bootstrap store is gone with rank {}, which hosted it", host)
                   : "the bootstrap store is gone (its process ended)";
}

std::string Job::dead_text(int r) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = dead_.find(r);
  return it == dead_.end() ? "" : it->second;
}

void Job::broadcast_error(uint64_t comm_uid, const std::string& text) {
  std::shared_ptr<transport::StoreServer> server;
  {
    std::lock_guard<std::mutex> lock(mu_);
    server = server_;
  }
  if (server)
    server->announce_error(rank_, comm_uid, text);
  else if (transport::WatchClient* w = watch())
    w->broadcast_error(comm_uid, text);
}

void Job::mark_dead(int r, const std::string& text) {
  for (auto& c : live_comms()) c->on_peer_dead(r, text);
  std::lock_guard<std::mutex> lock(mu_);
  dead_[r] = text;
}

void Job::on_event(const transport::WatchEvent& e) {
  if (e.type == transport::WatchType::kDead) {
    if (e.rank >= 0) return mark_dead(e.rank, e.text);
    // The store's host went away: that rank is dead, and the survivors need a new store.
    const int host = store_host_rank();
    const transport::ServerInfo info = store_->server_info();
    if (host >= 0)
      mark_dead(host, fmt::format("rank {} (pid {}) died: {}", host, info.pid, e.text));
    else
      mark_dead(host, fmt::format("the process hosting the bootstrap store (pid {}, not a rank of "
                                  "this communicator) died: the store closed the connection "
                                  "without a goodbye",
                                  info.pid));
    // The test hook: the takeover starts late, the communicators already failed by the death
    // (a loaded machine may leave this thread here a while).
    if (failover_late_ms_ > 0) usleep(static_cast<useconds_t>(failover_late_ms_) * 1000);
    return start_failover();
  }
  bool delivered = false;
  for (auto& c : live_comms()) {
    if (e.type == transport::WatchType::kError && e.comm_uid == c->uid()) {
      c->on_remote_error(e.text);
      delivered = true;
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (e.type == transport::WatchType::kError && !delivered)
    early_errors_.emplace(e.comm_uid, std::make_pair(e.rank, e.text));
}

std::string Job::answer(uint64_t comm_uid) {
  for (auto& c : live_comms())
    if (c->uid() == comm_uid) return c->state_text();
  return "not in this communicator (destroyed, or never created)";
}

}  // namespace chorus
