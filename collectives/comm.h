// CommImpl: a communicator -- its ranks, its links, its queue of operations and the progress
// thread that runs them in call order.
//
// Threading: any thread may submit operations, wait on Request, abort or destroy. One progress
// thread per communicator drives the links; operations never run concurrently. A failure
// (dead peer, mismatch, timeout, abort) is sticky: the running operation and every later one
// fail with the first error, as NCCL's async error does.
//
// Teardown: destroy() is bounded by the timeout and safe from any thread, also while another
// thread is inside an operation (it fails that operation when it does not end in time, waits
// for it, then joins the threads). It releases the links, threads and buffers; the CommImpl object
// itself stays valid, so a late call on it is answered with an error instead of a crash.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "collectives/device_ops.h"
#include "collectives/hosts.h"
#include "collectives/op.h"
#include "collectives/op_state.h"
#include "collectives/tuner.h"
#include "common/clock.h"
#include "common/function_ref.h"
#include "kernels/cuda/gpu_identity.h"
#include "transport/connect.h"
#include "transport/waiter.h"

namespace chorus {

class Job;
struct GrowId;
class OpCtx;

// Staging memory for links without direct slot access (tcp): one input buffer and a few
// output buffers, owned by the communicator so that no operation allocates on its path.
struct StagingBuffers {
  static constexpr int kOut = 4;
  static constexpr size_t kBytes = 256 << 10;
  std::vector<char> in;
  std::vector<char> out[kOut];
  std::vector<char> eager;         // header + data of an eager message over tcp
  std::vector<char> scratch;       // a reduced piece on its way to user memory by streaming stores
  std::vector<char> aside;         // the input of an all-to-all whose buffers overlap, copied aside
  std::vector<char> multi;         // staged pieces per peer of a multi-peer fold (multi_exchange.h)
  std::vector<int> peers;          // every other rank, in order (ordered.cc)
  std::vector<const char*> parts;  // one fold's inputs (ordered.cc)
};

// One submitted operation: the state behind a chorusRequest_t (which the public C++ layer wraps
// as chorus::Work, include/chorus/chorus.hpp).
class Request {
 public:
  explicit Request(OpDesc desc) : desc_(desc) {}
  // true when finished within `seconds` (< 0: no limit besides the operation's own deadline).
  bool wait(double seconds);
  bool test() const;
  Status status() const;
  void finish(Status s);
  const OpDesc& desc() const { return desc_; }

 private:
  OpDesc desc_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  Status status_;
};

using OpFn = std::function<Status(OpCtx&)>;

// A channel: one lane of a communicator with links of its own, the waiter its thread sleeps
// on, staging memory and header scratch. Channel 0 always
// exists; with CHORUS_NCHANNELS=n, large all-reduce, reduce and broadcast calls are cut into n
// parts that run at once, part k on channel k, channels >= 1 on threads of their own.
struct Channel {
  transport::LinkSet links;
  std::unique_ptr<transport::Waiter> waiter;
  StagingBuffers staging;
  std::vector<OpHeader> headers;       // received, one per peer
  std::vector<OpHeader> pair_headers;  // sent, one per peer, when the header differs by peer
  // The worker of a channel >= 1: one job at a time.
  std::thread thread;
  std::mutex mu;
  std::condition_variable cv;
  FunctionRef<Status(int)>* job = nullptr;
  bool stop = false;
  bool done = false;
  Status result;
};

// The communicator itself: the state behind a chorusComm_t (which the public C++ layer wraps as
// chorus::Communicator). Ranks, channels and their links, the progress threads, the tuner.
class CommImpl : public std::enable_shared_from_this<CommImpl> {
 public:
  // Collective over `job_ranks` (job rank of each comm rank). prefix/uid identify the comm.
  // Every wait of the communicator lasts at most timeout_s seconds (> 0); timeout_origin names
  // where that limit came from in messages ("CHORUS_TIMEOUT", "the communicator's config").
  // deterministic: 0 or 1 sets the deterministic mode, -1 leaves it to CHORUS_DETERMINISTIC.
  static Result<std::shared_ptr<CommImpl>> create(std::shared_ptr<Job> job, std::string prefix,
                                                  uint64_t uid, int rank,
                                                  std::vector<int> job_ranks, Deadline deadline,
                                                  double timeout_s, std::string timeout_origin,
                                                  int deterministic = -1);
  ~CommImpl();

