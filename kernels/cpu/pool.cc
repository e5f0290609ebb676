// Max pooling kernels: general reference and a 2x2/stride-2 fast path.
#include "kernels/cpu/pool.h"

#include <algorithm>

namespace chorus::kernels::cpu {

void max_pool2d_forward_ref(const PoolShape& s, const float* x, float* y) {
  const int oh = s.oh(), ow = s.ow();
  for (long p = 0; p < s.planes; ++p) {
    const float* xp = x + p * s.h * s.w;
    for (int i = 0; i < oh; ++i)
      for (int j = 0; j < ow; ++j) {
        float m = xp[(i * s.stride) * s.w + j * s.stride];
        for (int u = 0; u < s.kernel; ++u)
          for (int v = 0; v < s.kernel; ++v) m = std::max(m, xp[(i * s.stride + u) * s.w + j * s.stride + v]);
        y[(p * oh + i) * ow + j] = m;
      }
  }
}

void max_pool2d_backward_ref(const PoolShape& s, const float* x, const float* y, const float* dy, float* dx) {
  const int oh = s.oh(), ow = s.ow();
  std::fill(dx, dx + static_cast<long>(s.planes) * s.h * s.w, 0.0f);
  for (long p = 0; p < s.planes; ++p) {
    const float* xp = x + p * s.h * s.w;
    float* dxp = dx + p * s.h * s.w;
    for (int i = 0; i < oh; ++i)
      for (int j = 0; j < ow; ++j) {
        const long o = (p * oh + i) * ow + j;
        bool done = false;
        for (int u = 0; u < s.kernel && !done; ++u)
          for (int v = 0; v < s.kernel && !done; ++v) {
            const long xi = (i * s.stride + u) * s.w + j * s.stride + v;
            if (xp[xi] == y[o]) {
              dxp[xi] += dy[o];
              done = true;
            }
          }
      }
  }
}

namespace {

// 2x2/stride 2: max and index of the first maximum in window order (r0[2j], r0[2j+1], r1[2j],
// r1[2j+1]), written with selects rather than branches (ties are common after relu).
void pool2x2_forward(const PoolShape& s, const float* __restrict x, float* __restrict y,
                     uint8_t* __restrict argmax) {
  const int oh = s.oh(), ow = s.ow();
  for (long p = 0; p < s.planes; ++p) {
    const float* xp = x + p * s.h * s.w;
    for (int i = 0; i < oh; ++i) {
      const float* __restrict r0 = xp + (2 * i) * s.w;
      const float* __restrict r1 = r0 + s.w;
      float* __restrict yr = y + (p * oh + i) * ow;
      uint8_t* __restrict ar = argmax ? argmax + (p * oh + i) * ow : nullptr;
      for (int j = 0; j < ow; ++j)
        yr[j] = std::max(std::max(r0[2 * j], r0[2 * j + 1]), std::max(r1[2 * j], r1[2 * j + 1]));
      if (!ar) continue;
      for (int j = 0; j < ow; ++j) {
        const float m = yr[j];
        const int e0 = r0[2 * j] == m, e1 = r0[2 * j + 1] == m, e2 = r1[2 * j] == m;
        ar[j] = static_cast<uint8_t>((1 - e0) * (1 + (1 - e1) * (1 + (1 - e2))));
      }
    }
  }
}

void pool2x2_backward(const PoolShape& s, const uint8_t* __restrict argmax, const float* __restrict dy,
                      float* __restrict dx) {
  const int oh = s.oh(), ow = s.ow();
  const long hw = static_cast<long>(s.h) * s.w;
  std::fill(dx, dx + s.planes * hw, 0.0f);
  const long offset[4] = {0, 1, s.w, s.w + 1};
  for (long p = 0; p < s.planes; ++p) {
    float* dxp = dx + p * hw;
    for (int i = 0; i < oh; ++i) {
      const long o = (p * oh + i) * ow;
      float* d0 = dxp + (2 * i) * s.w;
      for (int j = 0; j < ow; ++j) d0[2 * j + offset[argmax[o + j]]] = dy[o + j];
    }
  }
}

}  // namespace

bool max_pool2d_uses_argmax(const PoolShape& s) { return s.kernel == 2 && s.stride == 2; }

void max_pool2d_forward(const PoolShape& s, const float* x, float* y, uint8_t* argmax) {
  if (max_pool2d_uses_argmax(s)) return pool2x2_forward(s, x, y, argmax);
  max_pool2d_forward_ref(s, x, y);
}

void max_pool2d_backward(const PoolShape& s, const float* x, const float* y, const uint8_t* argmax,
                         const float* dy, float* dx) {
  if (max_pool2d_uses_argmax(s)) return pool2x2_backward(s, argmax, dy, dx);
  max_pool2d_backward_ref(s, x, y, dy, dx);
}

}  // namespace chorus::kernels::cpu
