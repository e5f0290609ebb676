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
//         Ranks that share one GPU leave every task to one leader; then only the leader and each
//         peer meet (device_meet): a peer signals ready to the leader and waits for its done, the
//         leader waits for every ready and signals every done -- 2 stream memory operations a
//         call on each peer instead of 4(p-1) (an eager barrier still meets every rank, on
//         "ready" alone; a captured one meets as the other calls do, device_graph.h).
//   Send/recv: the sender signals "data ready", the receiver "buffer free"; each waits for the
//   other's; the receiver copies and signals "copied", which the sender waits for. In a group
//   every item signals before any item waits, so exchanges both ways cannot deadlock.
//   Captured into a CUDA graph, a collective's signals and waits go to flag words of its own,
//   0 and 1 with a reset after each wait (device_graph.h), not to the counted words below; a
//   send's and its receive's to their pair's, with "data ready" and "copied" only.
//   No kernel waits for another process; every cross-process wait is a stream memory
//   operation, which holds no SM (ranks sharing one GPU time-slice it; a spinning kernel would
//   stall them). Each rank signals before it waits.
//
// Flag words (32-bit, this rank's, written by peers): ready[q], done[q] (collectives, the count
// of device collectives), tx_ready[q] (q's sends to this rank), rx_ready[q] and rx_done[q] (q's
// receives from this rank), 32 of each. They lie in host memory shared with the peers and mapped
// for the GPU, or in device memory (device_words.h: where, and why host memory by default).
//
// What a rank that fails after the exchange does: it still writes every signal of the call to
// its peers (so that no stream waits for ever), aborts the communicator (every rank's next call
// fails naming why) and returns the error. A peer that dies instead (kill -9) signals nothing:
// when the communicator fails -- the watch channel names the dead rank within its deadline --
// every flag word of each survivor is set past every wait on it (release_device_waits: by a store
// of the host's into host words, by a stream of its own into device words), so that their
// streams go on (on void results) instead of waiting for ever, and their calls fail naming the
// dead rank. Ranks on several hosts (or more than 32, or
// on GPUs that cannot reach each other peer to peer) go through host memory instead
// (device_staged.cc: the progress thread runs the host collective, the stream waits on a flag
// word of its own, which the host part's end writes, failed or not: device_stage.h). VMM (cuMem)
// memory, which CUDA IPC cannot map, is mapped by the peers through its file descriptor where
// CUDA exports it as one (device_vmm.h: after the record exchange and before any GPU work, each
// allocation once per peer over a Unix socket); the rest -- stream-ordered memory, VMM memory
// without that handle type -- goes through a bounce buffer (device_bounce.h).
#include "collectives/device_ops.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <string>

#include "collectives/device_call.h"
#include "collectives/device_plan.h"
#include "collectives/op.h"
#include "common/log.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/ipc.h"
#include "kernels/cuda/memory.h"

namespace chorus {

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
  graph_release(st.graph);
  stage_graph_release(st.stage);
  void* flags = st.live_flags.load();
  if (flags == nullptr) return;
  const std::array<uint32_t, 5 * kMaxDeviceRanks> v = device_release_values(st);
  static_assert(sizeof v == kFlagBytes);
  // Host words (device_words.h): a store. (host_words was set before live_flags.)
  if (int rc = write_words(st.host_words, st.live_device.load(), flags, v.data(), v.size()); rc)
    log_warn("releasing this rank's device waits failed: {}",
             kernels::cuda::ipc().error_string(rc));
  // Again every 20 ms: a peer still alive may have signals of earlier calls in flight, which
  // would put a word back below a wait that the release had ended (its calls after the failure
  // signal nothing: they fail before any GPU work).
  start_keeper(st.keeper, st.live_device.load(),
               {{flags, v.size(), st.host_words, {v.begin(), v.end()}}});
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

// A gather's, scatter's or all-to-all's input that overlaps its output -- other than as this
// rank's own block of a gather's or scatter's root, which is then a copy onto itself -- is
// copied aside first (LocalBuffer::aside): else this rank's writes would change what it, or a
// peer, has still to read.
void set_aside(OpKind kind, int rank, size_t block_bytes, CallBuffers& bufs, devcall::Record& me) {
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
  if (int q = device_alltoallv_out_of_range(per_rank, kMaxBufferBytes / dtype_size(a.datatype));
      q >= 0)
    return fail(Code::kRemoteError,
                "{} on rank {}: rank {}'s counts and displacements arrived out of range (a block "
                "past what a buffer can hold): corrupt",
                call.name, r, q);
  if (auto [from, to] = device_alltoallv_mismatch(per_rank); from >= 0)
    return fail(Code::kMismatch,
                "{} on rank {}: rank {} sends {} elements to rank {}, which expects {} from it",
                call.name, r, from, per_rank[from].sendcounts[to], to,
                per_rank[to].recvcounts[from]);
  return chorusSuccess;
}

static_assert(kGraphBlockWords == kMaxDeviceRanks, "a slot's block holds a word per rank");

// This rank's part of the record about capture (device_graph.h): the slot a call captured into a
// CUDA graph takes (the communicator's slots made and exported at its first one), or -1; why not,
// when it cannot be captured.
void describe_capture(DeviceIpc& st, void* stream, devcall::Record& me) {
  me.graph = -1;
  if (!devcall::capturing(st, stream, me)) return;
  me.graph_free = settled_free(st.graph.slots->calls);
  if (me.graph_free == 0)
    return devcall::set_why(
        me, fmt::format("{} captured device collectives of this communicator are held by CUDA "
                        "graphs that live still, the most it holds (destroy the graphs no longer "
                        "replayed)",
                        kGraphSlots));
  me.graph = 0;  // the slot: the lowest free on every rank (after the exchange)
}

std::string describe_graph(const devcall::Record& x, int rank) {
  return fmt::format("rank {}'s stream is {}", rank,
                     x.graph < 0 ? "not being captured" : "being captured into a CUDA graph");
}

bool same_call(const devcall::Record& a, const devcall::Record& b) {
  return a.kind == b.kind && a.count == b.count && a.datatype == b.datatype && a.op == b.op &&
         a.root == b.root;
}

}  // namespace

