// All-reduce of device buffers over CUDA IPC, for ranks of one host (their GPUs, or one GPU
// they share with CHORUS_ALLOW_SHARED_GPU=1), after ../shared/notes/gpu-collectives.md and the
// measurements in bench/RESULTS.md ("First GPU run"):
//
//   host: every rank exports its sendbuff and recvbuff (legacy IPC handle + offset) and, at the
//         first call, its flag words; one host all-gather of these records through the
//         communicator (which also checks that every rank makes the same call); each rank maps
//         the others' buffers (cached per allocation) and enqueues, on the caller's stream:
//   GPU:  1. ready: write seq into every peer's ready[me] (a stream write-value: 9 us per round
//            trip on an H200, 30x faster than NCCL's 4-byte copy), then wait until every
//            ready[q] >= seq here: every rank's input is complete, its output free;
//         2. rank r reduces slice r of every rank's sendbuff (one fold kernel, reading peers'
//            memory directly) into slice r of its own recvbuff and copies that slice into every
//            peer's recvbuff (a copy kernel): each input byte is read once, and in place is
//            safe (slice r is read and written by rank r alone). Ranks that share one GPU
//            (equal UUIDs) leave every slice to rank 0 instead: see enqueue();
//         3. done: the same signal-then-wait on done[*]: no rank leaves before every peer has
//            written its slice here and stopped reading this rank's buffers.
//   No kernel waits for another process; every cross-process wait is a stream memory
//   operation, which holds no SM (ranks sharing one GPU time-slice it; a spinning kernel would
//   stall them). Each rank signals before it waits.
//
// What a rank that fails after the exchange does: it still signals ready and done to every peer
// (so that no stream waits for ever), aborts the communicator (every rank's next call fails
// naming why) and returns the error. Not built yet: other collectives on device buffers, VMM
// (cuMem) and stream-ordered memory (no legacy handle: refused by name), ranks on several
// hosts, a deadline on the GPU-side waits (a peer killed mid-call leaves this rank's stream
// waiting; the host side fails the communicator as for host buffers).
#include "collectives/device_allreduce.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>

#include "collectives/c_api_internal.h"
#include "collectives/comm.h"
#include "collectives/op.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/ipc.h"
#include "kernels/cuda/memory.h"
#include "kernels/cuda/reduce.h"

namespace chorus {

bool device_buffers(const void* sendbuff, const void* recvbuff) {
  using kernels::cuda::MemSpace;
  for (const void* p : {sendbuff, recvbuff})
    if (p != nullptr && kernels::cuda::classify_pointer(p).space == MemSpace::kDevice) return true;
  return false;
}

}  // namespace chorus

