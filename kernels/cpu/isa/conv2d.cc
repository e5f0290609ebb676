// The im2col + GEMM convolution path (conv2d.h) of one instruction-set build: im2col, col2im,
// and the chunked forward and backward around the GEMM (gemm(): OpenBLAS, or gemm_blocked).
// Both take the direct path (isa/conv2d_direct.cc) where it applies.
#include "kernels/cpu/isa/entries.h"

namespace chorus::kernels::CHORUS_ISA_NS {
namespace {

using cpu::Conv2dShape;
using cpu::Trans;

void zero(float* p, long n) {
  for (long i = 0; i < n; ++i) p[i] = 0.0f;
}

bool direct_applies(const Conv2dShape& s) {
  const int ow = out_w(s);
  return s.stride == 1 && s.pad == 0 && patch(s) <= cpu::kDirectMaxPatch && (ow == 24 || ow == 28);
}

}  // namespace

// Calls between the functions below are qualified (CHORUS_ISA_NS::im2col): the shape argument
// would also find the public cpu::im2col by argument-dependent lookup.

// GCC turns the short row copies below into memcpy calls, which cost more than the copies
// themselves (measured: 10% of a training step); keep them as inline vector loops.
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("no-tree-loop-distribute-patterns")))
#endif
void im2col(const Conv2dShape& s, const float* __restrict x, float* __restrict col) {
  const int oh = out_h(s), ow = out_w(s);
  const long plane = static_cast<long>(oh) * ow, npix = s.n * plane;
  for (int c = 0; c < s.c; ++c)
    for (int u = 0; u < s.kh; ++u)
      for (int v = 0; v < s.kw; ++v) {
        float* row = col + ((static_cast<long>(c) * s.kh + u) * s.kw + v) * npix;
        for (int n = 0; n < s.n; ++n) {
          const float* xp = x + (static_cast<long>(n) * s.c + c) * s.h * s.w;
          float* __restrict out = row + n * plane;
          for (int i = 0; i < oh; ++i, out += ow) {
            const int ih = i * s.stride - s.pad + u;
            if (ih < 0 || ih >= s.h) {
              zero(out, ow);
              continue;
            }
            const float* __restrict xr = xp + static_cast<long>(ih) * s.w;
            if (s.stride == 1 && s.pad == 0) {
              for (int j = 0; j < ow; ++j)
                out[j] = xr[v + j];  // short rows: a call to memcpy costs more
              continue;
            }
            for (int j = 0; j < ow; ++j) {
              const int iw = j * s.stride - s.pad + v;
              out[j] = (iw >= 0 && iw < s.w) ? xr[iw] : 0.0f;
            }
          }
        }
      }
}

void col2im(const Conv2dShape& s, const float* col, float* dx) {
  const int oh = out_h(s), ow = out_w(s);
  const long plane = static_cast<long>(oh) * ow, npix = s.n * plane;
  zero(dx, static_cast<long>(s.n) * s.c * s.h * s.w);
  for (int c = 0; c < s.c; ++c)
    for (int u = 0; u < s.kh; ++u)
      for (int v = 0; v < s.kw; ++v) {
        const float* row = col + ((static_cast<long>(c) * s.kh + u) * s.kw + v) * npix;
        for (int n = 0; n < s.n; ++n) {
          float* xp = dx + (static_cast<long>(n) * s.c + c) * s.h * s.w;
          const float* in = row + n * plane;
          for (int i = 0; i < oh; ++i, in += ow) {
            const int ih = i * s.stride - s.pad + u;
            if (ih < 0 || ih >= s.h) continue;
            float* xr = xp + static_cast<long>(ih) * s.w;
            if (s.stride == 1 && s.pad == 0) {
              for (int j = 0; j < ow; ++j) xr[v + j] += in[j];
              continue;
            }
            for (int j = 0; j < ow; ++j) {
              const int iw = j * s.stride - s.pad + v;
              if (iw >= 0 && iw < s.w) xr[iw] += in[j];
            }
          }
        }
      }
}

