// Store failover: when the process that hosts the bootstrap store dies, the survivors go on with
// a new store hosted by one of them, so that shrink, grow, error news and the news of deaths keep
// working whichever rank died, under every launcher (under chorus-run --elastic the store lives
// in the launcher and never needs this).
//
// Set-up (Job::create): every rank but the store's host opens a standby port (a listening TCP
// socket on the address its tcp links would use; nothing is accepted there) and publishes it as
// chorus/standby/<job rank> before the start barrier; after the barrier each reads them all (a
// grow's newcomers publish theirs as they join, and the members read them once the grown
// communicator exists). CHORUS_STORE_FAILOVER=0 turns it off: a dead store then stays dead.
//
// Takeover, started on a survivor's watch thread when the store's connection drops without a
// goodbye (a store that shuts down cleanly says so, and nothing happens):
//   1. the candidates are the job ranks with a standby port, in rank order, less those known
//      dead (the store's host is, by now);
//   2. a survivor tries each candidate before itself in turn: a refused connection means that
//      process is gone (it is marked dead), so on to the next; an accepted one (the process
//      lives) waits for the candidate to answer the store's handshake, which it does once it
//      has itself walked the candidates before it and found them gone; if it dies meanwhile,
//      the connection resets and the survivor goes on to the next. If every candidate before
//      it is gone, the survivor hosts the new store itself, on its standby port, and tells that
//      store to probe every other candidate's standby port until its watch connection arrives:
//      a refused probe is announced as that rank's death, so nobody waits for a rank that died
//      unseen;
//   3. the new store's generation is the old one's plus one (key chorus/store/generation,
//      written by its host); each survivor moves its store client over and opens a new watch
//      channel. A store that dies during or after this starts the same again.
// Since every survivor walks the same list in the same order, passes over only ranks whose
// process is gone, and waits only for ranks before it (no cycle), all of them end at the
// lowest live candidate, which waits for nobody.
// Assumes: a process's death closes its listening socket, and survivors reach each other's
// standby ports as they reach each other's tcp link addresses. Bounded by CHORUS_TIMEOUT: a
// candidate that lives but never answers (stopped; or dead while a forked child of it still
// holds the socket) ends everyone's failover at that deadline with an error naming it.
// What is lost with the old store is its keys: whatever was in flight through it (a
// communicator's creation, an agreement) fails on the ranks in it, and chorusCommShrink starts
// over on the new store under names that carry the generation (shrink.cc). Test hook:
// CHORUS_TEST_FAILOVER_DIE=R makes job rank R kill itself once it hosts the new store.
#include <signal.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>

#include "collectives/failover.h"

#include "collectives/comm.h"
#include "collectives/job.h"
#include "common/env.h"
#include "common/log.h"
#include "common/thread.h"
#include "transport/wire.h"

namespace chorus {
namespace {

constexpr double kMoveSeconds = 5.0;  // a store that answered serves its generation, watch
constexpr const char* kGenerationKey = "chorus/store/generation";

std::string standby_key(int r) {
  return fmt::format("chorus/standby/{}", r);
}

}  // namespace

std::string encode_standby(const SockAddr& a) {
  return a.host.empty() ? "-" : fmt::format("{} {}", a.host, a.port);
}

SockAddr decode_standby(const std::string& v) {
  char host[64] = {};
  int port = 0, end = 0;
  if (v.size() > 80 || v.find('\0') != std::string::npos ||
      std::sscanf(v.c_str(), "%63s %d%n", host, &port, &end) != 2 ||
      static_cast<size_t>(end) != v.size() || port <= 0 || port > 65535)
    return {};
  return {host, port};
}

Result<int> decode_generation(const std::string& v) {
  char* end = nullptr;
  errno = 0;
  const long g = v.empty() || v.size() > 10 ? -1 : std::strtol(v.c_str(), &end, 10);
  if (g <= 0 || errno != 0 || *end != '\0' || g > (1 << 30))
    return make_error(Code::kRemoteError, "the store holds generation '{}', not a count",
                      v.substr(0, 40));
  return static_cast<int>(g);
}

Status Job::open_standby() {
  CHORUS_ASSIGN_OR_RETURN(int64_t on, env_int_in("CHORUS_STORE_FAILOVER", 1, 0, 1));
  failover_enabled_ = on == 1;
  if (env_get("CHORUS_TEST_FAILOVER_DIE")) {
    CHORUS_ASSIGN_OR_RETURN(int64_t die,
                            env_int_in("CHORUS_TEST_FAILOVER_DIE", 0, 0, CHORUS_MAX_RANKS));
    failover_die_ = static_cast<int>(die);
  }
  if (failover_enabled_ && !server_) {
    // Where the store is reached on loopback (one host), on loopback too; else where the links
    // would listen (CHORUS_SOCKET_IFNAME, the first non-loopback address).
    std::string host = "127.0.0.1";
    if (!is_loopback_address(store_->server().host)) {
      CHORUS_ASSIGN_OR_RETURN(host, local_address());
    }
    CHORUS_ASSIGN_OR_RETURN(standby_, tcp_listen(host, 0, &standby_addr_));
  }
  std::lock_guard<std::mutex> lock(mu_);
  standby_addrs_[rank_] = standby_addr_;
  return store_->set(standby_key(rank_), encode_standby(standby_addr_));
}

void Job::learn_standby(const std::vector<int>& job_ranks) {
  for (int r : job_ranks) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!failover_enabled_ || standby_addrs_.count(r)) continue;
    }
    auto v = store_->try_get(standby_key(r));
    if (!v.is_ok()) continue;  // not published (yet): asked again after the next grow
    std::lock_guard<std::mutex> lock(mu_);
    standby_addrs_[r] = decode_standby(*v);
  }
}

