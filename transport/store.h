// Bootstrap store: a TCP key-value store hosted by one process of the job (rank 0, or whoever
// called chorusGetUniqueId), plus a "watch" channel per rank that carries health news.
//
// Store connections serve set/get/join. get waits (with a deadline) until a key is present;
// join waits until every rank of the job has joined and logs who is missing meanwhile.
// Watch connections stay open for the job's lifetime: when one drops without a goodbye, the
// server tells every other rank that this rank died; ranks also broadcast errors (a mismatch,
// an abort) and ask each other "what are you doing?" when a wait times out.
//
// What strangers and peers can cost the server (see acceptor.h for connections that fail their
// handshake): an authenticated connection costs a thread until it closes, and at most
// max_conns exist at once; keys and values together are capped at max_bytes.
// Frames: store_proto.h. Threading: every StoreClient/WatchClient method is thread-safe.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/socket.h"
#include "transport/acceptor.h"
#include "transport/store_proto.h"
#include "transport/wire.h"

namespace chorus::transport {

struct StoreOptions {
  int world = 0;                         // 0 when unknown (unique-id init): the first join fixes it
  size_t max_bytes = size_t{256} << 20;  // keys and values held, in all
  int max_conns = 0;                     // authenticated connections at once; 0: 4 * world + 64
  bool stop_when_job_ends = false;  // stop once every rank has joined and every connection closed
  // A store that took over from a dead one (collectives/failover.cc): the job ranks it checks,
  // at their standby addresses, until each one's watch connection arrives. A connection refused
  // there means that rank's process is gone: the store announces its death as it would a watch
  // connection dropped without a goodbye (the rank may have died with the old store, unseen).
  std::map<int, SockAddr> probe;
};

class StoreServer {
 public:
  static Result<std::unique_ptr<StoreServer>> start(const std::string& host, int port,
                                                    const Secret& secret, StoreOptions opt);
  // On a socket already listening at `bound` (a rank's standby port, when it takes over).
  static Result<std::unique_ptr<StoreServer>> start(Fd listener, const SockAddr& bound,
                                                    const Secret& secret, StoreOptions opt);
  static Result<std::unique_ptr<StoreServer>> start(const std::string& host, int port,
                                                    const Secret& secret, int world) {
    StoreOptions o;
    o.world = world;
    return start(host, port, secret, o);
  }
  ~StoreServer();
  const SockAddr& address() const { return addr_; }
  // True once a stop_when_job_ends store has stopped by itself (its port is closed).
  bool finished() const { return finished_.load(); }
  // Runs when the store stops (first thing in the destructor): removes what advertises it.
  void on_stop(std::function<void()> fn) { on_stop_ = std::move(fn); }
  // A rank of the process hosting the store tells every watch client of an error, from the
  // calling thread: sent when this returns, so news sent just before the process ends is not
  // lost with the serving thread that would have forwarded it.
  void announce_error(int32_t rank, uint64_t comm_uid, const std::string& text) {
    broadcast(WatchType::kError, rank, comm_uid, 0, rank, text, nullptr, rank);
  }
  // For tests: serving threads alive, bytes held.
  size_t serving_threads() const;
  size_t stored_bytes() const;

 private:
  struct Conn;
  struct Worker {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  StoreServer() = default;
  void accept_loop();
  void probe_loop();
  bool watching(int rank);  // a watch connection of that rank is open
  void admit(Accepted a);
  void run_conn(const std::shared_ptr<Conn>& c);
  void serve_store(Conn& c);
  void serve_watch(const std::shared_ptr<Conn>& c);
  bool handle_set(Conn& c, std::string key, std::string val,
                  const std::function<bool(Code, const std::string&)>& reply);
  Status handle_join(Conn& c, uint32_t timeout_ms);
  // To every watch client but `except` and the clients of rank except_rank (>= 0).
  void broadcast(WatchType type, int32_t rank, uint64_t comm_uid, uint64_t qid, int32_t target,
                 const std::string& text, const Conn* except, int except_rank = -1);
  void reap_workers(bool all);
  bool job_over();

