// Bootstrap store server (see store.h for the protocol's purpose).
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/env.h"
#include "common/log.h"
#include "common/thread.h"
#include "transport/store.h"
#include "transport/topology.h"

namespace chorus::transport {
namespace {

constexpr size_t kMaxNews = 256;

std::string rank_list(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) {
    if (!s.empty()) s += ',';
    s += std::to_string(r);
  }
  return s;
}

}  // namespace

struct StoreServer::Conn {
  Fd fd;
  std::string peer;
  Hello hello;
  std::mutex write_mu;
  bool bye = false;
};

Result<std::unique_ptr<StoreServer>> StoreServer::start(const std::string& host, int port,
                                                        const Secret& secret, StoreOptions opt) {
  SockAddr bound;
  CHORUS_ASSIGN_OR_RETURN(Fd listener, tcp_listen(host, port, &bound));
  return start(std::move(listener), bound, secret, std::move(opt));
}

Result<std::unique_ptr<StoreServer>> StoreServer::start(Fd listener, const SockAddr& bound,
                                                        const Secret& secret, StoreOptions opt) {
  std::unique_ptr<StoreServer> s(new StoreServer());
  // Test hook: the serving threads forward a rank's error news this much later, as a loaded
  // machine may (tests/collectives/test_failures.cc).
  CHORUS_ASSIGN_OR_RETURN(s->watch_delay_ms_,
                          env_int_in("CHORUS_TEST_WATCH_DELAY_MS", 0, 0, 10000));
  // Test hook: error news goes to one watch client after another this far apart, so a client
  // served early can act (and end its process) before a later one hears.
  CHORUS_ASSIGN_OR_RETURN(s->watch_gap_ms_, env_int_in("CHORUS_TEST_WATCH_GAP_MS", 0, 0, 10000));
  // Test hook: news of a death reaches the watch clients in this process this much later than
  // the others, so another rank's reaction to it (an abort) can reach them first.
  CHORUS_ASSIGN_OR_RETURN(s->death_late_ms_,
                          env_int_in("CHORUS_TEST_DEATH_NEWS_LATE_MS", 0, 0, 10000));
  // Test hook: a connection's thread pauses this long after its verdict, as a loaded machine
  // may leave it (tests/adversarial/test_store.cc).
  CHORUS_ASSIGN_OR_RETURN(s->admit_pause_ms_,
                          env_int_in("CHORUS_TEST_STORE_ADMIT_PAUSE_MS", 0, 0, 10000));
  s->listen_ = std::move(listener);
  s->addr_ = bound;
  s->secret_ = secret;
  s->opt_ = std::move(opt);
  s->world_ = s->opt_.world;
  s->host_ = host_id();
  CHORUS_ASSIGN_OR_RETURN(s->acceptor_,
                          start_thread("bootstrap store", [p = s.get()] { p->accept_loop(); }));
  if (!s->opt_.probe.empty()) {
    CHORUS_ASSIGN_OR_RETURN(
        s->prober_, start_thread("bootstrap store prober", [p = s.get()] { p->probe_loop(); }));
  }
  log_info("bootstrap: store listening at {}", s->addr_.to_string());
  return s;
}

StoreServer::~StoreServer() {
  if (on_stop_) on_stop_();
  const bool serving = !finished_.load();
  if (serving)
    broadcast(WatchType::kShutdown, -1, 0, 0, -1, "the bootstrap store is shutting down", nullptr);
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;  // from here on the acceptor thread cannot detach itself (see accept_loop)
  }
  cv_.notify_all();
  if (serving) {
    usleep(100000);  // lets pending joins and gets send their final answers before the cut
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& c : conns_) ::shutdown(c->fd.get(), SHUT_RDWR);
  }
  if (acceptor_.joinable()) acceptor_.join();
  if (prober_.joinable()) prober_.join();
  reap_workers(true);
}

size_t StoreServer::serving_threads() const {
  std::lock_guard<std::mutex> lock(mu_);
  return conns_.size();
}

size_t StoreServer::stored_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stored_bytes_;
}

void StoreServer::reap_workers(bool all) {
  for (auto it = workers_.begin(); it != workers_.end();) {
    if (all || it->done->load()) {
      it->thread.join();
      it = workers_.erase(it);
    } else {
      ++it;
    }
  }
}

// A store made for a unique id ends with its job: every rank joined once, and all are gone.
bool StoreServer::job_over() {
  if (!opt_.stop_when_job_ends || !workers_.empty()) return false;
  std::lock_guard<std::mutex> lock(mu_);
  return all_joined_once_ && conns_.empty();
}