int Job::store_generation() const {
  std::lock_guard<std::mutex> lock(mu_);
  return generation_;
}

Status Job::await_store(Deadline deadline) {
  while (true) {
    // Looked at before failing_over_: the watch reader marks its store gone only after it has
    // started the takeover, so a store seen gone here has its takeover seen below (running, or
    // ended). Looked at after only, a store that went in between would read as gone for good.
    transport::WatchClient* before = watch();
    const bool seen_gone = before && before->store_gone();
    std::unique_lock<std::mutex> lock(mu_);
    while ((failing_over_ && !ending_.load()) && !deadline.expired())
      cv_.wait_for(lock, std::chrono::milliseconds(deadline.slice_ms(100)));
    const bool running = failing_over_;
    lock.unlock();
    // The test hook: a pause here, as a loaded machine may leave this thread.
    if (await_lag_ms_ > 0) usleep(static_cast<useconds_t>(await_lag_ms_) * 1000);
    std::string gone = store_gone_text();
    if (running)
      return make_error(Code::kTimeout, "{}, and no survivor has taken it over within {:.0f} s",
                        gone, deadline.total());
    if (gone.empty()) return Status::ok();
    if (seen_gone || ending_.load()) return Status(Code::kRemoteError, gone);
  }
}

bool Job::store_moved_since(int gen, double seconds) {
  const Deadline d = Deadline::after_seconds(seconds);
  while (true) {
    transport::WatchClient* w = watch();
    if (store_generation() != gen || (w && w->store_gone())) return true;
    // Only a failed connection is worth waiting for the watch channel's news of the store.
    if (d.expired() || !store_->connection_failed()) return false;
    usleep(10000);
  }
}

void Job::start_failover() {
  std::thread previous;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!failover_enabled_ || ending_.load()) return;
    if (failing_over_) {  // the store it is moving to died already: once more after this one
      failover_again_ = true;
      return;
    }
    failing_over_ = true;
    failover_error_.clear();
    previous = std::move(failover_thread_);  // ended: it cleared failing_over_ as its last step
  }
  if (previous.joinable()) previous.join();
  auto t = start_thread("store failover", [this] {
    while (true) {
      Status s = take_over_store();
      if (!s.is_ok())
        log_error("bootstrap: rank {}: the store's failover failed: {}", rank_, s.message());
      std::lock_guard<std::mutex> lock(mu_);
      if (s.is_ok() && failover_again_ && !ending_.load()) {
        failover_again_ = false;
        continue;
      }
      failing_over_ = false;
      failover_again_ = false;
      if (!s.is_ok())
        failover_error_ = fmt::format(
            "the bootstrap store is gone with its host, and no "
            "survivor took over: {}",
            s.message());
      break;
    }
    cv_.notify_all();
  });
  std::lock_guard<std::mutex> lock(mu_);
  if (t.is_ok()) {
    failover_thread_ = std::move(t.value());
    return;
  }
  failing_over_ = false;
  failover_error_ = "the bootstrap store is gone with its host: " + t.status().message();
  cv_.notify_all();
}

Status Job::take_over_store() {
  CHORUS_ASSIGN_OR_RETURN(double timeout, env_timeout());
  const Deadline deadline = Deadline::after_seconds(timeout);
  std::map<int, SockAddr> candidates;
  int gen = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [r, at] : standby_addrs_)
      if (!at.host.empty() && (r == rank_ || !dead_.count(r))) candidates[r] = at;
    gen = generation_;
  }
  log_warn("bootstrap: rank {}: the store is gone; {} candidate(s) to host the next one", rank_,
           candidates.size());
  for (auto& [r, at] : candidates) {
    if (ending_.load()) return make_error(Code::kInvalidUsage, "the job is ending");
    if (r == rank_) return host_store(gen + 1, candidates, deadline);
    CHORUS_ASSIGN_OR_RETURN(auto client, try_candidate(r, at, deadline));
    if (!client) continue;
    Status s = use_store(r, std::move(client), -1, deadline);
    if (s.is_ok()) return s;
    // Its store went too (the candidate died as it took over): on to the next one.
    log_warn(
        "bootstrap: rank {}: rank {}'s new store failed as this rank moved to it ({}); "
        "passed over",
        rank_, r, s.message());
  }
  return make_error(Code::kRemoteError,
                    "rank {} has no standby port, and every candidate before it is gone", rank_);
}

