// Device buffers where CUDA IPC cannot join the ranks (several hosts, more ranks than its flag
// words hold, GPUs that cannot reach each other): the input goes to page-locked host memory on
// the stream, the communicator's progress thread runs the host collective (shm within a host,
// tcp or verbs across) once that copy is done, and the stream copies the result back after a
// flag word says the host part ended (device_stage.h has the sequence). The calling thread only
// enqueues: it returns without waiting for the stream's earlier work or for the peers, as
// NCCL's network path does. In place or not, the host side runs out of place. On a stream being
// captured into a CUDA graph, a collective goes to staged_capture (device_staged_graph.cc).
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
#include <vector>

#include "collectives/c_api_internal.h"
#include "collectives/comm.h"
#include "collectives/device_call.h"
#include "collectives/device_ops.h"
#include "collectives/device_plan.h"
#include "common/log.h"
#include "kernels/cuda/ipc.h"

namespace chorus {

namespace kc = kernels::cuda;

void stage_signal(StageState& st, uint32_t n) {
  void* word = st.word.load();
  if (word == nullptr) return;
  std::lock_guard<std::mutex> lock(st.mu);
  if (static_cast<int32_t>(n - st.written) <= 0) return;  // cyclic, as the stream's wait
  st.written = n;
  if (int rc = write_words(st.host_word, st.device, word, &n, 1); rc)
    log_warn("signalling a staged device call's end failed: {}", kc::ipc().error_string(rc));
}

void stage_close(StageState& st, double timeout_s, bool graphs_live) {
  const kc::IpcBackend& ipc = kc::ipc();
  if (graphs_live) {
    size_t bytes = 0;
    for (const StageBuffer& b : st.buffers) bytes += b.bytes;
    if (bytes > 0)
      log_warn(
          "the staged device calls' host buffers ({} bytes) are left allocated: CUDA graphs "
          "still hold captured calls, and a free may wait for their replays",
          bytes);
    st.buffers.clear();
    return;
  }
  const Deadline end = Deadline::after_seconds(timeout_s);
  for (StageBuffer& b : st.buffers) {
    if (int rc = await_mark(st.device, b.done, end); rc != 0) {  // the GPU may still copy from it
      log_warn(
          "a staged device call's host buffer ({} bytes) is left allocated: its stream {}", b.bytes,
          rc == kc::kStampNotReady ? "has not got past it" : "failed: " + ipc.error_string(rc));
      continue;
    }
    ipc.pinned_free(b.host);
    ipc.mark_free(b.ready);
    ipc.mark_free(b.done);
  }
  st.buffers.clear();
}

}  // namespace chorus

