// Storage: cached f32 blocks on the CPU; any other device is refused until it has kernels.
#include "ddp/tensor/storage.h"

#include <fmt/format.h>

#include <stdexcept>

#include "ddp/tensor/buffer_cache.h"

namespace chorus {

const char* device_name(Device d) {
  return d == Device::kCpu ? "cpu" : "cuda";
}

Storage::Storage(size_t count, Device device) : size_(count), device_(device) {
  if (device != Device::kCpu)
    throw std::invalid_argument(
        fmt::format("storage: expected device cpu, got {} (not built yet)", device_name(device)));
  data_ = buffer_cache_get(count);
}

Storage::~Storage() {
  buffer_cache_put(data_, size_);
}

}  // namespace chorus
