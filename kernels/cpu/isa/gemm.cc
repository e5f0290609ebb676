// gemm_blocked's two loop nests (gemm.h) of one instruction-set build; gemm.cc scales C by beta,
// packs B^T where needed and calls one of them.
#include "kernels/cpu/isa/entries.h"

namespace chorus::kernels::CHORUS_ISA_NS {
namespace {

inline float at(const float* p, int ld, cpu::Trans t, int row, int col) {
  return t == cpu::Trans::kNo ? p[static_cast<long>(row) * ld + col]
                              : p[static_cast<long>(col) * ld + row];
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

// C[i,j] += alpha * dot(A row i, B row j): both rows contiguous.
void gemm_rows_dot(int m, int n, int k, float alpha, const float* a, int lda, const float* b,
                   int ldb, float* c, int ldc) {
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j)
      c[static_cast<long>(i) * ldc + j] +=
          alpha * dot(a + static_cast<long>(i) * lda, b + static_cast<long>(j) * ldb, k);
}

// C row i += alpha * op(A)[i,p] * B row p, blocked over columns so a strip of C stays in L1
// while p runs.
void gemm_rows_axpy(cpu::Trans ta, int m, int n, int k, float alpha, const float* a, int lda,
                    const float* b, int ldb, float* c, int ldc) {
  constexpr int kColBlock = 512;
  constexpr int kDepthBlock = 128;
  for (int j0 = 0; j0 < n; j0 += kColBlock) {
    const int nb = n - j0 < kColBlock ? n - j0 : kColBlock;
    for (int p0 = 0; p0 < k; p0 += kDepthBlock) {
      const int pe = k < p0 + kDepthBlock ? k : p0 + kDepthBlock;
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

}  // namespace chorus::kernels::CHORUS_ISA_NS
