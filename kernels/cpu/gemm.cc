// GEMM: reference triple loop, a compiler-vectorised blocked loop nest (its inner loops run the
// active instruction-set build, isa/gemm.cc), and the OpenBLAS call.
#include "kernels/cpu/gemm.h"

#include <algorithm>
#include <vector>

#include "kernels/cpu/isa/table.h"

#if CHORUS_HAVE_OPENBLAS
#include <cblas.h>
#endif

namespace chorus::kernels::cpu {
namespace {

inline float at(const float* p, int ld, Trans t, int row, int col) {
  return t == Trans::kNo ? p[static_cast<long>(row) * ld + col]
                         : p[static_cast<long>(col) * ld + row];
}

void scale_c(int m, int n, float beta, float* c, int ldc) {
  for (int i = 0; i < m; ++i) {
    float* ci = c + static_cast<long>(i) * ldc;
    if (beta == 0.0f) {
      std::fill(ci, ci + n, 0.0f);
    } else if (beta != 1.0f) {
      for (int j = 0; j < n; ++j) ci[j] *= beta;
    }
  }
}

}  // namespace

void gemm_ref(Trans ta, Trans tb, int m, int n, int k, float alpha, const float* a, int lda,
              const float* b, int ldb, float beta, float* c, int ldc) {
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      double s = 0.0;
      for (int p = 0; p < k; ++p)
        s += static_cast<double>(at(a, lda, ta, i, p)) * at(b, ldb, tb, p, j);
      float& cij = c[static_cast<long>(i) * ldc + j];
      cij = static_cast<float>(alpha * s + (beta == 0.0f ? 0.0 : static_cast<double>(beta) * cij));
    }
  }
}

void gemm_blocked(Trans ta, Trans tb, int m, int n, int k, float alpha, const float* a, int lda,
                  const float* b, int ldb, float beta, float* c, int ldc) {
  scale_c(m, n, beta, c, ldc);
  if (k == 0 || alpha == 0.0f) return;
  if (ta == Trans::kNo && tb == Trans::kYes)
    return cpu_kernels().gemm_rows_dot(m, n, k, alpha, a, lda, b, ldb, c, ldc);
  if (tb == Trans::kYes) {
    // A^T B^T: pack B^T into a k x n row-major copy, then the axpy form.
    std::vector<float> bt(static_cast<size_t>(k) * n);
    for (int j = 0; j < n; ++j)
      for (int p = 0; p < k; ++p)
        bt[static_cast<size_t>(p) * n + j] = b[static_cast<long>(j) * ldb + p];
    return cpu_kernels().gemm_rows_axpy(ta, m, n, k, alpha, a, lda, bt.data(), n, c, ldc);
  }
  cpu_kernels().gemm_rows_axpy(ta, m, n, k, alpha, a, lda, b, ldb, c, ldc);
}

void gemm_blas(Trans ta, Trans tb, int m, int n, int k, float alpha, const float* a, int lda,
               const float* b, int ldb, float beta, float* c, int ldc) {
#if CHORUS_HAVE_OPENBLAS
  if (m == 0 || n == 0) return;
  cblas_sgemm(CblasRowMajor, ta == Trans::kNo ? CblasNoTrans : CblasTrans,
              tb == Trans::kNo ? CblasNoTrans : CblasTrans, m, n, k, alpha, a, lda, b, ldb, beta, c,
              ldc);
#else
  gemm_blocked(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
#endif
}

void gemm(Trans ta, Trans tb, int m, int n, int k, float alpha, const float* a, int lda,
          const float* b, int ldb, float beta, float* c, int ldc) {
  gemm_blas(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

bool gemm_has_blas() {
  return CHORUS_HAVE_OPENBLAS != 0;
}

void gemm_set_threads(int threads) {
#if CHORUS_HAVE_OPENBLAS
  openblas_set_num_threads(threads);
#else
  (void)threads;
#endif
}

}  // namespace chorus::kernels::cpu
