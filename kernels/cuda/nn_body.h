// The index arithmetic of the CUDA CNN kernels (nn.cu) as CHORUS_HD functions, so that the host
// runs the very same lines in tests/kernels/test_cuda_nn_host.cc against the CPU kernels.
//
// im2col layout here: col (K, N*P) with K = C*KH*KW (k = (c*KH + kh)*KW + kw) and P = OH*OW,
// column j = n*P + oh*OW + ow: one GEMM for the whole batch.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/cpu/conv2d.h"
#include "kernels/cpu/pool.h"
#include "kernels/hd.h"

namespace chorus::kernels::cuda::nn::body {

using cpu::Conv2dShape;
using cpu::PoolShape;

// The shapes' output sizes (their own oh()/ow() are host functions).
CHORUS_HD inline int out_h(const Conv2dShape& s) {
  return (s.h + 2 * s.pad - s.kh) / s.stride + 1;
}
CHORUS_HD inline int out_w(const Conv2dShape& s) {
  return (s.w + 2 * s.pad - s.kw) / s.stride + 1;
}
CHORUS_HD inline int out_h(const PoolShape& s) {
  return (s.h - s.kernel) / s.stride + 1;
}
CHORUS_HD inline int out_w(const PoolShape& s) {
  return (s.w - s.kernel) / s.stride + 1;
}

// col[k][j]: the input element under tap k of output pixel j, 0 in the padding.
CHORUS_HD inline float im2col_at(const Conv2dShape& s, const float* x, long k, long j) {
  const int OW = out_w(s), ohw = out_h(s) * OW;
  const long n = j / ohw;
  const int p = int(j % ohw), oh = p / OW, ow = p % OW;
  const int kw = int(k % s.kw), kh = int((k / s.kw) % s.kh), c = int(k / (long(s.kw) * s.kh));
  const int h = oh * s.stride - s.pad + kh, w = ow * s.stride - s.pad + kw;
  if (h < 0 || h >= s.h || w < 0 || w >= s.w) return 0.0f;
  return x[((n * s.c + c) * s.h + h) * s.w + w];
}

// dx[i] (i over N*C*H*W): the sum of every col entry that im2col_at read from it, taps in order.
CHORUS_HD inline float col2im_at(const Conv2dShape& s, const float* col, long i) {
  const int w = int(i % s.w), h = int((i / s.w) % s.h), c = int((i / (long(s.w) * s.h)) % s.c);
  const long n = i / (long(s.w) * s.h * s.c);
  const int OH = out_h(s), OW = out_w(s);
  const long cols = long(s.n) * OH * OW;
  float acc = 0.0f;
  for (int kh = 0; kh < s.kh; ++kh) {
    const int th = h + s.pad - kh;
    if (th < 0 || th % s.stride) continue;
    const int oh = th / s.stride;
    if (oh >= OH) continue;
    for (int kw = 0; kw < s.kw; ++kw) {
      const int tw = w + s.pad - kw;
      if (tw < 0 || tw % s.stride) continue;
      const int ow = tw / s.stride;
      if (ow >= OW) continue;
      const long k = (long(c) * s.kh + kh) * s.kw + kw;
      acc += col[k * cols + n * OH * OW + long(oh) * OW + ow];
    }
  }
  return acc;
}

// Output o of a pooling (o over planes*OH*OW): the window's first maximum in row-major order,
// and its position in the window.
CHORUS_HD inline float pool_max_at(const PoolShape& s, const float* x, long o, int* where) {
  const int OH = out_h(s), OW = out_w(s);
  const long plane = o / (long(OH) * OW);
  const int oh = int((o / OW) % OH), ow = int(o % OW);
  const float* xp = x + plane * s.h * s.w;
  float best = xp[long(oh * s.stride) * s.w + ow * s.stride];
  int at = 0;
  for (int kh = 0; kh < s.kernel; ++kh)
    for (int kw = 0; kw < s.kernel; ++kw) {
      const float v = xp[long(oh * s.stride + kh) * s.w + ow * s.stride + kw];
      if (v > best) {
        best = v;
        at = kh * s.kernel + kw;
      }
    }
  *where = at;
  return best;
}

// dx[i] (i over planes*H*W): the dy of every window whose first maximum is element i.
// `argmax` (one byte per output) or null (then found again from x).
CHORUS_HD inline float pool_grad_at(const PoolShape& s, const float* x, const uint8_t* argmax,
                                    const float* dy, long i) {
  const int OH = out_h(s), OW = out_w(s);
  const long plane = i / (long(s.h) * s.w);
  const int h = int((i / s.w) % s.h), w = int(i % s.w);
  float acc = 0.0f;
  for (int kh = 0; kh < s.kernel; ++kh) {
    const int th = h - kh;
    if (th < 0 || th % s.stride) continue;
    const int oh = th / s.stride;
    if (oh >= OH) continue;
    for (int kw = 0; kw < s.kernel; ++kw) {
      const int tw = w - kw;
      if (tw < 0 || tw % s.stride) continue;
      const int ow = tw / s.stride;
      if (ow >= OW) continue;
      const long o = (plane * OH + oh) * OW + ow;
      int at = 0;
      if (argmax)
        at = argmax[o];
      else
        (void)pool_max_at(s, x, o, &at);
      if (at == kh * s.kernel + kw) acc += dy[o];
    }
  }
  return acc;
}

// One row of log_softmax, as kernels/cpu/softmax.cc computes it.
CHORUS_HD inline void log_softmax_row(int cols, const float* x, float* y) {
  float m = x[0];
  for (int c = 1; c < cols; ++c) m = x[c] > m ? x[c] : m;
  float s = 0.0f;
  for (int c = 0; c < cols; ++c) s += expf(x[c] - m);
  const float lse = m + logf(s);
  for (int c = 0; c < cols; ++c) y[c] = x[c] - lse;
}

// dx = dy - exp(y) * sum(dy), one row.
CHORUS_HD inline void log_softmax_grad_row(int cols, const float* y, const float* dy, float* dx) {
  float s = 0.0f;
  for (int c = 0; c < cols; ++c) s += dy[c];
  for (int c = 0; c < cols; ++c) dx[c] = dy[c] - expf(y[c]) * s;
}

// argmax of one row, first maximum wins.
CHORUS_HD inline int32_t argmax_row(int cols, const float* x) {
  int32_t at = 0;
  for (int c = 1; c < cols; ++c)
    if (x[c] > x[at]) at = c;
  return at;
}

}  // namespace chorus::kernels::cuda::nn::body