  int rank() const { return rank_; }
  int size() const { return static_cast<int>(job_ranks_.size()); }
  uint64_t uid() const { return uid_; }
  double timeout_seconds() const { return timeout_s_; }
  const std::string& timeout_origin() const { return timeout_origin_; }
  bool deterministic() const { return tuner_.deterministic; }
  // The cost model of the slowest link any pair of ranks uses: the same answer on every rank.
  const transport::LinkModel& link_model() const { return link_model_; }
  // Which ranks share a host, the same on every rank.
  const HostLayout& hosts() const { return hosts_; }
  // Why CUDA IPC cannot join this communicator's ranks of one host -- two of their GPUs that
  // cannot reach each other's memory peer to peer, named -- or "" (the same on every rank:
  // decided from the GPU identities exchanged at creation).
  const std::string& gpus_unreachable() const { return gpus_unreachable_; }
  // The tuner's answer, remembered for the last (kind, size): training repeats its calls.
  // Any thread may call it; a repeat reads the cache without a lock (tune_cache_).
  Tuned tune(OpKind kind, size_t bytes) {
    if (std::optional<Tuned> t = tune_cache_.lookup(kind, bytes)) return *t;
    return tune_slow(kind, bytes);
  }
  // Ring against direct for large all-reduces over shm (tune_measure.cc): whether a call of
  // `bytes` is the first that needs the measurement (then it is under way: no other call starts
  // one), which algorithm the next calls run while it lasts, and its outcome (kNone: failed;
  // direct stays).
  bool begin_measurement(size_t bytes);
  void set_trial_algo(Algo a);
  void end_measurement(Algo chosen);
  // CHORUS_TEST_SLOW_ALGO: an all-reduce that runs this algorithm takes 250 ms longer (more than
  // the ring and direct differ by under TSan).
  bool test_slow(Algo a) const { return a == tuner_.test_slow; }
  void mark_waiting_since();  // first long wait of the current operation
  int nchannels() const { return nchannels_; }
  // The job rank of the member whose process is `pid` on host `host`, or -1.
  int job_rank_of(int pid, const std::string& host) const;
  // "ranks A and B are threads of one process (pid P)" when two of this communicator's ranks
  // are (chorusCommInitRank on several threads, chorusCommInitAll), else "".
  std::string ranks_sharing_a_process() const;
  // Runs fn(k) for k in [0, n): k = 0 on this thread, the others on their channels' threads;
  // waits for all and returns the first error (which also fails the communicator, so the
  // other parts stop at once).
  Status run_channels(int n, FunctionRef<Status(int)> fn);

  // Queues an operation; the Request reports its end. Fails at once on a broken communicator.
  Result<std::shared_ptr<Request>> submit(OpDesc desc, OpFn fn);
  // Runs a blocking call on the caller's thread when nothing is queued or running, skipping
  // the hand-off to the progress thread (two thread wake-ups). false: busy, submit instead.
  bool try_run_inline(const OpDesc& desc, FunctionRef<Status(OpCtx&)> fn, Status* result);
  // Sequence numbers: collectives share one counter, send/recv count per peer and direction.
  uint64_t next_collective_seq() { return ++coll_seq_; }
  uint64_t next_p2p_seq(int peer, bool send);