namespace chorus::capi {
namespace {

namespace kc = kernels::cuda;

Status copy_failed(const char* call, int rank, const char* what, int rc) {
  return make_error(Code::kSystemError, "{} on rank {}: staging: {} failed: {}", call, rank, what,
                    kc::ipc().error_string(rc));
}

// Marks free the buffers whose last call's stream is done with them; the bytes held by the rest.
Result<size_t> refresh(StageState& st, const char* call, int rank) {
  const kc::IpcBackend& ipc = kc::ipc();
  size_t held = 0;
  for (StageBuffer& b : st.buffers) {
    if (b.used && b.done != nullptr) {  // (no done mark: its call failed half way; kept)
      const int rc = ipc.mark_done(st.device, b.done);
      if (rc != 0 && rc != kc::kStampNotReady)
        return copy_failed(call, rank, "asking whether a staging buffer is free", rc);
      b.used = rc != 0;
    }
    held += b.bytes;
  }
  return held;
}

// A staged call's page-locked buffer of at least `bytes` (nullptr when 0): one whose last call's
// stream is done with it, or a new one. Past st.max_bytes held (CHORUS_STAGED_MAX_BYTES) the free
// buffers go first, then the call waits for an earlier call's stream to finish with its buffer
// (bounded by the communicator's timeout): calls enqueued far ahead of their streams hold host
// memory only up to there. One buffer is always allowed, whatever its size.
Result<StageBuffer*> take_buffer(CommImpl& comm, StageState& st, size_t bytes, const char* call) {
  const kc::IpcBackend& ipc = kc::ipc();
  const int rank = comm.rank();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0;; ++i) {
    Result<size_t> held = refresh(st, call, rank);
    if (!held.is_ok()) return held.status();
    for (StageBuffer& b : st.buffers)
      if (!b.used && b.bytes >= bytes) return &b;
    for (StageBuffer& b : st.buffers)  // too small: freed, to make room
      if (!b.used && *held + bytes > st.max_bytes && b.bytes > 0) {
        ipc.pinned_free(b.host);
        *held -= b.bytes;
        b.host = nullptr;
        b.bytes = 0;
      }
    const bool waiting = std::any_of(st.buffers.begin(), st.buffers.end(),
                                     [](const StageBuffer& b) { return b.used; });
    if (*held + bytes <= st.max_bytes || !waiting) break;
    if (Status e = comm.error(); !e.is_ok()) return e;
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (waited > comm.timeout_seconds())
      return make_error(Code::kTimeout,
                        "{} on rank {}: staged through host memory: {} bytes of page-locked "
                        "memory (CHORUS_STAGED_MAX_BYTES={}) are held by earlier calls whose "
                        "streams have not finished with them after {:.0f} s ({})",
                        call, rank, *held, st.max_bytes, comm.timeout_seconds(),
                        comm.timeout_origin());
    usleep(i < 100 ? 50 : 1000);
  }
  // New memory, in an entry whose memory went above (past the limit) or a new one: never freed
  // here within the limit -- cudaFreeHost may wait for the whole device, whose streams may wait
  // for this communicator's host parts (and, on another thread, a capture in global mode would
  // refuse it). Up to the limit, smaller buffers stay for later calls.
  StageBuffer* spare = nullptr;
  for (StageBuffer& b : st.buffers)
    if (!b.used && b.host == nullptr) spare = &b;
  if (spare == nullptr) spare = &st.buffers.emplace_back();
  if (bytes > 0) {
    if (int rc = ipc.pinned_alloc(bytes, &spare->host); rc != 0)
      return copy_failed(call, rank,
                         fmt::format("allocating {} bytes of host memory", bytes).c_str(), rc);
    spare->bytes = bytes;
  }
  return spare;
}

// The stage word, at the communicator's first staged call (on the calling thread: flags_alloc
// makes the release stream that stage_signal writes on).
Status prepare(StageState& st, const char* call, int rank) {
  if (st.word.load() != nullptr) return Status::ok();
  const kc::IpcBackend& ipc = kc::ipc();
  st.device = ipc.current_device();
  void* word = nullptr;
  // With the captured calls' words behind it (device_stage.h), so that later captures allocate
  // none. When this call is itself captured, the allocations relax the thread's capture mode.
  const size_t bytes = (1 + kGraphSlots) * sizeof(uint32_t);
  int rc = st.want_host_words ? ipc.host_words_alloc(bytes, &word) : -1;
  st.host_word = rc == 0;
  if (rc != 0) {
    const std::string why = rc == -1 ? std::string("CHORUS_STAGE_WORDS=device")
                                     : "mapped host memory refused: " + ipc.error_string(rc);
    if (rc = ipc.flags_alloc(bytes, &word); rc != 0)
      return copy_failed(call, rank, "allocating its flag word", rc);
    log_info(
        "rank {}: staged device calls end on a flag word in device memory, written on a "
        "stream of its own ({})",
        rank, why);
  } else {
    log_info(
        "rank {}: staged device calls end on a flag word in mapped host memory, which the "
        "host part stores into (no stream behind the wait it ends)",
        rank);
  }
  st.word.store(word);
  return Status::ok();
}

// Until the stream's work before the call (the input's copy) is done: bounded by the
// communicator's timeout, and over at once when the communicator fails.
Status wait_ready(CommImpl& comm, void* ready, const char* call) {
  const kc::IpcBackend& ipc = kc::ipc();
  const int device = comm.device_ipc().stage.device;  // (this thread may have used none yet)
  const double limit = comm.timeout_seconds();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0;; ++i) {
    const int rc = ipc.mark_done(device, ready);
    if (rc == 0) return Status::ok();
    if (rc != kc::kStampNotReady)
      return copy_failed(call, comm.rank(), "waiting for the stream's work before the call", rc);
    if (Status e = comm.error(); !e.is_ok()) return e;
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (waited > limit)
      return make_error(Code::kTimeout,
                        "{} on rank {}: staged through host memory: the work enqueued on its "
                        "stream before the call has not finished after {:.0f} s ({})",
                        call, comm.rank(), limit, comm.timeout_origin());
    if (i < 64) {
      sched_yield();
    } else {
      usleep(i < 1000 ? 50 : 1000);
    }
  }
}

