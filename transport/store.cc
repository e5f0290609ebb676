// Bootstrap store server and clients (see store.h for the protocol's purpose).
#include "transport/store.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "common/log.h"

namespace chorus::transport {
namespace {

enum StoreOp : uint32_t { kSet = 1, kGet = 2, kJoin = 3 };

struct StoreReq {
  uint32_t op;
  uint32_t key_len;
  uint64_t val_len;
  uint32_t timeout_ms;
  uint32_t reserved;
};

struct StoreResp {
  int32_t code;
  uint32_t reserved;
  uint64_t len;
};

struct WatchMsg {
  uint32_t type;
  int32_t rank;
  uint64_t comm_uid;
  uint64_t qid;
  int32_t target;
  uint32_t text_len;
};

constexpr double kIoSeconds = 10.0;

// Waits until fd is readable or stop is set; false when stopping.
bool wait_readable(int fd, const std::atomic<bool>& stop) {
  while (!stop.load()) {
    auto r = poll_fd(fd, POLLIN, 100);
    if (!r.is_ok() || *r) return true;
  }
  return false;
}

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
                                                        const Secret& secret, int world) {
  std::unique_ptr<StoreServer> s(new StoreServer());
  CHORUS_ASSIGN_OR_RETURN(s->listen_, tcp_listen(host, port, &s->addr_));
  s->secret_ = secret;
  s->world_ = world;
  s->acceptor_ = std::thread([p = s.get()] { p->accept_loop(); });
  log_info("bootstrap: store listening at {}", s->addr_.to_string());
  return s;
}

StoreServer::~StoreServer() {
  broadcast(static_cast<uint32_t>(WatchType::kShutdown), -1, 0, 0, -1, "the bootstrap store is shutting down", nullptr);
  stop_ = true;
  cv_.notify_all();
  usleep(100000);  // lets pending joins and gets send their final answers before the cut
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& c : conns_) ::shutdown(c->fd.get(), SHUT_RDWR);
  }
  if (acceptor_.joinable()) acceptor_.join();
  std::vector<Worker> threads;
  {
    std::lock_guard<std::mutex> lock(mu_);
    threads.swap(threads_);
  }
  for (auto& t : threads) t.thread.join();
}

// Threads of closed connections are joined as they end, not kept until the store stops.
void StoreServer::join_finished() {
  for (size_t i = 0; i < threads_.size();) {
    if (!threads_[i].done->load()) {
      ++i;
      continue;
    }
    threads_[i].thread.join();
    threads_[i] = std::move(threads_.back());
    threads_.pop_back();
  }
}

void StoreServer::accept_loop() {
  while (!stop_.load()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      join_finished();
    }
    SockAddr peer;
    auto fd = tcp_accept(listen_.get(), Deadline::after_seconds(0.1), &peer);
    if (!fd.is_ok()) continue;
    auto c = std::make_shared<Conn>();
    c->fd = std::move(fd.value());
    c->peer = peer.to_string();
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_.load()) break;
    conns_.push_back(c);
    auto done = std::make_shared<std::atomic<bool>>(false);
    threads_.push_back({std::thread([this, c, done] {
                          serve(c);
                          done->store(true);
                        }),
                        done});
  }
}

void StoreServer::serve(std::shared_ptr<Conn> c) {
  auto hello = server_handshake(c->fd.get(), secret_, kind_bit(ConnKind::kStore) | kind_bit(ConnKind::kWatch), c->peer);
  if (!hello.is_ok()) {
    ::shutdown(c->fd.get(), SHUT_RDWR);
    return;
  }
  c->hello = *hello;
  int world = c->hello.world;
  if (c->hello.rank < 0 || world <= 0 || c->hello.rank >= world) {
    auto msg = fmt::format("rank {} is outside a world of {} ranks", c->hello.rank, world);
    log_warn("bootstrap: refused connection from {}: {}", c->peer, msg);
    (void)send_verdict(c->fd.get(), Code::kInvalidArgument, msg);
    ::shutdown(c->fd.get(), SHUT_RDWR);
    return;
  }
  if (!send_verdict(c->fd.get(), Code::kOk, "").is_ok()) return;
  if (c->hello.kind == static_cast<uint16_t>(ConnKind::kWatch))
    serve_watch(c);
  else
    serve_store(*c);
}

