// The driver's answers in a build without CUDA: no devices, every pointer is host memory, no
// rank has a GPU (but the test hook's fake one); IPC and kernels fail with kNoCuda.
#include "kernels/cuda/device.h"
#include "kernels/cuda/ipc.h"
#include "kernels/cuda/memory.h"
#include "kernels/cuda/reduce.h"

namespace chorus::kernels::cuda {

int device_count() {
  return 0;
}

int device_alloc(int, size_t, void** out) {
  *out = nullptr;
  return 100;
}
int device_free(int, void*) {
  return 100;
}
int stream_create(int, void** out) {
  *out = nullptr;
  return kNoCuda;
}
int event_record(int, void*, void**) {
  return kNoCuda;
}
int stream_wait_event(int, void*, void*) {
  return kNoCuda;
}
int timed_event_record(int, void*, void**) {
  return kNoCuda;
}
int event_elapsed_ms(void*, void*, float* ms) {
  *ms = 0;
  return kNoCuda;
}
void event_free(void*) {}
int event_query(void*) {
  return kNoCuda;
}
int event_query_on(int, void*) {
  return kNoCuda;
}
int device_copy(void*, const void*, size_t) {
  return 100;
}
const char* memory_error_string(int rc) {
  return rc ? "no CUDA in this build" : "no error";
}

PointerInfo driver_classify_pointer(const void*) {
  return {};
}

int driver_current_gpu(GpuIdentity*) {
  return 0;
}

int ipc_export(const void*, IpcHandle*) {
  return kNoCuda;
}
int ipc_open(const IpcHandle&, void** out) {
  *out = nullptr;
  return kNoCuda;
}
void ipc_close(const IpcHandle&) {}
void ipc_close_all() {}
int buffer_id(const void*, uint64_t* id) {
  *id = 0;
  return kNoCuda;
}
int vmm_identify(const void*, size_t, VmmAllocation*) {
  return kNoCuda;
}
int vmm_release(uint64_t) {
  return kNoCuda;
}
int vmm_export_fd(uint64_t, int* fd) {
  *fd = -1;
  return kNoCuda;
}
int vmm_map(int, uint64_t, void** out) {
  *out = nullptr;
  return kNoCuda;
}
int vmm_unmap(void*, uint64_t) {
  return kNoCuda;
}
int flags_alloc(size_t, void** out) {
  *out = nullptr;
  return kNoCuda;
}
void flags_free(void*) {}
int host_words_alloc(size_t, void** out) {
  *out = nullptr;
  return kNoCuda;
}
void host_unregister(void*) {}
int host_register(void*, size_t) {
  return kNoCuda;
}
int flags_release(int, void*, const uint32_t*, size_t) {
  return kNoCuda;
}
int mark_record(void*, void**) {
  return kNoCuda;
}
int mark_wait(void*, void*) {
  return kNoCuda;
}
int stamp_record(void*, void**) {
  return kNoCuda;
}
int stamp_ms(void*, void*, float* ms) {
  *ms = 0;
  return kNoCuda;
}
void stamp_free(void*) {}
int stream_write_u32(void*, void*, uint32_t) {
  return kNoCuda;
}
int stream_wait_u32_geq(void*, const void*, uint32_t) {
  return kNoCuda;
}
int copy_to_device(void*, const void*, size_t, void*) {
  return kNoCuda;
}
int pinned_alloc(size_t, void** out) {
  *out = nullptr;
  return kNoCuda;
}
void pinned_free(void*) {}
int copy_to_host_async(void*, const void*, size_t, void*) {
  return kNoCuda;
}
int stream_capturing(void*, int* out) {
  *out = 0;
  return kNoCuda;
}
int graph_destructor(void*, void (*)(void*), void*) {
  return kNoCuda;
}
int host_func(void*, void (*)(void*), void*) {
  return kNoCuda;
}
int current_device() {
  return -1;
}
int reduce_fold(DType, RedOp, const void* const*, int, void*, size_t, int, void*) {
  return kNoCuda;
}
int reduce_fold_to(DType, RedOp, const void* const*, int, void* const*, int, size_t, int, void*) {
  return kNoCuda;
}
std::string ipc_error_string(int rc) {
  return rc ? "no CUDA in this build" : "no error";
}

}  // namespace chorus::kernels::cuda
