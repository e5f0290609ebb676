// CUDA IPC and stream memory operations (ipc.h), with the driver reached at run time.
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "kernels/cuda/capture_mode.h"
#include "kernels/cuda/device_scope.h"
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

// flags_release's streams, one a device, which wait for no other stream (the legacy default
// stream waits for every blocking one, and one of them is stuck on the very flags released).
// Made by flags_alloc, on the thread that sets up a communicator -- never at the release: that
// runs on the watch thread while the rank's own thread may sit in a blocking call behind the
// waits it ends (the loss's cudaMemcpy, on an H100), and creating a stream then waits for a
// driver lock that call holds: neither goes on (tests/cuda/test_cuda_release.cc). Never
// destroyed, like `opened`.
struct ReleaseStreams {
  std::mutex mu;
  std::map<int, cudaStream_t> by_device;
};

int release_stream(int device, bool create, cudaStream_t* out) {
  static ReleaseStreams* r = new ReleaseStreams;
  {
    std::lock_guard<std::mutex> lock(r->mu);
    auto it = r->by_device.find(device);
    if (it != r->by_device.end()) return *out = it->second, 0;
  }
  if (!create) return kReleaseUnprepared;
  cudaStream_t s = nullptr;
  if (cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking); e) return int(e);
  std::lock_guard<std::mutex> lock(r->mu);
  auto [it, made] = r->by_device.emplace(device, s);
  if (!made) cudaStreamDestroy(s);  // another thread's came first
  *out = it->second;
  return 0;
}

}  // namespace

int ipc_export(const void* p, IpcHandle* out) {
  const Ops& o = ops();
  if (!o.ok) return kNoCuda;
  const RelaxedCapture relaxed;  // capture_mode.h
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
  out->base = uint64_t(base);
  out->size = uint64_t(size);
  out->owner = 0;
  out->id = 0;
  return 0;
}

int ipc_open(const IpcHandle& h, void** out) {
  if (!ops().ok) return kNoCuda;
  const RelaxedCapture relaxed;  // capture_mode.h
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

void ipc_close(const IpcHandle& h) {
  const RelaxedCapture relaxed;  // capture_mode.h
  const std::string key(reinterpret_cast<const char*>(h.bytes), sizeof h.bytes);
  Opened& o = opened();
  std::lock_guard<std::mutex> lock(o.mu);
  auto it = o.bases.find(key);
  if (it == o.bases.end()) return;
  if (cudaIpcCloseMemHandle(it->second) != cudaSuccess) (void)cudaGetLastError();
  o.bases.erase(it);
}

int buffer_id(const void* p, uint64_t* id) {
  *id = 0;
  const Ops& o = ops();
  if (!o.ok) return kNoCuda;
  const RelaxedCapture relaxed;  // capture_mode.h
  unsigned long long v = 0;      // NOLINT(runtime/int): the attribute's type
  const CUresult r =
      o.pointer_attribute(&v, CU_POINTER_ATTRIBUTE_BUFFER_ID, reinterpret_cast<CUdeviceptr>(p));
  if (r == CUDA_ERROR_INVALID_VALUE) return kNotAllocated;
  if (r) return -int(r);
  *id = uint64_t(v);
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
  const RelaxedCapture relaxed;  // capture_mode.h
  int device = 0;
  if (cudaError_t e = cudaGetDevice(&device); e) return int(e);
  cudaStream_t s = nullptr;
  if (int rc = release_stream(device, true, &s); rc) return rc;
  if (cudaError_t e = cudaMalloc(out, bytes); e) return int(e);
  // Zeroed before this returns: cudaMemset on the legacy default stream would be ordered after
  // nothing on the callers' non-blocking streams, so it could land after a peer's first signal
  // (or after a copy into a bounce buffer) and wipe it. The release stream, waited for here.
  if (cudaError_t e = cudaMemsetAsync(*out, 0, bytes, s); e) return int(e);
  return int(cudaStreamSynchronize(s));
}

void flags_free(void* p) {
  if (p == nullptr || !ops().ok) return;
  const RelaxedCapture relaxed;  // as pinned_free: another thread may capture in global mode
  if (cudaFree(p) != cudaSuccess) (void)cudaGetLastError();
}

int host_words_alloc(size_t bytes, void** out) {
  *out = nullptr;
  if (!ops().ok) return kNoCuda;
  const RelaxedCapture relaxed;  // capture_mode.h: the first staged call may be a captured one
  void* host = nullptr;
  if (cudaError_t e = cudaHostAlloc(&host, bytes, cudaHostAllocMapped | cudaHostAllocPortable); e)
    return int(e);
  void* dev = nullptr;
  if (cudaError_t e = cudaHostGetDevicePointer(&dev, host, 0); e || dev != host) {
    (void)cudaFreeHost(host);
    (void)cudaGetLastError();
    return e ? int(e) : kNotLegacyIpc;
  }
  std::memset(host, 0, bytes);
  *out = host;
  return 0;
}

void host_unregister(void* p) {
  if (p == nullptr || !ops().ok) return;
  const RelaxedCapture relaxed;  // as pinned_free
  if (cudaHostUnregister(p) != cudaSuccess) (void)cudaGetLastError();
}

int host_register(void* p, size_t bytes) {
  if (!ops().ok) return kNoCuda;
  const RelaxedCapture relaxed;  // capture_mode.h: the first call may be a captured one
  // Registered already (the same mapping, reached twice): as good.
  if (cudaError_t e = cudaHostRegister(p, bytes, cudaHostRegisterPortable | cudaHostRegisterMapped);
      e) {
    (void)cudaGetLastError();
    if (e != cudaErrorHostMemoryAlreadyRegistered) return int(e);
  }
  void* dev = nullptr;
  if (cudaError_t e = cudaHostGetDevicePointer(&dev, p, 0); e || dev != p) {
    (void)cudaHostUnregister(p);
    (void)cudaGetLastError();
    return e ? int(e) : kNotLegacyIpc;
  }
  return 0;
}

int flags_release(int device, void* flags, const uint32_t* values, size_t count) {
  const Ops& o = ops();
  if (!o.ok) return kNoCuda;
  cudaStream_t s = nullptr;
  if (int rc = release_stream(device, false, &s); rc) return rc;
  // The calling thread (the watch thread, usually) may have used no device yet, or another one:
  // `device` for the writes, the caller's own again after them.
  const DeviceScope scope(device);
  if (scope.rc() != 0) return scope.rc();
  // Each word's value is the call's argument: nothing of `values` is read after this returns,
  // and no host memory is staged (a pageable copy could wait for staging buffers that a blocked
  // cudaMemcpy holds).
  const CUdeviceptr base = reinterpret_cast<CUdeviceptr>(flags);
  for (size_t i = 0; i < count; ++i)
    if (CUresult r = o.write_value(reinterpret_cast<CUstream>(s), base + 4 * i, values[i],
                                   CU_STREAM_WRITE_VALUE_DEFAULT);
        r)
      return -int(r);
  return 0;
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

int copy_to_device(void* dst, const void* src, size_t bytes, void* stream) {
  if (!ops().ok) return kNoCuda;
  // From pageable memory: returns once `src` is staged, so the caller may free it.
  return int(
      cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, static_cast<cudaStream_t>(stream)));
}

int pinned_alloc(size_t bytes, void** out) {
  *out = nullptr;
  if (!ops().ok) return kNoCuda;
  const RelaxedCapture relaxed;  // capture_mode.h
  // Portable: the memory is page-locked for every device, whichever is current here.
  return int(cudaHostAlloc(out, bytes == 0 ? 1 : bytes, cudaHostAllocPortable));
}

void pinned_free(void* p) {
  if (p == nullptr) return;
  // On the caller's thread while another may capture in global mode (capture_mode.h). Ignored
  // when it fails (the block stays allocated), and cleared: the thread's next launch check
  // (cudaGetLastError) must not take it as its own.
  const RelaxedCapture relaxed;
  if (cudaFreeHost(p) != cudaSuccess) (void)cudaGetLastError();
}

int copy_to_host_async(void* dst, const void* src, size_t bytes, void* stream) {
  if (!ops().ok) return kNoCuda;
  if (bytes == 0) return 0;
  return int(
      cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, static_cast<cudaStream_t>(stream)));
}

