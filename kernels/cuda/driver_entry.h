// A CUDA driver function by name, through the runtime (cudaGetDriverEntryPointByVersion, CUDA
// 12 ABI), so that nothing links libcuda.so. For the .cu files of kernels/cuda only.
#pragma once

#include <cuda_runtime.h>

namespace chorus::kernels::cuda {

template <class Fn>
bool driver_entry(const char* name, Fn& out) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
  if (cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &found) !=
          cudaSuccess ||
      found != cudaDriverEntryPointSuccess || fn == nullptr)
    return false;
  out = reinterpret_cast<Fn>(fn);
  return true;
}

}  // namespace chorus::kernels::cuda
