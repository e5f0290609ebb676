// DistributedDataParallel: data-parallel training of a Module over a chorus communicator, using
// only chorus's public C++ API (include/chorus/chorus.hpp), as an outside embedder would.
//
// What it does, after PyTorch's c10d Reducer:
//   - at construction: every rank states (host, device); two ranks of one host on the same
//     non-CPU device fail on every rank. Parameter names and shapes are compared across ranks (a
//     mismatch names the parameter and both shapes), then rank 0's values are broadcast.
//   - buckets: parameters in reverse registration order (the order backward makes their
//     gradients ready) fill flat f32 buckets; the first closes at first_bucket_bytes (1 MiB),
//     the rest at bucket_cap_bytes (25 MiB). Each parameter's .grad becomes a view into its
//     bucket, so autograd accumulates straight into the buffer that is all-reduced.
//   - during backward: each gradient-ready hook divides that gradient by the world size (copying
//     it into the bucket first when it is not already the bucket view: the "copy-in"); when a
//     bucket's last gradient is ready its iall_reduce(sum) is launched at once, strictly in
//     bucket order (a bucket that completes early waits for its predecessors, so every rank
//     issues the same sequence and no cross-rank deadlock is possible).
//   - buckets on a GPU: all-reduced on a communication stream of that device (one per device,
//     not waiting for the default stream, where the tensor layer runs every kernel), each after
//     an event recorded behind its gradients' kernels, so that backward's remaining kernels and
//     the all-reduce overlap on the GPU; the host call returns once the ranks have exchanged the
//     bucket's handles, without waiting for the GPU.
//   - finish_gradient_sync() waits for every bucket; call it between backward and the optimizer
//     step (Trainer does). When a gradient never arrived it throws, naming the parameters. For
//     GPU buckets it waits on the GPU, not the host: the default stream waits for an event
//     recorded behind the communication stream's all-reduces, so the optimizer's kernels run
//     after them.
//   - no_sync(): while the guard lives, backward only accumulates into the buckets; the next
//     synchronised backward reduces the accumulated sum.
//   - CUDA graphs (Trainer with cuda_graph): a graph replays kernels, not host code, so no hook
//     runs at a replay. Where every bucket is on the graph's device, the whole step is one
//     graph: the hooks run while it is captured and fork each bucket's all-reduce onto the
//     communication stream as in an eager step (the default stream is the capturing one then),
//     and finish() joins them back; every replay runs them, overlapped with backward as eagerly
//     (over CUDA IPC on one host; across hosts each replay's host part runs when its host node
//     does: collectives/device_stage.h). Elsewhere (a bucket on the cpu; or asked for, to
//     compare: TrainOptions.cuda_graph_split) the reducer is set to defer its launches: the
//     hooks divide the gradients as always (kernels, captured) but launch nothing; after the
//     graph's run, sync_deferred() launches every bucket in order and waits as finish() does
//     (no overlap with backward). Either way, the eager step's bits.
//
// Threading: one thread drives forward/backward/finish; the communicator's progress thread runs
// the all-reduces. Buckets must not be touched between launch and finish_gradient_sync().
#pragma once

#include <chorus/chorus.hpp>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ddp/nn/modules.h"

namespace chorus {

// The launcher's local rank: the first of LOCAL_RANK (torchrun, chorus-run),
// OMPI_COMM_WORLD_LOCAL_RANK (mpirun) and SLURM_LOCALID (srun) that is set, else 0. A value that
// is not an integer >= 0 throws std::invalid_argument naming the variable and the value.
int env_local_rank();

// Every rank gets every rank's string (all_gather of lengths, then of padded bytes). Collective.
std::vector<std::string> all_gather_strings(Communicator& comm, const std::string& mine);

// Collective: throws on every rank when two ranks on one host claim the same non-CPU device.
void check_devices(Communicator& comm, const Device& device);

struct ReducerOptions {
  size_t first_bucket_bytes = size_t{1} << 20;
  size_t bucket_cap_bytes = size_t{25} << 20;
};

struct BucketInfo {
  std::vector<std::string> params;  // names, in the order they sit in the bucket
  int64_t numel = 0;
};

// Per-step timing of the gradient sync (seconds), for the communication-share report.
struct SyncStats {
  double wait_seconds = 0;  // time finish_gradient_sync() spent waiting for all-reduces
  int64_t syncs = 0;        // synchronised steps
};

class Reducer {
 public:
  Reducer(Communicator& comm, std::vector<NamedTensor> params, ReducerOptions options);
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // Arms the next backward to reduce (called by DDP's forward when sync is on).
  void prepare_for_backward();
  bool armed() const { return armed_; }
  // Waits for every bucket; throws naming the parameters that got no gradient. No-op when the
  // last backward was not armed.
  void finish();