namespace chorus::capi {
namespace {

namespace kc = kernels::cuda;

// What each rank tells the others, as raw bytes through a host all-gather.
struct Record {
  uint64_t count;
  int32_t datatype;
  int32_t op;
  int32_t ok;  // 0: `why` says what this rank could not do
  char why[180];
  char gpu[48];  // the UUID of this rank's GPU ("" if unknown)
  kc::IpcHandle flags, send, recv;
};

constexpr size_t kFlagBytes = 256;  // ready[p] and done[p], p <= 32, as 32-bit words

std::string where(const void* p) {
  kc::PointerInfo i = kc::classify_pointer(p);
  if (i.space == kc::MemSpace::kHost) return "host memory";
  return fmt::format("{} memory of CUDA device {}", kc::mem_space_name(i.space), i.device);
}

void set_why(Record& r, const std::string& why) {
  r.ok = 0;
  std::snprintf(r.why, sizeof r.why, "%s", why.c_str());
}

// This rank's part of the record: both buffers device memory of the current device, exported.
void describe_self(DeviceIpc& st, const void* send, void* recv, Record& me) {
  const int dev = kc::current_device();
  for (auto [p, name] :
       {std::pair<const void*, const char*>{send, "sendbuff"}, {recv, "recvbuff"}}) {
    kc::PointerInfo i = kc::classify_pointer(p);
    if (i.space != kc::MemSpace::kDevice || i.device != dev) {
      set_why(me, fmt::format("{} {} is {}, {}: both buffers must be memory of the current "
                              "device",
                              name, p, where(p),
                              dev < 0 ? std::string("and this process uses no CUDA device")
                                      : fmt::format("the current device is {}", dev)));
      return;
    }
  }
  if (st.flags == nullptr) {
    if (int rc = kc::flags_alloc(kFlagBytes, &st.flags); rc != 0) {
      set_why(me, "allocating its flag words failed: " + kc::ipc_error_string(rc));
      return;
    }
    st.device = dev;
    Result<std::optional<kc::GpuIdentity>> g = kc::current_gpu();
    if (g.is_ok() && g.value()) st.gpu = g.value()->uuid;
  }
  if (st.device != dev) {
    set_why(me, fmt::format("the current device is {}, but this communicator's device calls "
                            "ran on device {}",
                            dev, st.device));
    return;
  }
  std::snprintf(me.gpu, sizeof me.gpu, "%s", st.gpu.c_str());
  if (int rc = kc::ipc_export(st.flags, &me.flags); rc != 0) {
    set_why(me, "exporting its flag words failed: " + kc::ipc_error_string(rc));
    return;
  }
  if (int rc = kc::ipc_export(send, &me.send); rc != 0) {
    set_why(me, fmt::format("sendbuff {} cannot be shared with other processes ({}; cudaMalloc "
                            "memory can, VMM and cudaMallocAsync memory not yet)",
                            send, kc::ipc_error_string(rc)));
    return;
  }
  if (int rc = kc::ipc_export(recv, &me.recv); rc != 0) {
    set_why(me, fmt::format("recvbuff {} cannot be shared with other processes ({}; cudaMalloc "
                            "memory can, VMM and cudaMallocAsync memory not yet)",
                            recv, kc::ipc_error_string(rc)));
    return;
  }
  me.ok = 1;
}

// The enqueued part (steps 1-3 above). Returns 0 or the failing call's result; `what` names it.
int enqueue(const DeviceIpc& st, int r, int p, uint32_t seq, const std::vector<char*>& send,
            const std::vector<char*>& recv, kernels::DType dt, kernels::RedOp op, size_t count,
            bool one_gpu, void* stream, std::string* what) {
  const size_t es = kernels::dtype_size(dt);
  auto signal_then_wait = [&](int base, const char* name) {
    for (int q = 0; q < p; ++q)
      if (q != r)
        if (int rc = kc::stream_write_u32(stream, st.peer_flags[q] + base + r, seq); rc != 0) {
          *what = fmt::format("signalling {} to rank {}", name, q);
          return rc;
        }
    for (int q = 0; q < p; ++q)
      if (q != r)
        if (int rc = kc::stream_wait_u32_geq(stream, st.peer_flags[r] + base + q, seq); rc != 0) {
          *what = fmt::format("waiting for rank {}'s {}", q, name);
          return rc;
        }
    return 0;
  };
  if (int rc = signal_then_wait(0, "ready"); rc != 0) return rc;
  // Slices start on 16-byte boundaries of the buffers (the kernel's vector loads). Ranks that
  // share one GPU leave it all to rank 0: their contexts take turns on the GPU, so slices buy
  // no parallelism there and each turn costs about 300 us (bench/RESULTS.md).
  const size_t align = std::max<size_t>(1, 16 / es);
  const size_t per = one_gpu ? count : ((count + p - 1) / p + align - 1) / align * align;
  const size_t lo = one_gpu ? 0 : std::min(count, per * r);
  const size_t n = one_gpu ? (r == 0 ? count : 0) : std::min(per, count - lo);
  if (n > 0) {
    std::vector<const void*> in(p);
    for (int q = 0; q < p; ++q) in[q] = send[q] + lo * es;
    const int avg_n = op == kernels::RedOp::kAvg ? p : 0;
    if (int rc = kc::reduce_fold(dt, op, in.data(), p, recv[r] + lo * es, n, avg_n, stream);
        rc != 0) {
      *what = "launching the reduction kernel";
      return rc;
    }
    // The copies to peers by a kernel (a fold of one input), not the copy engine: a copy-engine
    // copy into another process's memory cost about 280 us on an H200 (bench/RESULTS.md).
    const void* mine = recv[r] + lo * es;
    for (int q = 0; q < p; ++q)
      if (q != r)
        if (int rc = kc::reduce_fold(dt, kernels::RedOp::kSum, &mine, 1, recv[q] + lo * es, n, 0,
                                     stream);
            rc != 0) {
          *what = fmt::format("copying the result to rank {}", q);
          return rc;
        }
  }
  return signal_then_wait(kFlagBytes / 8, "done");
}

// After a failure past the exchange: signal ready and done anyway, so that no peer's stream
// waits for this rank for ever.
void release_peers(const DeviceIpc& st, int r, int p, uint32_t seq, void* stream) {
  for (int base : {0, int(kFlagBytes / 8)})
    for (int q = 0; q < p; ++q)
      if (q != r && q < int(st.peer_flags.size()) && st.peer_flags[q] != nullptr)
        (void)kc::stream_write_u32(stream, st.peer_flags[q] + base + r, seq);
}

}  // namespace

chorusResult_t device_all_reduce(chorusComm_t h, CommImpl& comm, const char* call,
                                 const void* sendbuff, void* recvbuff, size_t count, int datatype,
                                 int op, void* stream) {
  const int r = comm.rank(), p = comm.size();
  const std::optional<kernels::DType> dt = kernel_dtype(datatype);
  const std::optional<kernels::RedOp> ro = kernel_redop(op);
  if (!dt)
    return fail(Code::kInvalidArgument, "{} on rank {}: datatype {} is not a chorusDataType_t",
                call, r, datatype);
  if (!ro)
    return fail(Code::kInvalidArgument, "{} on rank {}: op {} is not a chorusRedOp_t", call, r, op);
  const size_t es = kernels::dtype_size(*dt);
  if (count > kMaxBufferBytes / es)
    return fail(Code::kInvalidArgument,
                "{} on rank {}: count {} of {} is more than a buffer can hold", call, r, count,
                dtype_name(datatype));
  if (count > 0 && (sendbuff == nullptr || recvbuff == nullptr))
    return fail(Code::kInvalidArgument, "{} on rank {}: {} is NULL with count {}", call, r,
                sendbuff == nullptr ? "sendbuff" : "recvbuff", count);
  // The same answer on every rank: refused before any exchange.
  if (comm.hosts().nhosts() != 1)
    return fail(Code::kInvalidUsage,
                "{} on rank {}: device buffers across hosts are not supported yet ({} hosts; "
                "CUDA IPC maps memory of one host)",
                call, r, comm.hosts().nhosts());
  if (p > int(kFlagBytes / 8))
    return fail(Code::kInvalidUsage,
                "{} on rank {}: device buffers with more than {} ranks are "
                "not supported yet ({} ranks)",
                call, r, kFlagBytes / 8, p);
  if (count == 0) return chorusSuccess;  // as NCCL: nothing to do, nothing enqueued
  DeviceIpc& st = comm.device_ipc();
  if (p == 1) {
    int rc = sendbuff == recvbuff ? 0 : kc::copy_async(recvbuff, sendbuff, count * es, stream);
    if (rc != 0)
      return fail(Code::kSystemError, "{} on rank 0: copying sendbuff to recvbuff failed: {}", call,
                  kc::ipc_error_string(rc));
    return chorusSuccess;
  }

  Record me{};
  me.count = count;
  me.datatype = datatype;
  me.op = op;
  describe_self(st, sendbuff, recvbuff, me);
  std::vector<Record> all(p);
  if (chorusResult_t rc = run_op(
          {call, OpKind::kAllGather, false}, h,
          {.sendbuff = &me, .recvbuff = all.data(), .count = sizeof me, .datatype = chorusUint8});
      rc != chorusSuccess)
    return rc;
  for (int q = 0; q < p; ++q) {
    if (!all[q].ok)
      return fail(q == r ? Code::kInvalidArgument : Code::kRemoteError, "{} on rank {}: {}{}", call,
                  r, q == r ? "" : fmt::format("rank {}: ", q), all[q].why);
    if (all[q].count != count || all[q].datatype != datatype || all[q].op != op)
      return fail(Code::kInvalidUsage,
                  "{} on rank {}: ranks disagree: rank {} reduces count {} of {} by {}, rank {} "
                  "count {} of {} by {}",
                  call, r, r, count, dtype_name(datatype), redop_name(op), q, all[q].count,
                  dtype_name(all[q].datatype), redop_name(all[q].op));
  }

  const uint32_t seq = ++st.seq;
  std::vector<char*> send(p), recv(p);
  std::string failed;
  int rc = 0;
  if (st.peer_flags.empty()) {  // the first call: map every peer's flag words
    st.peer_flags.assign(p, nullptr);
    st.peer_flags[r] = static_cast<uint32_t*>(st.flags);
    for (int q = 0; q < p && rc == 0; ++q) {
      void* f = nullptr;
      if (q != r && (rc = kc::ipc_open(all[q].flags, &f)) != 0)
        failed = fmt::format("mapping rank {}'s flag words", q);
      if (q != r) st.peer_flags[q] = static_cast<uint32_t*>(f);
    }
  }
  for (int q = 0; q < p && rc == 0; ++q) {
    void* s = const_cast<void*>(sendbuff);
    void* d = recvbuff;
    if (q != r && (rc = kc::ipc_open(all[q].send, &s)) != 0)
      failed = fmt::format("mapping rank {}'s sendbuff", q);
    if (q != r && rc == 0 && (rc = kc::ipc_open(all[q].recv, &d)) != 0)
      failed = fmt::format("mapping rank {}'s recvbuff", q);
    send[q] = static_cast<char*>(s);
    recv[q] = static_cast<char*>(d);
  }
  bool one_gpu = true;
  for (int q = 0; q < p; ++q)
    one_gpu =
        one_gpu && all[q].gpu[0] != 0 && std::strncmp(all[q].gpu, all[0].gpu, sizeof me.gpu) == 0;
  if (rc == 0) rc = enqueue(st, r, p, seq, send, recv, *dt, *ro, count, one_gpu, stream, &failed);
  if (rc == 0) return chorusSuccess;
  release_peers(st, r, p, seq, stream);
  const Status why(Code::kSystemError, fmt::format("{} on rank {}: {} failed: {}", call, r, failed,
                                                   kc::ipc_error_string(rc)));
  comm.abort(why.message());
  return report(why);
}

}  // namespace chorus::capi
