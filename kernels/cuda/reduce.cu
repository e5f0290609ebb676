// CUDA reduction kernels for the collectives' GPU path: out = a op b over f32 (more types follow
// with the CUDA transport). Built whenever nvcc is found; tested where a GPU is present.
#include "kernels/cuda/reduce.h"

#include <cuda_runtime.h>

namespace chorus::kernels::cuda {
namespace {

__global__ void sum_f32(const float* __restrict__ a, const float* __restrict__ b,
                        float* __restrict__ out, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    out[i] = a[i] + b[i];
}

}  // namespace

int reduce_sum_f32(const float* a, const float* b, float* out, size_t count, void* stream) {
  if (count == 0) return 0;
  const int threads = 256;
  const size_t want = (count + threads - 1) / threads;
  const int blocks = static_cast<int>(want < 65535 ? want : 65535);
  sum_f32<<<blocks, threads, 0, static_cast<cudaStream_t>(stream)>>>(a, b, out, count);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace chorus::kernels::cuda
