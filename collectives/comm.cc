// Communicator life cycle, the operation queue and the progress thread.
#include "collectives/comm.h"

#include <unistd.h>

#include <cstdlib>

#include <algorithm>

#include "collectives/device_bounce.h"
#include "collectives/device_timing.h"
#include "collectives/device_vmm.h"
#include "collectives/job.h"
#include "common/env.h"
#include "common/log.h"
#include "common/thread.h"
#include "kernels/cpu/isa.h"
#include "kernels/cuda/device.h"
#include "transport/machine.h"

namespace chorus {

// ---- Request ----

bool Request::wait(double seconds) {
  std::unique_lock<std::mutex> lock(mu_);
  // Negative, NaN, infinite or absurdly long: until done (the operation has its own deadline,
  // CHORUS_TIMEOUT). A duration of 1e300 s would overflow the clock's representation.
  if (!(seconds >= 0 && seconds <= 1e9)) {
    cv_.wait(lock, [&] { return done_; });
    return true;
  }
  return cv_.wait_for(lock, std::chrono::duration<double>(seconds), [&] { return done_; });
}

bool Request::test() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

Status Request::status() const {
  std::lock_guard<std::mutex> lock(mu_);
  return status_;
}

void Request::finish(Status s) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    status_ = std::move(s);
    done_ = true;
  }
  cv_.notify_all();
}

// ---- CommImpl ----

Result<std::shared_ptr<CommImpl>> CommImpl::create(std::shared_ptr<Job> job, std::string prefix,
                                                   uint64_t uid, int rank,
                                                   std::vector<int> job_ranks, Deadline deadline,
                                                   double timeout_s, std::string timeout_origin,
                                                   int deterministic) {
  std::shared_ptr<CommImpl> c(new CommImpl());
  c->job_ = job;
  c->prefix_ = std::move(prefix);
  c->uid_ = uid;
  c->rank_ = rank;
  c->job_ranks_ = std::move(job_ranks);
  auto s = [&]() -> Status {
    c->timeout_s_ = timeout_s;
    c->timeout_origin_ = std::move(timeout_origin);
    CHORUS_ASSIGN_OR_RETURN(int64_t spin, env_int_in("CHORUS_SPIN_US", 50, 0, 1000000));
    CHORUS_TRY(check_log_level_env());
    c->spin_us_ = static_cast<int>(spin);
    CHORUS_TRY(kernels::init_isa());  // CHORUS_CPU_ISA: a build this CPU lacks is an error here
    c->spin_now_us_ = c->spin_us_;
    CHORUS_ASSIGN_OR_RETURN(int64_t jitter, env_int("CHORUS_TEST_JITTER_US", 0));
    if (jitter < 0 || jitter > 1000000)
      return make_error(Code::kInvalidArgument,
                        "CHORUS_TEST_JITTER_US must be 0..1000000 microseconds, got {}", jitter);
    c->jitter_us_ = static_cast<int>(jitter);
    CHORUS_ASSIGN_OR_RETURN(int64_t map_fail, env_int_in("CHORUS_TEST_SHARED_MAP_FAIL", 0, 0, 1));
    c->shared_map_fail_ = map_fail == 1;
    CHORUS_ASSIGN_OR_RETURN(int64_t device_die,
                            env_int_in("CHORUS_TEST_DEVICE_DIE", -1, -1, CHORUS_MAX_RANKS - 1));
    c->device_die_ = static_cast<int>(device_die);
    CHORUS_ASSIGN_OR_RETURN(int64_t lag, env_int_in("CHORUS_TEST_REPLAY_LAG_MS", 0, 0, 10000));
    c->replay_lag_ms_ = static_cast<int>(lag);
    CHORUS_ASSIGN_OR_RETURN(int64_t linger,
                            env_int_in("CHORUS_TEST_HOST_PART_LINGER_MS", 0, 0, 10000));
    c->host_part_linger_ms_ = static_cast<int>(linger);
    CHORUS_ASSIGN_OR_RETURN(int64_t alive_lag,
                            env_int_in("CHORUS_TEST_ALIVE_CHECK_LAG_MS", 0, 0, 10000));
    c->alive_check_lag_ms_ = static_cast<int>(alive_lag);
    CHORUS_ASSIGN_OR_RETURN(int64_t timing, env_int_in("CHORUS_DEVICE_TIMING", 0, 0, 10000));
    c->device_timing_ = static_cast<int>(timing);
    CHORUS_ASSIGN_OR_RETURN(int64_t staged_max, env_int_in("CHORUS_STAGED_MAX_BYTES",
                                                           int64_t(1) << 30, 0, int64_t(1) << 50));
    c->device_ipc_.stage.max_bytes = static_cast<size_t>(staged_max);
    const std::string words = env_str("CHORUS_STAGE_WORDS", "host");
    if (words != "host" && words != "device")
      return make_error(Code::kInvalidArgument,
                        "CHORUS_STAGE_WORDS must be host or device, got '{}'", words);
    c->device_ipc_.stage.want_host_words = words == "host";
    const std::string ipc_words = env_str("CHORUS_IPC_WORDS", "host");
    if (ipc_words != "host" && ipc_words != "device")
      return make_error(Code::kInvalidArgument, "CHORUS_IPC_WORDS must be host or device, got '{}'",
                        ipc_words);
    c->device_ipc_.want_host_words = ipc_words == "host";
    c->send_seq_.assign(c->size(), 0);
    c->recv_seq_.assign(c->size(), 0);
    CHORUS_ASSIGN_OR_RETURN(auto transports, transport::Transports::from_env());
    CHORUS_ASSIGN_OR_RETURN(c->tuner_, TunerConfig::from_env());
    if (deterministic >= 0) c->tuner_.deterministic = deterministic == 1;
    return c->create_channels(transports, deadline);
  }();
  if (!s.is_ok()) {
    // Tell the others at once: they stop waiting for this rank and say why.
    job->publish_creation_failure(uid, s);
    return s;
  }
  job->add(c);
  job->learn_standby(c->job_ranks_);  // a grow's newcomers: their standby ports (failover.cc)
  auto t = start_thread(
      fmt::format("the progress thread of rank {}", rank), [p = c.get()] { p->progress_loop(); },
      [p = c.get()](const std::string& e) {
        p->fail(make_error(Code::kInternalError, "progress thread failed: {}", e));
        std::lock_guard<std::mutex> lock(p->mu_);
        p->thread_exited_ = true;
        p->cv_.notify_all();
      });
  if (!t.is_ok()) {
    job->publish_creation_failure(uid, t.status());
    return t.status();
  }
  c->thread_ = std::move(t.value());
  return c;
}