void StoreServer::accept_loop() {
  AcceptorOptions ao;
  ao.allowed_kinds = kind_bit(ConnKind::kStore) | kind_bit(ConnKind::kWatch);
  ao.what = "bootstrap";
  Acceptor acceptor(listen_.get(), secret_, ao);
  while (!stop_.load()) {
    for (auto& a : acceptor.poll(100)) admit(std::move(a));
    reap_workers(false);
    if (job_over()) {
      std::lock_guard<std::mutex> lock(mu_);  // the destructor sets stop_ under it
      if (stop_.load()) break;
      log_info("bootstrap: every rank joined and left; the store at {} stops", addr_.to_string());
      listen_.reset();
      acceptor_.detach();  // nobody joins a store that stopped by itself; its thread ends here
      finished_ = true;
      return;
    }
  }
}

bool StoreServer::watching(int rank) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& c : conns_)
    if (c->hello.kind == static_cast<uint16_t>(ConnKind::kWatch) && c->hello.rank == rank)
      return true;
  return false;
}

// Until every probed rank's watch connection has come (from then on its closing tells), tries
// its standby address every kProbeSeconds: refused means nothing listens there any more, so
// its process is gone. An answered try costs the live rank one connection in its listen queue,
// closed at once.
void StoreServer::probe_loop() {
  constexpr double kProbeSeconds = 0.2;
  std::map<int, SockAddr> pending = opt_.probe;
  while (!pending.empty()) {
    for (auto it = pending.begin(); it != pending.end() && !stop_.load();) {
      const auto& [rank, addr] = *it;
      int err = 0;
      if (watching(rank) ||
          tcp_connect_once(addr, Deadline::after_seconds(kProbeSeconds), &err).is_ok() ||
          err != ECONNREFUSED) {
        it = watching(rank) ? pending.erase(it) : std::next(it);
        continue;
      }
      auto text = fmt::format(
          "rank {} died: its process is gone (nothing listens at its standby address {}; found "
          "by the bootstrap store that took over)",
          rank, addr.to_string());
      log_warn("bootstrap: {}", text);
      broadcast(WatchType::kDead, rank, 0, 0, -1, text, nullptr);
      it = pending.erase(it);
    }
    std::unique_lock<std::mutex> lock(mu_);
    if (cv_.wait_for(lock, std::chrono::duration<double>(kProbeSeconds),
                     [&] { return stop_.load(); }))
      return;
  }
}

// Checks an authenticated connection and hands it to a thread of its own.
void StoreServer::admit(Accepted a) {
  int world = a.hello.world;
  if (a.hello.rank < 0 || world <= 0 || a.hello.rank >= world) {
    auto msg = fmt::format("rank {} is outside a world of {} ranks", a.hello.rank, world);
    log_warn("bootstrap: refused connection from {}: {}", a.peer, msg);
    (void)send_verdict(a.fd.get(), Code::kInvalidArgument, msg);
    return;
  }
  int limit = opt_.max_conns;
  if (limit <= 0) {
    std::lock_guard<std::mutex> lock(mu_);
    limit = 4 * (world_ > 0 ? world_ : world) + 64;  // a unique id's store learns the world late
  }
  if (workers_.size() >= static_cast<size_t>(limit)) {
    auto msg = fmt::format("the bootstrap store already serves {} connections (limit {})",
                           workers_.size(), limit);
    log_warn("bootstrap: refused connection from {} (rank {}): {}", a.peer, a.hello.rank, msg);
    (void)send_verdict(a.fd.get(), Code::kInvalidUsage, msg);
    return;
  }
  auto c = std::make_shared<Conn>();
  c->fd = std::move(a.fd);
  c->peer = a.peer;
  c->hello = a.hello;
  auto done = std::make_shared<std::atomic<bool>>(false);
  auto t = start_thread(
      fmt::format("bootstrap store connection from rank {}", a.hello.rank),
      [this, c, done] {
        run_conn(c);
        done->store(true);
      },
      [done](const std::string&) { done->store(true); });
  if (!t.is_ok()) {
    log_warn("bootstrap: refused connection from {} (rank {}): {}", c->peer, c->hello.rank,
             t.status().message());
    (void)send_verdict(c->fd.get(), Code::kSystemError,
                       "the bootstrap store " + t.status().message());
    return;
  }
  workers_.push_back({std::move(t.value()), done});
}

