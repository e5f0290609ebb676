// The driver's answers with CUDA (memory.h, device.h): entry points reached through
// cudaGetDriverEntryPointByVersion (libcuda.so is loaded by the static runtime at run time, never
// linked), so this library loads and runs on a machine with no driver; there every pointer is
// host memory and no rank has a GPU.
#include <cuda.h>
#include <cuda_runtime.h>

#include <cctype>
#include <cstdio>

#include "kernels/cuda/capture_mode.h"
#include "kernels/cuda/device_scope.h"
#include "kernels/cuda/driver_entry.h"
#include "kernels/cuda/gpu_identity.h"
#include "kernels/cuda/memory.h"

namespace chorus::kernels::cuda {
namespace {

using PointerGetAttributes = CUresult (*)(unsigned, CUpointer_attribute*, void**, CUdeviceptr);
using CtxGetCurrent = CUresult (*)(CUcontext*);
using CtxGetDevice = CUresult (*)(CUdevice*);
using DeviceGetUuid = CUresult (*)(CUuuid*, CUdevice);
using DeviceGetAttribute = CUresult (*)(int*, CUdevice_attribute, CUdevice);
using DeviceGetPCIBusId = CUresult (*)(char*, int, CUdevice);

struct Driver {
  int devices = 0;
  PointerGetAttributes get_attributes = nullptr;
  CtxGetCurrent ctx_get_current = nullptr;
  CtxGetDevice ctx_get_device = nullptr;
  DeviceGetUuid device_get_uuid = nullptr;
  DeviceGetAttribute device_get_attribute = nullptr;
  DeviceGetPCIBusId device_get_pci_bus_id = nullptr;
};

Driver probe() {
  Driver d;
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n <= 0) {
    (void)cudaGetLastError();  // no driver or no device: not an error for a host-only job
    return d;
  }
  if (!driver_entry("cuPointerGetAttributes", d.get_attributes) ||
      !driver_entry("cuCtxGetCurrent", d.ctx_get_current) ||
      !driver_entry("cuCtxGetDevice", d.ctx_get_device) ||
      !driver_entry("cuDeviceGetUuid", d.device_get_uuid) ||
      !driver_entry("cuDeviceGetAttribute", d.device_get_attribute) ||
      !driver_entry("cuDeviceGetPCIBusId", d.device_get_pci_bus_id))
    return Driver{};  // a driver older than CUDA 12: treated as none
  d.devices = n;
  return d;
}

// Probed once. A function-local static rather than std::call_once: every host collective asks
// (classify_pointer, several times a call), and call_once's thread-local bookkeeping cost more
// than the rest of an 8-byte all-reduce's checks.
const Driver& driver() {
  static const Driver d = probe();
  return d;
}

}  // namespace

int device_count() {
  return driver().devices;
}

PointerInfo driver_classify_pointer(const void* p) {
  const Driver& d = driver();
  if (d.devices == 0 || p == nullptr) return {};
  unsigned int type = 0, managed = 0;  // is_managed is written as a bool: keep the rest zero
  int ordinal = -1;
  CUpointer_attribute attrs[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_IS_MANAGED,
                                 CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL};
  void* data[] = {&type, &managed, &ordinal};
  // Not a CUDA pointer: CUDA_SUCCESS with every attribute left at its null value (host memory).
  if (d.get_attributes(3, attrs, data, reinterpret_cast<CUdeviceptr>(p)) != CUDA_SUCCESS) return {};
  if (managed) return {MemSpace::kManaged, ordinal};
  if (type == CU_MEMORYTYPE_DEVICE || type == CU_MEMORYTYPE_ARRAY)
    return {MemSpace::kDevice, ordinal};
  return {};
}

int driver_current_gpu(GpuIdentity* out) {
  const Driver& d = driver();
  if (d.devices == 0) return 0;
  // Also at a communicator's making inside a capture (the staged path splits one off at its first
  // captured collective): none of these touches a stream (capture_mode.h).
  const RelaxedCapture relaxed;
  CUcontext ctx = nullptr;
  if (d.ctx_get_current(&ctx) != CUDA_SUCCESS || ctx == nullptr) return 0;  // CUDA not used
  CUdevice dev = 0;
  CUuuid uuid{};
  char bus[32] = {0};
  GpuIdentity g;
  CUresult rc = d.ctx_get_device(&dev);
  if (rc == CUDA_SUCCESS) rc = d.device_get_uuid(&uuid, dev);
  if (rc == CUDA_SUCCESS) rc = d.device_get_pci_bus_id(bus, sizeof bus, dev);
  if (rc == CUDA_SUCCESS)
    rc = d.device_get_attribute(&g.compute_mode, CU_DEVICE_ATTRIBUTE_COMPUTE_MODE, dev);
  if (rc != CUDA_SUCCESS) return -int(rc);
  const auto* b = reinterpret_cast<const unsigned char*>(uuid.bytes);
  char text[64];
  std::snprintf(text, sizeof text,
                "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
                b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
                b[14], b[15]);
  g.uuid = text;
  g.ordinal = int(dev);
  g.bus_id = bus;
  for (int other = 0; other < d.devices; ++other) {  // the GPUs it can reach peer to peer
    int can = 0;
    char at[32] = {0};
    if (other == int(dev) || cudaDeviceCanAccessPeer(&can, int(dev), other) != cudaSuccess ||
        !can || cudaDeviceGetPCIBusId(at, sizeof at, other) != cudaSuccess) {
      (void)cudaGetLastError();
      continue;
    }
    if (!g.peers.empty()) g.peers += ',';
    g.peers += at;
  }
  for (std::string* s : {&g.bus_id, &g.peers})
    for (char& c : *s) c = char(std::tolower(static_cast<unsigned char>(c)));
  *out = g;
  return 1;
}