// The OS names of the NIC closest to this rank's GPU (hwloc), which its tcp links then listen
// on; none for a rank without a GPU (no topology is read then).
static std::vector<std::string> nics_near_gpu(
    int rank, const std::optional<kernels::cuda::GpuIdentity>& gpu) {
  if (!gpu) return {};
  auto machine = transport::read_machine();
  if (!machine.is_ok()) {
    log_warn("rank {}: no NIC chosen by GPU locality: {}", rank, machine.status().message());
    return {};
  }
  std::vector<std::string> names = transport::nic_names_near_gpu(*machine, gpu->bus_id);
  if (!names.empty())
    log_info("rank {}: GPU {} at {}: the closest NIC is {}", rank, gpu->uuid, gpu->bus_id,
             fmt::join(names, ","));
  return names;
}

// Every rank must open the same number of channels (compared through the store first), then
// each channel connects its links; any peer's failure or death meanwhile ends the wait at once.
Status CommImpl::create_channels(const transport::Transports& transports, Deadline deadline) {
  auto& store = job_->store();
  Job* job = job_.get();
  auto interrupt = [job, uid = uid_, members = job_ranks_] {
    return job->creation_news(uid, members);
  };
  // This rank's GPU, read once: exchanged with the settings, and it picks the tcp links' NIC.
  CHORUS_ASSIGN_OR_RETURN(std::optional<kernels::cuda::GpuIdentity> gpu,
                          kernels::cuda::current_gpu());
  CHORUS_TRY(agree_on_settings(gpu, deadline, interrupt));
  const std::vector<std::string> nics = nics_near_gpu(rank_, gpu);
  for (int k = 0; k < tuner_.nchannels; ++k) {
    auto ch = std::make_unique<Channel>();
    std::string prefix = k == 0 ? prefix_ : fmt::format("{}/ch{}", prefix_, k);
    CHORUS_ASSIGN_OR_RETURN(
        ch->links, transport::connect_links(store, prefix, uid_ + k, job_->secret(), rank_, size(),
                                            transports, deadline, interrupt, nics));
    ch->headers.resize(size());
    ch->pair_headers.resize(size());
    CHORUS_ASSIGN_OR_RETURN(ch->waiter, transport::Waiter::create(ch->links));
    channels_.push_back(std::move(ch));
  }
  nchannels_ = static_cast<int>(channels_.size());
  const std::vector<transport::PeerInfo>& peers = channels_[0]->links.peers;
  link_model_ = transports.model_for(peers);
  std::vector<std::string> host_ids;
  for (const transport::PeerInfo& p : peers) host_ids.push_back(p.host);
  hosts_ = HostLayout::from_hosts(host_ids);
  check_gpu_reach(gpus_);
  // Inside the first of the largest hosts: the same answer on every rank, as the tuner's must be.
  std::vector<transport::PeerInfo> local;
  for (const std::vector<int>& m : hosts_.members)
    if (static_cast<int>(m.size()) == hosts_.max_local()) {
      for (int r : m) local.push_back(peers[r]);
      break;
    }
  local_link_model_ = transports.model_for(local);
  for (int k = 1; k < nchannels(); ++k) {
    CHORUS_ASSIGN_OR_RETURN(channels_[k]->thread,
                            start_thread(fmt::format("channel {} of rank {}", k, rank_),
                                         [this, k] { channel_loop(k); }));
  }
  return Status::ok();
}

