// log_softmax / nll / argmax kernels.
#include "kernels/cpu/softmax.h"

#include <cmath>

namespace chorus::kernels::cpu {

void log_softmax_forward(int rows, int cols, const float* x, float* y) {
  for (int r = 0; r < rows; ++r) {
    const float* xr = x + static_cast<long>(r) * cols;
    float* yr = y + static_cast<long>(r) * cols;
    float m = xr[0];
    for (int c = 1; c < cols; ++c) m = xr[c] > m ? xr[c] : m;
    float s = 0.0f;
    for (int c = 0; c < cols; ++c) s += std::exp(xr[c] - m);
    const float lse = m + std::log(s);
    for (int c = 0; c < cols; ++c) yr[c] = xr[c] - lse;
  }
}

void log_softmax_backward(int rows, int cols, const float* y, const float* dy, float* dx) {
  for (int r = 0; r < rows; ++r) {
    const float* yr = y + static_cast<long>(r) * cols;
    const float* gr = dy + static_cast<long>(r) * cols;
    float* dr = dx + static_cast<long>(r) * cols;
    float s = 0.0f;
    for (int c = 0; c < cols; ++c) s += gr[c];
    for (int c = 0; c < cols; ++c) dr[c] = gr[c] - std::exp(yr[c]) * s;
  }
}

float nll_forward(int rows, int cols, const float* logp, const int32_t* labels) {
  double s = 0.0;
  for (int r = 0; r < rows; ++r) s -= logp[static_cast<long>(r) * cols + labels[r]];
  return static_cast<float>(s);
}

void nll_backward(int rows, int cols, const int32_t* labels, float scale, float* dlogp) {
  for (long i = 0; i < static_cast<long>(rows) * cols; ++i) dlogp[i] = 0.0f;
  for (int r = 0; r < rows; ++r) dlogp[static_cast<long>(r) * cols + labels[r]] = -scale;
}

void argmax_rows(int rows, int cols, const float* x, int32_t* out) {
  for (int r = 0; r < rows; ++r) {
    const float* xr = x + static_cast<long>(r) * cols;
    int best = 0;
    for (int c = 1; c < cols; ++c)
      if (xr[c] > xr[best]) best = c;
    out[r] = best;
  }
}

}  // namespace chorus::kernels::cpu
