// Device memory for tensors: the backend that allocates and copies it (CUDA's, through
// kernels/cuda, or a test's), and a caching allocator in front of it like PyTorch's: freed
// blocks are kept by size class and reused, so a training step calls the backend's allocator
// only until the caches hold every size it uses. Thread-safe.
#pragma once

#include <cstddef>
#include <string>

#include "ddp/tensor/storage.h"

namespace chorus {

// What a kind of device offers. Every call names its device; failures throw
// std::runtime_error naming the device and the bytes.
class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;
  virtual int count() = 0;  // devices visible to this process
  virtual void* alloc(Device d, size_t bytes) = 0;
  virtual void free(Device d, void* p) = 0;
  // bytes from src (on src_dev) to dst (on dst_dev); either side may be the cpu.
  virtual void copy(void* dst, Device dst_dev, const void* src, Device src_dev, size_t bytes) = 0;
  // y = a + b, n floats on device d: the one kernel the tensor layer itself runs (autograd's
  // accumulation of gradients). Throws where the backend has no kernels.
  virtual void add(Device d, long n, const float* a, const float* b, float* y);
  // For DDP's communication stream (ddp/dist/distributed.h). new_stream: a stream of d that does
  // not wait for the default stream, where the tensor layer runs every kernel. record_event: an
  // event after the work already on `stream` (nullptr: the default stream), made at the first
  // call into *event. wait_event: later work on `stream` waits for the event's latest record.
  // Nothing waits on the host. The defaults, for backends whose work is done when enqueued: the
  // default stream (nullptr), and events that order nothing.
  virtual void* new_stream(Device d);
  virtual void record_event(Device d, void* stream, void** event);
  virtual void wait_event(Device d, void* stream, void* event);
};

// The CUDA backend (no devices where CUDA is absent), or the test's when one is set.
DeviceBackend& cuda_backend();
void set_cuda_backend_for_test(DeviceBackend* backend);  // nullptr: the real one again

// Blocks are rounded up to a size class: 512 bytes below 1 MiB, 2 MiB above (as PyTorch's
// caching allocator rounds), so a step whose sizes vary a little still reuses them.
size_t device_size_class(size_t bytes);

void* device_cache_get(Device d, size_t bytes);  // bytes rounded to its class
void device_cache_put(Device d, void* p, size_t bytes);
void device_cache_release();  // gives every idle block back to its backend

struct DeviceCacheStats {
  size_t backend_allocs = 0;  // calls of the backend's alloc since the start
  size_t backend_frees = 0;
  size_t reused = 0;        // gets served from the cache
  size_t bytes_in_use = 0;  // handed out, by size class
  size_t bytes_cached = 0;  // idle in the cache
};
DeviceCacheStats device_cache_stats();

}  // namespace chorus