// Writes the call's number into the stage word when the last copy of its host part goes: after
// the progress thread ran it (and, when it failed, failed the communicator), or dropped it.
class Signal {
 public:
  Signal(StageState& st, uint32_t n) : st_(st), n_(n) {}
  Signal(const Signal&) = delete;
  Signal& operator=(const Signal&) = delete;
  ~Signal() { stage_signal(st_, n_); }

 private:
  StageState& st_;
  uint32_t n_;
};

// What the progress thread runs for a staged call: its host operation, once the input is there.
OpWrap wrap_for(CommImpl& comm, uint32_t n, void* ready, const char* call) {
  auto signal = std::make_shared<Signal>(comm.device_ipc().stage, n);
  return [signal, &comm, n, ready, call](OpFn fn) -> OpFn {
    return [signal, &comm, n, ready, call, fn = std::move(fn)](OpCtx& ctx) -> Status {
      comm.note_waiting(
          "waiting for the work enqueued on its stream before the call (device "
          "buffers staged through host memory)");
      Status s = wait_ready(comm, ready, call);
      comm.note_waiting("");
      if (!s.is_ok()) return s;
      if (comm.device_die_for_test() == comm.rank() && n == 2) {  // CHORUS_TEST_DEVICE_DIE
        usleep(200 * 1000);  // the peers are inside the host collective by then
        raise(SIGKILL);
      }
      s = fn(ctx);
      if (s.is_ok()) s = ctx.drain();  // nothing reads the input after this
      return s;
    };
  };
}

// The start of every staged call: a communicator that failed takes no more (its buffers may still
// be in an earlier call's hands).
Status usable(CommImpl& comm, const char* call) {
  Status e = comm.error();
  if (!e.is_ok())
    return Status(e.code(),
                  fmt::format("{} on rank {}: communicator is broken by an earlier error: {}", call,
                              comm.rank(), e.message()));
  return prepare(comm.device_ipc().stage, call, comm.rank());
}

// A failure after the stream was handed part of a call: the host part is queued, and the peers'
// with it, so the communicator cannot go on (every rank learns it at once).
chorusResult_t broken(CommImpl& comm, const Status& s) {
  abort_after_exception(comm, s);
  return report(s);
}

// A buffer the call moves bytes from or into (`name`: "sendbuff" or "recvbuff") that is not
// device memory of the current device (a host buffer beside a device one, another device's):
// refused before anything is enqueued, naming it -- the copies through host memory name their
// direction, and the other kind of memory there is undefined behaviour in CUDA. The peers' host
// parts would wait for this rank's: every rank learns it at once. nullopt: the buffer is fine.
std::optional<chorusResult_t> wrong_memory(CommImpl& comm, const char* call, const char* name,
                                           const void* p) {
  std::string why = devcall::not_device_memory(name, p, kc::ipc().current_device());
  if (why.empty()) return std::nullopt;
  return broken(comm, Status(Code::kInvalidArgument,
                             fmt::format("{} on rank {}: {} (staged through host memory)", call,
                                         comm.rank(), why)));
}

// A call that failed after enqueueing work on its buffer (a copy into it): the buffer stays taken
// until the stream gets past that work (its done mark), or for good when no mark can be made
// (refresh keeps a used buffer without one).
void held_by_stream(StageBuffer& b, void* stream) {
  b.used = true;
  if (kc::ipc().mark_record(stream, &b.done) != 0) b.done = nullptr;
}

