// Communicator life cycle, the operation queue and the progress thread.
#include "collectives/comm.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>

#include "collectives/job.h"
#include "common/env.h"
#include "common/log.h"

namespace chorus {

// ---- Work ----

bool Work::wait(double seconds) {
  std::unique_lock<std::mutex> lock(mu_);
  if (seconds < 0) {
    cv_.wait(lock, [&] { return done_; });
    return true;
  }
  return cv_.wait_for(lock, std::chrono::duration<double>(seconds), [&] { return done_; });
}

bool Work::test() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

Status Work::status() const {
  std::lock_guard<std::mutex> lock(mu_);
  return status_;
}

void Work::finish(Status s) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    status_ = std::move(s);
    done_ = true;
  }
  cv_.notify_all();
}

// ---- Comm ----

Result<std::shared_ptr<Comm>> Comm::create(std::shared_ptr<Job> job, std::string prefix, uint64_t uid,
                                           int rank, std::vector<int> job_ranks, Deadline deadline) {
  std::shared_ptr<Comm> c(new Comm());
  c->job_ = job;
  c->prefix_ = std::move(prefix);
  c->uid_ = uid;
  c->rank_ = rank;
  c->job_ranks_ = std::move(job_ranks);
  CHORUS_ASSIGN_OR_RETURN(c->timeout_s_, env_seconds("CHORUS_TIMEOUT", 300));
  CHORUS_ASSIGN_OR_RETURN(int64_t spin, env_int("CHORUS_SPIN_US", 50));
  c->spin_us_ = static_cast<int>(spin);
  c->spin_now_us_ = c->spin_us_;
  CHORUS_ASSIGN_OR_RETURN(int64_t jitter, env_int("CHORUS_TEST_JITTER_US", 0));
  if (jitter < 0 || jitter > 1000000)
    return make_error(Code::kInvalidArgument, "CHORUS_TEST_JITTER_US must be 0..1000000 microseconds, got {}", jitter);
  c->jitter_us_ = static_cast<int>(jitter);
  c->send_seq_.assign(c->size(), 0);
  c->recv_seq_.assign(c->size(), 0);
  CHORUS_ASSIGN_OR_RETURN(auto opt, transport::LinkOptions::from_env());
  CHORUS_ASSIGN_OR_RETURN(c->tuner_, TunerConfig::from_env());
  // Every rank must open the same number of channels: compare with everyone first.
  auto& store = job->store();
  CHORUS_TRY(store.set(fmt::format("{}/nch/{}", c->prefix_, rank), std::to_string(c->tuner_.nchannels)));
  for (int r = 0; r < c->size(); ++r) {
    CHORUS_ASSIGN_OR_RETURN(std::string v, store.get(fmt::format("{}/nch/{}", c->prefix_, r), deadline));
    if (std::atoi(v.c_str()) != c->tuner_.nchannels)
      return make_error(Code::kInvalidUsage, "CHORUS_NCHANNELS is {} on rank {} but {} on rank {}: set it the same everywhere",
                        c->tuner_.nchannels, rank, v, r);
  }
  for (int k = 0; k < c->tuner_.nchannels; ++k) {
    auto ch = std::make_unique<Channel>();
    std::string prefix = k == 0 ? c->prefix_ : fmt::format("{}/ch{}", c->prefix_, k);
    CHORUS_ASSIGN_OR_RETURN(ch->links, transport::connect_links(store, prefix, uid + k, job->secret(), rank,
                                                                c->size(), opt, deadline));
    ch->headers.resize(c->size());
    ch->event_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    ch->epoll_fd = epoll_create1(EPOLL_CLOEXEC);
    if (ch->event_fd < 0 || ch->epoll_fd < 0) return make_error(Code::kSystemError, "epoll/eventfd: {}", strerror(errno));
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = ch->event_fd;
    epoll_ctl(ch->epoll_fd, EPOLL_CTL_ADD, ch->event_fd, &ev);
    for (int fd : ch->links.tcp_fds) {
      epoll_event e{};
      e.events = EPOLLIN | EPOLLOUT | EPOLLET | EPOLLRDHUP;
      e.data.fd = fd;
      epoll_ctl(ch->epoll_fd, EPOLL_CTL_ADD, fd, &e);
    }
    c->channels_.push_back(std::move(ch));
  }
  const auto& peers = c->channels_[0]->links.peers;
  for (auto& p : peers) c->any_tcp_ |= p.host != peers[0].host;
  if (opt.force == "tcp" && c->size() > 1) c->any_tcp_ = true;
  c->slot_bytes_ = std::min<size_t>(opt.shm.slot_bytes, 256 << 10);
  for (int k = 1; k < c->nchannels(); ++k)
    c->channels_[k]->thread = std::thread([p = c.get(), k] { p->channel_loop(k); });
  job->add(c);
  c->thread_ = std::thread([p = c.get()] { p->progress_loop(); });
  return c;
}