chorusResult_t device_collective(chorusComm_t h, CommImpl& comm, const Call& call, const Args& a) {
  using namespace devcall;  // in the function: the unity build shares a namespace's using
  const int r = comm.rank(), p = comm.size();
  auto k = check_args(call, a, r, p, /*spaces_known=*/true);
  if (!k.is_ok()) return report(k.status());
  if (staged(comm, call.name)) return staged_collective(h, comm, call, a, k->elem_size);
  const OpRule& rule = rule_for(call.kind);
  const bool v = call.kind == OpKind::kAllToAllv;  // per-rank counts, blocks anywhere
  devcall::Record me{};
  me.graph = -1;
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
    const size_t n = v ? a.sendcounts[0] * es : bufs.recv.bytes;
    if (!bufs.send.used || !bufs.recv.used || n == 0) return chorusSuccess;
    const void* in = static_cast<const char*>(a.sendbuff) + (v ? a.sdispls[0] * es : 0);
    void* out = static_cast<char*>(a.recvbuff) + (v ? a.rdispls[0] * es : 0);
    if (in == out) return chorusSuccess;
    if (int rc = kc::ipc().fold(kernels::DType::kU8, kernels::RedOp::kSum, &in, 1, &out, 1, n, 0,
                                a.stream);
        rc != 0)
      return fail(Code::kSystemError, "{} on rank 0: copying sendbuff to recvbuff failed: {}",
                  call.name, ipc_error(rc));
    return chorusSuccess;
  }
  DeviceIpc& st = comm.device_ipc();
  describe_self(st, bufs, me, r);
  if (me.ok) describe_capture(st, a.stream, me);
  if (me.ok) set_aside(call.kind, r, a.count * es, bufs, me);
  if (me.ok)
    if (Status s = place_staged(st, std::array{&bufs.send, &bufs.recv}, r, call.name); !s.is_ok())
      set_why(me, s.message());
  if (me.ok && me.graph >= 0 && (bufs.send.staged || bufs.recv.staged))
    set_why(me,
            "a call captured into a CUDA graph needs memory that CUDA IPC maps (cudaMalloc, "
            "or VMM memory exported by descriptor): not the bounce buffer");
  std::vector<int> others;
  for (int q = 0; q < p; ++q)
    if (q != r) others.push_back(q);
  announce(st, me, others);
  const std::optional<Record> unspoilt = maybe_corrupt_for_test(me);
  std::vector<Record> all(p);
  if (chorusResult_t rc = run_op(
          {call.name, OpKind::kAllGather, false}, h,
          {.sendbuff = &me, .recvbuff = all.data(), .count = sizeof me, .datatype = chorusUint8});
      rc != chorusSuccess)
    return rc;
  if (unspoilt) me = all[r] = *unspoilt;  // a test's spoiling is of what the peers got
  for (int q : others)  // a peer may see none of it: the abort tells it, and ends its waits
    if (Status s = check_record(all[q], q, r, p, call.name); !s.is_ok()) {
      comm.abort(s.message());
      return report(s);
    }
  for (int q : others) take_news(st, q, all[q], me.graph >= 0);
  for (int q = 0; q < p; ++q)
    if (Status s = check_ok(all[q], q, r, call.name); !s.is_ok()) return report(s);
  for (int q = 0; q < p; ++q) {
    if (!same_call(all[q], me))
      return fail(Code::kInvalidUsage,
                  "{} on rank {}: ranks disagree: rank {} calls {}, rank {} {}", call.name, r, r,
                  describe_call(me), q, describe_call(all[q]));
    if ((all[q].graph >= 0) != (me.graph >= 0))
      return fail(Code::kInvalidUsage,
                  "{} on rank {}: ranks disagree: {}, {}: every rank captures a device call "
                  "into a CUDA graph, or none does",
                  call.name, r, describe_graph(me, r), describe_graph(all[q], q));
  }
  int slot = -1;  // >= 0: captured (device_graph.h), the lowest slot free on every rank
  if (me.graph >= 0) {
    uint64_t common = ~uint64_t(0);
    for (int q = 0; q < p; ++q) common &= all[q].graph_free;
    slot = nth_free(common, 0);
    if (slot < 0)
      return fail(Code::kInvalidUsage, "{}",
                  no_free_slot(fmt::format("{} on rank {}", call.name, r), "device collective",
                               "every rank"));
  }
  std::vector<size_t> flat;  // all-to-all-v: every rank's arrays
  std::vector<PerRankCounts> per_rank;
  if (v)
    if (chorusResult_t rc = exchange_counts(h, call, a, r, p, flat, per_rank); rc != chorusSuccess)
      return rc;

  if (comm.device_die_for_test() == r && st.seq.load() == 1) {  // CHORUS_TEST_DEVICE_DIE
    usleep(200 * 1000);  // the peers' exchange ends too (their last pieces may be in flight)
    raise(SIGKILL);
  }
  const uint32_t seq = slot < 0 ? ++st.seq : 0;  // a captured call's signals are 1s
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
  Enqueuer gpu(
      comm, st, r, a.stream,
      comm.device_timing_calls() ? fmt::format("{}: {}", call.name, describe_call(me)) : "",
      slot < 0);
  Status s;
  for (int q = 0; q < p && s.is_ok(); ++q) s = gpu.map_flags(q, all[q]);
  if (s.is_ok() && slot >= 0)  // the slot, until CUDA destroys the graph
    if (int rc = graph_hold(st.graph, a.stream, {{&st.graph.slots->calls, uint64_t(1) << slot}});
        rc != 0)
      s = make_error(Code::kSystemError,
                     "attaching the captured call's slot to the CUDA graph failed: {}",
                     ipc_error(rc));
  if (s.is_ok() && slot >= 0) s = gpu.capture_into(slot, all);
  // Whom this rank meets (device_plan.h): on one GPU the leader and each peer only.
  const int leader = v ? 0 : device_leader(call.kind, a.root);
  std::vector<DeviceMeet> meet(p);
  for (int q = 0; q < p; ++q)
    if (q != r)  // captured, a barrier meets on "done" too: its resets need it (device_graph.h)
      meet[q] = device_meet(r, q, leader, one_gpu, barrier && slot < 0);
  if (s.is_ok() && slot < 0)  // (a captured call's, owed into the graph, would not help)
    for (int q = 0; q < p; ++q) {
      if (meet[q].signal_ready) owed.push_back({word(st.peer_flags[q], kReady, r), seq});
      if (meet[q].signal_done) owed.push_back({word(st.peer_flags[q], kDone, r), seq});
    }
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
      Result<void*> at =
          open_peer(st, b.rank, b.recv ? all[b.rank].recv : all[b.rank].send, slot >= 0);
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
    if (meet[q].signal_ready) s = gpu.signal(q, kReady, seq, "ready");
  for (int q = 0; q < p && s.is_ok(); ++q)
    if (meet[q].wait_ready) s = gpu.wait(q, kReady, seq, "ready");
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
  for (int q = 0; q < p && s.is_ok(); ++q)
    if (meet[q].signal_done) s = gpu.signal(q, kDone, seq, "done");
  for (int q = 0; q < p && s.is_ok(); ++q)
    if (meet[q].wait_done) s = gpu.wait(q, kDone, seq, "done");
  if (s.is_ok()) s = gpu.bounce_out(staged);
  if (s.is_ok() && slot >= 0)  // for the keeper
    st.graph.live_calls.store(std::max(st.graph.live_calls.load(), slot + 1));
  if (s.is_ok()) {
    gpu.mark_end(slot >= 0);
    return finish(comm, call.name);
  }
  gpu.release(owed, staged);
  gpu.mark_end(slot >= 0);
  const Status why(Code::kSystemError, fmt::format("{} on rank {}: {}", call.name, r, s.message()));
  comm.abort(why.message());
  return report(why);
}

}  // namespace chorus::capi
