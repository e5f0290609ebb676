// The kernel entry points one instruction-set build provides. kernels/cpu/isa/ is compiled once
// per build (scalar, avx2, avx512; see its meson.build), each copy in its own namespace
// (chorus::kernels::scalar, ::avx2, ::avx512) with its own kCpuKernels; isa.cc points
// cpu_kernels() at one of them. The public functions in kernels/cpu/*.h call through it.
//
// Rule for code under isa/: everything it defines lives in CHORUS_ISA_NS, and it calls no inline
// function or template from outside that namespace (no <algorithm>, no std::vector, no member
// functions of the shape structs): the linker keeps one copy of such a function out of all the
// builds, which might be the AVX-512 one. tests/kernels/check_isa_symbols.sh checks the objects.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/conv2d.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/pool.h"
#include "kernels/cpu/reduce.h"

namespace chorus::kernels {

// out[i] = a[i] op b[i] (and out2[i], for the reduce_copy loops).
using ReduceFn = void (*)(const void* a, const void* b, void* out, void* out2, size_t count);

struct CpuKernels {
  int isa;  // the build's Isa (isa.h) as a number: isa/ code stays free of isa.h's includes
  // reduce.h: the loop for (t, op), with or without the second output.
  ReduceFn (*pick_reduce)(DType t, RedOp op, bool copy);
  void (*scale_avg)(DType t, void* buf, size_t count, int nranks);
  // copy.h
  void (*copy_streaming)(void* dst, const void* src, size_t bytes);
  // elementwise.h
  void (*relu_forward)(long n, const float* x, float* y);
  void (*relu_backward)(long n, const float* y, const float* dy, float* dx);
  void (*add)(long n, const float* a, const float* b, float* y);
  void (*mul)(long n, const float* a, const float* b, float* y);
  void (*scale)(long n, float alpha, const float* x, float* y);
  void (*axpy)(long n, float alpha, const float* x, float* y);
  void (*fill)(long n, float value, float* y);
  float (*sum)(long n, const float* x);
  void (*add_row_bias)(int rows, int cols, const float* bias, float* y);
  void (*sum_rows)(int rows, int cols, const float* dy, float* dbias);
  // pool.h: the 2x2 / stride 2 path.
  void (*pool2x2_forward)(const cpu::PoolShape& s, const float* x, float* y, uint8_t* argmax);
  void (*pool2x2_backward)(const cpu::PoolShape& s, const uint8_t* argmax, const float* dy,
                           float* dx);
  // conv2d.h: im2col + GEMM over chunks, and the direct path.
  void (*im2col)(const cpu::Conv2dShape& s, const float* x, float* col);
  void (*col2im)(const cpu::Conv2dShape& s, const float* col, float* dx);
  void (*conv2d_forward)(const cpu::Conv2dShape& s, const float* x, const float* w, const float* b,
                         float* y, float* workspace, int chunk);
  void (*conv2d_backward)(const cpu::Conv2dShape& s, const float* x, const float* w,
                          const float* dy, float* dx, float* dw, float* db, float* workspace,
                          int chunk);
  void (*conv2d_forward_direct)(const cpu::Conv2dShape& s, const float* x, const float* w,
                                const float* b, float* y);
  void (*conv2d_backward_direct)(const cpu::Conv2dShape& s, const float* x, const float* w,
                                 const float* dy, float* dx, float* dw, float* db, float* acc);
  // gemm.h, gemm_blocked's two loop nests (C already scaled by beta):
  //   C (m x n) += alpha * A (m x k) * B^T, both row-major with contiguous rows
  void (*gemm_rows_dot)(int m, int n, int k, float alpha, const float* a, int lda, const float* b,
                        int ldb, float* c, int ldc);
  //   C (m x n) += alpha * op(A) * B, B (k x n) row-major
  void (*gemm_rows_axpy)(cpu::Trans ta, int m, int n, int k, float alpha, const float* a, int lda,
                         const float* b, int ldb, float* c, int ldc);
};

// The active build's table (isa.h says how it is chosen).
const CpuKernels& cpu_kernels();

namespace scalar {
extern const CpuKernels kCpuKernels;
}
namespace avx2 {
extern const CpuKernels kCpuKernels;
}
namespace avx512 {
extern const CpuKernels kCpuKernels;
}

}  // namespace chorus::kernels