void StoreServer::run_conn(const std::shared_ptr<Conn>& c) {
  // Registered before its verdict goes out, so that a client that has its verdict gets every
  // later broadcast (registered after, a loaded machine could leave this thread between the two
  // long enough for news to pass the client by, and for the store's host to end with it); and
  // while this thread holds the connection's write lock, so that no broadcast reaches it ahead
  // of its verdict. The news so far follows the verdict; what comes later the broadcasts send.
  std::deque<std::string> news;
  std::unique_lock<std::mutex> writing(c->write_mu);
  {
    std::lock_guard<std::mutex> lock(mu_);
    conns_.push_back(c);
    if (c->hello.kind == static_cast<uint16_t>(ConnKind::kWatch)) news = news_;
  }
  bool ok = send_verdict(c->fd.get(), Code::kOk, server_info_text(getpid(), host_)).is_ok();
  for (auto& frame : news)
    if (ok)
      ok = send_all(c->fd.get(), frame.data(), frame.size(), Deadline::after_seconds(1.0), c->peer)
               .is_ok();
  writing.unlock();
  if (!ok) {
    std::lock_guard<std::mutex> lock(mu_);
    conns_.erase(std::remove(conns_.begin(), conns_.end(), c), conns_.end());
    return;
  }
  if (admit_pause_ms_ > 0) usleep(static_cast<useconds_t>(admit_pause_ms_) * 1000);
  if (c->hello.kind == static_cast<uint16_t>(ConnKind::kWatch))
    serve_watch(c);
  else
    serve_store(*c);
  {
    std::lock_guard<std::mutex> lock(mu_);
    conns_.erase(std::remove(conns_.begin(), conns_.end(), c), conns_.end());
  }
  ::shutdown(c->fd.get(), SHUT_RDWR);
}

bool StoreServer::handle_set(Conn& c, std::string key, std::string val,
                             const std::function<bool(Code, const std::string&)>& reply) {
  std::string refusal;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = kv_.find(key);
    size_t old = it == kv_.end() ? 0 : key.size() + it->second.size();
    size_t now = stored_bytes_ - old + key.size() + val.size();
    if (now > opt_.max_bytes) {
      refusal = fmt::format(
          "the bootstrap store is full: it holds {} bytes, this set by rank {} would make {} (cap "
          "{})",
          stored_bytes_, c.hello.rank, now, opt_.max_bytes);
    } else {
      stored_bytes_ = now;
      kv_[std::move(key)] = std::move(val);
    }
  }
  if (!refusal.empty()) {
    log_warn("bootstrap: {}", refusal);
    return reply(Code::kInvalidUsage, refusal);
  }
  cv_.notify_all();
  return reply(Code::kOk, "");
}

void StoreServer::serve_store(Conn& c) {
  std::string what = fmt::format("rank {} ({})", c.hello.rank, c.peer);
  auto reply = [&](Code code, const std::string& payload) {
    std::string frame = encode_store_response(code, payload);
    return send_all(c.fd.get(), frame.data(), frame.size(),
                    Deadline::after_seconds(kStoreIoSeconds), what)
        .is_ok();
  };
  while (wait_readable_unless(c.fd.get(), stop_)) {
    StoreReqHeader raw;
    auto d = Deadline::after_seconds(kStoreIoSeconds);
    if (!recv_all(c.fd.get(), &raw, sizeof raw, d, what).is_ok()) break;
    auto req = parse_store_request_header(&raw, sizeof raw);
    if (!req.is_ok()) {
      log_warn("bootstrap: {} from {}; closing it", req.status().message(), what);
      reply(req.status().code(), req.status().message());
      break;
    }
    std::string key(req->key_len, '\0'), val(req->val_len, '\0');
    if (!recv_all(c.fd.get(), key.data(), key.size(), d, what).is_ok()) break;
    if (!recv_all(c.fd.get(), val.data(), val.size(), d, what).is_ok()) break;
    if (req->op == kSet) {
      if (!handle_set(c, std::move(key), std::move(val), reply)) break;
    } else if (req->op == kGet) {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, std::chrono::milliseconds(req->timeout_ms),
                   [&] { return stop_.load() || kv_.count(key) > 0; });
      auto it = kv_.find(key);
      bool have = it != kv_.end();
      std::string v = have ? it->second : std::string();
      lock.unlock();
      if (!(have ? reply(Code::kOk, v)
                 : reply(Code::kTimeout, "key '" + key + "' not set in time")))
        break;
    } else {
      Status s = handle_join(c, req->timeout_ms);
      if (!reply(s.code(), s.message())) break;
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto it = joined_.find(c.hello.rank);
  if (static_cast<int>(joined_.size()) < world_ && it != joined_.end() &&
      it->second == fmt::format("pid {} at {}", c.hello.pid, c.peer))
    joined_.erase(it);
}

Status StoreServer::handle_join(Conn& c, uint32_t timeout_ms) {
  std::unique_lock<std::mutex> lock(mu_);
  int rank = c.hello.rank;
  if (world_ == 0) world_ = c.hello.world;
  if (c.hello.world != world_)
    return make_error(Code::kInvalidUsage,
                      "rank {} says the job has {} ranks, but this store was set up for {}", rank,
                      c.hello.world, world_);
  std::string who = fmt::format("pid {} at {}", c.hello.pid, c.peer);
  auto it = joined_.find(rank);
  if (it != joined_.end() && it->second != who)
    return make_error(
        Code::kInvalidUsage,
        "rank {} joined twice: first {}, now {} (two processes were given the same RANK)", rank,
        it->second, who);
  joined_[rank] = who;
  if (static_cast<int>(joined_.size()) >= world_) all_joined_once_ = true;
  cv_.notify_all();
  bool all = cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] {
    return stop_.load() || static_cast<int>(joined_.size()) >= world_;
  });
  if (all && !stop_.load()) return Status::ok();
  std::vector<int> missing;
  for (int r = 0; r < world_; ++r)
    if (!joined_.count(r)) missing.push_back(r);
  if (stop_.load())  // the host gave up: a final answer, so the others need not wait for theirs
    return make_error(Code::kTimeout,
                      "ranks {} of {} never joined (the store's host stopped waiting)",
                      rank_list(missing), world_);
  return make_error(Code::kTimeout, "ranks {} of {}", rank_list(missing), world_);
}