  // CUDA graphs (above). While deferred, a backward launches no all-reduce; sync_deferred() then
  // launches every bucket and finishes. `replayed`: the backward was a graph's replay, whose
  // hooks did not run: the bookkeeping is the captured backward's, which had every gradient (it
  // went through sync_deferred before: a backward with a gradient missing throws there, naming
  // it, and a replay before any such backward throws std::logic_error).
  void set_deferred(bool on) { deferred_ = on; }
  void sync_deferred(bool replayed);
  // Whether a backward through this reducer, its all-reduces and finish() may be captured into
  // a CUDA graph on `device` (above): every bucket there (the communicator's device collectives
  // are captured on one host and across hosts alike). The same answer on every rank.
  bool capturable(const Device& device) const;

  // Elastic training, after a failed step and before rolling back: waits until the GPU work of
  // the buckets' devices (their default streams and communication streams) has ended -- a stream
  // wait on a rank that died ends once the communicator's failure releases it -- for at most
  // `seconds`; throws when it has not (a roll-back would queue behind it for ever). No-op on cpu.
  void drain(double seconds);

  const std::vector<BucketInfo>& buckets() const;
  int buckets_launched() const { return next_launch_; }
  // True when bucket i's all-reduce has completed (polls; false when not launched).
  bool bucket_done(int i);
  const SyncStats& stats() const { return stats_; }
  void reset_stats() { stats_ = {}; }

 private:
  struct Slot {
    std::string name;
    Tensor param;
    int bucket = 0;
    int64_t offset = 0;  // floats into the bucket
  };
  struct Bucket {
    Tensor flat;
    std::vector<int> slots;
    int pending = 0;
    Work work;  // a host bucket's all-reduce
    bool launched = false;
    bool on_gpu = false;    // all-reduced on its device's communication stream
    void* ready = nullptr;  // GPU: the event behind its gradients' kernels
  };
  // A device's communication stream and the event behind its last all-reduce.
  struct CommStream {
    void* stream = nullptr;
    void* done = nullptr;
  };
  void on_grad_ready(int slot);
  void launch_ready_buckets();
  void launch_on_gpu(Bucket& b);
  // The default streams wait for the communication streams' all-reduces launched so far.
  void join_comm_streams();

  Communicator& comm_;
  ReducerOptions options_;
  std::vector<Slot> slots_;
  std::vector<Bucket> buckets_;
  std::map<int, CommStream> comm_streams_;  // by device index (streams and events never freed)
  std::vector<BucketInfo> info_;
  std::vector<char> ready_;  // per slot, this backward
  int next_launch_ = 0;
  bool armed_ = false;
  bool deferred_ = false;
  bool complete_deferred_ = false;  // a deferred backward has finished with every gradient
  float world_ = 1;
  SyncStats stats_;
  std::shared_ptr<char> alive_ = std::make_shared<char>(0);  // hooks check it (see the constructor)
};

struct DdpOptions {
  ReducerOptions reducer;
  // The device of the module's parameters ("cpu", "cuda", "cuda:N"), or "" for a module split
  // across devices (model parallel; PyTorch's device_ids=None): then each bucket holds the
  // gradients of one device and is all-reduced there.
  std::string device = "cpu";
  bool broadcast_parameters = true;
};

class DistributedDataParallel : public Module {
 public:
  // Collective over comm: every rank must construct with the same model structure.
  DistributedDataParallel(Module& module, Communicator& comm, DdpOptions options = {});
  Tensor forward(const Tensor& x) override;
  void finish_gradient_sync() { reducer_.finish(); }

  // While the returned guard lives, backward does not communicate (gradient accumulation).
  class NoSyncGuard {
   public:
    explicit NoSyncGuard(DistributedDataParallel& d) : d_(d), previous_(d.sync_) {
      d.sync_ = false;
    }
    ~NoSyncGuard() { d_.sync_ = previous_; }
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;

   private:
    DistributedDataParallel& d_;
    bool previous_;
  };
  [[nodiscard]] NoSyncGuard no_sync() { return NoSyncGuard(*this); }

  Module& module() { return module_; }
  Communicator& comm() { return comm_; }
  Reducer& reducer() { return reducer_; }
  // The device given (for a module split across devices: that of its first parameter).
  const Device& device() const { return device_; }

 private:
  Module& module_;
  Communicator& comm_;
  Device device_;
  bool one_device_;  // DdpOptions.device given: inputs are moved there
  Reducer reducer_;
  bool sync_ = true;
};

// Collective: throws on every rank naming the first parameter whose name or shape differs.
void verify_parameters_across_ranks(Communicator& comm, const std::vector<NamedTensor>& params);
// Collective: rank 0's parameter values, copied into every rank's (one flat broadcast).
void broadcast_parameters(Communicator& comm, const std::vector<NamedTensor>& params, int root = 0);

}  // namespace chorus