Channel::~Channel() {
  if (epoll_fd >= 0) close(epoll_fd);
  if (event_fd >= 0) close(event_fd);
}

Comm::~Comm() { (void)destroy(); }

void Comm::channel_loop(int k) {
  Channel& ch = *channels_[k];
  std::unique_lock<std::mutex> lock(ch.mu);
  while (true) {
    ch.cv.wait(lock, [&] { return ch.stop || ch.job != nullptr; });
    if (ch.job == nullptr) return;
    FunctionRef<Status(int)>& job = *ch.job;
    lock.unlock();
    Status s = job(k);
    lock.lock();
    ch.result = s;
    ch.job = nullptr;
    ch.done = true;
    ch.cv.notify_all();
  }
}

Status Comm::run_channels(int n, FunctionRef<Status(int)> fn) {
  for (int k = 1; k < n; ++k) {
    Channel& ch = *channels_[k];
    std::lock_guard<std::mutex> lock(ch.mu);
    ch.job = &fn;
    ch.done = false;
    ch.cv.notify_all();
  }
  Status first = fn(0);
  if (!first.is_ok()) fail(first);
  for (int k = 1; k < n; ++k) {
    Channel& ch = *channels_[k];
    std::unique_lock<std::mutex> lock(ch.mu);
    ch.cv.wait(lock, [&] { return ch.done; });  // each part is bounded by the operation's deadline
    if (first.is_ok() && !ch.result.is_ok()) {
      first = ch.result;
      lock.unlock();
      fail(first);
    }
  }
  return first;
}

uint64_t Comm::next_p2p_seq(int peer, bool send) {
  std::lock_guard<std::mutex> lock(seq_mu_);
  return ++(send ? send_seq_ : recv_seq_)[peer];
}

Status Comm::error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

Result<std::shared_ptr<Work>> Comm::submit(OpDesc desc, OpFn fn) {
  auto work = std::make_shared<Work>(desc);
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_) return make_error(Code::kInvalidUsage, "{}: the communicator is being destroyed", describe(desc));
  if (failed_.load()) return Status(error_.code(), fmt::format("{}: communicator is broken by an earlier error: {}", describe(desc), error_.message()));
  queue_.emplace_back(work, std::move(fn));
  cv_.notify_all();
  return work;
}

void Comm::progress_loop() {
  while (true) {
    std::shared_ptr<Work> work;
    OpFn fn;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return (stopping_ && !running_op_) || (!queue_.empty() && !running_op_); });
      if (queue_.empty()) return;
      work = queue_.front().first;
      fn = std::move(queue_.front().second);
      queue_.pop_front();
      current_ = work->desc();
      busy_ = true;
      current_since_ = now_seconds();
      running_op_ = true;
    }
    Status s;
    if (failed_.load()) {
      s = Status(error().code(), fmt::format("{}: communicator is broken by an earlier error: {}", describe(work->desc()), error().message()));
    } else {
      OpCtx ctx(*this, work->desc());
      s = fn(ctx);
      if (s.is_ok()) s = ctx.drain();
      if (!s.is_ok()) fail(s);
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      last_done_ = current_;
      have_last_ = true;
      busy_ = false;
      running_op_ = false;
    }
    work->finish(s);
    cv_.notify_all();
  }
}

