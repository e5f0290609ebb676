// Elementwise and small reduction kernels on contiguous f32 arrays (n elements).
#pragma once

namespace chorus::kernels::cpu {

// y = max(x, 0); dx = dy where y > 0 else 0 (PyTorch: gradient 0 at x == 0).
void relu_forward(long n, const float* x, float* y);
void relu_backward(long n, const float* y, const float* dy, float* dx);

void add(long n, const float* a, const float* b, float* y);  // y = a + b
void mul(long n, const float* a, const float* b, float* y);  // y = a * b
void scale(long n, float alpha, const float* x, float* y);   // y = alpha * x
void axpy(long n, float alpha, const float* x, float* y);    // y += alpha * x
void fill(long n, float value, float* y);
float sum(long n, const float* x);  // accumulated in double, returned as f32

// rows x cols matrix: y[r,:] += bias[:]; dbias[c] = sum over rows of dy[r,c] (overwrites).
void add_row_bias(int rows, int cols, const float* bias, float* y);
void sum_rows(int rows, int cols, const float* dy, float* dbias);

}  // namespace chorus::kernels::cpu
