// Size-keyed free lists of aligned f32 buffers.
#include "ddp/tensor/buffer_cache.h"

#include <cstdlib>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

namespace chorus {
namespace {

struct Cache {
  std::mutex mu;
  std::unordered_map<size_t, std::vector<float*>> free_lists;
};

Cache& cache() {
  static Cache* c = new Cache;  // never destroyed: storages may die during static destruction
  return *c;
}

size_t padded_bytes(size_t count) {
  return ((count * sizeof(float) + 63) / 64) * 64 + 64;
}

}  // namespace

float* buffer_cache_get(size_t count) {
  Cache& c = cache();
  {
    std::lock_guard<std::mutex> lock(c.mu);
    auto it = c.free_lists.find(count);
    if (it != c.free_lists.end() && !it->second.empty()) {
      float* p = it->second.back();
      it->second.pop_back();
      return p;
    }
  }
  void* p = std::aligned_alloc(64, padded_bytes(count));
  if (!p) throw std::bad_alloc();
  return static_cast<float*>(p);
}

void buffer_cache_put(float* data, size_t count) {
  if (!data) return;
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  c.free_lists[count].push_back(data);
}

void buffer_cache_release() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  for (auto& [count, list] : c.free_lists)
    for (float* p : list) std::free(p);
  c.free_lists.clear();
}

}  // namespace chorus
