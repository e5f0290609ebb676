// Job: what a root communicator and all communicators split from it share -- the bootstrap
// store (hosted here when this is rank 0), the store client, and the watch channel that
// brings health news (a rank died, a rank failed, "what are you doing?") to every communicator.
// When the store's process dies, the survivors move to a new store hosted by one of them
// (failover.cc); the store client stays the same object, the watch channel is a new one.
#pragma once

#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "transport/rendezvous.h"
#include "transport/store.h"

namespace chorus {

class CommImpl;

class Job : public std::enable_shared_from_this<Job> {
 public:
  static Result<std::shared_ptr<Job>> create(transport::Rendezvous rdzv, Deadline deadline);
  ~Job();

  int rank() const { return rank_; }
  int size() const { return size_; }
  const transport::Secret& secret() const { return secret_; }
  // The same object for the job's life: after a failover its requests go to the new store.
  transport::StoreClient& store() { return *store_; }
  transport::WatchClient* watch();  // the current store's
  // How job rank r died, as the watch channel told it; "" while it is not known to be dead.
  std::string dead_text(int r) const;
  // Tells every rank of the job about an error of communicator comm_uid (watch channel); the
  // store's host sends it itself, so it is out before that process can end.
  void broadcast_error(uint64_t comm_uid, const std::string& text);
  const std::string& method() const { return method_; }
  // This process hosts the bootstrap store (it closes when the process ends).
  bool hosts_store() const;
  // The store's connection closed (its process ended); "" while it is up, else why, naming
  // the rank that hosted it when known.
  std::string store_gone_text();

  // Failover (failover.cc). How many times the store has moved (0: the job's first store).
  int store_generation() const;
  // Returns once the store is up: at once, or when a failover running now has ended. An error
  // (naming the rank that hosted the store, and why no survivor took over) when it is gone.
  Status await_store(Deadline deadline);
  // True once the store has moved past generation `gen`, or is gone; when a store request's
  // connection failed, waits up to `seconds` for that news (a request can fail on a dead store
  // just before the watch channel says so).
  bool store_moved_since(int gen, double seconds);
  // Reads the standby addresses of these job ranks not known yet (a grow's newcomers).
  void learn_standby(const std::vector<int>& job_ranks);

  void add(const std::shared_ptr<CommImpl>& c);
  void remove(const CommImpl* c);
  // Says goodbye to the store when no communicator uses the job any more (the last one was
  // destroyed): now, on this thread. The job's teardown may come later, on another thread that
  // held it last (the watch thread, news being delivered at that moment, has it torn down on a
  // thread of its own), and a process that exits right after destroy would end that before a
  // goodbye in the teardown: the others would read a clean exit as a death.
  void goodbye_if_unused();
  // While a communicator is being created: an error once one of its ranks (job ranks
  // `members`) died or reported that its own creation failed, naming that rank.
  Status creation_news(uint64_t comm_uid, const std::vector<int>& members);
  // Tells the others that creating communicator comm_uid failed here.
  void publish_creation_failure(uint64_t comm_uid, const Status& why);
  // This rank will not make (or stops making) communicator comm_uid: its own creation, under
  // way on another thread, and the other members' stop, naming this rank and `why`.
  void stop_creation(uint64_t comm_uid, const Status& why);

 private:
  Job() = default;
  // The last reference may drop on the watch thread (news delivered while the last
  // communicator is destroyed); the destructor joins that thread, so it runs elsewhere then.
  static void release(Job* job);
  void on_event(const transport::WatchEvent& e);
  std::string answer(uint64_t comm_uid);
  std::vector<std::shared_ptr<CommImpl>> live_comms();
  int store_host_rank();
  // Job rank r is dead: every communicator hears it, and dead_text(r) says how.
  void mark_dead(int r, const std::string& text);
  Result<std::unique_ptr<transport::WatchClient>> connect_watch(const SockAddr& store,
                                                                Deadline deadline,
                                                                bool once = false);
  bool on_own_thread() const;  // a thread the destructor joins
  // s, or when the store's connection failed while this rank joined, an error naming its host.
  Status joining_failure(Status s) const;

  // failover.cc
  Status open_standby();
  void start_failover();
  Status take_over_store();
  Result<std::unique_ptr<transport::StoreClient>> try_candidate(int r, const SockAddr& at,
                                                                Deadline deadline);
  Status host_store(int generation, const std::map<int, SockAddr>& candidates, Deadline deadline);
  Status use_store(int host, std::unique_ptr<transport::StoreClient> client, int generation,
                   Deadline deadline);

  int rank_ = 0, size_ = 1;
  transport::Secret secret_{};
  std::string method_;
  int store_host_rank_ = 0;  // -1: not known yet (unique id), see store_host_rank()
  std::shared_ptr<transport::StoreServer> server_;
  std::unique_ptr<transport::StoreClient> store_;
  std::unique_ptr<transport::WatchClient> watch_;
  mutable std::mutex mu_;
  // Failover: this rank's standby port (listening until it hosts a store there), every job
  // rank's (an empty host: that rank has none), the watch channels of stores gone (kept: their
  // reader threads may still be delivering), and the takeover's state.
  bool failover_enabled_ = false;
  int failover_die_ = -1;  // test hook CHORUS_TEST_FAILOVER_DIE
  Fd standby_;
  SockAddr standby_addr_;
  std::map<int, SockAddr> standby_addrs_;
  std::vector<std::unique_ptr<transport::WatchClient>> old_watches_;
  std::thread failover_thread_;
  std::atomic<bool> ending_{false};
  bool failing_over_ = false;
  bool failover_again_ = false;  // the store died again while it ran
  int waiting_fd_ = -1;          // the connection a failover waits on (shut down to end it)
  std::string failover_error_;
  int generation_ = 0;
  std::condition_variable cv_;
  std::vector<std::weak_ptr<CommImpl>> comms_;
  // News that came before its communicator was registered (a fast peer failed while this rank
  // was still connecting): applied when that communicator is added.
  std::map<uint64_t, std::pair<int, std::string>> early_errors_;  // uid -> (rank, "code|text")
  std::map<int, std::string> dead_;
  int64_t watch_hold_ms_ = 0;     // test hook CHORUS_TEST_WATCH_HOLD_MS
  int64_t failover_late_ms_ = 0;  // test hook CHORUS_TEST_FAILOVER_LATE_MS
  int64_t await_lag_ms_ = 0;      // test hook CHORUS_TEST_AWAIT_STORE_LAG_MS
};

}  // namespace chorus