namespace {

// Where CUDA's MPS clients look for the control daemon's pipe (CUDA_MPS_PIPE_DIRECTORY, else
// /tmp/nvidia-mps), and whether the daemon's "control" pipe is there.
bool mps_daemon_found(std::string* dir) {
  const char* env = std::getenv("CUDA_MPS_PIPE_DIRECTORY");
  *dir = env && *env ? env : "/tmp/nvidia-mps";
  return access((*dir + "/control").c_str(), F_OK) == 0;
}

}  // namespace

// Two ranks on one GPU (the same UUID, on any host: namespaces of one machine share its GPUs)
// time-slice it; refused unless CHORUS_ALLOW_SHARED_GPU=1 (NCCL's NCCL_MULTI_RANK_GPU_ENABLE is
// the precedent). Every rank finds the same first pair, so every rank names the same two.
Status CommImpl::check_gpu_sharing(const std::vector<kernels::cuda::GpuIdentity>& gpus) {
  CHORUS_ASSIGN_OR_RETURN(int64_t allow, env_int_in("CHORUS_ALLOW_SHARED_GPU", 0, 0, 1));
  bool hinted = false;
  for (int a = 0; a < size(); ++a)
    for (int b = a + 1; b < size(); ++b) {
      const auto& g = gpus[a];
      if (g.uuid.empty() || g.uuid != gpus[b].uuid) continue;
      if (allow) {
        log_info("ranks {} and {} share GPU {} (CHORUS_ALLOW_SHARED_GPU=1)", a, b, g.uuid);
        // Without MPS the ranks' contexts take turns on the GPU by time slice: on an H100, 2-rank
        // DDP of the tutorial CNN ran at 10,900 images/s against 84,200 under MPS
        // (bench/RESULTS.md, 2026-11-27). Said once, by the lower rank of the first pair.
        std::string dir;
        if (!hinted && rank_ == a && !mps_daemon_found(&dir))
          log_warn(
              "ranks {} and {} share GPU {} and no MPS daemon was found (no {}/control): their "
              "kernels will take turns by time slice, several times slower than side by side; "
              "start one with `nvidia-cuda-mps-control -d` (or run the job with `chorus-run "
              "--mps`)",
              a, b, g.uuid, dir);
        hinted = true;
        continue;
      }
      return make_error(Code::kInvalidUsage,
                        "ranks {} and {} both use GPU {} (device {} at {} on rank {}, device {} "
                        "on rank {}; compute mode {}): one GPU per rank is the default. Give each "
                        "rank its own GPU (cudaSetDevice(LOCAL_RANK) before creating the "
                        "communicator), or set CHORUS_ALLOW_SHARED_GPU=1 to let ranks share one "
                        "(they then take turns on it)",
                        a, b, g.uuid, g.ordinal, g.bus_id, a, gpus[b].ordinal, b,
                        kernels::cuda::compute_mode_name(g.compute_mode));
    }
  return Status::ok();
}

void CommImpl::check_gpu_reach(const std::vector<kernels::cuda::GpuIdentity>& gpus) {
  auto reaches = [](const kernels::cuda::GpuIdentity& from, const std::string& bus) {
    const std::string list = "," + from.peers + ",";
    return list.find("," + bus + ",") != std::string::npos;
  };
  for (int a = 0; a < size(); ++a)
    for (int b = a + 1; b < size(); ++b) {
      const auto &ga = gpus[a], &gb = gpus[b];
      if (ga.uuid.empty() || gb.uuid.empty() || ga.uuid == gb.uuid) continue;
      if (hosts_.host_of[size_t(a)] != hosts_.host_of[size_t(b)]) continue;
      const int from = !reaches(ga, gb.bus_id) ? a : !reaches(gb, ga.bus_id) ? b : -1;
      if (from < 0) continue;
      const auto &g = gpus[size_t(from)], &other = from == a ? gb : ga;
      gpus_unreachable_ = fmt::format(
          "GPU {} at {} (rank {}) cannot reach the memory of GPU {} at {} (rank {}) peer to "
          "peer, or that GPU is not visible to it",
          g.uuid, g.bus_id, from, other.uuid, other.bus_id, from == a ? b : a);
      return;
    }
}

