// Storage: cached f32 blocks on the CPU (buffer_cache) or on a device (device_cache).
#include "ddp/tensor/storage.h"

#include <fmt/format.h>

#include <cstdlib>
#include <stdexcept>

#include "ddp/tensor/buffer_cache.h"
#include "ddp/tensor/device_cache.h"

namespace chorus {

std::string Device::str() const {
  return is_cpu() ? "cpu" : fmt::format("cuda:{}", index);
}

Device Device::parse(const std::string& text, int local_rank) {
  if (text == "cpu") return cpu();
  if (text == "cuda") return cuda(local_rank < 0 ? 0 : local_rank);
  if (text == "auto")
    return cuda_backend().count() > 0 ? cuda(local_rank < 0 ? 0 : local_rank) : cpu();
  if (text.rfind("cuda:", 0) == 0 && text.size() > 5 && text.size() <= 9) {
    char* end = nullptr;
    const long i = std::strtol(text.c_str() + 5, &end, 10);
    if (*end == '\0' && text[5] >= '0' && text[5] <= '9' && i >= 0) return cuda(int(i));
  }
  throw std::invalid_argument(
      fmt::format("device: expected cpu, cuda, cuda:N or auto, got '{}'", text));
}

Storage::Storage(size_t count, Device device) : size_(count), device_(device) {
  data_ = device.is_cpu() ? buffer_cache_get(count)
                          : static_cast<float*>(device_cache_get(device, count * sizeof(float)));
}

Storage::~Storage() {
  if (device_.is_cpu())
    buffer_cache_put(data_, size_);
  else
    device_cache_put(device_, data_, size_ * sizeof(float));
}

}  // namespace chorus
