// The driver's answers in a build without CUDA: no devices, every pointer is host memory, no
// rank has a GPU (but the test hook's fake one).
#include "kernels/cuda/device.h"
#include "kernels/cuda/memory.h"

namespace chorus::kernels::cuda {

int device_count() {
  return 0;
}

int device_alloc(int, size_t, void** out) {
  *out = nullptr;
  return 100;
}
int device_free(int, void*) {
  return 100;
}
int device_copy(void*, const void*, size_t) {
  return 100;
}
const char* memory_error_string(int rc) {
  return rc ? "no CUDA in this build" : "no error";
}

PointerInfo driver_classify_pointer(const void*) {
  return {};
}

int driver_current_gpu(GpuIdentity*) {
  return 0;
}

}  // namespace chorus::kernels::cuda