  // The job, unless destroy has begun ("{what}: the communicator is being destroyed").
  Result<std::shared_ptr<Job>> job_unless_stopping(const char* what);
  Result<std::shared_ptr<CommImpl>> split(int color, int key);
  // A communicator of this rank and `peer` alone (the lower one its rank 0), for calls only the
  // two make (staged sends and receives captured into CUDA graphs). Both ranks make it, under
  // the same name each time: once per pair. pair_failed: this rank will not make it (or stops),
  // and the peer, which may be making its side, stops too, naming why.
  Result<std::shared_ptr<CommImpl>> pair(int peer);
  void pair_failed(int peer, const Status& why);
  // The name of a communicator derived from this one (split, shrink, grow): short at any depth.
  std::string child_prefix(const std::string& suffix) const;
  std::pair<std::string, uint64_t> pair_name(int peer) const;  // prefix and uid
  // chorusCommShrink (shrink.cc): a communicator of every rank but `exclude` (this rank's
  // numbering); with `agree`, the survivors find and agree on the failed ranks themselves.
  // Works on a failed or revoked communicator. timeout_s <= 0 and deterministic < 0: this
  // communicator's.
  Result<std::shared_ptr<CommImpl>> shrink(const std::vector<int>& exclude, bool agree,
                                           double timeout_s, int deterministic);
  // chorusCommGetUniqueId and chorusCommGrow (grow.cc): an id for the newcomers (one member,
  // the coordinator, asks), and a larger communicator of this one's ranks, which keep their
  // numbers, and the newcomers'. id: the coordinator's, NULL on the other members.
  Status grow_id(GrowId* out);
  Result<std::shared_ptr<CommImpl>> grow(int nranks, const GrowId* id, double timeout_s,
                                         int deterministic);
  // A newcomer's side of chorusCommGrow: joins the running job and the new communicator.
  static Result<std::shared_ptr<CommImpl>> join_grow(const GrowId& id, int nranks, int rank,
                                                     double timeout_s, int deterministic);
  void abort(const std::string& why);
  // The all-reduce of chorusMemAlloc buffers (shared_allreduce.cc): on until a rank cannot map
  // a peer's buffer (every rank learns it at once, and turns it off for this communicator).
  bool shared_buffers() const { return shared_buffers_.load(std::memory_order_relaxed); }
  void disable_shared_buffers() { shared_buffers_.store(false, std::memory_order_relaxed); }
  bool shared_map_fail_for_test() const { return shared_map_fail_; }  // CHORUS_TEST_SHARED_MAP_FAIL
  // The state of device collectives (device_ops.h), filled at the first device call.
  DeviceIpc& device_ipc() { return device_ipc_; }
  // CHORUS_TEST_DEVICE_DIE: the rank of this communicator that kills itself (SIGKILL) right
  // after the host exchange of its second device collective (200 ms after, so that the peers'
  // exchange is over too), before it signals (the first has mapped the peers' memory, as in a
  // running job); on the staged path (device_staged.cc), 200 ms into its second call's host part
  // on the progress thread, while its peers' wait for it; -1: none.
  int device_die_for_test() const { return device_die_; }
  // CHORUS_TEST_REPLAY_LAG_MS: the thread that runs the host parts of replays of staged calls
  // captured into CUDA graphs (device_staged_graph.cc) sleeps this long after taking each one
  // from its queue, before using it; 0: never.
  int replay_lag_ms_for_test() const { return replay_lag_ms_; }
  // CHORUS_TEST_HOST_PART_LINGER_MS: a failed host part of such a replay stays this long before
  // it leaves, then writes its page-locked memory (as a receive that ends late would); 0: never.
  int host_part_linger_ms_for_test() const { return host_part_linger_ms_; }
  // CHORUS_DEVICE_TIMING: how many of this communicator's first device calls (CUDA IPC path) have
  // their GPU stages timed and printed at destroy (device_timing.h); 0: none.
  int device_timing_calls() const { return device_timing_; }
  // CHORUS_TEST_JITTER_US: how many waits of this communicator's operations drew a jitter so far
  // (OpCtx::jitter; slept or not).
  uint64_t jitter_points_for_test() const { return jitter_points_.load(); }
  // chorusCommRevoke: every pending and later operation fails with kRevoked, here and on every
  // peer; the communicator stays valid for destroy (and, later, shrink). Any thread.
  void revoke();
  // Waits for queued work (bounded by the timeout), stops the progress thread, closes links.
  // Safe from any thread and more than once; bounded by the timeout.
  Status destroy();
  Status error() const;

  // Called by the Job's watch thread.
  void on_peer_dead(int job_rank, const std::string& text);
  void on_remote_error(const std::string& text);
  std::string state_text() const;  // for "what are you doing?" queries
  // What the running operation waits for besides its peers, added to state_text (so that a
  // peer's timeout names it); empty: nothing. The staged device path's wait for its stream.
  void note_waiting(std::string what);