int stream_capturing(void* stream, int* out) {
  *out = 0;
  if (!ops().ok) return kNoCuda;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaError_t e = cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &status); e)
    return int(e);
  *out = status != cudaStreamCaptureStatusNone;
  return 0;
}

int graph_destructor(void* stream, void (*fn)(void*), void* arg) {
  if (!ops().ok) return kNoCuda;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  cudaGraph_t graph = nullptr;
  if (cudaError_t e =
          cudaStreamGetCaptureInfo(static_cast<cudaStream_t>(stream), &status, nullptr, &graph);
      e)
    return int(e);
  if (status != cudaStreamCaptureStatusActive || graph == nullptr)
    return int(cudaErrorStreamCaptureInvalidated);
  cudaUserObject_t object = nullptr;
  if (cudaError_t e = cudaUserObjectCreate(&object, arg, fn, 1, cudaUserObjectNoDestructorSync); e)
    return int(e);
  // The graph takes the reference: fn runs when the graph and its executable graphs are gone.
  // On failure the object is left as it is (a release would run fn, and the caller keeps arg).
  return int(cudaGraphRetainUserObject(graph, object, 1, cudaGraphUserObjectMove));
}

int host_func(void* stream, void (*fn)(void*), void* arg) {
  if (!ops().ok) return kNoCuda;
  return int(cudaLaunchHostFunc(static_cast<cudaStream_t>(stream), fn, arg));
}

int current_device() {
  if (device_count() == 0) return -1;
  int d = 0;
  return cudaGetDevice(&d) == cudaSuccess ? d : -1;
}

// ipc.h's answers of its own are no cudaError_t (the last is cudaErrorUnknown, 999).
static_assert(kNotLegacyIpc > int(cudaErrorUnknown) && kNotFdExportable > int(cudaErrorUnknown) &&
              kReleaseUnprepared > int(cudaErrorUnknown));

std::string ipc_error_string(int rc) {
  if (rc == 0) return "no error";
  if (rc == kReleaseUnprepared)
    return "no release stream on this device (flags_alloc makes it; none was called here)";
  if (rc == kNotLegacyIpc)
    return "no legacy CUDA IPC handle (VMM or stream-ordered memory, or a host address the GPU "
           "sees elsewhere)";
  if (rc == kNotFdExportable)
    return "not inside one VMM allocation that CUDA exports as a file descriptor";
  if (rc < 0) return "CUDA driver error " + std::to_string(-rc);
  return std::string(cudaGetErrorName(cudaError_t(rc))) + ": " +
         cudaGetErrorString(cudaError_t(rc));
}

}  // namespace chorus::kernels::cuda
