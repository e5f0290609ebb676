// [cuda] The CUDA reduction kernel against the CPU reference. Skips (exit 77) without a GPU.
#include <cuda_runtime.h>

#include <cstdio>
#include <vector>

#include "kernels/cuda/reduce.h"

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("skip: [cuda] no CUDA device visible (cudaGetDeviceCount: %d devices)\n", devices);
    return 77;
  }
  const size_t n = (1u << 20) + 7;
  std::vector<float> a(n), b(n), out(n);
  for (size_t i = 0; i < n; ++i)
    a[i] = static_cast<float>(i % 1000), b[i] = static_cast<float>(i % 7);
  float *da, *db, *dout;
  cudaMalloc(&da, n * 4);
  cudaMalloc(&db, n * 4);
  cudaMalloc(&dout, n * 4);
  cudaMemcpy(da, a.data(), n * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(db, b.data(), n * 4, cudaMemcpyHostToDevice);
  if (chorus::kernels::cuda::reduce_sum_f32(da, db, dout, n, nullptr) != 0) {
    std::printf("launch failed\n");
    return 1;
  }
  cudaMemcpy(out.data(), dout, n * 4, cudaMemcpyDeviceToHost);
  for (size_t i = 0; i < n; ++i)
    if (out[i] != a[i] + b[i]) {
      std::printf("element %zu: %f != %f\n", i, out[i], a[i] + b[i]);
      return 1;
    }
  std::printf("ok: %zu elements on %d device(s)\n", n, devices);
  return 0;
}
