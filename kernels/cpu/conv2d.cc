// Conv2d kernels: direct reference loops; the fast paths (im2col + GEMM, direct) run the active
// instruction-set build (isa/conv2d.cc, isa/conv2d_direct.cc).
//
// The fast path lays a chunk of images out as one matrix so each chunk is a single GEMM:
//   forward   Y'(OC, N*P) = W(OC, K) * col(K, N*P)          then Y(N,OC,P) = transpose(Y') + b
//   backward  dY'(OC, N*P) = transpose(dY)
//             dW(OC, K)    = dY' * col^T
//             dcol(K, N*P) = W^T * dY'                      then dx = col2im(dcol)
// with P = OH*OW and K = C*KH*KW; backward recomputes col per chunk instead of keeping it
// (Chellapilla et al. 2006, "High Performance Convolutional Neural Networks for Document
// Processing").
#include "kernels/cpu/conv2d.h"

#include <algorithm>

#include "kernels/cpu/isa/table.h"

namespace chorus::kernels::cpu {

void conv2d_forward_ref(const Conv2dShape& s, const float* x, const float* w, const float* b,
                        float* y) {
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
                acc += static_cast<double>(
                           x[((static_cast<long>(n) * s.c + c) * s.h + ih) * s.w + iw]) *
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

void im2col(const Conv2dShape& s, const float* x, float* col) {
  cpu_kernels().im2col(s, x, col);
}

void col2im(const Conv2dShape& s, const float* col, float* dx) {
  cpu_kernels().col2im(s, col, dx);
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

bool conv2d_direct_applies(const Conv2dShape& s) {
  return s.stride == 1 && s.pad == 0 && s.patch() <= kDirectMaxPatch &&
         (s.ow() == 24 || s.ow() == 28);
}

void conv2d_forward_direct(const Conv2dShape& s, const float* x, const float* w, const float* b,
                           float* y) {
  cpu_kernels().conv2d_forward_direct(s, x, w, b, y);
}

void conv2d_backward_direct(const Conv2dShape& s, const float* x, const float* w, const float* dy,
                            float* dx, float* dw, float* db, float* acc) {
  cpu_kernels().conv2d_backward_direct(s, x, w, dy, dx, dw, db, acc);
}

void conv2d_forward(const Conv2dShape& s, const float* x, const float* w, const float* b, float* y,
                    float* workspace, int chunk) {
  cpu_kernels().conv2d_forward(s, x, w, b, y, workspace, chunk);
}

void conv2d_backward(const Conv2dShape& s, const float* x, const float* w, const float* dy,
                     float* dx, float* dw, float* db, float* workspace, int chunk) {
  cpu_kernels().conv2d_backward(s, x, w, dy, dx, dw, db, workspace, chunk);
}

}  // namespace chorus::kernels::cpu