// Each rank publishes its settings and reads everyone's; on a mismatch, every rank fails
// naming itself and a rank that differs. The settings carry each rank's GPU (kernels/cuda/
// device.h), so that every rank also refuses two ranks on one GPU, naming both, unless
// CHORUS_ALLOW_SHARED_GPU=1.
Status CommImpl::agree_on_settings(const std::optional<kernels::cuda::GpuIdentity>& gpu,
                                   Deadline deadline, const std::function<Status()>& interrupt) {
  auto& store = job_->store();
  const int det = tuner_.deterministic ? 1 : 0;
  CHORUS_TRY(store.set(
      fmt::format("{}/nch/{}", prefix_, rank_),
      gpu ? fmt::format("{} {} {} {} {} {} {}", tuner_.nchannels, det, gpu->uuid, gpu->ordinal,
                        gpu->bus_id, gpu->compute_mode, gpu->peers.empty() ? "-" : gpu->peers)
          : fmt::format("{} {} - -1 - 0 -", tuner_.nchannels, det)));
  // Marks in the store that this rank has stopped reading (see the end).
  auto done = [&] { (void)store.set(fmt::format("{}/nch_done/{}", prefix_, rank_), "1"); };
  Status agreed = Status::ok();
  std::vector<kernels::cuda::GpuIdentity> gpus(size());
  for (int r = 0; r < size() && agreed.is_ok(); ++r) {
    auto v = store.get(fmt::format("{}/nch/{}", prefix_, r), deadline, interrupt);
    if (!v.is_ok()) {  // news of another rank's failure, or of the store's
      done();
      return v.status();
    }
    int their_nch = 0, their_det = 0;
    char uuid[65] = "-", bus[33] = "-", peers[1025] = "-";
    kernels::cuda::GpuIdentity& g = gpus[r];
    sscanf(v.value().c_str(), "%d %d %64s %d %32s %d %1024s", &their_nch, &their_det, uuid,
           &g.ordinal, bus, &g.compute_mode, peers);
    if (std::string(uuid) != "-") g.uuid = uuid, g.bus_id = bus;
    if (std::string(peers) != "-") g.peers = peers;
    if (their_nch != tuner_.nchannels)
      agreed = make_error(
          Code::kInvalidUsage,
          "CHORUS_NCHANNELS is {} on rank {} but {} on rank {}: set it the same everywhere",
          tuner_.nchannels, rank_, their_nch, r);
    else if (their_det != det)
      agreed = make_error(Code::kInvalidUsage,
                          "the deterministic mode is {} on rank {} but {} on rank {} "
                          "(CHORUS_DETERMINISTIC or the communicator's config): set it the same "
                          "everywhere",
                          det ? "on" : "off", rank_, their_det ? "on" : "off", r);
  }
  if (agreed.is_ok()) agreed = check_gpu_sharing(gpus);
  if (agreed.is_ok()) {
    gpus_ = std::move(gpus);  // check_gpu_reach reads them once the hosts are known
    return agreed;
  }
  // A mismatch: every rank that gets here finds one. The one whose process hosts the store
  // waits (5 s at most) until the others are done reading: its failure may end the process and
  // close the store under a rank still reading, which would then report a closed store
  // instead of the mismatch.
  done();
  const Deadline linger = Deadline::after_seconds(std::min(5.0, deadline.remaining()));
  for (int r = 0; r < size() && job_->hosts_store(); ++r)
    if (r != rank_ && !store.get(fmt::format("{}/nch_done/{}", prefix_, r), linger).is_ok()) break;
  return agreed;
}

CommImpl::~CommImpl() {
  (void)destroy();
}

int CommImpl::job_rank_of(int pid, const std::string& host) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (channels_.empty()) return -1;
  const auto& peers = channels_[0]->links.peers;
  for (size_t r = 0; r < peers.size(); ++r)
    if (peers[r].pid == pid && peers[r].host == host) return job_ranks_[r];
  return -1;
}

std::string CommImpl::ranks_sharing_a_process() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (channels_.empty()) return {};
  const auto& peers = channels_[0]->links.peers;
  for (size_t a = 0; a < peers.size(); ++a)
    for (size_t b = a + 1; b < peers.size(); ++b)
      if (peers[a].pid == peers[b].pid && peers[a].host == peers[b].host)
        return fmt::format("ranks {} and {} are threads of one process (pid {})", a, b,
                           peers[a].pid);
  return {};
}

// Progress and channel threads run next to their rank: when the launcher (or taskset, numactl)
// bound the process, on the CPUs of its NUMA node(s), not only its own core (transport/machine.h).
static void bind_near_rank(int rank, const char* what) {
  auto r = transport::bind_thread_near_process();
  if (!r.is_ok())
    log_warn("rank {}: {}: not bound next to the rank: {}", rank, what, r.status().message());
  else if (!r->empty())
    log_info("rank {}: {}: {}", rank, what, *r);
}

