// The [cuda] tests' check of a CUDA runtime call: on an error, print where and what, return 1.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>

#define CHECK_CUDA(x)                                                                 \
  do {                                                                                \
    cudaError_t e_ = (x);                                                             \
    if (e_ != cudaSuccess) {                                                          \
      std::printf("%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      return 1;                                                                       \
    }                                                                                 \
  } while (0)
