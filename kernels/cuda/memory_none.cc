// Buffer classification in a build without CUDA: no devices, every pointer is host memory.
#include "kernels/cuda/memory.h"

namespace chorus::kernels::cuda {

int device_count() {
  return 0;
}

PointerInfo driver_classify_pointer(const void*) {
  return {};
}

}  // namespace chorus::kernels::cuda
