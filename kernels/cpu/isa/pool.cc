// The 2x2 / stride 2 max-pooling path (pool.h) of one instruction-set build.
#include "kernels/cpu/isa/entries.h"

namespace chorus::kernels::CHORUS_ISA_NS {
namespace {

// std::max's definition, spelled out (no <algorithm> under isa/).
inline float max2(float a, float b) {
  return a < b ? b : a;
}

}  // namespace

// Max and index of the first maximum in window order (r0[2j], r0[2j+1], r1[2j], r1[2j+1]),
// written with selects rather than branches (ties are common after relu).
void pool2x2_forward(const cpu::PoolShape& s, const float* __restrict x, float* __restrict y,
                     uint8_t* __restrict argmax) {
  const int oh = out_h(s), ow = out_w(s);
  for (long p = 0; p < s.planes; ++p) {
    const float* xp = x + p * s.h * s.w;
    for (int i = 0; i < oh; ++i) {
      const float* __restrict r0 = xp + (2 * i) * s.w;
      const float* __restrict r1 = r0 + s.w;
      float* __restrict yr = y + (p * oh + i) * ow;
      uint8_t* __restrict ar = argmax ? argmax + (p * oh + i) * ow : nullptr;
      for (int j = 0; j < ow; ++j)
        yr[j] = max2(max2(r0[2 * j], r0[2 * j + 1]), max2(r1[2 * j], r1[2 * j + 1]));
      if (!ar) continue;
      for (int j = 0; j < ow; ++j) {
        const float m = yr[j];
        const int e0 = r0[2 * j] == m, e1 = r0[2 * j + 1] == m, e2 = r1[2 * j] == m;
        ar[j] = static_cast<uint8_t>((1 - e0) * (1 + (1 - e1) * (1 + (1 - e2))));
      }
    }
  }
}

void pool2x2_backward(const cpu::PoolShape& s, const uint8_t* __restrict argmax,
                      const float* __restrict dy, float* __restrict dx) {
  const int oh = out_h(s), ow = out_w(s);
  const long hw = static_cast<long>(s.h) * s.w;
  for (long i = 0; i < s.planes * hw; ++i) dx[i] = 0.0f;
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

}  // namespace chorus::kernels::CHORUS_ISA_NS