void StoreServer::serve_store(Conn& c) {
  std::string what = fmt::format("rank {} ({})", c.hello.rank, c.peer);
  auto reply = [&](Code code, const std::string& payload) {
    StoreResp r{static_cast<int32_t>(code), 0, payload.size()};
    auto d = Deadline::after_seconds(kIoSeconds);
    return send_all(c.fd.get(), &r, sizeof r, d, what).is_ok() &&
           send_all(c.fd.get(), payload.data(), payload.size(), d, what).is_ok();
  };
  while (wait_readable(c.fd.get(), stop_)) {
    StoreReq req;
    auto d = Deadline::after_seconds(kIoSeconds);
    if (!recv_all(c.fd.get(), &req, sizeof req, d, what).is_ok()) break;
    if (req.key_len > kMaxKeyBytes || req.val_len > kMaxValueBytes) {
      auto msg = fmt::format("request with a {} byte key and a {} byte value exceeds the limits ({} and {})",
                             req.key_len, req.val_len, kMaxKeyBytes, kMaxValueBytes);
      log_warn("bootstrap: {} from {}; closing it", msg, what);
      reply(Code::kInvalidArgument, msg);
      break;
    }
    std::string key(req.key_len, '\0'), val(req.val_len, '\0');
    if (!recv_all(c.fd.get(), key.data(), key.size(), d, what).is_ok()) break;
    if (!recv_all(c.fd.get(), val.data(), val.size(), d, what).is_ok()) break;
    if (req.op == kSet) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        kv_[key] = std::move(val);
      }
      cv_.notify_all();
      if (!reply(Code::kOk, "")) break;
    } else if (req.op == kGet) {
      std::unique_lock<std::mutex> lock(mu_);
      bool found = cv_.wait_for(lock, std::chrono::milliseconds(req.timeout_ms),
                                [&] { return stop_.load() || kv_.count(key) > 0; });
      std::string v = (found && kv_.count(key)) ? kv_[key] : std::string();
      bool have = found && kv_.count(key);
      lock.unlock();
      if (!(have ? reply(Code::kOk, v) : reply(Code::kTimeout, "key '" + key + "' not set in time"))) break;
    } else if (req.op == kJoin) {
      Status s = handle_join(c, req.timeout_ms);
      if (!reply(s.code(), s.message())) break;
    } else {
      log_warn("bootstrap: unknown request {} from {}; closing it", req.op, what);
      reply(Code::kInvalidArgument, fmt::format("unknown request {}", req.op));
      break;
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
    return make_error(Code::kInvalidUsage, "rank {} says the job has {} ranks, but this store was set up for {}",
                      rank, c.hello.world, world_);
  std::string who = fmt::format("pid {} at {}", c.hello.pid, c.peer);
  auto it = joined_.find(rank);
  if (it != joined_.end() && it->second != who)
    return make_error(Code::kInvalidUsage, "rank {} joined twice: first {}, now {} (two processes were given the same RANK)",
                      rank, it->second, who);
  joined_[rank] = who;
  cv_.notify_all();
  bool all = cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms),
                          [&] { return stop_.load() || static_cast<int>(joined_.size()) >= world_; });
  if (all && !stop_.load()) return Status::ok();
  std::vector<int> missing;
  for (int r = 0; r < world_; ++r)
    if (!joined_.count(r)) missing.push_back(r);
  if (stop_.load())  // the host gave up: a final answer, so the others need not wait for theirs
    return make_error(Code::kTimeout, "ranks {} of {} never joined (the store's host stopped waiting)", rank_list(missing), world_);
  return make_error(Code::kTimeout, "ranks {} of {}", rank_list(missing), world_);
}

void StoreServer::broadcast(uint32_t type, int32_t rank, uint64_t comm_uid, uint64_t qid,
                            int32_t target, const std::string& text, const Conn* except) {
  std::vector<std::shared_ptr<Conn>> conns;
  {
    std::lock_guard<std::mutex> lock(mu_);
    conns = conns_;
  }
  WatchMsg m{type, rank, comm_uid, qid, target, static_cast<uint32_t>(std::min(text.size(), kMaxTextBytes))};
  for (auto& c : conns) {
    if (c.get() == except || c->hello.kind != static_cast<uint16_t>(ConnKind::kWatch)) continue;
    if (target >= 0 && type == static_cast<uint32_t>(WatchType::kState) && c->hello.rank != target) continue;
    std::lock_guard<std::mutex> lock(c->write_mu);
    auto d = Deadline::after_seconds(1.0);
    if (send_all(c->fd.get(), &m, sizeof m, d, c->peer).is_ok())
      (void)send_all(c->fd.get(), text.data(), m.text_len, d, c->peer);
  }
}