 private:
  friend class OpCtx;
  CommImpl() = default;
  void progress_loop();
  void channel_loop(int k);
  Status create_channels(const transport::Transports& transports, Deadline deadline);
  // Every rank must open the same number of channels and share the deterministic mode.
  Status check_gpu_sharing(const std::vector<kernels::cuda::GpuIdentity>& gpus);
  // gpus_unreachable_ from every rank's identity.
  void check_gpu_reach(const std::vector<kernels::cuda::GpuIdentity>& gpus);
  Status agree_on_settings(const std::optional<kernels::cuda::GpuIdentity>& gpu, Deadline deadline,
                           const std::function<Status()>& interrupt);
  Status wait_idle(std::unique_lock<std::mutex>& lock, Deadline deadline);
  // `round` names the agreement's store keys ("3", or "3f1" on the store's first successor).
  Result<std::set<int>> agree_on_failed(const std::set<int>& mine, const std::string& round,
                                        Deadline deadline);
  // One try of shrink: agree (when asked), then create; `tag` names the store's generation.
  Result<std::shared_ptr<CommImpl>> shrink_once(std::set<int> excluded, bool agree, uint64_t n,
                                                const std::string& tag, double timeout_s,
                                                const std::string& origin, int deterministic,
                                                Deadline deadline);
  Status join_threads(Deadline deadline);
  void fail(const Status& s);
  void wake();
  void wake_locked();
  std::string timeout_report(const OpDesc& d, const std::string& waiting_for);

  std::shared_ptr<Job> job_;
  std::string prefix_;
  uint64_t uid_ = 0;
  int rank_ = 0;
  std::vector<int> job_ranks_;
  std::vector<std::unique_ptr<Channel>> channels_;  // cleared by destroy, under mu_
  int nchannels_ = 1;
  double timeout_s_ = 300;
  std::string timeout_origin_ = "CHORUS_TIMEOUT";
  std::string waiting_note_;  // note_waiting's, under mu_
  transport::LinkModel link_model_{};
  HostLayout hosts_;
  std::vector<kernels::cuda::GpuIdentity> gpus_;  // every rank's, from agree_on_settings
  std::string gpus_unreachable_;
  DeviceIpc device_ipc_;
  int device_die_ = -1;
  int replay_lag_ms_ = 0;        // CHORUS_TEST_REPLAY_LAG_MS
  int host_part_linger_ms_ = 0;  // CHORUS_TEST_HOST_PART_LINGER_MS
  int alive_check_lag_ms_ = 0;   // CHORUS_TEST_ALIVE_CHECK_LAG_MS: see OpCtx::sleep_once
  int device_timing_ = 0;
  std::atomic<bool> shared_buffers_{true};
  bool shared_map_fail_ = false;
  transport::LinkModel local_link_model_{};  // of the links inside the largest host
  int drain_waiters_ = 0;  // threads waiting for the queue to empty (destroy); kGateWaiters
  TunerConfig tuner_;
  std::mutex tune_mu_;
  TuneCache tune_cache_;  // written under tune_mu_; empty while a measurement forces a trial
  Tuned tune_slow(OpKind kind, size_t bytes);
  TuneInput tune_input(OpKind kind, size_t bytes) const {
    return {kind,
            bytes,
            size(),
            link_model_,
            nchannels(),
            hosts_.nhosts(),
            hosts_.max_local(),
            local_link_model_,
            large_in_place_};
  }
  Algo large_in_place_ = Algo::kNone;       // measured (tune_measure.cc); under tune_mu_
  std::atomic<bool> measure_begun_{false};  // read without the lock by every all-reduce
  Algo trial_algo_ = Algo::kNone;
  int spin_us_ = 50;  // CHORUS_SPIN_US: the most a wait spins before it sleeps
  std::atomic<int> spin_now_us_{
      50};             // adapts: halves when spinning did not pay, regrows when it did
  int jitter_us_ = 0;  // CHORUS_TEST_JITTER_US: test hook, see OpCtx::jitter()
  std::atomic<uint64_t> jitter_points_{0};

