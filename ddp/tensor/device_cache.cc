// The device backend and the caching allocator (see device_cache.h).
#include "ddp/tensor/device_cache.h"

#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "kernels/cuda/memory.h"
#include "kernels/cuda/nn.h"

namespace chorus {
namespace {

// CUDA through kernels/cuda (the runtime linked statically; no devices without a driver).
class CudaBackend final : public DeviceBackend {
 public:
  int count() override { return kernels::cuda::device_count(); }
  void* alloc(Device d, size_t bytes) override {
    void* p = nullptr;
    check(kernels::cuda::device_alloc(d.index, bytes, &p), "allocating", d, bytes);
    return p;
  }
  void free(Device d, void* p) override {
    check(kernels::cuda::device_free(d.index, p), "freeing", d, 0);
  }
  void copy(void* dst, Device dst_dev, const void* src, Device src_dev, size_t bytes) override {
    if (kernels::cuda::nn::capturing())
      throw std::runtime_error(fmt::format(
          "copying {} bytes from {} to {} inside a captured step: copy into the step's static "
          "inputs before the replay, read its outputs after it",
          bytes, src_dev.str(), dst_dev.str()));
    int rc = kernels::cuda::device_copy(dst, src, bytes);
    if (rc)
      throw std::runtime_error(fmt::format("copying {} bytes from {} to {}: {}", bytes,
                                           src_dev.str(), dst_dev.str(),
                                           kernels::cuda::memory_error_string(rc)));
  }
  void add(Device d, long n, const float* a, const float* b, float* y) override {
    kernels::cuda::nn::set_device(d.index);
    kernels::cuda::nn::add(n, a, b, y);
  }
  void fill(Device d, long n, float value, float* y) override {
    kernels::cuda::nn::set_device(d.index);
    kernels::cuda::nn::fill(n, value, y);
  }
  // Streams and events are the DDP buckets'. The default stream (nullptr) is the legacy one,
  // or while this thread captures a step the capturing stream: an event recorded there and
  // waited for by the communication stream forks a bucket's all-reduce into the graph, and the
  // wait for an event behind it joins it back (cross-stream capture, as CUDA defines it).
  static void* stream_of(void* stream) {
    return stream ? stream : kernels::cuda::nn::capture_stream();
  }
  void* new_stream(Device d) override {
    if (kernels::cuda::nn::capturing())
      throw std::runtime_error(
          fmt::format("creating a stream on {} inside a captured step (DDP makes its streams at "
                      "construction)",
                      d.str()));
    void* s = nullptr;
    check(kernels::cuda::stream_create(d.index, &s), "creating a stream", d);
    return s;
  }
  void record_event(Device d, void* stream, void** event) override {
    check(kernels::cuda::event_record(d.index, stream_of(stream), event), "recording an event", d);
  }
  void wait_event(Device d, void* stream, void* event) override {
    check(kernels::cuda::stream_wait_event(d.index, stream_of(stream), event),
          "waiting for an event", d);
  }
  bool drained(Device d, const std::vector<void*>& streams, double seconds) override {
    std::vector<void*> events(streams.size(), nullptr);
    struct Free {
      std::vector<void*>& e;
      ~Free() {
        for (void* x : e) kernels::cuda::event_free(x);
      }
    } free_events{events};
    for (size_t i = 0; i < streams.size(); ++i)
      check(kernels::cuda::event_record(d.index, streams[i], &events[i]), "recording an event", d);
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    for (size_t i = 0; i < events.size();) {
      const int rc = kernels::cuda::event_query(events[i]);
      if (rc == 0) {
        ++i;
        continue;
      }
      if (rc != kernels::cuda::kEventPending) check(rc, "waiting for a stream", d);
      if (std::chrono::steady_clock::now() > end) return false;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    return true;
  }
  void capture_begin(Device d) override { kernels::cuda::nn::capture_begin(d.index); }
  void* capture_end(Device) override { return kernels::cuda::nn::capture_end(); }
  void graph_launch(Device d, void* graph) override {
    kernels::cuda::nn::set_device(d.index);
    kernels::cuda::nn::graph_launch(graph);
  }
  void graph_destroy(Device, void* graph) override { kernels::cuda::nn::graph_destroy(graph); }

 private:
  static void check(int rc, const char* what, Device d, size_t bytes) {
    if (rc)
      throw std::runtime_error(fmt::format("{} {} bytes on {}: {}", what, bytes, d.str(),
                                           kernels::cuda::memory_error_string(rc)));
  }
  static void check(int rc, const char* what, Device d) {
    if (rc)
      throw std::runtime_error(
          fmt::format("{} on {}: {}", what, d.str(), kernels::cuda::memory_error_string(rc)));
  }
};

std::atomic<DeviceBackend*> g_test_backend{nullptr};

struct Pool {
  int device = 0;
  bool released = false;
  std::map<size_t, std::vector<void*>> idle;  // size class -> idle blocks
  size_t blocks = 0;                          // owned, idle or in use
};

struct Cache {
  std::mutex mu;
  // (device index, size class) -> idle blocks
  std::map<std::pair<int, size_t>, std::vector<void*>> idle;
  DeviceCacheStats stats;
  std::map<int, Pool> pools;
  std::map<void*, int> owner;  // block -> the pool it belongs to
  int capturing = -1;          // the pool that serves every get now
  int next_pool = 0;
};

Cache& cache() {
  static Cache* c = new Cache();  // never destroyed: storages may outlive static destruction
  return *c;
}

}  // namespace

void DeviceBackend::add(Device d, long, const float*, const float*, float*) {
  throw std::runtime_error(fmt::format("add on {}: this device backend has no kernels", d.str()));
}

void DeviceBackend::fill(Device d, long n, float value, float* y) {
  std::vector<float> v(static_cast<size_t>(n), value);
  copy(y, d, v.data(), Device::cpu(), v.size() * sizeof(float));
}

void* DeviceBackend::new_stream(Device) {
  return nullptr;
}
void DeviceBackend::record_event(Device, void*, void**) {}
void DeviceBackend::wait_event(Device, void*, void*) {}
bool DeviceBackend::drained(Device, const std::vector<void*>&, double) {
  return true;
}

namespace {
[[noreturn]] void cannot_capture(Device d) {
  throw std::runtime_error(
      fmt::format("{}: this device backend cannot capture a CUDA graph", d.str()));
}
}  // namespace

void DeviceBackend::capture_begin(Device d) {
  cannot_capture(d);
}
void* DeviceBackend::capture_end(Device d) {
  cannot_capture(d);
}
void DeviceBackend::graph_launch(Device d, void*) {
  cannot_capture(d);
}
void DeviceBackend::graph_destroy(Device, void*) {}

DeviceBackend& cuda_backend() {
  if (DeviceBackend* b = g_test_backend.load()) return *b;
  static CudaBackend real;
  return real;
}

void set_cuda_backend_for_test(DeviceBackend* backend) {
  device_cache_release();
  g_test_backend.store(backend);
}

size_t device_size_class(size_t bytes) {
  const size_t unit = bytes < (size_t{1} << 20) ? 512 : (size_t{2} << 20);
  return bytes == 0 ? unit : (bytes + unit - 1) / unit * unit;
}

void* device_cache_get(Device d, size_t bytes) {
  if (d.is_cpu()) throw std::logic_error("device_cache_get: the cpu has its own buffer cache");
  DeviceBackend& backend = cuda_backend();
  const int n = backend.count();
  if (d.index < 0 || d.index >= n)
    throw std::invalid_argument(
        fmt::format("device {}: this process sees {} CUDA device(s){}", d.str(), n,
                    n == 0 ? " (no GPU, no driver, or a build without CUDA)" : ""));
  const size_t cls = device_size_class(bytes);
  Cache& c = cache();
  int pool = -1;  // a capturing pool of this device serves the get, else the common cache
  {
    std::lock_guard<std::mutex> lock(c.mu);
    if (c.capturing >= 0 && c.pools[c.capturing].device == d.index) pool = c.capturing;
    std::vector<void*>* idle = pool >= 0 ? &c.pools[pool].idle[cls] : nullptr;
    if (!idle)
      if (auto it = c.idle.find({d.index, cls}); it != c.idle.end()) idle = &it->second;
    if (idle && !idle->empty()) {
      void* p = idle->back();
      idle->pop_back();
      c.stats.reused++;
      c.stats.bytes_cached -= cls;
      c.stats.bytes_in_use += cls;
      return p;
    }
  }
  void* p = backend.alloc(d, cls);  // a pool's new block never comes from the common cache
  std::lock_guard<std::mutex> lock(c.mu);
  if (pool >= 0) {
    c.owner[p] = pool;
    c.pools[pool].blocks++;
  }
  c.stats.backend_allocs++;
  c.stats.bytes_in_use += cls;
  return p;
}

void device_cache_put(Device d, void* p, size_t bytes) {
  if (p == nullptr) return;
  const size_t cls = device_size_class(bytes);
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  c.stats.bytes_in_use -= cls;
  c.stats.bytes_cached += cls;
  if (auto o = c.owner.find(p); o != c.owner.end()) {
    Pool& pool = c.pools[o->second];
    if (!pool.released) {
      pool.idle[cls].push_back(p);
      return;
    }
    const int id = o->second;
    pool.blocks--;
    c.owner.erase(o);
    if (pool.blocks == 0) c.pools.erase(id);
  }
  c.idle[{d.index, cls}].push_back(p);
}

int device_pool_begin(Device d) {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  if (c.capturing >= 0)
    throw std::logic_error(
        fmt::format("device_pool_begin on {}: pool {} is capturing already", d.str(), c.capturing));
  const int id = c.next_pool++;
  c.pools[id].device = d.index;
  c.capturing = id;
  return id;
}

void device_pool_end(int pool) {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  if (c.capturing == pool) c.capturing = -1;
}

void device_pool_release(int pool) {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  auto it = c.pools.find(pool);
  if (it == c.pools.end() || it->second.released) return;
  if (c.capturing == pool) c.capturing = -1;
  Pool& p = it->second;
  p.released = true;
  for (auto& [cls, blocks] : p.idle)
    for (void* b : blocks) {
      c.owner.erase(b);
      p.blocks--;
      c.idle[{p.device, cls}].push_back(b);
    }
  p.idle.clear();
  if (p.blocks == 0) c.pools.erase(it);
}

size_t device_pool_blocks(int pool) {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  auto it = c.pools.find(pool);
  return it == c.pools.end() ? 0 : it->second.blocks;
}

void device_cache_release() {
  Cache& c = cache();
  std::map<std::pair<int, size_t>, std::vector<void*>> idle;
  {
    std::lock_guard<std::mutex> lock(c.mu);
    idle.swap(c.idle);
    c.stats.bytes_cached = 0;
  }
  DeviceBackend& backend = cuda_backend();
  size_t freed = 0;
  for (auto& [key, blocks] : idle)
    for (void* p : blocks) {
      backend.free(Device::cuda(key.first), p);
      ++freed;
    }
  std::lock_guard<std::mutex> lock(c.mu);
  c.stats.backend_frees += freed;
}

DeviceCacheStats device_cache_stats() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  return c.stats;
}

}  // namespace chorus
