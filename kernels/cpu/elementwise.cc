// Elementwise kernels: each call runs the active instruction-set build (isa/elementwise.cc).
#include "kernels/cpu/elementwise.h"

#include "kernels/cpu/isa/table.h"

namespace chorus::kernels::cpu {

void relu_forward(long n, const float* x, float* y) {
  cpu_kernels().relu_forward(n, x, y);
}

void relu_backward(long n, const float* y, const float* dy, float* dx) {
  cpu_kernels().relu_backward(n, y, dy, dx);
}

void add(long n, const float* a, const float* b, float* y) {
  cpu_kernels().add(n, a, b, y);
}

void mul(long n, const float* a, const float* b, float* y) {
  cpu_kernels().mul(n, a, b, y);
}

void scale(long n, float alpha, const float* x, float* y) {
  cpu_kernels().scale(n, alpha, x, y);
}

void axpy(long n, float alpha, const float* x, float* y) {
  cpu_kernels().axpy(n, alpha, x, y);
}

void fill(long n, float value, float* y) {
  cpu_kernels().fill(n, value, y);
}

float sum(long n, const float* x) {
  return cpu_kernels().sum(n, x);
}

void add_row_bias(int rows, int cols, const float* bias, float* y) {
  cpu_kernels().add_row_bias(rows, cols, bias, y);
}

void sum_rows(int rows, int cols, const float* dy, float* dbias) {
  cpu_kernels().sum_rows(rows, cols, dy, dbias);
}

}  // namespace chorus::kernels::cpu