void StoreServer::serve_watch(std::shared_ptr<Conn> c) {
  std::string what = fmt::format("rank {} ({})", c->hello.rank, c->peer);
  while (wait_readable(c->fd.get(), stop_)) {
    WatchMsg m;
    auto d = Deadline::after_seconds(kIoSeconds);
    if (!recv_all(c->fd.get(), &m, sizeof m, d, what).is_ok()) break;
    if (m.text_len > kMaxTextBytes) {
      log_warn("bootstrap: watch message of {} bytes from {} exceeds {}; closing it", m.text_len, what, kMaxTextBytes);
      break;
    }
    std::string text(m.text_len, '\0');
    if (!recv_all(c->fd.get(), text.data(), text.size(), d, what).is_ok()) break;
    auto type = static_cast<WatchType>(m.type);
    if (type == WatchType::kBye) {
      c->bye = true;
      break;
    }
    if (type == WatchType::kError || type == WatchType::kQuery)
      broadcast(m.type, c->hello.rank, m.comm_uid, m.qid, c->hello.rank, text, c.get());
    else if (type == WatchType::kState)
      broadcast(m.type, c->hello.rank, m.comm_uid, m.qid, m.target, text, nullptr);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    conns_.erase(std::remove(conns_.begin(), conns_.end(), c), conns_.end());
  }
  if (!c->bye && !stop_.load()) {
    auto text = fmt::format("rank {} (pid {}, {}) died: its connection to the bootstrap store closed without a goodbye",
                            c->hello.rank, c->hello.pid, c->peer);
    log_warn("bootstrap: {}", text);
    broadcast(static_cast<uint32_t>(WatchType::kDead), c->hello.rank, 0, 0, -1, text, nullptr);
  }
}

// ---- StoreClient ----

Result<std::unique_ptr<StoreClient>> StoreClient::connect(const SockAddr& server, const Secret& secret,
                                                          int rank, int world, Deadline deadline) {
  std::unique_ptr<StoreClient> c(new StoreClient());
  c->server_ = server;
  c->what_ = "the bootstrap store at " + server.to_string();
  while (true) {
    double slice = std::min(10.0, deadline.remaining());
    auto fd = tcp_connect(server, Deadline::after_seconds(slice));
    if (fd.is_ok()) {
      c->fd_ = std::move(fd.value());
      break;
    }
    if (fd.status().code() != Code::kTimeout) return fd.status().wrap("bootstrap");
    if (deadline.expired())
      return make_error(Code::kTimeout, "bootstrap: rank {} could not reach the store at {} within {:.0f} s (is rank 0 running, and MASTER_ADDR/MASTER_PORT right?)",
                        rank, server.to_string(), deadline.total());
    log_warn("bootstrap: rank {} waiting for the store at {}, {:.0f} s of {:.0f} s", rank,
             server.to_string(), deadline.elapsed(), deadline.total());
  }
  Hello h = make_hello(ConnKind::kStore, secret, rank, world);
  CHORUS_TRY(client_handshake(c->fd_.get(), h, c->what_, deadline).wrap("bootstrap"));
  return c;
}

Result<std::string> StoreClient::request(uint32_t op, const std::string& key, const std::string& value,
                                         uint32_t timeout_ms, Deadline deadline) {
  std::lock_guard<std::mutex> lock(mu_);
  StoreReq req{op, static_cast<uint32_t>(key.size()), value.size(), timeout_ms, 0};
  CHORUS_TRY(send_all(fd_.get(), &req, sizeof req, deadline, what_));
  CHORUS_TRY(send_all(fd_.get(), key.data(), key.size(), deadline, what_));
  CHORUS_TRY(send_all(fd_.get(), value.data(), value.size(), deadline, what_));
  StoreResp resp;
  auto reply_deadline = Deadline::after_seconds(timeout_ms / 1000.0 + kIoSeconds);
  CHORUS_TRY(recv_all(fd_.get(), &resp, sizeof resp, reply_deadline, what_));
  if (resp.len > kMaxValueBytes)
    return make_error(Code::kRemoteError, "bootstrap: reply of {} bytes exceeds the {} byte limit", resp.len, kMaxValueBytes);
  std::string payload(resp.len, '\0');
  CHORUS_TRY(recv_all(fd_.get(), payload.data(), payload.size(), reply_deadline, what_));
  if (resp.code != 0) return Status(static_cast<Code>(resp.code), payload);
  return payload;
}

Status StoreClient::set(const std::string& key, const std::string& value) {
  return request(kSet, key, value, 0, Deadline::after_seconds(kIoSeconds)).status();
}

Result<std::string> StoreClient::get(const std::string& key, Deadline deadline) {
  auto ms = static_cast<uint32_t>(deadline.remaining() * 1000);
  return request(kGet, key, "", ms, deadline);
}

