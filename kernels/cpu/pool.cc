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

// One output row of a 2x2/stride-2 window: reads two input rows.
void pool2x2_forward(const PoolShape& s, const float* x, float* y) {
  const int oh = s.oh(), ow = s.ow();
  for (long p = 0; p < s.planes; ++p) {
    const float* xp = x + p * s.h * s.w;
    float* yp = y + p * oh * ow;
    for (int i = 0; i < oh; ++i) {
      const float* r0 = xp + (2 * i) * s.w;
      const float* r1 = r0 + s.w;
      for (int j = 0; j < ow; ++j)
        yp[i * ow + j] = std::max(std::max(r0[2 * j], r0[2 * j + 1]), std::max(r1[2 * j], r1[2 * j + 1]));
    }
  }
}

void pool2x2_backward(const PoolShape& s, const float* x, const float* y, const float* dy, float* dx) {
  const int oh = s.oh(), ow = s.ow();
  const long hw = static_cast<long>(s.h) * s.w;
  for (long p = 0; p < s.planes; ++p) {
    const float* xp = x + p * hw;
    float* dxp = dx + p * hw;
    const float* yp = y + p * oh * ow;
    const float* gp = dy + p * oh * ow;
    if (s.h != 2 * oh || s.w != 2 * ow) std::fill(dxp, dxp + hw, 0.0f);  // odd sizes: untouched edge
    for (int i = 0; i < oh; ++i) {
      const float* r0 = xp + (2 * i) * s.w;
      const float* r1 = r0 + s.w;
      float* d0 = dxp + (2 * i) * s.w;
      float* d1 = d0 + s.w;
      for (int j = 0; j < ow; ++j) {
        const float m = yp[i * ow + j], g = gp[i * ow + j];
        // first maximum in window order (r0[2j], r0[2j+1], r1[2j], r1[2j+1]) takes the gradient
        const bool a = r0[2 * j] == m;
        const bool b = !a && r0[2 * j + 1] == m;
        const bool c = !a && !b && r1[2 * j] == m;
        const bool d = !a && !b && !c;
        d0[2 * j] = a ? g : 0.0f;
        d0[2 * j + 1] = b ? g : 0.0f;
        d1[2 * j] = c ? g : 0.0f;
        d1[2 * j + 1] = d ? g : 0.0f;
      }
    }
  }
}

}  // namespace

void max_pool2d_forward(const PoolShape& s, const float* x, float* y) {
  if (s.kernel == 2 && s.stride == 2) return pool2x2_forward(s, x, y);
  max_pool2d_forward_ref(s, x, y);
}

void max_pool2d_backward(const PoolShape& s, const float* x, const float* y, const float* dy, float* dx) {
  if (s.kernel == 2 && s.stride == 2) return pool2x2_backward(s, x, y, dy, dx);
  max_pool2d_backward_ref(s, x, y, dy, dx);
}

}  // namespace chorus::kernels::cpu
