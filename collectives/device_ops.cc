// Collectives and send/recv on device buffers over CUDA IPC, for ranks of one host (their GPUs,
// or one GPU they share with CHORUS_ALLOW_SHARED_GPU=1), after ../shared/notes/gpu-collectives.md
// and the measurements in bench/RESULTS.md ("First GPU run"):
//
//   host: every rank exports the buffers its call uses (legacy IPC handle + offset) and its flag
//         words; one host exchange of these records through the communicator -- an all-gather
//         for collectives, the pair's messages for send/recv -- which also checks that the ranks
//         make matching calls; each rank maps what its tasks read or write (cached per
//         allocation) and enqueues, on the caller's stream:
//   GPU:  1. ready: write seq into every peer's ready word for this rank (a stream write-value:
//            9 us per round trip on an H200, 30x faster than NCCL's 4-byte copy), then wait
//            until every peer's ready word here is >= seq: every input complete, every output
//            free;
//         2. this rank's tasks (device_plan.h): fold kernels reading peers' memory directly and
//            writing the result into every output at once (an all-reduce: each rank's), copies
//            by a kernel too (a copy-engine copy into another process's memory cost about
//            280 us on an H200), moving bytes whatever the type (gather, scatter and all-to-all
//            are only copies; an input overlapping its output other than as the rank's own
//            block is copied aside into the bounce buffer first, set_aside);
//         3. done: the same signal-then-wait on the done words: no rank goes on before every
//            peer has written into its buffers and stopped reading them.
//   Send/recv: the sender signals "data ready", the receiver "buffer free"; each waits for the
//   other's; the receiver copies and signals "copied", which the sender waits for. In a group
//   every item signals before any item waits, so exchanges both ways cannot deadlock.
//   No kernel waits for another process; every cross-process wait is a stream memory
//   operation, which holds no SM (ranks sharing one GPU time-slice it; a spinning kernel would
//   stall them). Each rank signals before it waits.
//
// Flag words (32-bit, this rank's, written by peers): ready[q], done[q] (collectives, the count
// of device collectives), tx_ready[q] (q's sends to this rank), rx_ready[q] and rx_done[q] (q's
// receives from this rank), 32 of each.
//
// What a rank that fails after the exchange does: it still writes every signal of the call to
// its peers (so that no stream waits for ever), aborts the communicator (every rank's next call
// fails naming why) and returns the error. A peer that dies instead (kill -9) signals nothing:
// when the communicator fails -- the watch channel names the dead rank within its deadline --
// every flag word of each survivor is set to its largest value on a stream of its own
// (release_device_waits), so that their streams go on (on void results) instead of waiting for
// ever, and their calls fail naming the dead rank. Ranks on several hosts (or more than 32) go
// through host memory instead (device_staged.cc). VMM (cuMem) memory, which CUDA IPC cannot
// map, is mapped by the peers through its file descriptor where CUDA exports it as one
// (device_vmm.h: after the record exchange and before any GPU work, each allocation once per
// peer over a Unix socket); the rest -- stream-ordered memory, VMM memory without that handle
// type -- goes through a bounce buffer (device_bounce.h).
#include "collectives/device_ops.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <string>

#include "collectives/c_api_internal.h"
#include "collectives/comm.h"
#include "collectives/device_bounce.h"
#include "collectives/device_plan.h"
#include "collectives/device_timing.h"
#include "collectives/device_vmm.h"
#include "collectives/op.h"
#include "common/log.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/ipc.h"
#include "kernels/cuda/memory.h"

namespace chorus {
namespace {

enum FlagBlock : int { kReady = 0, kDone = 1, kTxReady = 2, kRxReady = 3, kRxDone = 4 };
constexpr size_t kFlagBytes = 5 * kMaxDeviceRanks * sizeof(uint32_t);

}  // namespace

bool device_buffers(const void* sendbuff, const void* recvbuff) {
  using kernels::cuda::MemSpace;
  for (const void* p : {sendbuff, recvbuff})
    if (p != nullptr && kernels::cuda::classify_pointer(p).space == MemSpace::kDevice) return true;
  return false;
}

// A stream wait ends when (int32_t)(word - awaited) >= 0 (CUDA's CU_STREAM_WAIT_VALUE_GEQ is a
// cyclic comparison), so no one value ends every wait: 0xffffffff is -1 against the first
// call's 1, and left the survivors of a kill -9 waiting on an H200. Each word gets instead the
// count that its waits are for, plus 2^30: ahead of every wait enqueued so far and of those that
// the calls in flight may still enqueue, by far less than 2^31 (words kReady and kDone: the
// collectives; kTxReady[q]: the receives from q; kRxReady[q] and kRxDone[q]: the sends to q).
std::array<uint32_t, 5 * kMaxDeviceRanks> device_release_values(const DeviceIpc& st) {
  constexpr uint32_t kAhead = 1u << 30;
  std::array<uint32_t, 5 * kMaxDeviceRanks> v{};
  const uint32_t seq = st.seq.load() + kAhead;
  for (int q = 0; q < kMaxDeviceRanks; ++q) {
    const uint32_t tx = st.tx_seq[q].load() + kAhead, rx = st.rx_seq[q].load() + kAhead;
    v[kReady * kMaxDeviceRanks + q] = seq;
    v[kDone * kMaxDeviceRanks + q] = seq;
    v[kTxReady * kMaxDeviceRanks + q] = rx;
    v[kRxReady * kMaxDeviceRanks + q] = tx;
    v[kRxDone * kMaxDeviceRanks + q] = tx;
  }
  return v;
}

void release_device_waits(DeviceIpc& st) {
  void* flags = st.live_flags.load();
  if (flags == nullptr) return;
  const std::array<uint32_t, 5 * kMaxDeviceRanks> v = device_release_values(st);
  static_assert(sizeof v == kFlagBytes);
  if (int rc = kernels::cuda::ipc().flags_release(st.live_device.load(), flags, v.data(), v.size());
      rc)
    log_warn("releasing this rank's device waits failed: {}",
             kernels::cuda::ipc().error_string(rc));
}

Status with_peer_news(CommImpl& comm, const Status& s) {
  Status why = comm.error();
  for (int i = 0; i < 200 && why.is_ok(); ++i) {
    usleep(10000);
    why = comm.error();
  }
  if (why.is_ok()) return s;
  return Status(s.code(), s.message() + "; the communicator failed: " + why.message());
}

}  // namespace chorus

