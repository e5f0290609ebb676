// Storage: a block of f32 on one device, shared by the tensors that view it, and the Device
// enum that every layer above carries (CPU only today; the device lives here, with the memory).
#pragma once

#include <cstddef>

namespace chorus {

// Where a tensor's storage lives. Every op reaches its kernels through kernel_table_for(device)
// (ddp/ops/kernel_table.h), the one dispatch point.
enum class Device { kCpu, kCuda };
const char* device_name(Device d);

// A block of f32 on one device. Buffers come from and return to a size-keyed cache, so the
// training loop does not churn the heap (ddp/tensor/buffer_cache.h).
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
