// GEMM for the CPU kernels: C = alpha * op(A) * op(B) + beta * C, row-major, f32.
//
// Three implementations behind one signature:
//   gemm_ref      the textbook triple loop (the reference every test compares against)
//   gemm_blocked  a hand-written loop nest the compiler vectorises (no BLAS needed)
//   gemm_blas     OpenBLAS cblas_sgemm, when the build found OpenBLAS
// gemm() is the fast path: OpenBLAS when present, else gemm_blocked. bench/gemm_bench.cc measures
// the three on the shapes of the tutorial CNN; bench/RESULTS.md records why the fast path is BLAS.
#pragma once

namespace chorus::kernels::cpu {

enum class Trans { kNo, kYes };

// op(A) is m x k, op(B) is k x n, C is m x n. lda/ldb/ldc are row strides of the stored matrices.
// beta == 0 overwrites C without reading it (NaNs in C do not propagate), like BLAS.
void gemm_ref(Trans ta, Trans tb, int m, int n, int k, float alpha, const float* a, int lda,
              const float* b, int ldb, float beta, float* c, int ldc);
void gemm_blocked(Trans ta, Trans tb, int m, int n, int k, float alpha, const float* a, int lda,
                  const float* b, int ldb, float beta, float* c, int ldc);
// Falls back to gemm_blocked when the build has no OpenBLAS.
void gemm_blas(Trans ta, Trans tb, int m, int n, int k, float alpha, const float* a, int lda,
               const float* b, int ldb, float beta, float* c, int ldc);
void gemm(Trans ta, Trans tb, int m, int n, int k, float alpha, const float* a, int lda,
          const float* b, int ldb, float beta, float* c, int ldc);

bool gemm_has_blas();
// Threads OpenBLAS may use (process-wide setting inside OpenBLAS); no-op without OpenBLAS.
void gemm_set_threads(int threads);

}  // namespace chorus::kernels::cpu