void StoreServer::broadcast(WatchType type, int32_t rank, uint64_t comm_uid, uint64_t qid,
                            int32_t target, const std::string& text, const Conn* except,
                            int except_rank) {
  std::string frame = encode_watch(type, rank, comm_uid, qid, target, text);
  std::vector<std::shared_ptr<Conn>> conns;
  {
    std::lock_guard<std::mutex> lock(mu_);
    conns = conns_;  // with the news log in one step: a new watch client gets each item once
    if (type == WatchType::kDead || type == WatchType::kError) {
      news_.push_back(frame);
      if (news_.size() > kMaxNews) news_.pop_front();
    }
  }
  // The clients in this process last: a host that hears of an error may end at once, and the
  // store with it; by then every other rank has the news.
  const int32_t here = getpid();
  bool sent = false;
  bool late_once = death_late_ms_ > 0;
  for (int last = 0; last < 2; ++last) {
    for (auto& c : conns) {
      if ((c->hello.pid == here) != (last == 1)) continue;
      if (c.get() == except || c->hello.kind != static_cast<uint16_t>(ConnKind::kWatch)) continue;
      if (except_rank >= 0 && c->hello.rank == except_rank) continue;
      if (target >= 0 && type == WatchType::kState && c->hello.rank != target) continue;
      if (sent && watch_gap_ms_ > 0 && type == WatchType::kError) usleep(watch_gap_ms_ * 1000);
      if (last == 1 && late_once && type == WatchType::kDead) {
        usleep(death_late_ms_ * 1000);
        late_once = false;
      }
      std::lock_guard<std::mutex> lock(c->write_mu);
      (void)send_all(c->fd.get(), frame.data(), frame.size(), Deadline::after_seconds(1.0),
                     c->peer);
      sent = true;
    }
  }
}

void StoreServer::serve_watch(const std::shared_ptr<Conn>& c) {
  std::string what = fmt::format("rank {} ({})", c->hello.rank, c->peer);
  while (wait_readable_unless(c->fd.get(), stop_)) {
    WatchHeader raw;
    auto d = Deadline::after_seconds(kStoreIoSeconds);
    if (!recv_all(c->fd.get(), &raw, sizeof raw, d, what).is_ok()) break;
    auto m = parse_watch_header(&raw, sizeof raw);
    if (!m.is_ok()) {
      log_warn("bootstrap: {} from {}; closing it", m.status().message(), what);
      break;
    }
    std::string text(m->text_len, '\0');
    if (!recv_all(c->fd.get(), text.data(), text.size(), d, what).is_ok()) break;
    auto type = static_cast<WatchType>(m->type);
    if (type == WatchType::kBye) {
      c->bye = true;
      break;
    }
    if (type == WatchType::kError && watch_delay_ms_ > 0) usleep(watch_delay_ms_ * 1000);
    if (type == WatchType::kError || type == WatchType::kQuery)
      broadcast(type, c->hello.rank, m->comm_uid, m->qid, c->hello.rank, text, c.get());
    else if (type == WatchType::kState)
      broadcast(type, c->hello.rank, m->comm_uid, m->qid, m->target, text, nullptr);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    conns_.erase(std::remove(conns_.begin(), conns_.end(), c), conns_.end());
  }
  if (!c->bye && !stop_.load()) {
    auto text = fmt::format(
        "rank {} (pid {}, {}) died: its connection to the bootstrap store closed without a goodbye",
        c->hello.rank, c->hello.pid, c->peer);
    log_warn("bootstrap: {}", text);
    broadcast(WatchType::kDead, c->hello.rank, 0, 0, -1, text, nullptr);
  }
}

}  // namespace chorus::transport
