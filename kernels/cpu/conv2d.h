// 2-D convolution (cross-correlation, like PyTorch), NCHW, f32: a direct reference and an
// im2col + GEMM fast path, forward and backward side by side.
#pragma once

#include <cstddef>

namespace chorus::kernels::cpu {

struct Conv2dShape {
  int n = 0, c = 0, h = 0, w = 0;  // input (N,C,H,W)
  int oc = 0, kh = 0, kw = 0;      // weight (OC,C,KH,KW)
  int stride = 1, pad = 0;
  int oh() const { return (h + 2 * pad - kh) / stride + 1; }
  int ow() const { return (w + 2 * pad - kw) / stride + 1; }
  long patch() const { return static_cast<long>(c) * kh * kw; }       // K: one column of im2col
  long pixels() const { return static_cast<long>(n) * oh() * ow(); }  // N*OH*OW
  size_t col_floats() const { return static_cast<size_t>(patch()) * pixels(); }
};

// ---- reference: seven plain loops ---------------------------------------------------------
// x (N,C,H,W), w (OC,C,KH,KW), b (OC) or null -> y (N,OC,OH,OW)
void conv2d_forward_ref(const Conv2dShape& s, const float* x, const float* w, const float* b,
                        float* y);
// dy (N,OC,OH,OW) -> dx (N,C,H,W) (skipped when null), dw (OC,C,KH,KW), db (OC) or null.
// Overwrites.
void conv2d_backward_ref(const Conv2dShape& s, const float* x, const float* w, const float* dy,
                         float* dx, float* dw, float* db);

// ---- fast path: im2col + GEMM over chunks of images -----------------------------------------
// x (N,C,H,W) -> col (K, N*OH*OW) where K = C*KH*KW; padding reads as zero.
void im2col(const Conv2dShape& s, const float* x, float* col);
// col (K, N*OH*OW) -> dx (N,C,H,W): overwrites dx with the sum of every column entry's source.
void col2im(const Conv2dShape& s, const float* col, float* dx);

// Images per GEMM: as many as keep one chunk's im2col within ~kChunkFloats, so it stays in L2
// between im2col and the GEMM (one 64-image chunk of the first layer is 3.7 MB and runs ~1.4x
// slower; bench/RESULTS.md).
constexpr long kChunkFloats = 64 * 1024;
int conv2d_default_chunk(const Conv2dShape& s);
// Floats of workspace conv2d_forward/backward need for a given chunk: col + GEMM output.
size_t conv2d_workspace_floats(const Conv2dShape& s, int chunk);
// y (N,OC,OH,OW) = conv(x, w) + b.
void conv2d_forward(const Conv2dShape& s, const float* x, const float* w, const float* b, float* y,
                    float* workspace, int chunk);
// Recomputes im2col of x chunk by chunk (cheaper than keeping all of it). dx may be null (the
// input needs no gradient), db may be null. Overwrites dx, dw, db.
void conv2d_backward(const Conv2dShape& s, const float* x, const float* w, const float* dy,
                     float* dx, float* dw, float* db, float* workspace, int chunk);

// Direct path (conv2d_direct.cc), taken by conv2d_forward/backward when it applies: stride 1,
// no padding, at most kDirectMaxPatch taps per output and output rows 24 or 28 wide (the first
// layers of the tutorial nets: 1x5x5 on 28x28, 3x5x5 on 32x32).
constexpr long kDirectMaxPatch = 75;
bool conv2d_direct_applies(const Conv2dShape& s);
void conv2d_forward_direct(const Conv2dShape& s, const float* x, const float* w, const float* b,
                           float* y);
// acc: OC * patch() * OW floats of scratch.
void conv2d_backward_direct(const Conv2dShape& s, const float* x, const float* w, const float* dy,
                            float* dx, float* dw, float* db, float* acc);

}  // namespace chorus::kernels::cpu