// A new store at candidate r's standby port: its client, or null when r is passed over.
Result<std::unique_ptr<transport::StoreClient>> Job::try_candidate(int r, const SockAddr& at,
                                                                   Deadline deadline) {
  int err = 0;
  auto fd =
      tcp_connect_once(at, Deadline::after_seconds(std::min(1.0, deadline.remaining())), &err);
  if (!fd.is_ok()) {
    if (err == ECONNREFUSED) {
      mark_dead(r, fmt::format("rank {} died: its process is gone (its standby port {} refused "
                               "a connection while the bootstrap store failed over)",
                               r, at.to_string()));
      return std::unique_ptr<transport::StoreClient>();
    }
    log_warn("bootstrap: rank {}: rank {}'s standby port {} did not answer ({}); passed over",
             rank_, r, at.to_string(), fd.status().message());
    return std::unique_ptr<transport::StoreClient>();
  }
  transport::Hello h = transport::make_hello(transport::ConnKind::kStore, rank_, size_);
  CHORUS_TRY(transport::random_bytes(h.nonce.data(), h.nonce.size()));
  const std::string what = fmt::format("rank {}'s store at {}", r, at.to_string());
  // It lives: wait until it hosts (its own walk may take a while), or dies; the destructor
  // cuts the wait short (waiting_fd_).
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (ending_.load()) return make_error(Code::kInvalidUsage, "the job is ending");
    waiting_fd_ = fd->get();
  }
  auto info = transport::client_handshake(fd->get(), secret_, h, what, deadline);
  {
    std::lock_guard<std::mutex> lock(mu_);
    waiting_fd_ = -1;
    if (ending_.load()) return make_error(Code::kInvalidUsage, "the job is ending");
  }
  if (!info.is_ok() && deadline.expired())
    return make_error(Code::kTimeout,
                      "rank {} lives (its standby port {} takes connections) but hosted no "
                      "store within {:.0f} s: {}",
                      r, at.to_string(), deadline.total(), info.status().message());
  if (!info.is_ok()) {
    log_warn("bootstrap: rank {}: rank {} did not take the store over ({}); passed over", rank_, r,
             info.status().message());
    return std::unique_ptr<transport::StoreClient>();
  }
  return transport::StoreClient::adopt(std::move(fd.value()), at, *info);
}

Status Job::host_store(int generation, const std::map<int, SockAddr>& candidates,
                       Deadline deadline) {
  transport::StoreOptions o;
  o.world = size_;
  for (auto& [r, at] : candidates)
    if (r != rank_) o.probe[r] = at;
  Fd listener;
  {
    std::lock_guard<std::mutex> lock(mu_);
    listener = std::move(standby_);
  }
  CHORUS_ASSIGN_OR_RETURN(
      std::shared_ptr<transport::StoreServer> server,
      transport::StoreServer::start(std::move(listener), standby_addr_, secret_, std::move(o)));
  {
    std::lock_guard<std::mutex> lock(mu_);
    server_ = server;  // from here on this rank sends error news through it (broadcast_error)
  }
  CHORUS_ASSIGN_OR_RETURN(
      auto client, transport::StoreClient::connect(standby_addr_, secret_, rank_, size_, deadline));
  CHORUS_TRY(client->set(kGenerationKey, std::to_string(generation)));
  if (failover_die_ == rank_) {
    log_warn("rank {}: CHORUS_TEST_FAILOVER_DIE={}: killing myself as the new store's host", rank_,
             failover_die_);
    raise(SIGKILL);
  }
  return use_store(rank_, std::move(client), generation, deadline);
}

// Moves this rank to the store at `host` (generation -1: read it there).
Status Job::use_store(int host, std::unique_ptr<transport::StoreClient> client, int generation,
                      Deadline deadline) {
  if (generation < 0) {
    auto g =
        client->get(kGenerationKey,
                    Deadline::after_seconds(std::min(kMoveSeconds, deadline.remaining())), [this] {
                      return ending_.load() ? make_error(Code::kInvalidUsage, "the job is ending")
                                            : Status::ok();
                    });
    if (!g.is_ok()) return g.status().wrap(fmt::format("rank {}'s new store", host));
    auto decoded = decode_generation(*g);
    if (!decoded.is_ok()) return decoded.status().wrap(fmt::format("rank {}'s new store", host));
    generation = *decoded;
  }
  const Deadline answer = Deadline::after_seconds(std::min(kMoveSeconds, deadline.remaining()));
  CHORUS_ASSIGN_OR_RETURN(auto w, connect_watch(client->server(), answer, /*once=*/true));
  store_->take_over(*client);
  {
    std::lock_guard<std::mutex> lock(mu_);
    old_watches_.push_back(std::move(watch_));
    watch_ = std::move(w);
    generation_ = generation;
    store_host_rank_ = host;
  }
  cv_.notify_all();
  log_warn("bootstrap: rank {}: the store moved to rank {} at {} (generation {})", rank_, host,
           store_->server().to_string(), generation);
  return Status::ok();
}

}  // namespace chorus
