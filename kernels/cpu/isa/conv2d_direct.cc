// Direct convolution (conv2d.h), one instruction-set build: for layers with few input taps and 24-
// or 28-wide output rows (stride 1, no padding: the first layer of the tutorial nets, 1x5x5 on
// 28x28 and 3x5x5 on 32x32). There im2col + GEMM is a poor fit: the GEMM has only OC = 6 rows, and
// writing the im2col matrix (25 x the input) costs more than the arithmetic. Instead each output
// row is accumulated from shifted input rows, vectorised along the row, with the whole image in L1.
#include <cstring>

#include "kernels/cpu/isa/entries.h"

namespace chorus::kernels::CHORUS_ISA_NS {
namespace {

using cpu::Conv2dShape;

void zero(float* p, long n) {
  for (long i = 0; i < n; ++i) p[i] = 0.0f;
}

// A row of kRow (24 or 28) floats held in registers, as vectors of the build's width (16 lanes
// with AVX-512, 8 with AVX2, 4 with SSE2) plus an 8- and a 4-lane part for what is left, written
// in the compiler's vector types. Left to the auto-vectoriser, the 28-wide AVX-512 loop came out
// as zmm + ymm + 4 scalars with the partial sums spilled to the stack, slower than the AVX2 build.
// Each lane does exactly the scalar arithmetic (multiply, then add: no FMA), so every build gives
// the same bits.
#if CHORUS_ISA_LEVEL == 2
constexpr int kWidth = 16;
#elif CHORUS_ISA_LEVEL == 1
constexpr int kWidth = 8;
#else
constexpr int kWidth = 4;
#endif
typedef float VW __attribute__((vector_size(4 * kWidth)));
typedef float V8 __attribute__((vector_size(32)));
typedef float V4 __attribute__((vector_size(16)));

template <int kRow>
struct Row {
  static_assert(kRow % 4 == 0);
  static constexpr int kFull = kRow / kWidth;               // vectors of the build's width
  static constexpr bool kHalf = kRow % kWidth >= 8;         // then 8 lanes (AVX-512 only)
  static constexpr bool kQuarter = kRow % kWidth % 8 == 4;  // then 4 lanes
  static constexpr int kHalfAt = kFull * kWidth;
  static constexpr int kQuarterAt = kHalfAt + (kHalf ? 8 : 0);
  VW full[kFull];
  V8 half;
  V4 quarter;

  static Row splat(float s) {
    Row r;
    for (int k = 0; k < kFull; ++k) r.full[k] = s - VW{};
    r.half = s - V8{};
    r.quarter = s - V4{};
    return r;
  }
  static Row load(const float* p) {
    Row r = splat(0.0f);
    for (int k = 0; k < kFull; ++k) std::memcpy(&r.full[k], p + k * kWidth, sizeof(VW));
    if constexpr (kHalf) std::memcpy(&r.half, p + kHalfAt, sizeof(V8));
    if constexpr (kQuarter) std::memcpy(&r.quarter, p + kQuarterAt, sizeof(V4));
    return r;
  }
  void store(float* p) const {
    for (int k = 0; k < kFull; ++k) std::memcpy(p + k * kWidth, &full[k], sizeof(VW));
    if constexpr (kHalf) std::memcpy(p + kHalfAt, &half, sizeof(V8));
    if constexpr (kQuarter) std::memcpy(p + kQuarterAt, &quarter, sizeof(V4));
  }
  // this += w * x, lane by lane (w a broadcast scalar, or another row).
  void add_product(float w, const Row& x) {
    for (int k = 0; k < kFull; ++k) full[k] += w * x.full[k];
    if constexpr (kHalf) half += w * x.half;
    if constexpr (kQuarter) quarter += w * x.quarter;
  }
  void add_product(const Row& w, const Row& x) {
    for (int k = 0; k < kFull; ++k) full[k] += w.full[k] * x.full[k];
    if constexpr (kHalf) half += w.half * x.half;
    if constexpr (kQuarter) quarter += w.quarter * x.quarter;
  }
  Row& add_sum(const Row& x) {
    for (int k = 0; k < kFull; ++k) full[k] += x.full[k];
    if constexpr (kHalf) half += x.half;
    if constexpr (kQuarter) quarter += x.quarter;
    return *this;
  }
};

// The output row width kRow is a compile-time constant so that a row's partial sums live in
// vector registers across all taps (Row above).
// y[n,o,i,:] = b[o] + sum_{c,u,v} w[o,c,u,v] * x[n,c,i+u, v:v+OW]
template <int kRow>
void forward_rows(const Conv2dShape& s, const float* __restrict x, const float* __restrict w,
                  const float* __restrict b, float* __restrict y) {
  const int oh = out_h(s);
  for (int n = 0; n < s.n; ++n)
    for (int o = 0; o < s.oc; ++o)
      for (int i = 0; i < oh; ++i) {
        Row<kRow> acc = Row<kRow>::splat(b ? b[o] : 0.0f);
        for (int c = 0; c < s.c; ++c) {
          const float* __restrict xc = x + (static_cast<long>(n) * s.c + c) * s.h * s.w;
          const float* __restrict wc = w + (static_cast<long>(o) * s.c + c) * s.kh * s.kw;
          for (int u = 0; u < s.kh; ++u) {
            const float* __restrict xr = xc + static_cast<long>(i + u) * s.w;
            for (int v = 0; v < s.kw; ++v)
              acc.add_product(wc[u * s.kw + v], Row<kRow>::load(xr + v));
          }
        }
        acc.store(y + ((static_cast<long>(n) * s.oc + o) * oh + i) * kRow);
      }
}

// dw[o,c,u,v] = sum_{n,i,j} dy[n,o,i,j] x[n,c,i+u,j+v]; db[o] = sum dy[n,o]; dx by scatter.
// acc (OC * patch * OW floats) keeps row-wide partial sums of dw so the inner loops are vector
// multiply-adds on registers; the lanes are summed once at the end.
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
            Row<kRow> part = Row<kRow>::splat(0.0f);
            for (int i = 0; i < oh; ++i)
              part.add_product(Row<kRow>::load(go + static_cast<long>(i) * kRow),
                               Row<kRow>::load(xc + static_cast<long>(i + u) * s.w + v));
            float* __restrict a =
                acc + ((static_cast<long>(o) * s.c + c) * s.kh * s.kw + u * s.kw + v) * kRow;
            Row<kRow>::load(a).add_sum(part).store(a);
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
