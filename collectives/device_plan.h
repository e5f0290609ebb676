// What each rank's GPU does in a collective on device buffers (device_ops.cc): a list of tasks,
// each a fold of some ranks' buffers into one buffer (or a copy of one), planned from the call
// alone -- no memory, no CUDA -- so that the plan is checked on every machine
// (tests/collectives/test_device_plan.cc). The order of the ready/done signals around the tasks
// is device_ops.cc's.
#pragma once

#include <cstddef>
#include <span>
#include <utility>
#include <vector>

#include "collectives/op.h"

namespace chorus {

// Rank `rank`'s sendbuff (or recvbuff), from element `elem` on.
struct BufRef {
  int rank = 0;
  bool recv = false;
  size_t elem = 0;
};

struct DeviceTask {
  std::vector<BufRef> in;   // folded left to right, in rank order (the deterministic bits)
  std::vector<BufRef> out;  // each gets the result (one kernel writes them all)
  size_t count = 0;         // elements
  bool reduce = false;      // false: each out is a copy of in[0] (none onto itself)
};

struct DevicePlanArgs {
  // all-reduce, reduce, broadcast, all-gather, reduce-scatter, gather, scatter, all-to-all
  OpKind kind = OpKind::kAllReduce;
  int nranks = 1;
  int rank = 0;
  int root = 0;      // reduce, broadcast, gather, scatter
  size_t count = 0;  // the call's count: sendcount (all-gather, gather), recvcount
                     // (reduce-scatter, scatter), a block (all-to-all)
  size_t align = 1;  // slices start at multiples of this many elements (16-byte loads)
  bool one_gpu = false;
};

// This rank's tasks. Ranks on GPUs of their own each take a slice (all-reduce, reduce) or their
// own output (broadcast, all-gather, reduce-scatter, gather at the root, scatter, all-to-all),
// reading the peers' buffers directly; ranks that share one GPU leave every task to one rank
// (the root, else rank 0): their contexts take
// turns on the GPU, so several workers buy nothing there and each turn costs about 300 us
// (bench/RESULTS.md, "First GPU run"). An all-reduce slice is one task writing every rank's
// output: each input byte read once, each output byte written once (2pN bytes for p ranks' N,
// the bound of ../shared/notes/gpu-collectives.md), where a copy per peer after the fold moved
// (3p-1)N. Gathers, scatters and all-to-all are copies of blocks; where a rank's input overlaps
// its output other than as its own block (an in-place all-to-all, a root's sendbuff elsewhere in
// its recvbuff), device_ops.cc first copies the input aside, so a plan never reads what it writes.
std::vector<DeviceTask> plan_device_op(const DevicePlanArgs& a);

// All-to-all-v: one rank's four arrays (nranks entries each, in elements), as it passed them.
struct PerRankCounts {
  const size_t* sendcounts = nullptr;
  const size_t* sdispls = nullptr;
  const size_t* recvcounts = nullptr;
  const size_t* rdispls = nullptr;
};

// This rank's tasks of an all-to-all-v: rank d's block from rank q -- q's sendcounts[d] elements
// at its sdispls[d] -- copied into d's recvbuff at d's rdispls[q]; each rank its own output, or
// every task to rank 0 where the ranks share one GPU; empty blocks none. Every pair's counts must
// agree (device_alltoallv_mismatch says where they do not).
std::vector<DeviceTask> plan_device_alltoallv(int nranks, int rank, bool one_gpu,
                                              std::span<const PerRankCounts> all);

// All-to-all-v: the elements from a side's buffer start to its furthest non-empty block's end.
size_t device_extent(const size_t* counts, const size_t* displs, int nranks);

// The first rank whose arrays (as it sent them) put a block past `most` elements -- a count
// above it, or a displacement past most - count -- or -1. Every rank checked its own arrays so
// (c_api_check); this keeps a peer's corrupt ones out of the pointer arithmetic.
int device_alltoallv_out_of_range(std::span<const PerRankCounts> all, size_t most);

// The first pair (sender, receiver) whose counts disagree -- the sender's sendcounts[receiver]
// against the receiver's recvcounts[sender] -- or {-1, -1}.
std::pair<int, int> device_alltoallv_mismatch(std::span<const PerRankCounts> all);

// The rank that does every task where the ranks share one GPU: the root of a rooted call
// (reduce, broadcast, gather, scatter), else rank 0.
int device_leader(OpKind kind, int root);

// Whom a rank meets in a call on device buffers: whether it signals its ready (done) to peer q
// and whether it waits for q's. Where every task is the leader's (ranks sharing one GPU, and not a
// barrier) only the leader and each peer meet -- the peer signals ready to the leader and waits for
// its done; the leader waits for every ready and signals every done: 2 stream memory operations
// on each other rank instead of 4(p-1), 2(p-1) on the leader, and no wait of the leader's for a
// peer's context after its tasks. Otherwise every rank meets every other (a barrier: ready only).
struct DeviceMeet {
  bool signal_ready = false, wait_ready = false, signal_done = false, wait_done = false;
};
DeviceMeet device_meet(int rank, int peer, int leader, bool star, bool barrier);

// Whether a rank's call reads its sendbuff / writes its recvbuff (the other may be anything, as
// in NCCL: a broadcast's or scatter's sendbuff off the root, a reduce's or gather's recvbuff off
// the root).
bool device_uses_send(OpKind kind, int rank, int root);
bool device_uses_recv(OpKind kind, int rank, int root);

// Elements of rank's sendbuff / recvbuff the call touches.
size_t device_send_count(OpKind kind, size_t count, int nranks);
size_t device_recv_count(OpKind kind, size_t count, int nranks);

}  // namespace chorus
