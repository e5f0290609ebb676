// The entry points each instruction-set build defines in its own namespace (CHORUS_ISA_NS:
// scalar, avx2 or avx512); isa/table.cc gathers them into that build's kCpuKernels. Contracts are
// those of the public functions of the same name in kernels/cpu/*.h.
#pragma once

#ifndef CHORUS_ISA_NS
#error "kernels/cpu/isa/ is compiled once per instruction set, with -DCHORUS_ISA_NS=<name>"
#endif

#include "kernels/cpu/isa/table.h"

namespace chorus::kernels::CHORUS_ISA_NS {

// isa/reduce.cc
ReduceFn pick_reduce(DType t, RedOp op, bool copy);
void scale_avg(DType t, void* buf, size_t count, int nranks);
// isa/copy.cc
void copy_streaming(void* dst, const void* src, size_t bytes);
// isa/elementwise.cc
void relu_forward(long n, const float* x, float* y);
void relu_backward(long n, const float* y, const float* dy, float* dx);
void add(long n, const float* a, const float* b, float* y);
void mul(long n, const float* a, const float* b, float* y);
void scale(long n, float alpha, const float* x, float* y);
void axpy(long n, float alpha, const float* x, float* y);
void fill(long n, float value, float* y);
float sum(long n, const float* x);
void add_row_bias(int rows, int cols, const float* bias, float* y);
void sum_rows(int rows, int cols, const float* dy, float* dbias);
// isa/pool.cc
void pool2x2_forward(const cpu::PoolShape& s, const float* x, float* y, uint8_t* argmax);
void pool2x2_backward(const cpu::PoolShape& s, const uint8_t* argmax, const float* dy, float* dx);
// isa/conv2d.cc
void im2col(const cpu::Conv2dShape& s, const float* x, float* col);
void col2im(const cpu::Conv2dShape& s, const float* col, float* dx);
void conv2d_forward(const cpu::Conv2dShape& s, const float* x, const float* w, const float* b,
                    float* y, float* workspace, int chunk);
void conv2d_backward(const cpu::Conv2dShape& s, const float* x, const float* w, const float* dy,
                     float* dx, float* dw, float* db, float* workspace, int chunk);
// isa/conv2d_direct.cc
void conv2d_forward_direct(const cpu::Conv2dShape& s, const float* x, const float* w,
                           const float* b, float* y);
void conv2d_backward_direct(const cpu::Conv2dShape& s, const float* x, const float* w,
                            const float* dy, float* dx, float* dw, float* db, float* acc);
// isa/gemm.cc
void gemm_rows_dot(int m, int n, int k, float alpha, const float* a, int lda, const float* b,
                   int ldb, float* c, int ldc);
void gemm_rows_axpy(cpu::Trans ta, int m, int n, int k, float alpha, const float* a, int lda,
                    const float* b, int ldb, float* c, int ldc);

// Shape arithmetic for isa/ code (Conv2dShape's and PoolShape's own inline members must not be
// called from here: see isa/table.h).
inline int out_h(const cpu::Conv2dShape& s) {
  return (s.h + 2 * s.pad - s.kh) / s.stride + 1;
}
inline int out_w(const cpu::Conv2dShape& s) {
  return (s.w + 2 * s.pad - s.kw) / s.stride + 1;
}
inline long patch(const cpu::Conv2dShape& s) {
  return static_cast<long>(s.c) * s.kh * s.kw;
}
inline int out_h(const cpu::PoolShape& s) {
  return (s.h - s.kernel) / s.stride + 1;
}
inline int out_w(const cpu::PoolShape& s) {
  return (s.w - s.kernel) / s.stride + 1;
}

}  // namespace chorus::kernels::CHORUS_ISA_NS