bool Comm::try_run_inline(const OpDesc& desc, const OpFn& fn, Status* result) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) {
      *result = make_error(Code::kInvalidUsage, "{}: the communicator is being destroyed", describe(desc));
      return true;
    }
    if (failed_.load()) {
      *result = Status(error_.code(), fmt::format("{}: communicator is broken by an earlier error: {}", describe(desc), error_.message()));
      return true;
    }
    if (!queue_.empty() || running_op_) return false;
    running_op_ = true;
    current_ = desc;
    busy_ = true;
    current_since_ = 0;  // set when the operation first waits long (OpCtx::wait_slow)
  }
  OpCtx ctx(*this, desc);
  *result = fn(ctx);
  if (result->is_ok()) *result = ctx.drain();
  if (!result->is_ok()) fail(*result);
  {
    std::lock_guard<std::mutex> lock(mu_);
    last_done_ = current_;
    have_last_ = true;
    busy_ = false;
    running_op_ = false;
    // Wake the progress thread only when work queued up meanwhile, or destroy is waiting:
    // a notify per call would cost a futex call on the fast path.
    if (queue_.empty() && drain_waiters_ == 0) return true;
  }
  cv_.notify_all();
  return true;
}

void Comm::mark_waiting_since() {
  std::lock_guard<std::mutex> lock(mu_);
  if (busy_ && current_since_ == 0) current_since_ = now_seconds();
}

void Comm::wake() {
  for (auto& ch : channels_) {
    if (ch->links.own_segment) transport::doorbell_ring(ch->links.own_segment->doorbell());
    uint64_t one = 1;
    if (ch->event_fd >= 0) (void)!write(ch->event_fd, &one, sizeof one);
  }
}

// First error wins; it is told to every other rank so they fail at once too.
void Comm::fail(const Status& s) {
  bool first = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!failed_.load()) {
      error_ = s;
      failed_ = true;
      first = true;
    }
  }
  if (first) {
    log_error("{}", s.message());
    if (s.code() != Code::kRemoteError && job_ && job_->watch())
      job_->watch()->broadcast_error(uid_, fmt::format("{}|{}", static_cast<int>(s.code()), s.message()));
  }
  wake();
}

void Comm::on_peer_dead(int job_rank, const std::string& text) {
  auto it = std::find(job_ranks_.begin(), job_ranks_.end(), job_rank);
  if (it == job_ranks_.end()) return;
  int r = static_cast<int>(it - job_ranks_.begin());
  std::string msg = r == job_rank ? text : fmt::format("rank {} of this communicator: {}", r, text);
  std::string cur;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (busy_) cur = describe(current_);
  }
  fail(Status(Code::kRemoteError, cur.empty() ? msg : fmt::format("{} on rank {} failed: {}", cur, rank_, msg)));
}

void Comm::on_remote_error(const std::string& text) {
  auto bar = text.find('|');
  Code code = Code::kRemoteError;
  std::string msg = text;
  if (bar != std::string::npos) {
    code = static_cast<Code>(std::atoi(text.substr(0, bar).c_str()));
    msg = text.substr(bar + 1);
  }
  if (code != Code::kMismatch) code = Code::kRemoteError;
  std::lock_guard<std::mutex> lock(mu_);
  if (failed_.load()) return;
  error_ = Status(code, msg);
  failed_ = true;
  for (auto& ch : channels_) {
    if (ch->links.own_segment) transport::doorbell_ring(ch->links.own_segment->doorbell());
    uint64_t one = 1;
    if (ch->event_fd >= 0) (void)!write(ch->event_fd, &one, sizeof one);
  }
}

