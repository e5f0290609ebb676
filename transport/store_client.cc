// Bootstrap store clients: the request/response client and the watch channel (see store.h).
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>

#include "common/clock.h"
#include "common/log.h"
#include "common/thread.h"
#include "transport/store.h"

namespace chorus::transport {
namespace {

constexpr double kInterruptSliceSeconds = 0.2;
// A waiting get holds the connection for its slice, and the process's other threads wait for it
// meanwhile (a pair of communicators made at once on two threads, each waiting for a key the
// other's peer sets, took 0.6-2.8 s instead of milliseconds). So slices start short and grow to
// kInterruptSliceSeconds only while no other thread has wanted the connection for a while.
constexpr double kShortSliceSeconds = 0.005;
constexpr double kContendedSeconds = 1.0;
// How long a get whose store failed waits for the news that explains it: 50 x 10 ms (as a
// collective waits for a peer's news when its link fails, collectives/engine.cc).
constexpr int kNewsWaits = 50;
constexpr useconds_t kNewsWaitMicros = 10000;

}  // namespace

// ---- StoreClient ----

Result<std::unique_ptr<StoreClient>> StoreClient::connect(const SockAddr& server,
                                                          const Secret& secret, int rank, int world,
                                                          Deadline deadline) {
  std::unique_ptr<StoreClient> c(new StoreClient());
  c->server_ = server;
  c->what_ = "the bootstrap store at " + server.to_string();
  Hello h = make_hello(ConnKind::kStore, rank, world);
  while (true) {
    double slice = std::min(10.0, deadline.remaining());
    auto fd = dial(server, secret, h, c->what_, Deadline::after_seconds(slice), &c->info_);
    if (fd.is_ok()) {
      c->fd_ = std::move(fd.value());
      return c;
    }
    if (fd.status().code() != Code::kTimeout) return fd.status().wrap("bootstrap");
    if (deadline.expired())
      return make_error(Code::kTimeout,
                        "bootstrap: rank {} could not reach the store at {} within {:.0f} s (is "
                        "rank 0 running, and MASTER_ADDR/MASTER_PORT right?)",
                        rank, server.to_string(), deadline.total());
    log_warn("bootstrap: rank {} waiting for the store at {}, {:.0f} s of {:.0f} s", rank,
             server.to_string(), deadline.elapsed(), deadline.total());
  }
}

std::unique_ptr<StoreClient> StoreClient::adopt(Fd fd, const SockAddr& server,
                                                const ServerInfo& info) {
  std::unique_ptr<StoreClient> c(new StoreClient());
  c->fd_ = std::move(fd);
  c->server_ = server;
  c->info_ = info;
  c->what_ = "the bootstrap store at " + server.to_string();
  return c;
}

void StoreClient::take_over(StoreClient& other) {
  std::scoped_lock lock(mu_, other.mu_);
  std::lock_guard<std::mutex> info_lock(info_mu_);
  fd_ = std::move(other.fd_);
  connection_failed_ = false;
  server_ = other.server_;
  info_ = other.info_;
  what_ = other.what_;
}

SockAddr StoreClient::server() const {
  std::lock_guard<std::mutex> lock(info_mu_);
  return server_;
}

ServerInfo StoreClient::server_info() const {
  std::lock_guard<std::mutex> lock(info_mu_);
  return info_;
}

Result<std::string> StoreClient::request(uint32_t op, const std::string& key,
                                         const std::string& value, uint32_t timeout_ms,
                                         Deadline deadline) {
  // take_over changes fd_ and what_ under it too. Waiting for it: the connection is contended.
  std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
  if (!lock.owns_lock()) {
    contended_at_.store(now_seconds());
    wanting_.fetch_add(1);
    lock.lock();
    wanting_.fetch_sub(1);
  }
  std::string frame = encode_store_request(op, key, value, timeout_ms);
  // A failure to move the bytes is the connection's (the store may be gone): remembered.
  auto io = [this](Status s) {
    if (!s.is_ok()) connection_failed_ = true;
    return s;
  };
  CHORUS_TRY(io(send_all(fd_.get(), frame.data(), frame.size(), deadline, what_)));
  StoreRespHeader raw;
  auto reply_deadline = Deadline::after_seconds(timeout_ms / 1000.0 + kStoreIoSeconds);
  CHORUS_TRY(io(recv_all(fd_.get(), &raw, sizeof raw, reply_deadline, what_)));
  auto resp = parse_store_response_header(&raw, sizeof raw);
  if (!resp.is_ok()) return resp.status().wrap("bootstrap");
  std::string payload(resp->len, '\0');
  CHORUS_TRY(io(recv_all(fd_.get(), payload.data(), payload.size(), reply_deadline, what_)));
  if (resp->code != 0) return Status(code_from_wire(resp->code), payload);
  return payload;
}

Status StoreClient::set(const std::string& key, const std::string& value) {
  return request(kSet, key, value, 0, Deadline::after_seconds(kStoreIoSeconds)).status();
}

Result<std::string> StoreClient::try_get(const std::string& key) {
  return request(kGet, key, "", 0, Deadline::after_seconds(kStoreIoSeconds));
}

Result<std::string> StoreClient::get(const std::string& key, Deadline deadline,
                                     const std::function<Status()>& interrupt) {
  double grown = kShortSliceSeconds;
  while (true) {
    const bool shared =
        wanting_.load() > 0 || now_seconds() - contended_at_.load() < kContendedSeconds;
    grown = shared ? kShortSliceSeconds : std::min(kInterruptSliceSeconds, grown * 2);
    double slice = interrupt ? std::min(grown, deadline.remaining()) : deadline.remaining();
    auto r = request(kGet, key, "", static_cast<uint32_t>(std::ceil(slice * 1000)), deadline);
    if (r.is_ok() || !interrupt) return r;
    if (r.status().code() != Code::kTimeout) {
      // The store failed us (its host ended, say, having heard that a rank died): the news
      // that explains it comes over the watch connection, which may be a little behind.
      for (int i = 0; i < kNewsWaits; ++i) {
        CHORUS_TRY(interrupt());
        usleep(kNewsWaitMicros);
      }
      return r;
    }
    CHORUS_TRY(interrupt());
    if (deadline.expired()) return r;
    yield_to_waiters();
  }
}

// A mutex lets the thread that unlocks it take it again at once, before a waiter it woke gets
// to run; between slices this thread did so every time on an Emerald Rapids Xeon (20 requests
// of another thread took the whole 1.2 s the get waited). So the waiters go first, up to a slice.
void StoreClient::yield_to_waiters() {
  const Deadline until = Deadline::after_seconds(kInterruptSliceSeconds);
  while (wanting_.load() > 0 && !until.expired()) usleep(20);
}

Status StoreClient::join(Deadline deadline) {
  while (true) {
    double slice = std::min(10.0, deadline.remaining());
    auto r = request(kJoin, "", "", static_cast<uint32_t>(slice * 1000), deadline);
    if (r.is_ok()) return Status::ok();
    if (r.status().code() != Code::kTimeout) return r.status().wrap("bootstrap");
    if (r.status().message().find("never joined") != std::string::npos)
      return make_error(Code::kTimeout, "bootstrap: {} at {}", r.status().message(),
                        server().to_string());
    if (deadline.remaining() < 0.05)
      return make_error(Code::kTimeout,
                        "bootstrap: timed out after {:.0f} s at {}: {} never joined",
                        deadline.total(), server().to_string(), r.status().message());
    log_warn("bootstrap: waiting for {} at {}, {:.0f} s of {:.0f} s", r.status().message(),
             server().to_string(), deadline.elapsed(), deadline.total());
  }
}

// ---- WatchClient ----

Result<std::unique_ptr<WatchClient>> WatchClient::connect(const SockAddr& server,
                                                          const Secret& secret, int rank, int world,
                                                          EventFn on_event, AnswerFn answer,
                                                          Deadline deadline, bool once) {
  std::unique_ptr<WatchClient> w(new WatchClient());
  Hello h = make_hello(ConnKind::kWatch, rank, world);
  const std::string what = "the bootstrap store at " + server.to_string();
  int err = 0;
  CHORUS_ASSIGN_OR_RETURN(w->fd_,
                          once ? dial_once(server, secret, h, what, deadline, &w->info_, &err)
                               : dial(server, secret, h, what, deadline, &w->info_));
  w->rank_ = rank;
  w->on_event_ = std::move(on_event);
  w->answer_ = std::move(answer);
  CHORUS_ASSIGN_OR_RETURN(w->thread_,
                          start_thread("the watch channel", [p = w.get()] { p->reader(); }));
  return w;
}

void WatchClient::goodbye() {
  if (said_bye_.exchange(true)) return;
  try {
    (void)send(WatchType::kBye, 0, 0, -1, "");
  } catch (...) {
    // Out of memory for the goodbye frame: the store will report this rank as gone without
    // one, which is better than std::terminate from a destructor.
  }
}

WatchClient::~WatchClient() {
  goodbye();
  stop_ = true;
  ::shutdown(fd_.get(), SHUT_RDWR);  // the goodbye still goes out; the reader wakes at once
  if (thread_.joinable()) thread_.join();
}

Status WatchClient::send(WatchType t, uint64_t comm_uid, uint64_t qid, int32_t target,
                         const std::string& text) {
  std::string frame = encode_watch(t, rank_, comm_uid, qid, target, text);
  std::lock_guard<std::mutex> lock(write_mu_);
  return send_all(fd_.get(), frame.data(), frame.size(), Deadline::after_seconds(2.0),
                  "the bootstrap store");
}

void WatchClient::broadcast_error(uint64_t comm_uid, const std::string& text) {
  (void)send(WatchType::kError, comm_uid, 0, -1, text);
}

std::map<int, std::string> WatchClient::query(uint64_t comm_uid, int expect, double seconds) {
  uint64_t qid = (static_cast<uint64_t>(rank_) << 40) | next_qid_.fetch_add(1);
  {
    std::lock_guard<std::mutex> lock(query_mu_);
    answers_[qid];  // answers are kept only for a query that waits for them
  }
  std::map<int, std::string> out;
  if (send(WatchType::kQuery, comm_uid, qid, -1, "").is_ok()) {
    std::unique_lock<std::mutex> lock(query_mu_);
    query_cv_.wait_for(lock, std::chrono::duration<double>(seconds),
                       [&] { return static_cast<int>(answers_[qid].size()) >= expect; });
    out = std::move(answers_[qid]);
  }
  std::lock_guard<std::mutex> lock(query_mu_);
  answers_.erase(qid);
  return out;
}

size_t WatchClient::pending_answers() const {
  std::lock_guard<std::mutex> lock(query_mu_);
  size_t n = 0;
  for (auto& [qid, m] : answers_) n += m.size();
  return n + answers_.size();
}

void WatchClient::reader() {
  const std::string store = "the bootstrap store";
  while (wait_readable_unless(fd_.get(), stop_)) {
    WatchHeader raw;
    auto d = Deadline::after_seconds(kStoreIoSeconds);
    Status s = recv_all(fd_.get(), &raw, sizeof raw, d, store);
    auto m = s.is_ok() ? parse_watch_header(&raw, sizeof raw) : Result<WatchHeader>(s);
    std::string text;
    if (m.is_ok()) {
      text.resize(m->text_len);
      s = recv_all(fd_.get(), text.data(), text.size(), d, store);
    }
    if (!m.is_ok() || !s.is_ok()) {
      // (After our goodbye the store closes the connection: no news.)
      if (!stop_.load() && !store_gone_.load() && !said_bye_.load()) {
        std::string why = s.is_ok() ? " (it sent " + m.status().message() + ")" : "";
        on_event_({WatchType::kDead, -1, 0, 0,
                   "the bootstrap store it hosted closed the connection without a goodbye" + why});
      }
      store_gone_ = true;
      return;
    }
    auto type = static_cast<WatchType>(m->type);
    if (type == WatchType::kQuery) {
      (void)send(WatchType::kState, m->comm_uid, m->qid, m->target, answer_(m->comm_uid));
    } else if (type == WatchType::kState) {
      std::lock_guard<std::mutex> lock(query_mu_);
      auto it = answers_.find(m->qid);
      if (it != answers_.end()) it->second[m->rank] = std::move(text);  // late or unasked: dropped
      query_cv_.notify_all();
    } else if (type == WatchType::kShutdown) {
      store_gone_ = true;
    } else {
      on_event_({type, m->rank, m->comm_uid, m->qid, text});
    }
  }
}

}  // namespace chorus::transport
