// Storage: a block of f32 on one device, shared by the tensors that view it, and the Device
// that every layer above carries: cpu, or cuda:N (the device lives here, with the memory).
#pragma once

#include <cstddef>
#include <string>

namespace chorus {

// Where a tensor's storage lives. Every op reaches its kernels through kernel_table_for(device)
// (ddp/ops/kernel_table.h), the one dispatch point.
struct Device {
  enum Kind : int { kCpuKind, kCudaKind };
  Kind kind = kCpuKind;
  int index = -1;  // cuda: the device number in this process; cpu: -1

  static constexpr Device cpu() { return {}; }
  static constexpr Device cuda(int i) { return {kCudaKind, i}; }
  bool is_cpu() const { return kind == kCpuKind; }
  bool operator==(const Device&) const = default;
  std::string str() const;  // "cpu", "cuda:0"
  // "cpu", "cuda:N", "cuda" (= cuda:local_rank) or "auto" (cuda:local_rank when CUDA devices
  // are visible, else cpu). Throws std::invalid_argument naming the text otherwise.
  static Device parse(const std::string& text, int local_rank);
};

// A block of f32 on one device. Buffers come from and return to caches keyed by size, so the
// training loop allocates nothing after its first step: the CPU's buffer cache
// (ddp/tensor/buffer_cache.h) and, for devices, the caching allocator (device_cache.h).
class Storage {
 public:
  Storage(size_t count, Device device);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  float* data() { return data_; }
  size_t size() const { return size_; }
  Device device() const { return device_; }

 private:
  float* data_;
  size_t size_;
  Device device_;
};

}  // namespace chorus