  std::atomic<uint64_t> coll_seq_{0};
  std::mutex seq_mu_;
  std::vector<uint64_t> send_seq_, recv_seq_;
  uint64_t split_count_ = 0;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<std::shared_ptr<Request>, OpFn>> queue_;
  bool stopping_ = false;
  std::atomic<bool> failed_{false};
  Status error_;
  // Who may run an operation: one word, so that the inline path (try_run_inline) claims it with
  // one compare-and-swap from 0 and gives it back with one to 0, without mu_. kGateRunning:
  // an operation runs (inline or on the progress thread). The rest mirror state kept under mu_
  // (and change only under it), so that any of them sends the inline path to the locked one: the
  // queue is not empty, destroy has begun (stopping_), the communicator failed (failed_), a thread
  // waits for the running operation to end (drain_waiters_ > 0: the inline path then notifies).
  static constexpr uint32_t kGateRunning = 1, kGateQueued = 2, kGateStopping = 4, kGateFailed = 8,
                            kGateWaiters = 16;
  std::atomic<uint32_t> gate_{0};
  bool running() const { return gate_.load(std::memory_order_acquire) & kGateRunning; }
  void gate_set(uint32_t bit, bool on) {
    if (on)
      gate_.fetch_or(bit, std::memory_order_acq_rel);
    else
      gate_.fetch_and(~bit, std::memory_order_acq_rel);
  }
  void add_drain_waiter(int d) {  // under mu_
    drain_waiters_ += d;
    gate_set(kGateWaiters, drain_waiters_ > 0);
  }
  // What this rank is doing, for messages and queries (formatted only when asked).
  OpState state_;
  std::thread thread_;
  bool thread_exited_ = false;  // the progress thread has left its loop (under mu_)
  bool destroyed_ = false;      // destroy() has finished (under mu_)
};

// What an algorithm sees while it runs: the links, and a wait that progresses them.
class OpCtx {
 public:
  OpCtx(CommImpl& comm, const OpDesc& desc, int channel = 0);
  CommImpl& comm() { return comm_; }
  // Narrows this context to a part of the operation (channel 0's part of a split call).
  void set_count(uint64_t count);
  int rank() const { return comm_.rank_; }
  int size() const { return comm_.size(); }
  StagingBuffers& staging() { return ch_.staging; }
  const OpDesc& desc() const { return desc_; }
  const HostLayout& hosts() const { return comm_.hosts_; }
  transport::Link& link(int peer) { return *ch_.links.links[peer]; }

  // Sends this operation's header to every rank in `to` and checks the header of every rank
  // in `from` (-1 entries are skipped): how an algorithm opens its links for this operation.
  Status exchange_headers(std::initializer_list<int> to, std::initializer_list<int> from);
  // The same with every rank in `peers` both ways (distinct ranks, none this one); headers are
  // checked as they arrive, so a rank in another call is named while others are still late.
  Status exchange_headers_with(std::span<const int> peers);
  // Headers of an exchange whose counts differ by pair (all-to-all-v): send_pair_header posts
  // `to` this operation's header saying `send_count` (what this rank sends it);
  // check_pair_header checks, once recv_header(from) completed, that `from`'s says `recv_count`
  // (what this rank expects from it).
  void send_pair_header(int to, uint64_t send_count);
  Status check_pair_header(int from, uint64_t recv_count);
  // Small messages over a direct link in one slot: header and data together. Writes ours,
  // waits for the peer's, checks its header and returns its data (valid until eager_release).
  // Both sides must call it for the same exchange. Use when eager_fits().
  // Over links without direct slots (tcp), header and data leave in one send from a staging
  // buffer (both sides agree on the choice: it depends only on the size and on the link
  // between them, which is the same backend on both sides).
  bool eager_fits(int peer, size_t bytes) {
    transport::DirectSlots* d = link(peer).direct();
    if (d) return d->slot_capacity() >= sizeof(OpHeader) + bytes;
    return sizeof(OpHeader) + bytes <= kEagerStagedBytes;
  }
  static constexpr size_t kEagerStagedBytes = 64 << 10;
  Result<const char*> eager_exchange(int peer, const void* data, size_t bytes);
  // The two halves of an exchange, for several peers at once: eager_send writes header + data
  // to each peer (over links without direct slots: one staged copy posted to each, so wait
  // for those sends before the next eager_send); eager_recv waits for `peer`'s, checks its header
  // and returns its data (valid until eager_release; over links without direct slots it lands in
  // `staged`).
  Status eager_send(std::span<const int> peers, const void* data, size_t bytes);
  Result<const char*> eager_recv(int peer, size_t bytes, char* staged);
  void eager_release(int peer, size_t bytes) {
    if (transport::DirectSlots* d = link(peer).direct()) d->recv_consume(sizeof(OpHeader) + bytes);
  }
  // Waits until every posted send and receive of this operation is complete.
  Status drain();
  // Posts this operation's header to a peer / a receive of the peer's header.
  uint64_t send_header(int peer);
  uint64_t recv_header(int peer);  // the header lands in a buffer owned by the ctx
  Status check_header(int peer);   // after recv_header completed
  // Writes this operation's header at p (into a reserved slot: header and data in one).
  void write_header(char* p) const { std::memcpy(p, &my_header_, sizeof my_header_); }

