// Job set-up and the routing of health news to communicators.
#include "collectives/job.h"

#include "collectives/comm.h"
#include "common/log.h"

namespace chorus {

Result<std::shared_ptr<Job>> Job::create(transport::Rendezvous rdzv, Deadline deadline) {
  std::shared_ptr<Job> job(new Job());
  job->rank_ = rdzv.rank;
  job->size_ = rdzv.size;
  job->secret_ = rdzv.secret;
  job->method_ = rdzv.method;
  job->server_ = std::move(rdzv.server);
  set_log_rank(rdzv.rank);
  log_info("bootstrap: rank {} of {} ({}), store at {}", rdzv.rank, rdzv.size, rdzv.method, rdzv.store.to_string());
  CHORUS_ASSIGN_OR_RETURN(job->store_, transport::StoreClient::connect(rdzv.store, rdzv.secret, rdzv.rank, rdzv.size, deadline));
  CHORUS_TRY(job->store_->join(deadline));
  std::weak_ptr<Job> weak = job;
  CHORUS_ASSIGN_OR_RETURN(job->watch_, transport::WatchClient::connect(
      rdzv.store, rdzv.secret, rdzv.rank, rdzv.size,
      [weak](const transport::WatchEvent& e) { if (auto j = weak.lock()) j->on_event(e); },
      [weak](uint64_t uid) { auto j = weak.lock(); return j ? j->answer(uid) : std::string("exiting"); },
      deadline));
  return job;
}

Job::~Job() {
  watch_.reset();  // goodbye first, so nobody reads our exit as a death
  store_.reset();
  server_.reset();
}

void Job::add(const std::shared_ptr<Comm>& c) {
  std::string early;
  std::map<int, std::string> dead;
  {
    std::lock_guard<std::mutex> lock(mu_);
    comms_.push_back(c);
    auto it = early_errors_.find(c->uid());
    if (it != early_errors_.end()) early = it->second;
    dead = dead_;
  }
  if (!early.empty()) c->on_remote_error(early);
  for (auto& [rank, text] : dead) c->on_peer_dead(rank, text);
}

void Job::remove(const Comm* c) {
  std::lock_guard<std::mutex> lock(mu_);
  std::erase_if(comms_, [c](const std::weak_ptr<Comm>& w) { auto p = w.lock(); return !p || p.get() == c; });
}

std::vector<std::shared_ptr<Comm>> Job::live_comms() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::shared_ptr<Comm>> out;
  for (auto& w : comms_)
    if (auto p = w.lock()) out.push_back(p);
  return out;
}

void Job::on_event(const transport::WatchEvent& e) {
  const int dead_rank = e.rank < 0 ? 0 : e.rank;  // -1: the store's host went away (rank 0)
  bool delivered = false;
  for (auto& c : live_comms()) {
    if (e.type == transport::WatchType::kDead) {
      c->on_peer_dead(dead_rank, e.text);
    } else if (e.type == transport::WatchType::kError && e.comm_uid == c->uid()) {
      c->on_remote_error(e.text);
      delivered = true;
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (e.type == transport::WatchType::kDead) dead_[dead_rank] = e.text;
  if (e.type == transport::WatchType::kError && !delivered) early_errors_.emplace(e.comm_uid, e.text);
}

std::string Job::answer(uint64_t comm_uid) {
  for (auto& c : live_comms())
    if (c->uid() == comm_uid) return c->state_text();
  return "not in this communicator (destroyed, or never created)";
}

}  // namespace chorus