DeviceScope::DeviceScope(int device) {
  const Driver& d = driver();
  if (d.devices == 0) {
    rc_ = int(cudaErrorNoDevice);
    return;
  }
  // A thread with no context yet is made current on `device` (the driver calls after this need
  // a context: the release's stream writes) and stays there (device_scope.h).
  CUcontext ctx = nullptr;
  const bool had = d.ctx_get_current(&ctx) == CUDA_SUCCESS && ctx != nullptr;
  int previous = device;
  if (had) rc_ = int(cudaGetDevice(&previous));
  if (rc_ == 0 && (!had || previous != device)) rc_ = int(cudaSetDevice(device));
  if (rc_ == 0 && had && previous != device) restore_ = previous;
}

DeviceScope::~DeviceScope() {
  if (restore_ >= 0) (void)cudaSetDevice(restore_);
}

// Runs fn with `device` current, then makes the caller's device current again (DeviceScope).
template <class F>
int on_device(int device, F&& fn) {
  const DeviceScope scope(device);
  return scope.rc() != 0 ? scope.rc() : fn();
}

int device_alloc(int device, size_t bytes, void** out) {
  *out = nullptr;
  const RelaxedCapture relaxed;  // capture_mode.h
  return on_device(device, [&] { return int(cudaMalloc(out, bytes)); });
}

int device_free(int device, void* p) {
  return on_device(device, [&] { return int(cudaFree(p)); });
}

int device_copy(void* dst, const void* src, size_t bytes) {
  if (driver().devices == 0) return int(cudaErrorNoDevice);
  return int(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));
}

int stream_create(int device, void** out) {
  *out = nullptr;
  const RelaxedCapture relaxed;  // capture_mode.h
  return on_device(device, [&] {
    cudaStream_t s = nullptr;
    const int rc = int(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    *out = s;
    return rc;
  });
}

namespace {

// Records *event (made with `flags` at the first call) after the work on `stream`.
int record_event(int device, void* stream, void** event, unsigned flags) {
  return on_device(device, [&] {
    if (*event == nullptr) {
      const RelaxedCapture relaxed;  // capture_mode.h
      cudaEvent_t e = nullptr;
      if (cudaError_t rc = cudaEventCreateWithFlags(&e, flags); rc) return int(rc);
      *event = e;
    }
    return int(
        cudaEventRecord(static_cast<cudaEvent_t>(*event), static_cast<cudaStream_t>(stream)));
  });
}

}  // namespace

int event_record(int device, void* stream, void** event) {
  return record_event(device, stream, event, cudaEventDisableTiming);
}

int timed_event_record(int device, void* stream, void** event) {
  return record_event(device, stream, event, cudaEventDefault);
}

int event_elapsed_ms(void* from, void* to, float* ms) {
  *ms = 0;
  const RelaxedCapture relaxed;  // as event_query
  for (void* e : {from, to})
    if (cudaError_t rc = cudaEventQuery(static_cast<cudaEvent_t>(e)); rc) return int(rc);
  return int(
      cudaEventElapsedTime(ms, static_cast<cudaEvent_t>(from), static_cast<cudaEvent_t>(to)));
}

// The queries and the release run with this thread's capture mode relaxed (capture_mode.h):
// they run on chorus's threads and on the caller's while another thread may capture in global
// mode, where CUDA would refuse them and invalidate that capture (PyTorch's NCCL watchdog hit
// this: pytorch#104487). No event chorus queries was recorded inside a capture.
int event_query(void* event) {
  static_assert(kEventPending == int(cudaErrorNotReady));
  const RelaxedCapture relaxed;
  const cudaError_t rc = cudaEventQuery(static_cast<cudaEvent_t>(event));
  // A failure is the caller's to report: cleared, so that the thread's next launch check
  // (cudaGetLastError) does not take it as its own. "Not ready" is an answer, never kept.
  if (rc != cudaSuccess && rc != cudaErrorNotReady) (void)cudaGetLastError();
  return int(rc);
}

int event_query_on(int device, void* event) {
  return on_device(device, [&] { return event_query(event); });
}

void event_free(void* event) {
  if (event == nullptr) return;
  const RelaxedCapture relaxed;
  // Ignored: cleared, so that the next launch check (cudaGetLastError) does not take it as its own.
  if (cudaEventDestroy(static_cast<cudaEvent_t>(event)) != cudaSuccess) (void)cudaGetLastError();
}

int stream_wait_event(int device, void* stream, void* event) {
  return on_device(device, [&] {
    return int(
        cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), static_cast<cudaEvent_t>(event), 0));
  });
}

const char* memory_error_string(int rc) {
  return cudaGetErrorString(cudaError_t(rc));
}

}  // namespace chorus::kernels::cuda
