#include <stdexcept>

#include "perf/device.h"

namespace perf::device {

std::string unavailable() {
  return "this build has no CUDA (meson -Dcuda=enabled, with nvcc)";
}
void init(int) {}
void* alloc(size_t) {
  throw std::runtime_error(unavailable());
}
void release(void*) {}
void to_device(void*, const void*, size_t) {}
void to_host(void*, const void*, size_t) {}
void* stream() {
  return nullptr;
}
void sync() {}
double copy_traffic_gbs(size_t) {
  return 0;
}
std::string name() {
  return "none";
}

}  // namespace perf::device