namespace chorus::capi {
namespace {

namespace kc = kernels::cuda;

// What each rank tells the others, as raw bytes through the host.
struct Record {
  uint64_t count;
  int32_t kind;
  int32_t datatype;
  int32_t op;
  int32_t root;  // collectives; send/recv: the peer
  int32_t ok;    // 0: `why` says what this rank could not do
  char why[180];
  char gpu[48];  // the UUID of this rank's GPU ("" if unknown)
  int32_t pid;   // for the descriptor sockets of VMM memory (device_vmm.h)
  kc::IpcHandle flags, send, recv;
};

std::string where(const void* p) {
  kc::PointerInfo i = kc::classify_pointer(p);
  if (i.space == kc::MemSpace::kHost) return "host memory";
  return fmt::format("{} memory of CUDA device {}", kc::mem_space_name(i.space), i.device);
}

void set_why(Record& r, const std::string& why) {
  r.ok = 0;
  std::snprintf(r.why, sizeof r.why, "%s", why.c_str());
}

std::string ipc_error(int rc) {
  return kc::ipc().error_string(rc);
}

// This rank's part of the record: the buffers it uses device memory of the current device,
// exported (memory that CUDA IPC cannot map: VMM allocations by file descriptor, device_vmm.h,
// the rest staged, device_bounce.h); its flag words allocated (at its first device call) and
// exported. `bufs` says where the GPU work finds each buffer.
void describe_self(DeviceIpc& st, CallBuffers& bufs, Record& me, int rank) {
  const kc::IpcBackend& ipc = kc::ipc();
  const int dev = ipc.current_device();
  me.ok = 1;
  me.pid = int32_t(getpid());
  for (const LocalBuffer* b : {&bufs.send, &bufs.recv}) {
    if (!b->used) continue;
    kc::PointerInfo i = kc::classify_pointer(b->user);
    if (i.space != kc::MemSpace::kDevice || i.device != dev)
      return set_why(me, fmt::format("{} {} is {}, {}: the buffers must be memory of the current "
                                     "device",
                                     b->name, b->user, where(b->user),
                                     dev < 0 ? std::string("and this process uses no CUDA device")
                                             : fmt::format("the current device is {}", dev)));
  }
  if (st.flags == nullptr) {
    if (int rc = ipc.flags_alloc(kFlagBytes, &st.flags); rc != 0)
      return set_why(me, "allocating its flag words failed: " + ipc_error(rc));
    st.device = dev;
    st.live_device.store(dev);
    st.live_flags.store(st.flags);
    Result<std::optional<kc::GpuIdentity>> g = kc::current_gpu();
    if (g.is_ok() && g.value()) st.gpu = g.value()->uuid;
  }
  if (st.device != dev)
    return set_why(me, fmt::format("the current device is {}, but this communicator's device "
                                   "calls ran on device {}",
                                   dev, st.device));
  std::snprintf(me.gpu, sizeof me.gpu, "%s", st.gpu.c_str());
  if (int rc = ipc.export_buffer(st.flags, &me.flags); rc != 0)
    return set_why(me, "exporting its flag words failed: " + ipc_error(rc));
  for (auto [b, h] : {std::pair{&bufs.send, &me.send}, {&bufs.recv, &me.recv}}) {
    b->at = const_cast<void*>(b->user);
    if (!b->used || !b->shared) continue;
    const int rc = ipc.export_buffer(b->user, h);
    if (rc == kc::kNotLegacyIpc && !vmm_describe(st, *b, h, rank)) {
      b->staged = true;
      b->handle = h;
    } else if (rc != 0 && rc != kc::kNotLegacyIpc) {
      return set_why(me, fmt::format("{} {} cannot be shared with other processes ({})", b->name,
                                     b->user, ipc_error(rc)));
    }
  }
}

// Where rank q's buffer of handle h is mapped here: by CUDA IPC, or its VMM allocation mapped by
// descriptor (device_vmm.h).
Result<void*> open_peer(DeviceIpc& st, int q, const kc::IpcHandle& h) {
  if (is_vmm_handle(h)) return vmm_open(st, q, h);
  void* p = nullptr;
  if (int rc = kc::ipc().open(h, &p); rc != 0)
    return make_error(Code::kSystemError, "{}", ipc_error(rc));
  return p;
}

// VMM buffers go to the ranks of the call that lack them, before the GPU work.
Status pass_vmm(CommImpl& comm, DeviceIpc& st, std::vector<VmmTransfer> moves,
                std::vector<int32_t> pids) {
  if (moves.empty()) return Status::ok();
  return vmm_pass(comm, st, moves, pids, Deadline::after_seconds(comm.timeout_seconds()));
}

// Checks a record after the exchange: a rank that could not take part fails every rank.
Status check_ok(const Record& rec, int q, int r, const char* call) {
  if (rec.ok) return Status::ok();
  return make_error(q == r ? Code::kInvalidArgument : Code::kRemoteError, "{} on rank {}: {}{}",
                    call, r, q == r ? "" : fmt::format("rank {}: ", q), rec.why);
}

// The end of a call whose work is enqueued: a failure of the communicator meanwhile (a peer died
// during the call, whose waits were released) voids it.
chorusResult_t finish(CommImpl& comm, const char* call) {
  Status e = comm.error();
  if (e.is_ok()) return chorusSuccess;
  return report(Status(e.code(), fmt::format("{} on rank {}: the communicator failed during the "
                                             "call, its results are void: {}",
                                             call, comm.rank(), e.message())));
}

// Rank q's word in `block` of a rank's flag words.
uint32_t* word(uint32_t* flags, FlagBlock block, int q) {
  return flags + block * kMaxDeviceRanks + q;
}

// This communicator's per-rank state, sized at its first device call.
void size_state(DeviceIpc& st, int p) {
  if (!st.peer_flags.empty()) return;
  st.peer_flags.assign(p, nullptr);
}

// The GPU-side work of one call on this rank, enqueued in order; failures after the exchange
// still write every signal (release()).
class Enqueuer {
 public:
  // `call`: what the call is, for CHORUS_DEVICE_TIMING's report (made only when it is on).
  Enqueuer(CommImpl& comm, DeviceIpc& st, int rank, void* stream, const std::string& call)
      : comm_(comm), st_(st), r_(rank), stream_(stream), timer_(timing(comm, st), call, stream) {}