constexpr size_t kAlign = 64;
size_t aligned(size_t n) {
  return (n + kAlign - 1) / kAlign * kAlign;
}

}  // namespace

chorusResult_t staged_collective(chorusComm_t h, CommImpl& comm, const Call& call, const Args& a,
                                 size_t elem_size) {
  const int r = comm.rank(), p = comm.size();
  const kc::IpcBackend& ipc = kc::ipc();
  StageState& st = comm.device_ipc().stage;
  if (Status s = usable(comm, call.name); !s.is_ok()) return report(s);
  const bool v = call.kind == OpKind::kAllToAllv;  // each side to its furthest block's end
  const bool barrier = call.kind == OpKind::kBarrier;
  const bool uses_send = !barrier && (v || device_uses_send(call.kind, r, a.root));
  const bool uses_recv = !barrier && (v || device_uses_recv(call.kind, r, a.root));
  const size_t in_bytes = !uses_send ? 0
                          : v        ? device_extent(a.sendcounts, a.sdispls, p) * elem_size
                                     : device_send_count(call.kind, a.count, p) * elem_size;
  const size_t out_bytes = !uses_recv ? 0
                           : v        ? device_extent(a.recvcounts, a.rdispls, p) * elem_size
                                      : device_recv_count(call.kind, a.count, p) * elem_size;
  if (in_bytes > 0)
    if (auto rc = wrong_memory(comm, call.name, "sendbuff", a.sendbuff)) return *rc;
  if (out_bytes > 0)
    if (auto rc = wrong_memory(comm, call.name, "recvbuff", a.recvbuff)) return *rc;
  int capturing = 0;
  if (int rc = ipc.capturing(a.stream, &capturing); rc != 0)
    return report(copy_failed(call.name, r, "asking whether the stream is being captured", rc));
  if (capturing)
    return staged_capture(h, comm, call, a,
                          {.in = in_bytes,
                           .out = out_bytes,
                           .in_at = 0,
                           .out_at = aligned(in_bytes),
                           .elem_size = elem_size,
                           .uses_send = uses_send,
                           .uses_recv = uses_recv});
  Result<StageBuffer*> got = take_buffer(comm, st, aligned(in_bytes) + out_bytes, call.name);
  if (!got.is_ok()) return report(got.status());
  StageBuffer& b = **got;
  char* in = static_cast<char*>(b.host);
  char* out = in == nullptr ? nullptr : in + aligned(in_bytes);
  // The ready mark also when there is nothing to copy: the stream's earlier work may still
  // write recvbuff (and a barrier waits for it).
  if (int rc = ipc.to_host_async(in, a.sendbuff, in_bytes, a.stream); rc != 0)
    return report(copy_failed(call.name, r, "copying sendbuff to host memory", rc));
  if (int rc = ipc.mark_record(a.stream, &b.ready); rc != 0) {
    held_by_stream(b, a.stream);  // the copy into it is enqueued
    return report(copy_failed(call.name, r, "marking the input's copy", rc));
  }
  const uint32_t n = ++st.calls;
  {
    HostStage stage(wrap_for(comm, n, b.ready, call.name));
    Args host = a;
    host.sendbuff = uses_send ? in : nullptr;
    host.recvbuff = uses_recv ? out : nullptr;
    host.stream = nullptr;
    if (chorusResult_t rc = run_op({call.name, call.kind, false}, h, host); rc != chorusSuccess) {
      held_by_stream(b, a.stream);
      return rc;
    }
  }
  b.used = true;  // from here the stream holds it, until its done mark
  if (int rc = ipc.wait_u32_geq(a.stream, st.word.load(), n); rc != 0)
    return broken(comm, copy_failed(call.name, r, "waiting for the host collective", rc));
  // All-to-all-v: its blocks only, the gaps between them as they were.
  for (int q = 0; q < (v ? p : 1) && out_bytes > 0; ++q) {
    const size_t at = v ? a.rdispls[q] * elem_size : 0,
                 bytes = v ? a.recvcounts[q] * elem_size : out_bytes;
    if (bytes == 0) continue;
    if (int rc = ipc.to_device(static_cast<char*>(a.recvbuff) + at, out + at, bytes, a.stream);
        rc != 0)
      return broken(comm, copy_failed(call.name, r, "copying the result to recvbuff", rc));
  }
  if (int rc = ipc.mark_record(a.stream, &b.done); rc != 0)
    return broken(comm, copy_failed(call.name, r, "marking the result's copy", rc));
  return chorusSuccess;
}