void CommImpl::channel_loop(int k) {
  bind_near_rank(rank_, "channel thread");
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

Status CommImpl::run_channels(int n, FunctionRef<Status(int)> fn) {
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

uint64_t CommImpl::next_p2p_seq(int peer, bool send) {
  std::lock_guard<std::mutex> lock(seq_mu_);
  return ++(send ? send_seq_ : recv_seq_)[peer];
}

Status CommImpl::error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

Result<std::shared_ptr<Request>> CommImpl::submit(OpDesc desc, OpFn fn) {
  auto work = std::make_shared<Request>(desc);
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_)
    return make_error(Code::kInvalidUsage, "{}: the communicator is being destroyed",
                      describe(desc));
  if (failed_.load())
    return Status(error_.code(), fmt::format("{}: communicator is broken by an earlier error: {}",
                                             describe(desc), error_.message()));
  queue_.emplace_back(work, std::move(fn));
  gate_set(kGateQueued, true);
  cv_.notify_all();
  return work;
}

void CommImpl::progress_loop() {
  bind_near_rank(rank_, "progress thread");
  while (true) {
    std::shared_ptr<Request> work;
    OpFn fn;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return (stopping_ || !queue_.empty()) && !running(); });
      if (queue_.empty()) {
        thread_exited_ = true;
        cv_.notify_all();
        return;
      }
      work = queue_.front().first;
      fn = std::move(queue_.front().second);
      queue_.pop_front();
      // kGateQueued (or kGateStopping) is set and mu_ held: no inline call can claim the gate.
      gate_set(kGateRunning, true);
      if (queue_.empty()) gate_set(kGateQueued, false);
      state_.begin(work->desc(), now_seconds());
    }
    // `fn` goes at the end of this turn, after fail() below: a staged device call's stream waits
    // for that (device_stage.h).
    Status s;
    if (failed_.load()) {
      s = Status(error().code(), fmt::format("{}: communicator is broken by an earlier error: {}",
                                             describe(work->desc()), error().message()));
    } else {
      OpCtx ctx(*this, work->desc());
      s = fn(ctx);
      if (s.is_ok()) s = ctx.drain();
      if (!s.is_ok()) fail(s);
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      state_.end(coarse_now_seconds());
      gate_set(kGateRunning, false);
    }
    work->finish(s);
    cv_.notify_all();
  }
}

bool CommImpl::try_run_inline(const OpDesc& desc, FunctionRef<Status(OpCtx&)> fn, Status* result) {
  uint32_t idle = 0;
  if (!gate_.compare_exchange_strong(idle, kGateRunning, std::memory_order_acquire,
                                     std::memory_order_relaxed)) {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) {
      *result = make_error(Code::kInvalidUsage, "{}: the communicator is being destroyed",
                           describe(desc));
      return true;
    }
    if (failed_.load()) {
      *result =
          Status(error_.code(), fmt::format("{}: communicator is broken by an earlier error: {}",
                                            describe(desc), error_.message()));
      return true;
    }
    if (!queue_.empty()) return false;
    // Only a waiter's bit set, or an operation that has just ended: claim it unless one runs.
    uint32_t v = gate_.load(std::memory_order_relaxed);
    do {
      if (v & kGateRunning) return false;
    } while (!gate_.compare_exchange_weak(v, v | kGateRunning, std::memory_order_acquire,
                                          std::memory_order_relaxed));
  }
  state_.begin(desc, 0);  // since: set when the operation first waits long (OpCtx::wait_slow)
  {
    OpCtx ctx(*this, desc);
    *result = fn(ctx);
    if (result->is_ok()) *result = ctx.drain();
  }
  if (!result->is_ok()) fail(*result);
  state_.end(coarse_now_seconds());
  // Wake the others only when work queued up meanwhile, or someone waits for this operation, or
  // destroy has begun, or the communicator failed: a notify per call would cost a lock and a
  // futex call on the fast path. Then the gate opens under the lock, so that destroy, which
  // waits there, cannot go on (and free the communicator) before this thread is done with it.
  uint32_t only_running = kGateRunning;
  if (!gate_.compare_exchange_strong(only_running, 0, std::memory_order_acq_rel,
                                     std::memory_order_relaxed)) {
    std::lock_guard<std::mutex> lock(mu_);
    gate_set(kGateRunning, false);
    cv_.notify_all();
  }
  return true;
}

void CommImpl::mark_waiting_since() {
  state_.waiting_since(now_seconds());  // the running operation's own thread: the writer
}

void CommImpl::wake() {
  std::lock_guard<std::mutex> lock(mu_);
  wake_locked();
}

void CommImpl::wake_locked() {
  for (auto& ch : channels_) {
    if (ch->waiter) ch->waiter->wake();
  }
}