  // Rank q's flag words, mapped at first use from its exported handle.
  Status map_flags(int q, const kc::IpcHandle& h) {
    if (st_.peer_flags[q] != nullptr) return Status::ok();
    void* f = nullptr;
    if (q == r_) {
      f = st_.flags;
    } else if (int rc = kc::ipc().open(h, &f); rc != 0) {
      return with_peer_news(comm_, failed(fmt::format("mapping rank {}'s flag words", q), rc));
    }
    st_.peer_flags[q] = static_cast<uint32_t*>(f);
    return Status::ok();
  }

  // Writes v into peer q's word for this rank in `block`.
  Status signal(int q, FlagBlock block, uint32_t v, const char* name) {
    if (int rc = kc::ipc().write_u32(stream_, word(st_.peer_flags[q], block, r_), v); rc != 0)
      return failed(fmt::format("signalling {} to rank {}", name, q), rc);
    if (timer_.on()) timer_.stamp(fmt::format("signal {} to rank {}", name, q));
    return Status::ok();
  }
  // Waits until q's word here in `block` is >= v.
  Status wait(int q, FlagBlock block, uint32_t v, const char* name) {
    if (int rc =
            kc::ipc().wait_u32_geq(stream_, word(static_cast<uint32_t*>(st_.flags), block, q), v);
        rc != 0)
      return failed(fmt::format("waiting for rank {}'s {}", q, name), rc);
    if (timer_.on()) timer_.stamp(fmt::format("wait for rank {}'s {}", q, name));
    return Status::ok();
  }
  // One kernel: the fold of `in` into every one of `out` (a copy: one input, op sum, and no
  // output that is the input itself).
  Status fold(kernels::DType dt, kernels::RedOp op, const std::vector<const void*>& in,
              std::vector<void*> out, size_t n, int avg_n, const std::string& what) {
    if (in.size() == 1) std::erase(out, const_cast<void*>(in[0]));
    if (out.empty()) return Status::ok();
    if (int rc = kc::ipc().fold(dt, op, in.data(), int(in.size()), out.data(), int(out.size()), n,
                                avg_n, stream_);
        rc != 0)
      return failed(what, rc);
    if (timer_.on())  // "launching the reduction kernel" -> "reduction kernel"
      timer_.stamp(fmt::format("{} ({} bytes)",
                               what.starts_with("launching the ") ? what.substr(14) : what,
                               n * kernels::dtype_size(dt)));
    return Status::ok();
  }

  // The bounce buffer (device_bounce.h): before a call's first work, wait for the end of the last
  // call that used it (on whatever stream), then copy the staged input into its piece; after the
  // call's last wait, copy the staged output out of its piece and mark the end.
  Status bounce_in(const std::vector<const LocalBuffer*>& bufs) {
    if (!any_staged(bufs)) return Status::ok();
    if (int rc = kc::ipc().mark_wait(stream_, st_.bounce_mark); rc != 0)
      return failed("ordering after the last call through the bounce buffer", rc);
    for (const LocalBuffer* b : bufs)
      if (b->staged && (!b->output || b->partial))
        if (Status s = copy(b->user, b->at, b->bytes, "copying {} into the bounce buffer", b);
            !s.is_ok())
          return s;
    return Status::ok();
  }
  Status bounce_out(const std::vector<const LocalBuffer*>& bufs) {
    if (!any_staged(bufs)) return Status::ok();
    for (const LocalBuffer* b : bufs)
      if (b->staged && b->output)
        if (Status s = copy(b->at, b->user, b->bytes, "copying {} out of the bounce buffer", b);
            !s.is_ok())
          return s;
    if (int rc = kc::ipc().mark_record(stream_, &st_.bounce_mark); rc != 0)
      return failed("marking the end of a call through the bounce buffer", rc);
    return Status::ok();
  }

