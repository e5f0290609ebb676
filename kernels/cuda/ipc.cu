// CUDA IPC and stream memory operations (ipc.h), with the driver reached at run time.
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "kernels/cuda/driver_entry.h"
#include "kernels/cuda/ipc.h"
#include "kernels/cuda/memory.h"

namespace chorus::kernels::cuda {
namespace {

using GetAddressRange = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);
using PointerGetAttribute = CUresult (*)(void*, CUpointer_attribute, CUdeviceptr);
using StreamValue32 = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned);

struct Ops {
  bool ok = false;
  GetAddressRange address_range = nullptr;
  PointerGetAttribute pointer_attribute = nullptr;
  StreamValue32 write_value = nullptr;
  StreamValue32 wait_value = nullptr;
};

const Ops& ops() {
  static Ops o;
  static std::once_flag once;
  std::call_once(once, [] {
    if (device_count() == 0) return;
    o.ok = driver_entry("cuMemGetAddressRange", o.address_range) &&
           driver_entry("cuPointerGetAttribute", o.pointer_attribute) &&
           driver_entry("cuStreamWriteValue32", o.write_value) &&
           driver_entry("cuStreamWaitValue32", o.wait_value);
  });
  return o;
}

// Allocations mapped from other processes, by handle bytes. Never destroyed (a static
// destructor could run after the driver is gone).
struct Opened {
  std::mutex mu;
  std::map<std::string, void*> bases;
};

Opened& opened() {
  static Opened* o = new Opened;
  return *o;
}

}  // namespace

int ipc_export(const void* p, IpcHandle* out) {
  const Ops& o = ops();
  if (!o.ok) return kNoCuda;
  // VMM and stream-ordered memory: cudaIpcGetMemHandle would refuse it (or, for a pool, hand out
  // a handle of something else), so ask first.
  int legacy = 0;
  if (CUresult r = o.pointer_attribute(&legacy, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
                                       reinterpret_cast<CUdeviceptr>(p));
      r)
    return -int(r);
  if (!legacy) return kNotLegacyIpc;
  CUdeviceptr base = 0;
  size_t size = 0;
  if (CUresult r = o.address_range(&base, &size, reinterpret_cast<CUdeviceptr>(p)); r)
    return -int(r);
  cudaIpcMemHandle_t h;
  if (cudaError_t e = cudaIpcGetMemHandle(&h, reinterpret_cast<void*>(base)); e) return int(e);
  static_assert(sizeof h == sizeof out->bytes);
  std::memcpy(out->bytes, &h, sizeof h);
  out->offset = uint64_t(reinterpret_cast<CUdeviceptr>(p) - base);
  return 0;
}

int ipc_open(const IpcHandle& h, void** out) {
  if (!ops().ok) return kNoCuda;
  const std::string key(reinterpret_cast<const char*>(h.bytes), sizeof h.bytes);
  Opened& o = opened();
  std::lock_guard<std::mutex> lock(o.mu);
  auto it = o.bases.find(key);
  if (it == o.bases.end()) {
    cudaIpcMemHandle_t ch;
    std::memcpy(&ch, h.bytes, sizeof ch);
    void* base = nullptr;
    if (cudaError_t e = cudaIpcOpenMemHandle(&base, ch, cudaIpcMemLazyEnablePeerAccess); e)
      return int(e);
    it = o.bases.emplace(key, base).first;
  }
  *out = static_cast<char*>(it->second) + h.offset;
  return 0;
}

void ipc_close_all() {
  Opened& o = opened();
  std::lock_guard<std::mutex> lock(o.mu);
  for (auto& [key, base] : o.bases) cudaIpcCloseMemHandle(base);
  o.bases.clear();
}