  SockAddr addr_;
  Secret secret_{};
  StoreOptions opt_;
  std::string host_;
  Fd listen_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> finished_{false};
  std::function<void()> on_stop_;
  std::thread acceptor_;
  std::thread prober_;         // only with opt_.probe
  std::list<Worker> workers_;  // the acceptor thread's (and the destructor's, after it)
  mutable std::mutex mu_;
  std::condition_variable cv_;
  int world_ = 0;
  int64_t watch_delay_ms_ = 0;  // CHORUS_TEST_WATCH_DELAY_MS
  int64_t watch_gap_ms_ = 0;    // CHORUS_TEST_WATCH_GAP_MS
  int64_t death_late_ms_ = 0;   // CHORUS_TEST_DEATH_NEWS_LATE_MS
  int64_t admit_pause_ms_ = 0;  // CHORUS_TEST_STORE_ADMIT_PAUSE_MS
  bool all_joined_once_ = false;
  size_t stored_bytes_ = 0;
  std::map<std::string, std::string> kv_;
  std::map<int, std::string> joined_;         // rank -> "pid P on host H"
  std::vector<std::shared_ptr<Conn>> conns_;  // authenticated, verdict sent
  // Deaths and errors broadcast so far (the last kMaxNews), replayed to each new watch
  // connection: a rank that connects late still hears that a peer died or failed.
  std::deque<std::string> news_;
};

class StoreClient {
 public:
  // Connects, retrying until the deadline and logging "waiting for the bootstrap store" lines.
  static Result<std::unique_ptr<StoreClient>> connect(const SockAddr& server, const Secret& secret,
                                                      int rank, int world, Deadline deadline);
  Status set(const std::string& key, const std::string& value);
  // Waits for the key until the deadline. With `interrupt`, waits in short slices and gives up
  // as soon as interrupt() returns an error (a peer failed or died meanwhile).
  Result<std::string> get(const std::string& key, Deadline deadline,
                          const std::function<Status()>& interrupt = {});
  // The key's value if it is set now (kTimeout if not), without waiting.
  Result<std::string> try_get(const std::string& key);
  // Returns once all ranks have joined; on timeout, the error lists the ranks that never came.
  Status join(Deadline deadline);
  SockAddr server() const;
  ServerInfo server_info() const;
  // A client over a connection whose handshake is done (a failover dials it itself).
  static std::unique_ptr<StoreClient> adopt(Fd fd, const SockAddr& server, const ServerInfo& info);
  // From now on, requests go over `other`'s connection (a new store after a failover); the
  // request in flight on the old one, if any, ends first. `other` is left empty.
  void take_over(StoreClient& other);
  // A request failed to reach the store or to read its answer since the last take_over.
  bool connection_failed() const { return connection_failed_.load(); }

 private:
  void yield_to_waiters();  // between a get's slices: threads waiting for mu_ take it first
  Result<std::string> request(uint32_t op, const std::string& key, const std::string& value,
                              uint32_t timeout_ms, Deadline deadline);
  std::mutex mu_;
  Fd fd_;
  // Threads of this process waiting for the connection now, and when one last had to: a waiting
  // get then hands the connection over after short slices (store_client.cc).
  std::atomic<int> wanting_{0};
  std::atomic<double> contended_at_{-1e9};
  std::atomic<bool> connection_failed_{false};
  mutable std::mutex info_mu_;  // server_, info_, what_ (take_over changes them)
  SockAddr server_;
  ServerInfo info_;
  std::string what_;
};

struct WatchEvent {
  WatchType type;
  int32_t rank;  // whom it is about (dead rank, erring rank, answering rank); -1: the store
  uint64_t comm_uid;
  uint64_t qid;
  std::string text;
};

class WatchClient {
 public:
  using EventFn = std::function<void(const WatchEvent&)>;
  // answer(comm_uid) -> what this process is doing in that communicator, for queries.
  using AnswerFn = std::function<std::string(uint64_t comm_uid)>;
  // once: one try, no retry of a refused connection (a store that took over, and may be gone).
  static Result<std::unique_ptr<WatchClient>> connect(const SockAddr& server, const Secret& secret,
                                                      int rank, int world, EventFn on_event,
                                                      AnswerFn answer, Deadline deadline,
                                                      bool once = false);
  ~WatchClient();  // says goodbye (a clean exit is not a death), unless goodbye() did
  // Says goodbye now, once: this rank leaves the job (its last communicator is destroyed), and the
  // store reads the connection's end as a clean exit whenever it comes.
  void goodbye();
  void broadcast_error(uint64_t comm_uid, const std::string& text);
  // Asks every other rank what it is doing in comm_uid; collects answers for up to `seconds`.
  std::map<int, std::string> query(uint64_t comm_uid, int expect, double seconds);
  bool store_gone() const { return store_gone_.load(); }
  const ServerInfo& server_info() const { return info_; }
  size_t pending_answers() const;  // answers held for queries still waiting (tests)
  // True on the thread that delivers events (the destructor must not run there: it joins it).
  bool on_reader_thread() const { return std::this_thread::get_id() == thread_.get_id(); }

 private:
  void reader();
  Status send(WatchType t, uint64_t comm_uid, uint64_t qid, int32_t target,
              const std::string& text);
  Fd fd_;
  int rank_ = -1;
  ServerInfo info_;
  EventFn on_event_;
  AnswerFn answer_;
  std::mutex write_mu_;
  mutable std::mutex query_mu_;
  std::condition_variable query_cv_;
  std::map<uint64_t, std::map<int, std::string>> answers_;  // only for queries still waiting
  std::atomic<uint64_t> next_qid_{1};
  std::atomic<bool> stop_{false};
  std::atomic<bool> store_gone_{false};
  std::atomic<bool> said_bye_{false};
  std::thread thread_;
};

}  // namespace chorus::transport
