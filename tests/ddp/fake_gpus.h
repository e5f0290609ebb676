// A fake GPU backend for host-side tests of device tensors (test_device.cc, test_checkpoint.cc).
#pragma once

#include <sys/mman.h>

#include <cstring>
#include <map>
#include <stdexcept>
#include <vector>

#include "ddp/tensor/device_cache.h"

namespace chorus::test {

// Two fake GPUs. A block's address is an inaccessible mapping (PROT_NONE), as a real device
// pointer is to the CPU: reading or writing it from host code crashes the test. Its bytes live
// in a shadow buffer that only copy() reaches, and copy() checks that each side is a live block
// of the device it is said to be on (or no block at all for the cpu).
class FakeGpus final : public DeviceBackend {
 public:
  ~FakeGpus() override {
    for (auto& [p, b] : blocks_) munmap(p, b.bytes);
  }
  int count() override { return 2; }
  void* alloc(Device d, size_t bytes) override {
    void* p = mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::runtime_error("fake: mmap failed");
    blocks_[p] = {d.index, bytes, std::vector<char>(bytes)};
    ++allocs;
    return p;
  }
  void free(Device d, void* p) override {
    auto it = blocks_.find(p);
    if (it == blocks_.end() || it->second.device != d.index)
      throw std::runtime_error("fake: freeing a block of another device");
    munmap(p, it->second.bytes);
    blocks_.erase(it);
    ++frees;
  }
  void copy(void* dst, Device dst_dev, const void* src, Device src_dev, size_t bytes) override {
    char* to = host_side(dst, dst_dev, bytes);
    const char* from = host_side(src, src_dev, bytes);
    std::memmove(to, from, bytes);
    ++copies;
  }
  size_t live() const { return blocks_.size(); }
  int allocs = 0, frees = 0, copies = 0;

 private:
  struct Block {
    int device;
    size_t bytes;
    std::vector<char> shadow;
  };
  // Where the bytes at p really are: the shadow of a block, or p itself for host memory.
  char* host_side(const void* p, Device d, size_t bytes) {
    const char* q = static_cast<const char*>(p);
    for (auto& [base, b] : blocks_) {
      const char* start = static_cast<const char*>(base);
      if (q >= start && q + bytes <= start + b.bytes) {
        if (d.is_cpu() || b.device != d.index)
          throw std::runtime_error("fake: a copy names the wrong device for a block");
        return b.shadow.data() + (q - start);
      }
    }
    if (!d.is_cpu()) throw std::runtime_error("fake: a copy names a device for host memory");
    return const_cast<char*>(q);
  }
  std::map<void*, Block> blocks_;
};

// Installs the fake for one test and takes it out again (the cache is emptied both times).
struct UseFake {
  FakeGpus gpus;
  UseFake() { set_cuda_backend_for_test(&gpus); }
  ~UseFake() { set_cuda_backend_for_test(nullptr); }
};

}  // namespace chorus::test