// First error wins; it is told to every other rank so they fail at once too.
void CommImpl::fail(const Status& s) {
  bool first = false;
  std::shared_ptr<Job> job;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!failed_.load()) {
      error_ = s;
      failed_ = true;
      gate_set(kGateFailed, true);
      first = true;
    }
    job = job_;  // destroy may reset job_ meanwhile
    wake_locked();
  }
  if (first) {
    log_error("{}", s.message());
    release_device_waits(device_ipc_);
    if (s.code() != Code::kRemoteError && job && job->watch())
      job->broadcast_error(uid_, fmt::format("{}|{}", static_cast<int>(s.code()), s.message()));
  }
}

void CommImpl::on_peer_dead(int job_rank, const std::string& text) {
  auto it = std::find(job_ranks_.begin(), job_ranks_.end(), job_rank);
  if (it == job_ranks_.end()) return;
  int r = static_cast<int>(it - job_ranks_.begin());
  std::string msg = r == job_rank ? text : fmt::format("rank {} of this communicator: {}", r, text);
  std::string cur;
  if (OpState::Snapshot st = state_.read(); st.busy) cur = describe(st.op);
  fail(Status(Code::kRemoteError,
              cur.empty() ? msg : fmt::format("{} on rank {} failed: {}", cur, rank_, msg)));
}

void CommImpl::on_remote_error(const std::string& text) {
  auto bar = text.find('|');
  Code code = Code::kRemoteError;
  std::string msg = text;
  if (bar != std::string::npos) {
    code = static_cast<Code>(std::atoi(text.substr(0, bar).c_str()));
    msg = text.substr(bar + 1);
  }
  if (code != Code::kMismatch && code != Code::kRevoked) code = Code::kRemoteError;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (failed_.load()) return;
    error_ = Status(code, msg);
    failed_ = true;
    gate_set(kGateFailed, true);
    wake_locked();
  }
  release_device_waits(device_ipc_);
}

void CommImpl::note_waiting(std::string what) {
  std::lock_guard<std::mutex> lock(mu_);
  waiting_note_ = std::move(what);
}

std::string CommImpl::state_text() const {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string note = waiting_note_.empty() ? "" : ", " + waiting_note_;
  const OpState::Snapshot st = state_.read();
  if (st.busy && st.since > 0)
    return fmt::format("in {} for {:.1f} s{}", describe(st.op), now_seconds() - st.since, note);
  if (st.busy) return fmt::format("in {}{}", describe(st.op), note);
  if (st.have_last)
    return fmt::format("idle, last finished {} {:.1f} s ago", describe(st.op),
                       std::max(0.0, now_seconds() - st.done_at));
  return "idle, no operation yet";
}

std::string CommImpl::timeout_report(const OpDesc& d, const std::string& waiting_for) {
  // A rank arrived if it is in this call, or already left it (its own deadline or an error ended
  // it while our query was on its way).
  std::string mine = "in " + describe(d);
  std::string left = "idle, last finished " + describe(d) + " ";
  auto arrived = [&](const std::string& t) {
    return t.rfind(mine, 0) == 0 || t.rfind(left, 0) == 0;
  };
  std::string report, absent;
  std::shared_ptr<Job> job;
  {
    std::lock_guard<std::mutex> lock(mu_);
    job = job_;
  }
  if (job && job->watch()) {
    // Each rank is dead (its process or connection gone), in this call, or late: alive but
    // elsewhere, with what it is doing or last finished and how long ago.
    auto answers = job->watch()->query(uid_, job->size() - 1, 2.0);
    for (int r = 0; r < size(); ++r) {
      if (r == rank_) continue;
      auto it = answers.find(job_ranks_[r]);
      std::string text = it == answers.end() ? "no answer within 2 s" : it->second;
      if (std::string dead = job->dead_text(job_ranks_[r]); !dead.empty())
        text = "dead: " + dead;
      else if (!arrived(text))
        text = "late: " + text;
      report += fmt::format("; rank {}: {}", r, text);
      if (arrived(text)) continue;
      if (!absent.empty()) absent += ',';
      absent += std::to_string(r);
    }
  }
  return fmt::format("{} on rank {} timed out after {:g} s{} ({}); ranks that never arrived: {}{}",
                     describe(d), rank_, timeout_s_, waiting_for, timeout_origin_,
                     absent.empty() ? "none" : absent, report);
}

void CommImpl::abort(const std::string& why) {
  fail(Status(Code::kAborted, why));
}