  // Progresses every busy link until done() is true: spins briefly, then sleeps on a wake-up.
  // Fails on the operation's deadline, a link error, a dead peer or an abort.
  // `waiting_for` is a rank, for the timeout message (-1: unknown).
  Status wait(FunctionRef<bool()> done, int waiting_for);
  Status wait_send(int peer, uint64_t ticket) {
    return wait([&] { return link(peer).send_done(ticket); }, peer);
  }
  Status wait_recv(int peer, uint64_t ticket) {
    return wait([&] { return link(peer).recv_done(ticket); }, peer);
  }

 private:
  Result<bool> progress_all();
  Status explain_link_failure(const Status& link_error);
  // Test hook (CHORUS_TEST_JITTER_US=N): before one wait in four, sleep a random 0..N us, so
  // ranks fall out of step at arbitrary points of an operation and ordering bugs show here. A
  // wait that a first look would skip (a free slot, a message already in) is waited for while it
  // is on, so that those points jitter too.
  void jitter();
  bool jittering() const { return comm_.jitter_us_ > 0; }
  Result<bool> sleep_once(FunctionRef<bool()> done, bool* slept, int waiting_for);
  CommImpl& comm_;
  Channel& ch_;
  OpDesc desc_;
  OpHeader my_header_;
  OpHeader* headers_;  // received, per peer (the communicator's scratch)
  Status wait_slow(FunctionRef<bool()> done, int waiting_for);
  // The operation's deadline, fixed the first time a wait takes the slow path: operations
  // that never wait long never read the clock.
  Deadline& deadline();
  Deadline deadline_ = Deadline::never();
  bool deadline_set_ = false;
};

// The algorithms (one file each).
Status run_send(OpCtx& ctx, const void* buf, size_t bytes);
Status run_recv(OpCtx& ctx, void* buf, size_t bytes);
Status run_barrier(OpCtx& ctx);
Status run_broadcast(OpCtx& ctx, const void* send, void* recv, size_t bytes, size_t chunk_bytes);
// Reductions and gathers: buffers as in chorus.h, counts in elements, ctx.desc() says the rest.
Status run_ring_allreduce(OpCtx& ctx, const char* send, char* recv);
// The ring's steps over `ring` (ranks in ring order, this one among them), headers exchanged.
Status ring_allreduce_steps(OpCtx& ctx, std::span<const int> ring, const char* send, char* recv);
// Inside each host to its leader, across hosts between leaders, back inside (hier_allreduce.cc).
Status run_hier_allreduce(OpCtx& ctx, const char* send, char* recv);
Status run_tree_allreduce(OpCtx& ctx, const char* send, char* recv);
Status run_rd_allreduce(OpCtx& ctx, const char* send, char* recv);
Status run_chain_reduce(OpCtx& ctx, const char* send, char* recv);
Status run_ring_allgather(OpCtx& ctx, const char* send, char* recv);
Status run_ring_reduce_scatter(OpCtx& ctx, const char* send, char* recv);
// Gather and scatter: root's buffer holds nranks blocks of ctx.desc().count elements.
Status run_gather(OpCtx& ctx, const char* send, char* recv);
Status run_scatter(OpCtx& ctx, const char* send, char* recv);

// Where each rank's block of an all-to-all lies, in elements: uniform blocks of `count` (block j
// at j * count), or per-rank counts and displacements (all-to-all-v; the arrays outlive the call).
struct ExchangeLayout {
  uint64_t count = 0;
  const size_t* send_counts = nullptr;  // null: uniform
  const size_t* send_displs = nullptr;
  const size_t* recv_counts = nullptr;
  const size_t* recv_displs = nullptr;
  size_t send_count(int j) const { return send_counts ? send_counts[j] : count; }
  size_t send_displ(int j) const { return send_counts ? send_displs[j] : j * count; }
  size_t recv_count(int j) const { return send_counts ? recv_counts[j] : count; }
  size_t recv_displ(int j) const { return send_counts ? recv_displs[j] : j * count; }
};
// Ordered (deterministic) reductions, ordered.cc: every element is the fold of the ranks'
// contributions in rank order (chorus.h, "Deterministic reductions").
Status run_ordered_allreduce(OpCtx& ctx, const char* send, char* recv);
Status run_ordered_reduce(OpCtx& ctx, const char* send, char* recv);
Status run_ordered_reduce_scatter(OpCtx& ctx, const char* send, char* recv);
Status run_pairwise_alltoall(OpCtx& ctx, const char* send, char* recv, const ExchangeLayout& l);

}  // namespace chorus