int flags_alloc(size_t bytes, void** out) {
  *out = nullptr;
  if (!ops().ok) return kNoCuda;
  if (cudaError_t e = cudaMalloc(out, bytes); e) return int(e);
  // Zeroed before this returns: cudaMemset on the legacy default stream would be ordered after
  // nothing on the callers' non-blocking streams, so it could land after a peer's first signal
  // (or after a copy into a bounce buffer) and wipe it. A stream of its own, waited for here.
  cudaStream_t s = nullptr;
  cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  if (e == cudaSuccess) e = cudaMemsetAsync(*out, 0, bytes, s);
  if (e == cudaSuccess) e = cudaStreamSynchronize(s);
  if (s != nullptr) cudaStreamDestroy(s);
  return int(e);
}

int flags_release(int device, void* flags, const uint32_t* values, size_t count) {
  if (!ops().ok) return kNoCuda;
  // The calling thread (the watch thread, usually) may have used no device yet, or another one.
  if (cudaError_t e = cudaSetDevice(device); e) return int(e);
  // A stream of its own that does not wait for the legacy default stream, which waits for every
  // blocking stream: one of them is stuck on these very flags.
  static cudaStream_t side = nullptr;
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  if (side == nullptr)
    if (cudaError_t e = cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking); e) return int(e);
  // From pageable memory: staged before the call returns (the CUDA runtime's API
  // synchronization behaviour), so `values` may go at once.
  return int(
      cudaMemcpyAsync(flags, values, count * sizeof(uint32_t), cudaMemcpyHostToDevice, side));
}

int mark_record(void* stream, void** mark) {
  if (!ops().ok) return kNoCuda;
  return event_record(current_device(), stream, mark);
}

int mark_wait(void* stream, void* mark) {
  if (!ops().ok) return kNoCuda;
  if (mark == nullptr) return 0;
  return stream_wait_event(current_device(), stream, mark);
}

int stamp_record(void* stream, void** stamp) {
  if (!ops().ok) return kNoCuda;
  return timed_event_record(current_device(), stream, stamp);
}

int stamp_ms(void* from, void* to, float* ms) {
  return event_elapsed_ms(from, to, ms);
}

void stamp_free(void* stamp) {
  event_free(stamp);
}

int stream_write_u32(void* stream, void* word, uint32_t v) {
  const Ops& o = ops();
  if (!o.ok) return kNoCuda;
  // Flags 0: a memory barrier first, so the writes of the work before it are visible to whoever
  // sees the value.
  return -int(
      o.write_value(static_cast<CUstream>(stream), reinterpret_cast<CUdeviceptr>(word), v, 0));
}

int stream_wait_u32_geq(void* stream, const void* word, uint32_t v) {
  const Ops& o = ops();
  if (!o.ok) return kNoCuda;
  return -int(o.wait_value(static_cast<CUstream>(stream), reinterpret_cast<CUdeviceptr>(word), v,
                           CU_STREAM_WAIT_VALUE_GEQ));
}

int copy_to_host(void* dst, const void* src, size_t bytes, void* stream) {
  if (!ops().ok) return kNoCuda;
  auto s = static_cast<cudaStream_t>(stream);
  if (bytes > 0)
    if (cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s); e)
      return int(e);
  return int(cudaStreamSynchronize(s));
}

int copy_to_device(void* dst, const void* src, size_t bytes, void* stream) {
  if (!ops().ok) return kNoCuda;
  // From pageable memory: returns once `src` is staged, so the caller may free it.
  return int(
      cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, static_cast<cudaStream_t>(stream)));
}

int current_device() {
  if (device_count() == 0) return -1;
  int d = 0;
  return cudaGetDevice(&d) == cudaSuccess ? d : -1;
}

std::string ipc_error_string(int rc) {
  if (rc == 0) return "no error";
  if (rc == kNotFdExportable)
    return "not inside one VMM allocation that CUDA exports as a file descriptor";
  if (rc < 0) return "CUDA driver error " + std::to_string(-rc);
  return std::string(cudaGetErrorName(cudaError_t(rc))) + ": " +
         cudaGetErrorString(cudaError_t(rc));
}

}  // namespace chorus::kernels::cuda
