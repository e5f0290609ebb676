// Bootstrap store: a TCP key-value store hosted by one process of the job (rank 0, or whoever
// called chorusGetUniqueId), plus a "watch" channel per rank that carries health news.
//
// Store connections serve set/get/join. get waits (with a deadline) until a key is present;
// join waits until every rank of the job has joined and logs who is missing meanwhile.
// Watch connections stay open for the job's lifetime: when one drops without a goodbye, the
// server tells every other rank that this rank died; ranks also broadcast errors (a mismatch,
// an abort) and ask each other "what are you doing?" when a wait times out.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/socket.h"
#include "transport/wire.h"

namespace chorus::transport {

class StoreServer {
 public:
  // world may be 0 when unknown (unique-id init): the first join fixes it.
  static Result<std::unique_ptr<StoreServer>> start(const std::string& host, int port,
                                                    const Secret& secret, int world);
  ~StoreServer();
  const SockAddr& address() const { return addr_; }

 private:
  struct Conn;
  StoreServer() = default;
  void accept_loop();
  void serve(std::shared_ptr<Conn> c);
  void serve_store(Conn& c);
  void serve_watch(std::shared_ptr<Conn> c);
  Status handle_join(Conn& c, uint32_t timeout_ms);
  void broadcast(uint32_t type, int32_t rank, uint64_t comm_uid, uint64_t qid, int32_t target,
                 const std::string& text, const Conn* except);

  SockAddr addr_;
  Secret secret_{};
  Fd listen_;
  std::atomic<bool> stop_{false};
  std::thread acceptor_;
  std::mutex mu_;
  std::condition_variable cv_;
  int world_ = 0;
  std::map<std::string, std::string> kv_;
  std::map<int, std::string> joined_;  // rank -> "pid P on host H"
  std::vector<std::shared_ptr<Conn>> conns_;
  struct Worker {  // a connection's thread, and whether it has returned (then it can be joined)
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  std::vector<Worker> threads_;
  void join_finished();  // caller holds mu_
};

class StoreClient {
 public:
  // Connects, retrying until the deadline and logging "waiting for the bootstrap store" lines.
  static Result<std::unique_ptr<StoreClient>> connect(const SockAddr& server, const Secret& secret,
                                                      int rank, int world, Deadline deadline);
  Status set(const std::string& key, const std::string& value);
  Result<std::string> get(const std::string& key, Deadline deadline);
  // Returns once all ranks have joined; on timeout, the error lists the ranks that never came.
  Status join(Deadline deadline);
  const SockAddr& server() const { return server_; }

 private:
  Result<std::string> request(uint32_t op, const std::string& key, const std::string& value,
                              uint32_t timeout_ms, Deadline deadline);
  std::mutex mu_;
  Fd fd_;
  SockAddr server_;
  std::string what_;
};

// Messages on a watch connection.
enum class WatchType : uint32_t { kBye = 1, kDead, kError, kQuery, kState, kShutdown };

struct WatchEvent {
  WatchType type;
  int32_t rank;        // whom it is about (dead rank, erring rank, answering rank)
  uint64_t comm_uid;
  uint64_t qid;
  std::string text;
};

class WatchClient {
 public:
  using EventFn = std::function<void(const WatchEvent&)>;
  // answer(comm_uid) -> what this process is doing in that communicator, for queries.
  using AnswerFn = std::function<std::string(uint64_t comm_uid)>;
  static Result<std::unique_ptr<WatchClient>> connect(const SockAddr& server, const Secret& secret,
                                                      int rank, int world, EventFn on_event,
                                                      AnswerFn answer, Deadline deadline);
  ~WatchClient();  // says goodbye (a clean exit is not a death)
  void broadcast_error(uint64_t comm_uid, const std::string& text);
  // Asks every other rank what it is doing in comm_uid; collects answers for up to `seconds`.
  std::map<int, std::string> query(uint64_t comm_uid, int expect, double seconds);
  bool store_gone() const { return store_gone_.load(); }

 private:
  void reader();
  Status send(WatchType t, uint64_t comm_uid, uint64_t qid, int32_t target, const std::string& text);
  Fd fd_;
  int rank_ = -1;
  EventFn on_event_;
  AnswerFn answer_;
  std::mutex write_mu_;
  std::mutex query_mu_;
  std::condition_variable query_cv_;
  std::map<uint64_t, std::map<int, std::string>> answers_;
  std::atomic<uint64_t> next_qid_{1};
  std::atomic<bool> stop_{false};
  std::atomic<bool> store_gone_{false};
  std::thread thread_;
};

}  // namespace chorus::transport
