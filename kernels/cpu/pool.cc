// Max pooling kernels: general reference; the 2x2/stride-2 fast path runs the active
// instruction-set build (isa/pool.cc).
#include "kernels/cpu/pool.h"

#include <algorithm>

#include "kernels/cpu/isa/table.h"

namespace chorus::kernels::cpu {

void max_pool2d_forward_ref(const PoolShape& s, const float* x, float* y) {
  const int oh = s.oh(), ow = s.ow();
  for (long p = 0; p < s.planes; ++p) {
    const float* xp = x + p * s.h * s.w;
    for (int i = 0; i < oh; ++i)
      for (int j = 0; j < ow; ++j) {
        float m = xp[(i * s.stride) * s.w + j * s.stride];
        for (int u = 0; u < s.kernel; ++u)
          for (int v = 0; v < s.kernel; ++v)
            m = std::max(m, xp[(i * s.stride + u) * s.w + j * s.stride + v]);
        y[(p * oh + i) * ow + j] = m;
      }
  }
}

void max_pool2d_backward_ref(const PoolShape& s, const float* x, const float* y, const float* dy,
                             float* dx) {
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

bool max_pool2d_uses_argmax(const PoolShape& s) {
  return s.kernel == 2 && s.stride == 2;
}

void max_pool2d_forward(const PoolShape& s, const float* x, float* y, uint8_t* argmax) {
  if (max_pool2d_uses_argmax(s)) return cpu_kernels().pool2x2_forward(s, x, y, argmax);
  max_pool2d_forward_ref(s, x, y);
}

void max_pool2d_backward(const PoolShape& s, const float* x, const float* y, const uint8_t* argmax,
                         const float* dy, float* dx) {
  if (max_pool2d_uses_argmax(s)) return cpu_kernels().pool2x2_backward(s, argmax, dy, dx);
  max_pool2d_backward_ref(s, x, y, dy, dx);
}

}  // namespace chorus::kernels::cpu