std::string Comm::state_text() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (busy_ && current_since_ > 0)
    return fmt::format("in {} for {:.1f} s", describe(current_), now_seconds() - current_since_);
  if (busy_) return fmt::format("in {}", describe(current_));
  if (have_last_) return fmt::format("idle, last finished {}", describe(last_done_));
  return "idle, no operation yet";
}

std::string Comm::timeout_report(const OpDesc& d, const std::string& waiting_for) {
  std::string mine = "in " + describe(d);
  std::string report, absent;
  if (job_ && job_->watch()) {
    auto answers = job_->watch()->query(uid_, job_->size() - 1, 2.0);
    for (int r = 0; r < size(); ++r) {
      if (r == rank_) continue;
      auto it = answers.find(job_ranks_[r]);
      std::string text = it == answers.end() ? "no answer" : it->second;
      report += fmt::format("; rank {}: {}", r, text);
      if (text.rfind(mine, 0) == 0) continue;
      if (!absent.empty()) absent += ',';
      absent += std::to_string(r);
    }
  }
  return fmt::format("{} on rank {} timed out after {:.0f} s{} (CHORUS_TIMEOUT); ranks that never arrived: {}{}",
                     describe(d), rank_, timeout_s_, waiting_for, absent.empty() ? "none" : absent, report);
}

void Comm::abort(const std::string& why) {
  fail(Status(Code::kAborted, why));
}

Status Comm::destroy() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (stopping_ && !thread_.joinable()) return Status::ok();
    ++drain_waiters_;
    bool drained = cv_.wait_for(lock, std::chrono::duration<double>(failed_.load() ? 0.0 : timeout_s_),
                                [&] { return queue_.empty() && !running_op_; });
    --drain_waiters_;
    if (!drained && !failed_.load()) {
      lock.unlock();
      abort(fmt::format("rank {}: communicator destroyed with operations still pending after {:.0f} s", rank_, timeout_s_));
      lock.lock();
    }
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& q : queue_) q.first->finish(make_error(Code::kAborted, "{}: communicator destroyed", describe(q.first->desc())));
    queue_.clear();
  }
  if (job_) job_->remove(this);
  for (auto& ch : channels_) {
    {
      std::lock_guard<std::mutex> lock(ch->mu);
      ch->stop = true;
    }
    ch->cv.notify_all();
    if (ch->thread.joinable()) ch->thread.join();
  }
  channels_.clear();
  job_.reset();
  return Status::ok();
}

Result<std::shared_ptr<Comm>> Comm::split(int color, int key) {
  uint64_t n = ++split_count_;
  auto deadline = Deadline::after_seconds(timeout_s_);
  auto& store = job_->store();
  std::string base = fmt::format("{}/split{}", prefix_, n);
  CHORUS_TRY(store.set(fmt::format("{}/{}", base, rank_), fmt::format("{} {}", color, key)));
  std::vector<std::pair<std::pair<int, int>, int>> members;  // ((key, old rank), old rank)
  for (int r = 0; r < size(); ++r) {
    CHORUS_ASSIGN_OR_RETURN(std::string v, store.get(fmt::format("{}/{}", base, r), deadline));
    int c = 0, k = 0;
    sscanf(v.c_str(), "%d %d", &c, &k);
    if (c == color && color >= 0) members.push_back({{k, r}, r});
  }
  if (color < 0) return std::shared_ptr<Comm>();
  std::sort(members.begin(), members.end());
  std::vector<int> job_ranks;
  int new_rank = -1;
  for (auto& m : members) {
    if (m.second == rank_) new_rank = static_cast<int>(job_ranks.size());
    job_ranks.push_back(job_ranks_[m.second]);
  }
  std::string prefix = fmt::format("{}.s{}c{}", prefix_, n, color);
  uint64_t uid = transport::hash64(prefix.data(), prefix.size(), uid_);
  return Comm::create(job_, prefix, uid, new_rank, job_ranks, deadline);
}

}  // namespace chorus