void conv2d_forward(const Conv2dShape& s, const float* x, const float* w, const float* b, float* y,
                    float* workspace, int chunk) {
  if (direct_applies(s)) return CHORUS_ISA_NS::conv2d_forward_direct(s, x, w, b, y);
  const long plane = static_cast<long>(out_h(s)) * out_w(s),
             in_image = static_cast<long>(s.c) * s.h * s.w;
  const int k = static_cast<int>(patch(s));
  for (int n0 = 0; n0 < s.n; n0 += chunk) {
    Conv2dShape c = s;
    c.n = chunk < s.n - n0 ? chunk : s.n - n0;
    const long npix = c.n * plane;
    float* col = workspace;
    float* out = workspace + k * npix;
    CHORUS_ISA_NS::im2col(c, x + n0 * in_image, col);
    // out (OC, n*P) = w (OC, K) * col (K, n*P)
    cpu::gemm(Trans::kNo, Trans::kNo, s.oc, static_cast<int>(npix), k, 1.0f, w, k, col,
              static_cast<int>(npix), 0.0f, out, static_cast<int>(npix));
    // y (n, OC, P) = out viewed as (OC, n, P), transposed, plus bias
    for (int n = 0; n < c.n; ++n)
      for (int o = 0; o < s.oc; ++o) {
        const float* src = out + o * npix + n * plane;
        float* dst = y + ((static_cast<long>(n0) + n) * s.oc + o) * plane;
        const float bo = b ? b[o] : 0.0f;
        for (long p = 0; p < plane; ++p) dst[p] = src[p] + bo;
      }
  }
}

void conv2d_backward(const Conv2dShape& s, const float* x, const float* w, const float* dy,
                     float* dx, float* dw, float* db, float* workspace, int chunk) {
  if (direct_applies(s))
    return CHORUS_ISA_NS::conv2d_backward_direct(s, x, w, dy, dx, dw, db, workspace);
  const long plane = static_cast<long>(out_h(s)) * out_w(s),
             in_image = static_cast<long>(s.c) * s.h * s.w;
  const int k = static_cast<int>(patch(s));
  if (db) zero(db, s.oc);
  for (int n0 = 0; n0 < s.n; n0 += chunk) {
    Conv2dShape c = s;
    c.n = chunk < s.n - n0 ? chunk : s.n - n0;
    const long npix = c.n * plane;
    float* col = workspace;
    float* g = workspace + k * npix;
    // g (OC, n*P) = dy (n, OC, P) transposed; db (OC) += row sums
    for (int o = 0; o < s.oc; ++o) {
      float sum = 0.0f;
      for (int n = 0; n < c.n; ++n) {
        const float* src = dy + ((static_cast<long>(n0) + n) * s.oc + o) * plane;
        float* dst = g + o * npix + n * plane;
        for (long p = 0; p < plane; ++p) {
          dst[p] = src[p];
          sum += src[p];
        }
      }
      if (db) db[o] += sum;
    }
    CHORUS_ISA_NS::im2col(c, x + n0 * in_image, col);
    // dw (OC, K) (+)= g (OC, n*P) * col^T (n*P, K)
    cpu::gemm(Trans::kNo, Trans::kYes, s.oc, k, static_cast<int>(npix), 1.0f, g,
              static_cast<int>(npix), col, static_cast<int>(npix), n0 == 0 ? 0.0f : 1.0f, dw, k);
    if (!dx) continue;
    // dcol (K, n*P) = w^T (K, OC) * g (OC, n*P), written over col (dead once dw has it)
    cpu::gemm(Trans::kYes, Trans::kNo, k, static_cast<int>(npix), s.oc, 1.0f, w, k, g,
              static_cast<int>(npix), 0.0f, col, static_cast<int>(npix));
    CHORUS_ISA_NS::col2im(c, col, dx + n0 * in_image);
  }
}

}  // namespace chorus::kernels::CHORUS_ISA_NS
