// CUDA reduction kernels (see reduce.cu). Plain C++ interface: callers need no CUDA headers.
#pragma once

#include <cstddef>

namespace chorus::kernels::cuda {

// out[i] = a[i] + b[i] on the device, enqueued on `stream` (a cudaStream_t; nullptr: default).
// Returns the cudaError_t of the launch (0 on success).
int reduce_sum_f32(const float* a, const float* b, float* out, size_t count, void* stream);

}  // namespace chorus::kernels::cuda
