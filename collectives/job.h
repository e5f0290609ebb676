// Job: what a root communicator and all communicators split from it share -- the bootstrap
// store (hosted here when this is rank 0), the store client, and the watch channel that
// brings health news (a rank died, a rank failed, "what are you doing?") to every communicator.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <mutex>
#include <vector>

#include "transport/rendezvous.h"
#include "transport/store.h"

namespace chorus {

class Comm;

class Job : public std::enable_shared_from_this<Job> {
 public:
  static Result<std::shared_ptr<Job>> create(transport::Rendezvous rdzv, Deadline deadline);
  ~Job();

  int rank() const { return rank_; }
  int size() const { return size_; }
  const transport::Secret& secret() const { return secret_; }
  transport::StoreClient& store() { return *store_; }
  transport::WatchClient* watch() { return watch_.get(); }
  const std::string& method() const { return method_; }

  void add(const std::shared_ptr<Comm>& c);
  void remove(const Comm* c);

 private:
  Job() = default;
  void on_event(const transport::WatchEvent& e);
  std::string answer(uint64_t comm_uid);
  std::vector<std::shared_ptr<Comm>> live_comms();

  int rank_ = 0, size_ = 1;
  transport::Secret secret_{};
  std::string method_;
  std::unique_ptr<transport::StoreServer> server_;
  std::unique_ptr<transport::StoreClient> store_;
  std::unique_ptr<transport::WatchClient> watch_;
  std::mutex mu_;
  std::vector<std::weak_ptr<Comm>> comms_;
  // News that came before its communicator was registered (a fast peer failed while this rank
  // was still connecting): applied when that communicator is added.
  std::map<uint64_t, std::string> early_errors_;
  std::map<int, std::string> dead_;
};

}  // namespace chorus