Status StoreClient::join(Deadline deadline) {
  while (true) {
    double slice = std::min(10.0, deadline.remaining());
    auto r = request(kJoin, "", "", static_cast<uint32_t>(slice * 1000), deadline);
    if (r.is_ok()) return Status::ok();
    if (r.status().code() != Code::kTimeout) return r.status().wrap("bootstrap");
    if (r.status().message().find("never joined") != std::string::npos)
      return make_error(Code::kTimeout, "bootstrap: {} at {}", r.status().message(), server_.to_string());
    if (deadline.remaining() < 0.05)
      return make_error(Code::kTimeout, "bootstrap: timed out after {:.0f} s at {}: {} never joined",
                        deadline.total(), server_.to_string(), r.status().message());
    log_warn("bootstrap: waiting for {} at {}, {:.0f} s of {:.0f} s", r.status().message(),
             server_.to_string(), deadline.elapsed(), deadline.total());
  }
}

// ---- WatchClient ----

Result<std::unique_ptr<WatchClient>> WatchClient::connect(const SockAddr& server, const Secret& secret,
                                                          int rank, int world, EventFn on_event,
                                                          AnswerFn answer, Deadline deadline) {
  std::unique_ptr<WatchClient> w(new WatchClient());
  CHORUS_ASSIGN_OR_RETURN(w->fd_, tcp_connect(server, deadline));
  Hello h = make_hello(ConnKind::kWatch, secret, rank, world);
  CHORUS_TRY(client_handshake(w->fd_.get(), h, "the bootstrap store at " + server.to_string(), deadline));
  w->rank_ = rank;
  w->on_event_ = std::move(on_event);
  w->answer_ = std::move(answer);
  w->thread_ = std::thread([p = w.get()] { p->reader(); });
  return w;
}

WatchClient::~WatchClient() {
  (void)send(WatchType::kBye, 0, 0, -1, "");
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

Status WatchClient::send(WatchType t, uint64_t comm_uid, uint64_t qid, int32_t target, const std::string& text) {
  std::lock_guard<std::mutex> lock(write_mu_);
  WatchMsg m{static_cast<uint32_t>(t), rank_, comm_uid, qid, target,
             static_cast<uint32_t>(std::min(text.size(), kMaxTextBytes))};
  auto d = Deadline::after_seconds(2.0);
  CHORUS_TRY(send_all(fd_.get(), &m, sizeof m, d, "the bootstrap store"));
  return send_all(fd_.get(), text.data(), m.text_len, d, "the bootstrap store");
}

void WatchClient::broadcast_error(uint64_t comm_uid, const std::string& text) {
  (void)send(WatchType::kError, comm_uid, 0, -1, text);
}

std::map<int, std::string> WatchClient::query(uint64_t comm_uid, int expect, double seconds) {
  uint64_t qid = (static_cast<uint64_t>(rank_) << 40) | next_qid_.fetch_add(1);
  if (!send(WatchType::kQuery, comm_uid, qid, -1, "").is_ok()) return {};
  std::unique_lock<std::mutex> lock(query_mu_);
  query_cv_.wait_for(lock, std::chrono::duration<double>(seconds),
                     [&] { return static_cast<int>(answers_[qid].size()) >= expect; });
  auto out = std::move(answers_[qid]);
  answers_.erase(qid);
  return out;
}

void WatchClient::reader() {
  while (wait_readable(fd_.get(), stop_)) {
    WatchMsg m;
    auto d = Deadline::after_seconds(kIoSeconds);
    Status s = recv_all(fd_.get(), &m, sizeof m, d, "the bootstrap store");
    std::string text;
    if (s.is_ok() && m.text_len <= kMaxTextBytes) {
      text.resize(m.text_len);
      s = recv_all(fd_.get(), text.data(), text.size(), d, "the bootstrap store");
    }
    if (!s.is_ok() || m.text_len > kMaxTextBytes) {
      if (!stop_.load() && !store_gone_.load())
        on_event_({WatchType::kDead, -1, 0, 0,
                   "the bootstrap store closed the connection (the process hosting it died)"});
      store_gone_ = true;
      return;
    }
    auto type = static_cast<WatchType>(m.type);
    if (type == WatchType::kQuery) {
      (void)send(WatchType::kState, m.comm_uid, m.qid, m.target, answer_(m.comm_uid));
    } else if (type == WatchType::kState) {
      std::lock_guard<std::mutex> lock(query_mu_);
      if (answers_.count(m.qid) || true) answers_[m.qid][m.rank] = text;
      query_cv_.notify_all();
    } else if (type == WatchType::kShutdown) {
      store_gone_ = true;
    } else {
      on_event_({type, m.rank, m.comm_uid, m.qid, text});
    }
  }
}

}  // namespace chorus::transport
