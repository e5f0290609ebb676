// Conv2d kernels: direct reference loops, and im2col + GEMM for speed.
//
// The fast path lays a chunk of images out as one matrix so each chunk is a single GEMM:
//   forward   Y'(OC, N*P) = W(OC, K) * col(K, N*P)          then Y(N,OC,P) = transpose(Y') + b
//   backward  dY'(OC, N*P) = transpose(dY)
//             dW(OC, K)    = dY' * col^T
//             dcol(K, N*P) = W^T * dY'                      then dx = col2im(dcol)
// with P = OH*OW and K = C*KH*KW; backward recomputes col per chunk instead of keeping it (Chellapilla et al. 2006, "High Performance Convolutional
// Neural Networks for Document Processing").
#include "kernels/cpu/conv2d.h"

#include <algorithm>

#include "kernels/cpu/gemm.h"

namespace chorus::kernels::cpu {

void conv2d_forward_ref(const Conv2dShape& s, const float* x, const float* w, const float* b, float* y) {
  const int oh = s.oh(), ow = s.ow();
  for (int n = 0; n < s.n; ++n)
    for (int o = 0; o < s.oc; ++o)
      for (int i = 0; i < oh; ++i)
        for (int j = 0; j < ow; ++j) {
          double acc = b ? b[o] : 0.0;
          for (int c = 0; c < s.c; ++c)
            for (int u = 0; u < s.kh; ++u)
              for (int v = 0; v < s.kw; ++v) {
                const int ih = i * s.stride - s.pad + u, iw = j * s.stride - s.pad + v;
                if (ih < 0 || ih >= s.h || iw < 0 || iw >= s.w) continue;
                acc += static_cast<double>(x[((static_cast<long>(n) * s.c + c) * s.h + ih) * s.w + iw]) *
                       w[((static_cast<long>(o) * s.c + c) * s.kh + u) * s.kw + v];
              }
          y[((static_cast<long>(n) * s.oc + o) * oh + i) * ow + j] = static_cast<float>(acc);
        }
}

void conv2d_backward_ref(const Conv2dShape& s, const float* x, const float* w, const float* dy,
                         float* dx, float* dw, float* db) {
  const int oh = s.oh(), ow = s.ow();
  if (dx) std::fill(dx, dx + static_cast<long>(s.n) * s.c * s.h * s.w, 0.0f);
  std::fill(dw, dw + static_cast<long>(s.oc) * s.patch(), 0.0f);
  if (db) std::fill(db, db + s.oc, 0.0f);
  for (int n = 0; n < s.n; ++n)
    for (int o = 0; o < s.oc; ++o)
      for (int i = 0; i < oh; ++i)
        for (int j = 0; j < ow; ++j) {
          const float g = dy[((static_cast<long>(n) * s.oc + o) * oh + i) * ow + j];
          if (db) db[o] += g;
          for (int c = 0; c < s.c; ++c)
            for (int u = 0; u < s.kh; ++u)
              for (int v = 0; v < s.kw; ++v) {
                const int ih = i * s.stride - s.pad + u, iw = j * s.stride - s.pad + v;
                if (ih < 0 || ih >= s.h || iw < 0 || iw >= s.w) continue;
                const long xi = ((static_cast<long>(n) * s.c + c) * s.h + ih) * s.w + iw;
                const long wi = ((static_cast<long>(o) * s.c + c) * s.kh + u) * s.kw + v;
                dw[wi] += g * x[xi];
                if (dx) dx[xi] += g * w[wi];
              }
        }
}

// GCC turns the short row copies below into memcpy calls, which cost more than the copies
// themselves (measured: 10% of a training step); keep them as inline vector loops.
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("no-tree-loop-distribute-patterns")))
#endif
void im2col(const Conv2dShape& s, const float* __restrict x, float* __restrict col) {
  const int oh = s.oh(), ow = s.ow();
  const long plane = static_cast<long>(oh) * ow, npix = s.pixels();
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
              std::fill(out, out + ow, 0.0f);
              continue;
            }
            const float* __restrict xr = xp + static_cast<long>(ih) * s.w;
            if (s.stride == 1 && s.pad == 0) {
              for (int j = 0; j < ow; ++j) out[j] = xr[v + j];  // short rows: a call to memcpy costs more
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
  const int oh = s.oh(), ow = s.ow();
  const long plane = static_cast<long>(oh) * ow, npix = s.pixels();
  std::fill(dx, dx + static_cast<long>(s.n) * s.c * s.h * s.w, 0.0f);
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

int conv2d_default_chunk(const Conv2dShape& s) {
  const long per_image = s.patch() * s.oh() * s.ow();
  const long chunk = kChunkFloats / (per_image > 0 ? per_image : 1);
  return static_cast<int>(std::clamp<long>(chunk, 1, s.n > 0 ? s.n : 1));
}

size_t conv2d_workspace_floats(const Conv2dShape& s, int chunk) {
  if (conv2d_direct_applies(s)) return static_cast<size_t>(s.oc) * s.patch() * s.ow();
  const size_t pix = static_cast<size_t>(chunk) * s.oh() * s.ow();
  return (static_cast<size_t>(s.patch()) + static_cast<size_t>(s.oc)) * pix;
}

void conv2d_forward(const Conv2dShape& s, const float* x, const float* w, const float* b, float* y,
                    float* workspace, int chunk) {
  if (conv2d_direct_applies(s)) return conv2d_forward_direct(s, x, w, b, y);
  const long plane = static_cast<long>(s.oh()) * s.ow(), in_image = static_cast<long>(s.c) * s.h * s.w;
  const int k = static_cast<int>(s.patch());
  for (int n0 = 0; n0 < s.n; n0 += chunk) {
    Conv2dShape c = s;
    c.n = std::min(chunk, s.n - n0);
    const long npix = c.pixels();
    float* col = workspace;
    float* out = workspace + k * npix;
    im2col(c, x + n0 * in_image, col);
    // out (OC, n*P) = w (OC, K) * col (K, n*P)
    gemm(Trans::kNo, Trans::kNo, s.oc, static_cast<int>(npix), k, 1.0f, w, k, col, static_cast<int>(npix), 0.0f,
         out, static_cast<int>(npix));
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

void conv2d_backward(const Conv2dShape& s, const float* x, const float* w, const float* dy, float* dx,
                     float* dw, float* db, float* workspace, int chunk) {
  if (conv2d_direct_applies(s)) return conv2d_backward_direct(s, x, w, dy, dx, dw, db, workspace);
  const long plane = static_cast<long>(s.oh()) * s.ow(), in_image = static_cast<long>(s.c) * s.h * s.w;
  const int k = static_cast<int>(s.patch());
  if (db) std::fill(db, db + s.oc, 0.0f);
  for (int n0 = 0; n0 < s.n; n0 += chunk) {
    Conv2dShape c = s;
    c.n = std::min(chunk, s.n - n0);
    const long npix = c.pixels();
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
    im2col(c, x + n0 * in_image, col);
    // dw (OC, K) (+)= g (OC, n*P) * col^T (n*P, K)
    gemm(Trans::kNo, Trans::kYes, s.oc, k, static_cast<int>(npix), 1.0f, g, static_cast<int>(npix), col,
         static_cast<int>(npix), n0 == 0 ? 0.0f : 1.0f, dw, k);
    if (!dx) continue;
    // dcol (K, n*P) = w^T (K, OC) * g (OC, n*P), written over col (dead once dw has it)
    gemm(Trans::kYes, Trans::kNo, k, static_cast<int>(npix), s.oc, 1.0f, w, k, g, static_cast<int>(npix), 0.0f,
         col, static_cast<int>(npix));
    col2im(c, col, dx + n0 * in_image);
  }
}

}  // namespace chorus::kernels::cpu
