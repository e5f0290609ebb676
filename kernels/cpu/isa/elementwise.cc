// Elementwise kernels (elementwise.h) of one instruction-set build: plain loops written so the
// compiler vectorises them at the build's width.
#include "kernels/cpu/isa/entries.h"

namespace chorus::kernels::CHORUS_ISA_NS {

void relu_forward(long n, const float* x, float* y) {
  for (long i = 0; i < n; ++i) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

void relu_backward(long n, const float* y, const float* dy, float* dx) {
  for (long i = 0; i < n; ++i) dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}

void add(long n, const float* a, const float* b, float* y) {
  for (long i = 0; i < n; ++i) y[i] = a[i] + b[i];
}

void mul(long n, const float* a, const float* b, float* y) {
  for (long i = 0; i < n; ++i) y[i] = a[i] * b[i];
}

void scale(long n, float alpha, const float* x, float* y) {
  for (long i = 0; i < n; ++i) y[i] = alpha * x[i];
}

void axpy(long n, float alpha, const float* x, float* y) {
  for (long i = 0; i < n; ++i) y[i] += alpha * x[i];
}

void fill(long n, float value, float* y) {
  for (long i = 0; i < n; ++i) y[i] = value;
}

float sum(long n, const float* x) {
  double s = 0.0;
  for (long i = 0; i < n; ++i) s += x[i];
  return static_cast<float>(s);
}

void add_row_bias(int rows, int cols, const float* bias, float* y) {
  for (int r = 0; r < rows; ++r) {
    float* yr = y + static_cast<long>(r) * cols;
    for (int c = 0; c < cols; ++c) yr[c] += bias[c];
  }
}

void sum_rows(int rows, int cols, const float* dy, float* dbias) {
  for (int c = 0; c < cols; ++c) dbias[c] = 0.0f;
  for (int r = 0; r < rows; ++r) {
    const float* dr = dy + static_cast<long>(r) * cols;
    for (int c = 0; c < cols; ++c) dbias[c] += dr[c];
  }
}

}  // namespace chorus::kernels::CHORUS_ISA_NS
