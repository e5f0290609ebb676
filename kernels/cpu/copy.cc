// Streaming copy (copy.h): runs the active instruction-set build (isa/copy.cc).
#include "kernels/cpu/copy.h"

#include <cstring>

#include "kernels/cpu/isa/table.h"

namespace chorus::kernels {

void copy_ref(void* dst, const void* src, size_t bytes) {
  if (bytes) std::memcpy(dst, src, bytes);
}

void copy_streaming(void* dst, const void* src, size_t bytes) {
  cpu_kernels().copy_streaming(dst, src, bytes);
}

}  // namespace chorus::kernels