  // After a failure: the signals not yet written, so that no peer's stream waits for ever.
  void release(const std::vector<std::pair<uint32_t*, uint32_t>>& owed) {
    for (const auto& [word, v] : owed)
      if (word != nullptr) (void)kc::ipc().write_u32(stream_, word, v);
  }

 private:
  static DeviceTiming* timing(CommImpl& comm, DeviceIpc& st) {
    if (comm.device_timing_calls() == 0) return nullptr;
    if (!st.timing) {
      st.timing = std::make_shared<DeviceTiming>();
      st.timing->left = comm.device_timing_calls();
    }
    return st.timing.get();
  }
  static bool any_staged(const std::vector<const LocalBuffer*>& bufs) {
    return std::any_of(bufs.begin(), bufs.end(), [](const LocalBuffer* b) { return b->staged; });
  }
  Status copy(const void* from, const void* to, size_t bytes, const char* what,
              const LocalBuffer* b) {
    return fold(kernels::DType::kU8, kernels::RedOp::kSum, {from}, {const_cast<void*>(to)}, bytes,
                0, fmt::format(fmt::runtime(what), b->name));
  }
  Status failed(const std::string& what, int rc) {
    return make_error(Code::kSystemError, "{} failed: {}", what, ipc_error(rc));
  }

