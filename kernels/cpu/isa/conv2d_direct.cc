// Direct convolution (conv2d.h), one instruction-set build: for layers with few input taps and 24-
// or 28-wide output rows (stride 1, no padding: the first layer of the tutorial nets, 1x5x5 on
// 28x28 and 3x5x5 on 32x32). There im2col + GEMM is a poor fit: the GEMM has only OC = 6 rows, and
// writing the im2col matrix (25 x the input) costs more than the arithmetic. Instead each output
// row is accumulated from shifted input rows, vectorised along the row, with the whole image in L1.
#include "kernels/cpu/isa/entries.h"

namespace chorus::kernels::CHORUS_ISA_NS {
namespace {

using cpu::Conv2dShape;

void zero(float* p, long n) {
  for (long i = 0; i < n; ++i) p[i] = 0.0f;
}

// The output row width kRow is a compile-time constant so that a row's partial sums live in
// vector registers across all taps (24 or 28 floats: two vector registers).
// y[n,o,i,:] = b[o] + sum_{c,u,v} w[o,c,u,v] * x[n,c,i+u, v:v+OW]
template <int kRow>
void forward_rows(const Conv2dShape& s, const float* __restrict x, const float* __restrict w,
                  const float* __restrict b, float* __restrict y) {
  const int oh = out_h(s);
  for (int n = 0; n < s.n; ++n)
    for (int o = 0; o < s.oc; ++o)
      for (int i = 0; i < oh; ++i) {
        float acc[kRow];
        for (int j = 0; j < kRow; ++j) acc[j] = b ? b[o] : 0.0f;
        for (int c = 0; c < s.c; ++c) {
          const float* __restrict xc = x + (static_cast<long>(n) * s.c + c) * s.h * s.w;
          const float* __restrict wc = w + (static_cast<long>(o) * s.c + c) * s.kh * s.kw;
          for (int u = 0; u < s.kh; ++u) {
            const float* __restrict xr = xc + static_cast<long>(i + u) * s.w;
            for (int v = 0; v < s.kw; ++v) {
              const float wv = wc[u * s.kw + v];
              for (int j = 0; j < kRow; ++j) acc[j] += wv * xr[j + v];
            }
          }
        }
        float* __restrict yr = y + ((static_cast<long>(n) * s.oc + o) * oh + i) * kRow;
        for (int j = 0; j < kRow; ++j) yr[j] = acc[j];
      }
}

// dw[o,c,u,v] = sum_{n,i,j} dy[n,o,i,j] x[n,c,i+u,j+v]; db[o] = sum dy[n,o]; dx by scatter.
// acc (OC * patch * OW floats) keeps row-wide partial sums of dw so the inner loops are vector
// FMAs on registers; the lanes are summed once at the end.
template <int kRow>
void backward_rows(const Conv2dShape& s, const float* __restrict x, const float* __restrict w,
                   const float* __restrict dy, float* __restrict dx, float* __restrict dw,
                   float* __restrict db, float* __restrict acc) {
  const int oh = out_h(s);
  const long taps = patch(s), plane = static_cast<long>(oh) * kRow;
  zero(acc, s.oc * taps * kRow);
  if (dx) zero(dx, static_cast<long>(s.n) * s.c * s.h * s.w);
  if (db) zero(db, s.oc);
  for (int n = 0; n < s.n; ++n)
    for (int o = 0; o < s.oc; ++o) {
      const float* __restrict go = dy + (static_cast<long>(n) * s.oc + o) * plane;
      if (db)
        for (long p = 0; p < plane; ++p) db[o] += go[p];
      for (int c = 0; c < s.c; ++c) {
        const float* __restrict xc = x + (static_cast<long>(n) * s.c + c) * s.h * s.w;
        for (int u = 0; u < s.kh; ++u)
          for (int v = 0; v < s.kw; ++v) {
            float part[kRow] = {};
            for (int i = 0; i < oh; ++i) {
              const float* __restrict gr = go + static_cast<long>(i) * kRow;
              const float* __restrict xr = xc + static_cast<long>(i + u) * s.w + v;
              for (int j = 0; j < kRow; ++j) part[j] += gr[j] * xr[j];
            }
            float* __restrict a =
                acc + ((static_cast<long>(o) * s.c + c) * s.kh * s.kw + u * s.kw + v) * kRow;
            for (int j = 0; j < kRow; ++j) a[j] += part[j];
          }
        if (!dx) continue;
        float* __restrict dxc = dx + (static_cast<long>(n) * s.c + c) * s.h * s.w;
        const float* __restrict wc = w + (static_cast<long>(o) * s.c + c) * s.kh * s.kw;
        for (int i = 0; i < oh; ++i)
          for (int u = 0; u < s.kh; ++u)
            for (int v = 0; v < s.kw; ++v) {
              const float wv = wc[u * s.kw + v];
              float* __restrict dr = dxc + static_cast<long>(i + u) * s.w + v;
              const float* __restrict gr = go + static_cast<long>(i) * kRow;
              for (int j = 0; j < kRow; ++j) dr[j] += wv * gr[j];
            }
      }
    }
  for (long t = 0; t < s.oc * taps; ++t) {
    float sum = 0.0f;
    for (int j = 0; j < kRow; ++j) sum += acc[t * kRow + j];
    dw[t] = sum;
  }
}

}  // namespace

void conv2d_forward_direct(const Conv2dShape& s, const float* x, const float* w, const float* b,
                           float* y) {
  if (out_w(s) == 24) return forward_rows<24>(s, x, w, b, y);
  forward_rows<28>(s, x, w, b, y);
}

void conv2d_backward_direct(const Conv2dShape& s, const float* x, const float* w, const float* dy,
                            float* dx, float* dw, float* db, float* acc) {
  if (out_w(s) == 24) return backward_rows<24>(s, x, w, dy, dx, dw, db, acc);
  backward_rows<28>(s, x, w, dy, dx, dw, db, acc);
}

}  // namespace chorus::kernels::CHORUS_ISA_NS
