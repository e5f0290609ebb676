// GEMM: reference triple loop, a compiler-vectorised blocked loop nest, and the OpenBLAS call.
#include "kernels/cpu/gemm.h"

#include <algorithm>
#include <vector>

#if CHORUS_HAVE_OPENBLAS
#include <cblas.h>
#endif

namespace chorus::kernels::cpu {
namespace {

inline float at(const float* p, int ld, Trans t, int row, int col) {
  return t == Trans::kNo ? p[static_cast<long>(row) * ld + col] : p[static_cast<long>(col) * ld + row];
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

// Dot product of two contiguous rows with 16 independent lanes, so the compiler vectorises it
// without reassociating a single sum (no -ffast-math needed).
inline float dot(const float* x, const float* y, int k) {
  float lane[16] = {};
  int p = 0;
  for (; p + 16 <= k; p += 16)
    for (int l = 0; l < 16; ++l) lane[l] += x[p + l] * y[p + l];
  float s = 0.0f;
  for (int l = 0; l < 16; ++l) s += lane[l];
  for (; p < k; ++p) s += x[p] * y[p];
  return s;
}

}  // namespace

void gemm_ref(Trans ta, Trans tb, int m, int n, int k, float alpha, const float* a, int lda,
              const float* b, int ldb, float beta, float* c, int ldc) {
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      double s = 0.0;
      for (int p = 0; p < k; ++p) s += static_cast<double>(at(a, lda, ta, i, p)) * at(b, ldb, tb, p, j);
      float& cij = c[static_cast<long>(i) * ldc + j];
      cij = static_cast<float>(alpha * s + (beta == 0.0f ? 0.0 : static_cast<double>(beta) * cij));
    }
  }
}

void gemm_blocked(Trans ta, Trans tb, int m, int n, int k, float alpha, const float* a, int lda,
                  const float* b, int ldb, float beta, float* c, int ldc) {
  scale_c(m, n, beta, c, ldc);
  if (k == 0 || alpha == 0.0f) return;
  if (ta == Trans::kNo && tb == Trans::kYes) {
    // C[i,j] += alpha * dot(A row i, B row j): both rows contiguous.
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < n; ++j)
        c[static_cast<long>(i) * ldc + j] +=
            alpha * dot(a + static_cast<long>(i) * lda, b + static_cast<long>(j) * ldb, k);
    return;
  }
  if (tb == Trans::kYes) {
    // A^T B^T: pack B^T into a k x n row-major copy, then fall through to the axpy form.
    std::vector<float> bt(static_cast<size_t>(k) * n);
    for (int j = 0; j < n; ++j)
      for (int p = 0; p < k; ++p) bt[static_cast<size_t>(p) * n + j] = b[static_cast<long>(j) * ldb + p];
    gemm_blocked(ta, Trans::kNo, m, n, k, alpha, a, lda, bt.data(), n, 1.0f, c, ldc);
    return;
  }
  // op(B) is B itself (k x n, contiguous rows): C row i += alpha * op(A)[i,p] * B row p,
  // blocked over columns so a strip of C stays in L1 while p runs.
  constexpr int kColBlock = 512;
  constexpr int kDepthBlock = 128;
  for (int j0 = 0; j0 < n; j0 += kColBlock) {
    const int nb = std::min(kColBlock, n - j0);
    for (int p0 = 0; p0 < k; p0 += kDepthBlock) {
      const int pe = std::min(k, p0 + kDepthBlock);
      for (int i = 0; i < m; ++i) {
        float* ci = c + static_cast<long>(i) * ldc + j0;
        for (int p = p0; p < pe; ++p) {
          const float aip = alpha * at(a, lda, ta, i, p);
          const float* bp = b + static_cast<long>(p) * ldb + j0;
          for (int j = 0; j < nb; ++j) ci[j] += aip * bp[j];
        }
      }
    }
  }
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

bool gemm_has_blas() { return CHORUS_HAVE_OPENBLAS != 0; }

void gemm_set_threads(int threads) {
#if CHORUS_HAVE_OPENBLAS
  openblas_set_num_threads(threads);
#else
  (void)threads;
#endif
}

}  // namespace chorus::kernels::cpu