  CommImpl& comm_;
  DeviceIpc& st_;
  const int r_;
  void* const stream_;
  CallTimer timer_;
};

// Whether CUDA IPC cannot join the communicator's ranks -- several hosts, or more ranks than the
// flag words have room for -- and the call goes through host memory (device_staged.cc). The
// same answer on every rank; said once per communicator at CHORUS_DEBUG=INFO.
bool staged(CommImpl& comm, const char* call) {
  const int hosts = comm.hosts().nhosts();
  if (hosts == 1 && comm.size() <= kMaxDeviceRanks) return false;
  DeviceIpc& st = comm.device_ipc();
  if (!st.staged_said) {
    st.staged_said = true;
    log_info("rank {}: {} on device buffers: staged through host memory ({})", comm.rank(), call,
             hosts != 1 ? fmt::format("{} hosts; CUDA IPC maps memory of one host", hosts)
                        : fmt::format("{} ranks; CUDA IPC here takes at most {}", comm.size(),
                                      kMaxDeviceRanks));
  }
  return true;
}

std::string describe(const Record& x) {
  const OpKind k = static_cast<OpKind>(x.kind);
  std::string s = op_name(k);
  if (k == OpKind::kBarrier) return s;
  if (k == OpKind::kAllToAllv) return s + " of " + dtype_name(x.datatype);
  s += fmt::format(" of count {} of {}", x.count, dtype_name(x.datatype));
  if (k == OpKind::kAllReduce || k == OpKind::kReduce || k == OpKind::kReduceScatter)
    s += fmt::format(" by {}", redop_name(x.op));
  if (rule_for(k).root) s += fmt::format(" with root {}", x.root);
  return s;
}

// A gather's, scatter's or all-to-all's input that overlaps its output -- other than as this
// rank's own block of a gather's or scatter's root, which is then a copy onto itself -- is
// copied aside first (LocalBuffer::aside): else this rank's writes would change what it, or a
// peer, has still to read.
void set_aside(OpKind kind, int rank, size_t block_bytes, CallBuffers& bufs, Record& me) {
  if (kind != OpKind::kGather && kind != OpKind::kScatter && kind != OpKind::kAllToAll &&
      kind != OpKind::kAllToAllv)
    return;
  if (!bufs.send.used || !bufs.recv.used) return;  // gather, scatter: off the root
  const char* in = static_cast<const char*>(bufs.send.user);
  const char* out = static_cast<const char*>(bufs.recv.user);
  if (!(in < out + bufs.recv.bytes && out < in + bufs.send.bytes)) return;
  const size_t own = rank * block_bytes;
  if ((kind == OpKind::kGather && in == out + own) || (kind == OpKind::kScatter && out == in + own))
    return;
  bufs.send.aside = bufs.send.staged = true;
  bufs.send.handle = &me.send;
}

// What a copy moves its elements of `es` bytes as: an unsigned integer of their size, or bytes
// (2-byte elements) -- never the call's type, whose fold would quiet a signalling NaN of f16 or
// bf16 on its way through float: a copy's bytes arrive as sent.
kernels::DType copy_type(size_t es) {
  return es == 8 ? kernels::DType::kU64 : es == 4 ? kernels::DType::kU32 : kernels::DType::kU8;
}

// All-to-all-v: every rank's four arrays, through the host (an all-gather), into `flat` (rank
// q's at 4p * q: sendcounts, sdispls, recvcounts, rdispls) and `per_rank` (pointing into it);
// every pair's counts checked on every rank, so that all fail alike.
chorusResult_t exchange_counts(chorusComm_t h, const Call& call, const Args& a, int r, int p,
                               std::vector<size_t>& flat, std::vector<PerRankCounts>& per_rank) {
  std::vector<size_t> mine;
  for (const size_t* arr : {a.sendcounts, a.sdispls, a.recvcounts, a.rdispls})
    mine.insert(mine.end(), arr, arr + p);
  flat.assign(mine.size() * p, 0);
  if (chorusResult_t rc = run_op({call.name, OpKind::kAllGather, false}, h,
                                 {.sendbuff = mine.data(),
                                  .recvbuff = flat.data(),
                                  .count = mine.size() * sizeof(size_t),
                                  .datatype = chorusUint8});
      rc != chorusSuccess)
    return rc;
  per_rank.resize(p);
  for (int q = 0; q < p; ++q) {
    const size_t* f = flat.data() + 4 * p * q;
    per_rank[q] = {f, f + p, f + 2 * p, f + 3 * p};
  }
  if (auto [from, to] = device_alltoallv_mismatch(per_rank); from >= 0)
    return fail(Code::kMismatch,
                "{} on rank {}: rank {} sends {} elements to rank {}, which expects {} from it",
                call.name, r, from, per_rank[from].sendcounts[to], to,
                per_rank[to].recvcounts[from]);
  return chorusSuccess;
}

bool same_call(const Record& a, const Record& b) {
  return a.kind == b.kind && a.count == b.count && a.datatype == b.datatype && a.op == b.op &&
         a.root == b.root;
}

}  // namespace

chorusResult_t device_collective(chorusComm_t h, CommImpl& comm, const Call& call, const Args& a) {
  const int r = comm.rank(), p = comm.size();
  auto k = check_args(call, a, r, p, /*device=*/true);
  if (!k.is_ok()) return report(k.status());
  if (staged(comm, call.name)) return staged_collective(h, comm, call, a, k->elem_size);
  const OpRule& rule = rule_for(call.kind);
  const bool v = call.kind == OpKind::kAllToAllv;  // per-rank counts, blocks anywhere
  Record me{};
  me.count = v ? 0 : a.count;
  me.kind = int32_t(call.kind);
  me.datatype = call.kind == OpKind::kBarrier ? 0 : a.datatype;
  me.op = rule.reduction ? a.op : -1;
  me.root = rule.root ? a.root : -1;
  if (call.kind != OpKind::kBarrier && !v && a.count == 0)
    return chorusSuccess;  // as NCCL: nothing to do, nothing enqueued, no exchange
  const size_t es = k->elem_size;
  CallBuffers bufs;
  bufs.send.user = a.sendbuff;
  bufs.recv.user = a.recvbuff;
  if (v) {
    bufs.send.bytes = device_extent(a.sendcounts, a.sdispls, p) * es;
    bufs.recv.bytes = device_extent(a.recvcounts, a.rdispls, p) * es;
    bufs.send.used = bufs.send.bytes > 0;
    bufs.recv.used = bufs.recv.bytes > 0;
    bufs.recv.partial = true;  // the gaps between its blocks keep what they hold
  } else if (call.kind != OpKind::kBarrier) {
    bufs.send.bytes = device_send_count(call.kind, a.count, p) * es;
    bufs.recv.bytes = device_recv_count(call.kind, a.count, p) * es;
    bufs.send.used = device_uses_send(call.kind, r, a.root);
    bufs.recv.used = device_uses_recv(call.kind, r, a.root);
  }
  if (p == 1) {  // no peers: a copy when the call has one to make
    const void* in = static_cast<const char*>(a.sendbuff) + (v ? a.sdispls[0] * es : 0);
    void* out = static_cast<char*>(a.recvbuff) + (v ? a.rdispls[0] * es : 0);
    const size_t n = v ? a.sendcounts[0] * es : bufs.recv.bytes;
    if (!bufs.send.used || !bufs.recv.used || n == 0 || in == out) return chorusSuccess;
    if (int rc = kc::ipc().fold(kernels::DType::kU8, kernels::RedOp::kSum, &in, 1, &out, 1, n, 0,
                                a.stream);
        rc != 0)
      return fail(Code::kSystemError, "{} on rank 0: copying sendbuff to recvbuff failed: {}",
                  call.name, ipc_error(rc));
    return chorusSuccess;
  }
  DeviceIpc& st = comm.device_ipc();
  describe_self(st, bufs, me, r);
  if (me.ok) set_aside(call.kind, r, a.count * es, bufs, me);
  if (me.ok)
    if (Status s = place_staged(st, std::array{&bufs.send, &bufs.recv}, r, call.name); !s.is_ok())
      set_why(me, s.message());
  std::vector<Record> all(p);
  if (chorusResult_t rc = run_op(
          {call.name, OpKind::kAllGather, false}, h,
          {.sendbuff = &me, .recvbuff = all.data(), .count = sizeof me, .datatype = chorusUint8});
      rc != chorusSuccess)
    return rc;
  for (int q = 0; q < p; ++q) {
    if (Status s = check_ok(all[q], q, r, call.name); !s.is_ok()) return report(s);
    if (!same_call(all[q], me))
      return fail(Code::kInvalidUsage,
                  "{} on rank {}: ranks disagree: rank {} calls {}, rank {} {}", call.name, r, r,
                  describe(me), q, describe(all[q]));
  }
  std::vector<size_t> flat;  // all-to-all-v: every rank's arrays
  std::vector<PerRankCounts> per_rank;
  if (v)
    if (chorusResult_t rc = exchange_counts(h, call, a, r, p, flat, per_rank); rc != chorusSuccess)
      return rc;

  if (comm.device_die_for_test() == r && st.seq.load() == 1)
    raise(SIGKILL);  // CHORUS_TEST_DEVICE_DIE
  const uint32_t seq = ++st.seq;
  size_state(st, p);
  bool one_gpu = true;
  for (int q = 0; q < p; ++q)
    one_gpu =
        one_gpu && all[q].gpu[0] != 0 && std::strncmp(all[q].gpu, all[0].gpu, sizeof me.gpu) == 0;
  const bool barrier = call.kind == OpKind::kBarrier;
  std::vector<std::pair<uint32_t*, uint32_t>> owed;  // every signal this call makes
  std::vector<DeviceTask> tasks;
  if (v)
    tasks = plan_device_alltoallv(p, r, one_gpu, per_rank);
  else if (!barrier)
    tasks = plan_device_op({.kind = call.kind,
                            .nranks = p,
                            .rank = r,
                            .root = a.root,
                            .count = a.count,
                            .align = std::max<size_t>(1, 16 / es),
                            .one_gpu = one_gpu});
  Enqueuer gpu(comm, st, r, a.stream,
               comm.device_timing_calls() ? fmt::format("{}: {}", call.name, describe(me)) : "");
  Status s;
  for (int q = 0; q < p && s.is_ok(); ++q) s = gpu.map_flags(q, all[q].flags);
  if (s.is_ok())
    for (int q = 0; q < p; ++q)
      if (q != r)
        for (FlagBlock b : {kReady, kDone})
          if (b == kReady || !barrier) owed.push_back({word(st.peer_flags[q], b, r), seq});
  if (s.is_ok()) {  // every VMM buffer to every other rank
    std::vector<VmmTransfer> moves;
    std::vector<int32_t> pids(p);
    for (int q = 0; q < p; ++q) {
      pids[q] = all[q].pid;
      for (const kc::IpcHandle* x : {&all[q].send, &all[q].recv})
        if (is_vmm_handle(*x))
          for (int t = 0; t < p; ++t)
            if (t != q) moves.push_back({q, t, x});
    }
    s = pass_vmm(comm, st, std::move(moves), std::move(pids));
  }

  // The tasks' buffers, mapped (own buffers are used as they are).
  std::map<std::pair<int, bool>, char*> mapped;
  auto buffer = [&](const BufRef& b) -> Result<char*> {
    auto key = std::make_pair(b.rank, b.recv);
    if (auto it = mapped.find(key); it != mapped.end()) return it->second + b.elem * es;
    void* ptr = b.recv ? bufs.recv.at : bufs.send.at;
    if (b.rank != r) {
      Result<void*> at = open_peer(st, b.rank, b.recv ? all[b.rank].recv : all[b.rank].send);
      if (!at.is_ok())
        return with_peer_news(
            comm, Status(Code::kSystemError,
                         fmt::format("mapping rank {}'s {} failed: {}", b.rank,
                                     b.recv ? "recvbuff" : "sendbuff", at.status().message())));
      ptr = *at;
    }
    mapped[key] = static_cast<char*>(ptr);
    return static_cast<char*>(ptr) + b.elem * es;
  };
  const kernels::DType dt = barrier ? kernels::DType::kU8 : *kernel_dtype(a.datatype);
  const kernels::RedOp op = rule.reduction ? *kernel_redop(a.op) : kernels::RedOp::kSum;
  std::vector<std::vector<const void*>> ins(tasks.size());
  std::vector<std::vector<void*>> outs(tasks.size());
  for (size_t i = 0; i < tasks.size() && s.is_ok(); ++i) {
    for (const BufRef& b : tasks[i].in) {
      Result<char*> ptr = buffer(b);
      if (!ptr.is_ok()) s = ptr.status();
      if (!ptr.is_ok()) break;
      ins[i].push_back(*ptr);
    }
    for (const BufRef& b : tasks[i].out) {
      Result<char*> ptr = s.is_ok() ? buffer(b) : Result<char*>(s);
      if (!ptr.is_ok()) s = ptr.status();
      if (!ptr.is_ok()) break;
      outs[i].push_back(*ptr);
    }
  }

  const std::vector<const LocalBuffer*> staged{&bufs.send, &bufs.recv};
  if (s.is_ok()) s = gpu.bounce_in(staged);
  for (int q = 0; q < p && s.is_ok(); ++q)
    if (q != r) s = gpu.signal(q, kReady, seq, "ready");
  for (int q = 0; q < p && s.is_ok(); ++q)
    if (q != r) s = gpu.wait(q, kReady, seq, "ready");
  const int avg_n = op == kernels::RedOp::kAvg ? p : 0;
  for (size_t i = 0; i < tasks.size() && s.is_ok(); ++i) {
    const DeviceTask& t = tasks[i];
    s = t.reduce ? gpu.fold(dt, op, ins[i], outs[i], t.count, avg_n,
                            "launching the reduction "
                            "kernel")
                 : gpu.fold(copy_type(es), kernels::RedOp::kSum, ins[i], outs[i],
                            t.count * es / kernels::dtype_size(copy_type(es)), 0,
                            fmt::format("copying rank {}'s {}", t.in[0].rank,
                                        t.in[0].recv ? "recvbuff" : "sendbuff"));
  }
  for (int q = 0; q < p && s.is_ok() && !barrier; ++q)
    if (q != r) s = gpu.signal(q, kDone, seq, "done");
  for (int q = 0; q < p && s.is_ok() && !barrier; ++q)
    if (q != r) s = gpu.wait(q, kDone, seq, "done");
  if (s.is_ok()) s = gpu.bounce_out(staged);
  if (s.is_ok()) return finish(comm, call.name);
  gpu.release(owed);
  const Status why(Code::kSystemError, fmt::format("{} on rank {}: {}", call.name, r, s.message()));
  comm.abort(why.message());
  return report(why);
}

namespace {

// A send/recv item's record: what it moves and to or from whom. Only a send's buffer is shared
// (the receiver copies from it into its own).
// `me` stays where it is: a staged buffer's handle is exported into it later (place_staged).
void p2p_record(DeviceIpc& st, const DeviceP2p& it, CallBuffers& bufs, Record& me, int rank) {
  const bool send = it.call.kind == OpKind::kSend;
  me = Record{};
  me.count = it.args.count;
  me.kind = int32_t(it.call.kind);
  me.datatype = it.args.datatype;
  me.op = -1;
  me.root = it.args.peer;
  LocalBuffer& b = send ? bufs.send : bufs.recv;
  b.user = send ? it.args.sendbuff : it.args.recvbuff;
  b.used = me.count > 0;
  b.shared = send;
  b.bytes = me.count * dtype_size(me.datatype);
  describe_self(st, bufs, me, rank);
}

std::string describe_p2p(const Record& x, int owner) {
  const bool send = static_cast<OpKind>(x.kind) == OpKind::kSend;
  return fmt::format("rank {} {} count {} of {} {} rank {}", owner, send ? "sends" : "receives",
                     x.count, dtype_name(x.datatype), send ? "to" : "from", x.root);
}

}  // namespace

chorusResult_t device_p2p(chorusComm_t h, CommImpl& comm, const std::vector<DeviceP2p>& items) {
  const int r = comm.rank(), p = comm.size();
  if (items.empty()) return chorusSuccess;
  const char* name = items.size() == 1 ? items[0].call.name : "chorusGroupEnd";
  for (const DeviceP2p& it : items) {
    auto k = check_args(it.call, it.args, r, p, /*device=*/true);
    if (!k.is_ok()) return report(k.status());
    if (it.args.stream != items[0].args.stream)
      return fail(Code::kInvalidUsage,
                  "{} on rank {}: the device sends and receives of one group must use one stream "
                  "(got {} and {})",
                  name, r, static_cast<void*>(items[0].args.stream),
                  static_cast<void*>(it.args.stream));
  }
  if (staged(comm, name)) return staged_p2p(h, comm, items);
  DeviceIpc& st = comm.device_ipc();
  const size_t n = items.size();
  std::vector<Record> mine(n), theirs(n);
  std::vector<CallBuffers> bufs(n);
  std::vector<LocalBuffer*> sends;
  for (size_t i = 0; i < n; ++i) {
    p2p_record(st, items[i], bufs[i], mine[i], r);
    sends.push_back(&bufs[i].send);
  }
  // The group's staged sends share the bounce buffer, a piece each.
  if (std::all_of(mine.begin(), mine.end(), [](const Record& x) { return x.ok != 0; }))
    if (Status s = place_staged(st, sends, r, name); !s.is_ok())
      for (size_t i = 0; i < n; ++i)
        if (bufs[i].send.staged) set_why(mine[i], s.message());
  // The exchange: one record each way per item, all posted at once (a host group).
  chorusGroupStart();
  chorusResult_t rc = chorusSuccess;
  for (size_t i = 0; i < n && rc == chorusSuccess; ++i) {
    const int q = items[i].args.peer;
    rc =
        run_op({name, OpKind::kSend, false}, h,
               {.sendbuff = &mine[i], .count = sizeof(Record), .datatype = chorusUint8, .peer = q});
    if (rc == chorusSuccess)
      rc = run_op(
          {name, OpKind::kRecv, false}, h,
          {.recvbuff = &theirs[i], .count = sizeof(Record), .datatype = chorusUint8, .peer = q});
  }
  const chorusResult_t end = chorusGroupEnd();
  if (rc != chorusSuccess) return rc;
  if (end != chorusSuccess) return end;

  // Pairing, per peer: its sends meet this rank's receives in call order, and the other way.
  std::map<int, std::vector<const Record*>> peer_sends, peer_recvs;
  for (size_t i = 0; i < n; ++i) {
    const int q = items[i].args.peer;
    if (Status s = check_ok(mine[i], r, r, name); !s.is_ok()) return report(s);
    if (Status s = check_ok(theirs[i], q, r, name); !s.is_ok()) return report(s);
    (static_cast<OpKind>(theirs[i].kind) == OpKind::kSend ? peer_sends : peer_recvs)[q].push_back(
        &theirs[i]);
  }
  std::vector<const Record*> match(n);
  std::map<int, size_t> used_sends, used_recvs;
  for (size_t i = 0; i < n; ++i) {
    const int q = items[i].args.peer;
    const bool send = items[i].call.kind == OpKind::kSend;
    auto& list = send ? peer_recvs[q] : peer_sends[q];
    size_t& next = send ? used_recvs[q] : used_sends[q];
    if (next >= list.size()) {
      const Record* other = (send ? peer_sends[q] : peer_recvs[q]).empty()
                                ? nullptr
                                : (send ? peer_sends[q] : peer_recvs[q]).front();
      return fail(Code::kInvalidUsage, "{} on rank {}: {}, but rank {} has no matching {}{}{}",
                  name, r, describe_p2p(mine[i], r), q, send ? "receive" : "send",
                  other ? fmt::format(" ({}; ", describe_p2p(*other, q)) : std::string(),
                  other ? "to exchange both ways, group the calls with chorusGroupStart/End)" : "");
    }
    match[i] = list[next++];
    if (match[i]->count != mine[i].count || match[i]->datatype != mine[i].datatype)
      return fail(Code::kInvalidUsage, "{} on rank {}: {}, but {}", name, r,
                  describe_p2p(mine[i], r), describe_p2p(*match[i], q));
  }

  size_state(st, p);
  std::string what;  // for CHORUS_DEVICE_TIMING only: not made on every call
  if (comm.device_timing_calls())
    for (size_t i = 0; i < n; ++i) what += (i ? "; " : ": ") + describe_p2p(mine[i], r);
  Enqueuer gpu(comm, st, r, items[0].args.stream, name + what);
  Status s;
  std::vector<uint32_t> seq(n);
  std::vector<std::pair<uint32_t*, uint32_t>> owed;
  for (size_t i = 0; i < n && s.is_ok(); ++i) {
    if (mine[i].count == 0) continue;
    const int q = items[i].args.peer;
    s = gpu.map_flags(q, match[i]->flags);
    if (!s.is_ok()) break;
    if (items[i].call.kind == OpKind::kSend) {
      seq[i] = ++st.tx_seq[q];
      owed.push_back({word(st.peer_flags[q], kTxReady, r), seq[i]});
    } else {
      seq[i] = ++st.rx_seq[q];
      owed.push_back({word(st.peer_flags[q], kRxReady, r), seq[i]});
      owed.push_back({word(st.peer_flags[q], kRxDone, r), seq[i]});
    }
  }
  if (s.is_ok()) {  // the VMM sendbuffs to their receivers
    std::vector<VmmTransfer> moves;
    std::vector<int32_t> pids(p, 0);
    pids[r] = mine[0].pid;
    for (size_t i = 0; i < n; ++i) {
      const int q = items[i].args.peer;
      pids[q] = match[i]->pid;
      if (mine[i].count == 0) continue;
      if (items[i].call.kind == OpKind::kSend && is_vmm_handle(mine[i].send))
        moves.push_back({r, q, &mine[i].send});
      if (items[i].call.kind == OpKind::kRecv && is_vmm_handle(match[i]->send))
        moves.push_back({q, r, &match[i]->send});
    }
    s = pass_vmm(comm, st, std::move(moves), std::move(pids));
  }
  auto each = [&](bool sends, auto&& fn) {
    for (size_t i = 0; i < n && s.is_ok(); ++i)
      if (mine[i].count > 0 && (items[i].call.kind == OpKind::kSend) == sends)
        s = fn(i, items[i].args.peer);
  };
  std::vector<const LocalBuffer*> staged;
  for (size_t i = 0; i < n; ++i) staged.push_back(&bufs[i].send);
  if (s.is_ok()) s = gpu.bounce_in(staged);
  // Every signal of the group before any wait.
  each(true, [&](size_t i, int q) { return gpu.signal(q, kTxReady, seq[i], "data ready"); });
  each(false, [&](size_t i, int q) { return gpu.signal(q, kRxReady, seq[i], "buffer free"); });
  each(true, [&](size_t i, int q) { return gpu.wait(q, kRxReady, seq[i], "buffer free"); });
  each(false, [&](size_t i, int q) { return gpu.wait(q, kTxReady, seq[i], "data ready"); });
  each(false, [&](size_t i, int q) -> Status {
    Result<void*> src = open_peer(st, q, match[i]->send);
    if (!src.is_ok())
      return with_peer_news(
          comm, Status(Code::kSystemError, fmt::format("mapping rank {}'s sendbuff failed: {}", q,
                                                       src.status().message())));
    const void* in = *src;
    return gpu.fold(kernels::DType::kU8, kernels::RedOp::kSum, {in}, {items[i].args.recvbuff},
                    mine[i].count * dtype_size(mine[i].datatype), 0,
                    fmt::format("copying from rank {}", q));
  });
  each(false, [&](size_t i, int q) { return gpu.signal(q, kRxDone, seq[i], "copied"); });
  each(true, [&](size_t i, int q) { return gpu.wait(q, kRxDone, seq[i], "copied"); });
  if (s.is_ok()) s = gpu.bounce_out(staged);
  if (s.is_ok()) return finish(comm, name);
  gpu.release(owed);
  const Status why(Code::kSystemError, fmt::format("{} on rank {}: {}", name, r, s.message()));
  comm.abort(why.message());
  return report(why);
}

}  // namespace chorus::capi