chorusResult_t staged_p2p(chorusComm_t h, CommImpl& comm, const std::vector<DeviceP2p>& items) {
  const int r = comm.rank();
  const char* name = items.size() == 1 ? items[0].call.name : "chorusGroupEnd";
  const kc::IpcBackend& ipc = kc::ipc();
  StageState& st = comm.device_ipc().stage;
  void* stream = items[0].args.stream;
  if (Status s = usable(comm, name); !s.is_ok()) return report(s);
  std::vector<size_t> at(items.size());
  size_t total = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const Args& a = items[i].args;
    at[i] = total;
    total += aligned(a.count * dtype_size(a.datatype));
    const bool send = items[i].call.kind == OpKind::kSend;
    if (a.count > 0)
      if (auto rc = wrong_memory(comm, name, send ? "sendbuff" : "recvbuff",
                                 send ? a.sendbuff : a.recvbuff))
        return *rc;
  }
  int capturing = 0;
  if (int rc = ipc.capturing(stream, &capturing); rc != 0)
    return report(copy_failed(name, r, "asking whether the stream is being captured", rc));
  if (capturing) return staged_p2p_capture(h, comm, items, at, total);
  Result<StageBuffer*> got = take_buffer(comm, st, total, name);
  if (!got.is_ok()) return report(got.status());
  StageBuffer& b = **got;
  char* base = static_cast<char*>(b.host);
  for (size_t i = 0; i < items.size(); ++i) {
    const Args& a = items[i].args;
    if (items[i].call.kind == OpKind::kSend)
      if (int rc =
              ipc.to_host_async(base + at[i], a.sendbuff, a.count * dtype_size(a.datatype), stream);
          rc != 0) {
        held_by_stream(b, stream);  // the copies before it are enqueued
        return report(copy_failed(name, r, "copying sendbuff to host memory", rc));
      }
  }
  if (int rc = ipc.mark_record(stream, &b.ready); rc != 0) {
    held_by_stream(b, stream);
    return report(copy_failed(name, r, "marking the inputs' copy", rc));
  }
  const uint32_t n = ++st.calls;
  {
    HostStage stage(wrap_for(comm, n, b.ready, name));
    chorusGroupStart();
    chorusResult_t rc = chorusSuccess;
    for (size_t i = 0; i < items.size() && rc == chorusSuccess; ++i) {
      Args host = items[i].args;
      host.stream = nullptr;
      if (items[i].call.kind == OpKind::kSend) {
        host.sendbuff = base + at[i];
      } else {
        host.recvbuff = base + at[i];
      }
      rc = run_op({name, items[i].call.kind, false}, h, host);
    }
    const chorusResult_t end = chorusGroupEnd();
    if (rc != chorusSuccess || end != chorusSuccess) {
      held_by_stream(b, stream);
      return rc != chorusSuccess ? rc : end;
    }
  }
  b.used = true;
  if (int rc = ipc.wait_u32_geq(stream, st.word.load(), n); rc != 0)
    return broken(comm, copy_failed(name, r, "waiting for the host transfers", rc));
  for (size_t i = 0; i < items.size(); ++i) {
    const Args& a = items[i].args;
    const size_t bytes = a.count * dtype_size(a.datatype);
    if (items[i].call.kind == OpKind::kRecv && bytes > 0)
      if (int e = ipc.to_device(a.recvbuff, base + at[i], bytes, stream); e != 0)
        return broken(comm, copy_failed(name, r, "copying into recvbuff", e));
  }
  if (int rc = ipc.mark_record(stream, &b.done); rc != 0)
    return broken(comm, copy_failed(name, r, "marking the results' copy", rc));
  return chorusSuccess;
}

}  // namespace chorus::capi