// Fails this rank's current and later operations with kRevoked, and tells every peer twice over:
// through the watch channel (fail() broadcasts) and over each link (Link::signal_revoke: shm, tcp,
// ib), which needs no store, so the news arrives also when the process that hosted it is
// gone. The links are told once no operation runs on them: a failed operation leaves within a
// sleep slice (100 ms); one that has not left after 2 s leaves the news to the watch channel.
void CommImpl::revoke() {
  fail(Status(Code::kRevoked,
              fmt::format("rank {} revoked the communicator (chorusCommRevoke)", rank_)));
  std::unique_lock<std::mutex> lock(mu_);
  add_drain_waiter(+1);  // the inline path notifies only when someone waits
  const bool idle = cv_.wait_for(lock, std::chrono::seconds(2), [&] { return !running(); });
  add_drain_waiter(-1);
  if (!idle) {
    log_warn(
        "rank {}: revoke: an operation still runs after 2 s; the peers hear of the revoke "
        "through the bootstrap store only",
        rank_);
    return;
  }
  for (auto& ch : channels_)
    for (auto& l : ch->links.links)
      if (l) l->signal_revoke();
}

// Waits until no operation runs (inline on a caller's thread or on the progress thread).
// Past the deadline the communicator is failed, which ends any operation within a sleep slice.
Status CommImpl::wait_idle(std::unique_lock<std::mutex>& lock, Deadline deadline) {
  add_drain_waiter(+1);
  bool drained =
      cv_.wait_for(lock, std::chrono::duration<double>(failed_.load() ? 0.0 : deadline.remaining()),
                   [&] { return queue_.empty() && !running(); });
  if (!drained && !failed_.load()) {
    lock.unlock();
    abort(
        fmt::format("rank {}: communicator destroyed with operations still pending after {:.0f} s",
                    rank_, timeout_s_));
    lock.lock();
  }
  // A failed operation ends within a sleep slice (100 ms) of seeing the failure.
  bool idle = cv_.wait_for(lock, std::chrono::duration<double>(std::max(deadline.remaining(), 1.0)),
                           [&] { return !running(); });
  add_drain_waiter(-1);
  if (!idle)
    return make_error(
        Code::kTimeout,
        "rank {}: destroy: an operation still runs {:.0f} s after the communicator failed", rank_,
        timeout_s_);
  return Status::ok();
}

// Joins the progress and channel threads, each within the deadline.
Status CommImpl::join_threads(Deadline deadline) {
  if (thread_.joinable()) {
    if (thread_.get_id() == std::this_thread::get_id()) {
      thread_.detach();  // destroy called from an operation's own callback: it exits on return
    } else {
      std::unique_lock<std::mutex> lock(mu_);
      bool exited =
          cv_.wait_for(lock, std::chrono::duration<double>(std::max(deadline.remaining(), 1.0)),
                       [&] { return thread_exited_; });
      lock.unlock();
      if (!exited)
        return make_error(Code::kTimeout,
                          "rank {}: destroy: the progress thread did not stop within {:.0f} s",
                          rank_, timeout_s_);
      thread_.join();
    }
  }
  for (auto& ch : channels_) {
    {
      std::lock_guard<std::mutex> lock(ch->mu);
      ch->stop = true;
    }
    ch->cv.notify_all();
    if (ch->thread.joinable()) ch->thread.join();  // idle: no operation runs (wait_idle)
  }
  return Status::ok();
}

Status CommImpl::destroy() {
  auto deadline = Deadline::after_seconds(timeout_s_);
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (destroyed_ || stopping_) {
      // Done, or another thread is at it: wait for that one (bounded) and return.
      cv_.wait_for(lock, std::chrono::duration<double>(deadline.remaining()),
                   [&] { return destroyed_; });
      return Status::ok();
    }
    Status idle = wait_idle(lock, deadline);
    stopping_ = true;
    gate_set(kGateStopping, true);
    cv_.notify_all();
    if (!idle.is_ok()) {
      log_error("{}", idle.message());
      return idle;  // the running operation keeps what it uses; nothing is freed under it
    }
  }
  Status joined = join_threads(deadline);
  if (!joined.is_ok()) {
    log_error("{}", joined.message());
    return joined;
  }
  close_held_back(device_ipc_);  // no call runs any more: nothing later would close them
  vmm_close(device_ipc_);        // the registry's retains end
  // Graphs that outlive the communicator: a replay of theirs would wait for ever on its stream,
  // and a free of page-locked memory may wait for the device, so none is freed then.
  const bool graphs_live = graph_warn_held(rank(), {device_ipc_.graph.slots.get(),
                                                    device_ipc_.stage.graph_slots.get()}) > 0;
  graph_close(device_ipc_.graph);
  stop_keeper(device_ipc_.keeper);
  stage_graph_close(device_ipc_.stage, graphs_live);  // the replays' thread and communicator end
  // A free may wait for the whole device, so not while graphs live (their replays may wait).
  if (!graphs_live) {
    close_peer_mappings(device_ipc_, deadline.remaining(), rank());
    bounce_close(device_ipc_, deadline.remaining(), rank());
  }
  if (device_ipc_.timing) device_timing_report(*device_ipc_.timing, rank(), timeout_s_);
  std::vector<std::unique_ptr<Channel>> channels;
  std::shared_ptr<Job> job;
  std::deque<std::pair<std::shared_ptr<Request>, OpFn>> queue;
  {
    std::lock_guard<std::mutex> lock(mu_);
    channels.swap(channels_);  // under the lock: news from the watch thread walks channels_
    job.swap(job_);
    queue.swap(queue_);
    gate_set(kGateQueued, false);
  }
  for (auto& q : queue)
    q.first->finish(
        make_error(Code::kAborted, "{}: communicator destroyed", describe(q.first->desc())));
  queue.clear();  // a staged device call's host part signals its stream as it goes
  // (destroy stays bounded by the timeout)
  stage_close(device_ipc_.stage, deadline.remaining(), graphs_live);
  if (job) {
    job->remove(this);
    job->goodbye_if_unused();  // the job's last communicator: said here, not at its teardown
  }
  channels.clear();
  job.reset();
  std::lock_guard<std::mutex> lock(mu_);
  destroyed_ = true;
  cv_.notify_all();
  return Status::ok();
}

