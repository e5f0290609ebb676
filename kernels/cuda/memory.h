// Where a buffer lives, as the CUDA driver sees it. Plain C++ interface, in every build: with
// CUDA (driver.cu, the driver reached through cudaGetDriverEntryPointByVersion, never
// linked) and without it (driver_none.cc: everything is host memory). The C API uses it to refuse
// device buffers clearly where a call moves host memory only, and to send device all-reduces
// down their own path (collectives/device_ops.cc).
#pragma once

#include <cstddef>

namespace chorus::kernels::cuda {

enum class MemSpace {
  kHost,     // ordinary or pinned host memory, or no CUDA on this machine
  kDevice,   // device memory (cudaMalloc, cuMem*), not readable by the CPU
  kManaged,  // managed (unified) memory: readable by the CPU
};

struct PointerInfo {
  MemSpace space = MemSpace::kHost;
  int device = -1;  // the device ordinal for kDevice / kManaged
};

// Devices the driver reports (0: no CUDA build, no driver or no device). Probed once; creates no
// context.
int device_count();

// What p points at. Costs nothing when device_count() is 0; otherwise one driver query, which
// creates no context either.
PointerInfo classify_pointer(const void* p);
// The same without the test hook (driver.cu or driver_none.cc).
PointerInfo driver_classify_pointer(const void* p);

// Device memory through the CUDA runtime, for tensors (ddp/tensor/device_cache.h). Each returns
// 0 or a cudaError_t value (memory_error_string names it); without CUDA, 100 (no device).
int device_alloc(int device, size_t bytes, void** out);
int device_free(int device, void* p);
int device_copy(void* dst, const void* src, size_t bytes);  // any direction (unified addressing)
const char* memory_error_string(int rc);
// Streams and events on `device`, for DDP's communication stream (ddp/tensor/device_cache.h): a
// stream that does not wait for the legacy default stream; an event recorded after the work on
// `stream` (nullptr: the legacy default stream), made at the first call into *event; `stream`
// made to wait for an event's latest record. None waits on the host.
int stream_create(int device, void** out);
int event_record(int device, void* stream, void** event);
int stream_wait_event(int device, void* stream, void* event);
// Timed events (CHORUS_DEVICE_TIMING): as event_record, but the event keeps its time; the
// milliseconds from `from` to `to` once both are reached (600, cudaErrorNotReady, before: it
// does not wait); an event's release.
int timed_event_record(int device, void* stream, void** event);
int event_elapsed_ms(void* from, void* to, float* ms);
void event_free(void* event);
// 0: the work before the event's record is done; kEventPending: not yet; else a CUDA error.
constexpr int kEventPending = 600;  // cudaErrorNotReady
int event_query(void* event);
// The same with `device` current for the query (DeviceScope, kernels/cuda/device_scope.h): for
// threads of chorus's, which may have used no device yet -- a query there would otherwise make
// device 0's primary context.
int event_query_on(int device, void* event);

// Tests: replace the classification (nullptr: back to the driver's).
using PointerClassifier = PointerInfo (*)(const void* p);
void set_pointer_classifier_for_test(PointerClassifier fn);

const char* mem_space_name(MemSpace s);

}  // namespace chorus::kernels::cuda
