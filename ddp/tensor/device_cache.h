// Device memory for tensors: the backend that allocates and copies it (CUDA's, through
// kernels/cuda, or a test's), and a caching allocator in front of it like PyTorch's: freed
// blocks are kept by size class and reused, so a training step calls the backend's allocator
// only until the caches hold every size it uses. Thread-safe.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

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
  // y[0..n) = value on device d (Tensor::fill, and so the optimizer's zero_grad): a kernel where
  // the backend has one; the default copies the values from the host.
  virtual void fill(Device d, long n, float value, float* y);
  // For DDP's communication stream (ddp/dist/distributed.h). new_stream: a stream of d that does
  // not wait for the default stream, where the tensor layer runs every kernel. record_event: an
  // event after the work already on `stream` (nullptr: the default stream), made at the first
  // call into *event. wait_event: later work on `stream` waits for the event's latest record.
  // Nothing waits on the host. While the calling thread captures a graph (capture_begin), the
  // default stream is the capturing one: a stream that waits for an event recorded there joins
  // the capture (its work goes into the graph), and must be waited for by it again before
  // capture_end (as CUDA's cross-stream capture). new_stream throws then. The defaults, for
  // backends whose work is done when enqueued: the default stream (nullptr), and events that
  // order nothing.
  virtual void* new_stream(Device d);
  virtual void record_event(Device d, void* stream, void** event);
  virtual void wait_event(Device d, void* stream, void* event);
  // Whether the work already on every one of `streams` of d (nullptr: the default stream) ends
  // within `seconds`: the host polls, and gives up then (elastic DDP, before it rolls back after
  // a failed step: ddp/dist/distributed.h). Throws on a CUDA error. The default: true.
  virtual bool drained(Device d, const std::vector<void*>& streams, double seconds);
  // CUDA graphs (ddp/train/step_graph.h). capture_begin: the calling thread's kernels on d are
  // recorded from here, not run; capture_end: what was recorded, as a graph (also when it throws,
  // the thread's kernels run again); graph_launch replays it after the work already enqueued,
  // before the work enqueued later (the default stream), until graph_destroy. copy() throws while
  // the calling thread captures. The defaults throw: the backend cannot capture.
  virtual void capture_begin(Device d);
  virtual void* capture_end(Device d);
  virtual void graph_launch(Device d, void* graph);
  virtual void graph_destroy(Device d, void* graph);
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

// A CUDA graph's memory (ddp/train/step_graph.h), as PyTorch's graph pools: between
// device_pool_begin and device_pool_end (the capture) every get of that device is served from the
// pool -- its idle blocks, else the backend -- and the block belongs to it; a put of a pool's
// block goes back to the pool, before and after device_pool_end, so that nothing outside the
// graph is ever handed memory its replays write. device_pool_release (the graph destroyed) gives
// the pool's idle blocks to the cache, and its blocks still in use go there when put. One pool
// captures at a time.
int device_pool_begin(Device d);
void device_pool_end(int pool);
void device_pool_release(int pool);
size_t device_pool_blocks(int pool);  // blocks the pool owns now, idle or in use

struct DeviceCacheStats {
  size_t backend_allocs = 0;  // calls of the backend's alloc since the start
  size_t backend_frees = 0;
  size_t reused = 0;        // gets served from the cache
  size_t bytes_in_use = 0;  // handed out, by size class
  size_t bytes_cached = 0;  // idle in the cache
};
DeviceCacheStats device_cache_stats();

}  // namespace chorus
