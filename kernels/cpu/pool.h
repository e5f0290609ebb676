// Max pooling 2-D over NCHW planes (no padding, floor mode, like nn.MaxPool2d(k, s)):
// a general reference and a 2x2/stride-2 fast path, forward and backward side by side.
#pragma once

#include <cstdint>

namespace chorus::kernels::cpu {

struct PoolShape {
  int planes = 0;  // N*C
  int h = 0, w = 0;
  int kernel = 2, stride = 2;
  int oh() const { return (h - kernel) / stride + 1; }
  int ow() const { return (w - kernel) / stride + 1; }
};

// x (planes,H,W) -> y (planes,OH,OW). Ties go to the first maximum in row-major window order,
// as in PyTorch.
void max_pool2d_forward_ref(const PoolShape& s, const float* x, float* y);
// Gradient flows to the window's first maximum, found again from x and y (no index buffer).
// Overwrites dx (planes,H,W).
void max_pool2d_backward_ref(const PoolShape& s, const float* x, const float* y, const float* dy,
                             float* dx);

// Fast path. For 2x2/stride-2 the forward also records each window's argmax (0..3) in `argmax`
// (one byte per output, may be null when no backward follows) and the backward scatters through
// it; other sizes fall back to the reference (argmax unused).
bool max_pool2d_uses_argmax(const PoolShape& s);
void max_pool2d_forward(const PoolShape& s, const float* x, float* y, uint8_t* argmax);
void max_pool2d_backward(const PoolShape& s, const float* x, const float* y, const uint8_t* argmax,
                         const float* dy, float* dx);

}  // namespace chorus::kernels::cpu
