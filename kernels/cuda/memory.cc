// Buffer classification, the part every build shares: the test hook and the names. What the
// driver says comes from memory_driver.cu (CUDA builds) or memory_none.cc (none).
#include "kernels/cuda/memory.h"

#include <atomic>

namespace chorus::kernels::cuda {
namespace {

std::atomic<PointerClassifier> g_test_classifier{nullptr};

}  // namespace

PointerInfo classify_pointer(const void* p) {
  if (PointerClassifier fn = g_test_classifier.load()) return fn(p);
  return driver_classify_pointer(p);
}

void set_pointer_classifier_for_test(PointerClassifier fn) {
  g_test_classifier.store(fn);
}

const char* mem_space_name(MemSpace s) {
  switch (s) {
    case MemSpace::kHost:
      return "host";
    case MemSpace::kDevice:
      return "device";
    case MemSpace::kManaged:
      return "managed";
  }
  return "?";
}

}  // namespace chorus::kernels::cuda
