// Job: what a root communicator and all communicators split from it share -- the bootstrap
// store (hosted here when this is rank 0), the store client, and the watch channel that
// brings health news (a rank died, a rank failed, "what are you doing?") to every communicator.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
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
  transport::StoreClient& store() { return *store_; }
  transport::WatchClient* watch() { return watch_.get(); }
  // How job rank r died, as the watch channel told it; "" while it is not known to be dead.
  std::string dead_text(int r) const;
  // Tells every rank of the job about an error of communicator comm_uid (watch channel); the
  // store's host sends it itself, so it is out before that process can end.
  void broadcast_error(uint64_t comm_uid, const std::string& text);
  const std::string& method() const { return method_; }
  // This process hosts the bootstrap store (it closes when the process ends).
  bool hosts_store() const { return server_ != nullptr; }
  // The store's connection closed (its process ended); "" while it is up, else why, naming
  // the rank that hosted it when known.
  std::string store_gone_text();

  void add(const std::shared_ptr<CommImpl>& c);
  void remove(const CommImpl* c);
  // While a communicator is being created: an error once one of its ranks (job ranks
  // `members`) died or reported that its own creation failed, naming that rank.
  Status creation_news(uint64_t comm_uid, const std::vector<int>& members);
  // Tells the others that creating communicator comm_uid failed here.
  void publish_creation_failure(uint64_t comm_uid, const Status& why);

 private:
  Job() = default;
  // The last reference may drop on the watch thread (news delivered while the last
  // communicator is destroyed); the destructor joins that thread, so it runs elsewhere then.
  static void release(Job* job);
  void on_event(const transport::WatchEvent& e);
  std::string answer(uint64_t comm_uid);
  std::vector<std::shared_ptr<CommImpl>> live_comms();
  int store_host_rank();

  int rank_ = 0, size_ = 1;
  transport::Secret secret_{};
  std::string method_;
  int store_host_rank_ = 0;  // -1: not known yet (unique id), see store_host_rank()
  std::shared_ptr<transport::StoreServer> server_;
  std::unique_ptr<transport::StoreClient> store_;
  std::unique_ptr<transport::WatchClient> watch_;
  mutable std::mutex mu_;
  std::vector<std::weak_ptr<CommImpl>> comms_;
  // News that came before its communicator was registered (a fast peer failed while this rank
  // was still connecting): applied when that communicator is added.
  std::map<uint64_t, std::pair<int, std::string>> early_errors_;  // uid -> (rank, "code|text")
  std::map<int, std::string> dead_;
};

}  // namespace chorus
