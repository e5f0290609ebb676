// Buffer classification with CUDA: the driver's cuPointerGetAttributes, reached through
// cudaGetDriverEntryPointByVersion (libcuda.so is loaded by the static runtime at run time, never
// linked), so this library loads and runs on a machine with no driver; there every pointer is
// host memory.
#include <cuda.h>
#include <cuda_runtime.h>

#include <mutex>

#include "kernels/cuda/memory.h"

namespace chorus::kernels::cuda {
namespace {

using PointerGetAttributes = CUresult (*)(unsigned, CUpointer_attribute*, void**, CUdeviceptr);

struct Driver {
  int devices = 0;
  PointerGetAttributes get_attributes = nullptr;
};

const Driver& driver() {
  static Driver d;
  static std::once_flag once;
  std::call_once(once, [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n <= 0) {
      (void)cudaGetLastError();  // no driver or no device: not an error for a host-only job
      return;
    }
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuPointerGetAttributes", &fn, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess || fn == nullptr)
      return;
    d.get_attributes = reinterpret_cast<PointerGetAttributes>(fn);
    d.devices = n;
  });
  return d;
}

}  // namespace

int device_count() {
  return driver().devices;
}

PointerInfo driver_classify_pointer(const void* p) {
  const Driver& d = driver();
  if (d.devices == 0 || p == nullptr) return {};
  unsigned int type = 0, managed = 0;  // is_managed is written as a bool: keep the rest zero
  int ordinal = -1;
  CUpointer_attribute attrs[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_IS_MANAGED,
                                 CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL};
  void* data[] = {&type, &managed, &ordinal};
  // Not a CUDA pointer: CUDA_SUCCESS with every attribute left at its null value (host memory).
  if (d.get_attributes(3, attrs, data, reinterpret_cast<CUdeviceptr>(p)) != CUDA_SUCCESS) return {};
  if (managed) return {MemSpace::kManaged, ordinal};
  if (type == CU_MEMORYTYPE_DEVICE || type == CU_MEMORYTYPE_ARRAY)
    return {MemSpace::kDevice, ordinal};
  return {};
}

}  // namespace chorus::kernels::cuda