// A derived communicator's name: this one's plus `suffix`, or, once that grows long (names end up
// in /dev/shm file names, at most 255 bytes), this one's uid plus `suffix`: after any number of
// splits, shrinks and grows it stays short, and the same on every rank.
std::string CommImpl::child_prefix(const std::string& suffix) const {
  if (prefix_.size() + suffix.size() <= 48) return prefix_ + suffix;
  return fmt::format("h{:016x}{}", uid_, suffix);
}

Result<std::shared_ptr<Job>> CommImpl::job_unless_stopping(const char* what) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_)
    return make_error(Code::kInvalidUsage, "{}{}the communicator is being destroyed", what,
                      *what ? ": " : "");
  return job_;
}

Result<std::shared_ptr<CommImpl>> CommImpl::split(int color, int key) {
  CHORUS_ASSIGN_OR_RETURN(std::shared_ptr<Job> job, job_unless_stopping("split"));
  uint64_t n = ++split_count_;
  auto deadline = Deadline::after_seconds(timeout_s_);
  auto& store = job->store();
  std::string base = fmt::format("{}/split{}", prefix_, n);
  CHORUS_TRY(store.set(fmt::format("{}/{}", base, rank_), fmt::format("{} {}", color, key)));
  std::vector<std::pair<std::pair<int, int>, int>> members;  // ((key, old rank), old rank)
  for (int r = 0; r < size(); ++r) {
    CHORUS_ASSIGN_OR_RETURN(std::string v,
                            store.get(fmt::format("{}/{}", base, r), deadline, [this] {
                              return failed_.load() ? error().wrap("split") : Status::ok();
                            }));
    int c = 0, k = 0;
    sscanf(v.c_str(), "%d %d", &c, &k);
    if (c == color && color >= 0) members.push_back({{k, r}, r});
  }
  if (color < 0) return std::shared_ptr<CommImpl>();
  std::sort(members.begin(), members.end());
  std::vector<int> job_ranks;
  int new_rank = -1;
  for (auto& m : members) {
    if (m.second == rank_) new_rank = static_cast<int>(job_ranks.size());
    job_ranks.push_back(job_ranks_[m.second]);
  }
  std::string prefix = child_prefix(fmt::format(".s{}c{}", n, color));
  uint64_t uid = transport::hash64(prefix.data(), prefix.size(), uid_);
  return CommImpl::create(job, prefix, uid, new_rank, job_ranks, deadline, timeout_s_,
                          timeout_origin_, tuner_.deterministic ? 1 : 0);
}

std::pair<std::string, uint64_t> CommImpl::pair_name(int peer) const {
  std::string prefix =
      child_prefix(fmt::format(".p{}_{}", std::min(rank_, peer), std::max(rank_, peer)));
  const uint64_t uid = transport::hash64(prefix.data(), prefix.size(), uid_);
  return {std::move(prefix), uid};
}

Result<std::shared_ptr<CommImpl>> CommImpl::pair(int peer) {
  CHORUS_ASSIGN_OR_RETURN(std::shared_ptr<Job> job, job_unless_stopping("pair"));
  auto [prefix, uid] = pair_name(peer);
  const int lo = std::min(rank_, peer), hi = std::max(rank_, peer);
  return CommImpl::create(job, prefix, uid, rank_ == lo ? 0 : 1, {job_ranks_[lo], job_ranks_[hi]},
                          Deadline::after_seconds(timeout_s_), timeout_s_, timeout_origin_,
                          tuner_.deterministic ? 1 : 0);
}

void CommImpl::pair_failed(int peer, const Status& why) {
  std::shared_ptr<Job> job;
  {
    std::lock_guard<std::mutex> lock(mu_);
    job = job_;
  }
  if (job) job->stop_creation(pair_name(peer).second, why);
}

}  // namespace chorus
