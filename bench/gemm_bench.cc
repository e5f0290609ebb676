// gemm_bench: OpenBLAS vs the hand-written blocked GEMM on the GEMM shapes of one training step
// of the tutorial CNN (conv2 per 6-image chunk, fc1 at batch 64 and 4). This is the measurement
// behind kernels/cpu gemm() choosing OpenBLAS; results in bench/RESULTS.md.
#include <benchmark/benchmark.h>

#include <vector>

#include "kernels/cpu/gemm.h"

namespace k = chorus::kernels::cpu;

namespace {

struct Case {
  const char* name;
  k::Trans ta, tb;
  int m, n, kk;
};

const Case kCases[] = {
    {"conv2_fwd_NN", k::Trans::kNo, k::Trans::kNo, 16, 384, 150},
    {"conv2_dw_NT", k::Trans::kNo, k::Trans::kYes, 16, 150, 384},
    {"conv2_dcol_TN", k::Trans::kYes, k::Trans::kNo, 150, 384, 16},
    {"fc1_fwd_b64_NT", k::Trans::kNo, k::Trans::kYes, 64, 120, 256},
    {"fc1_dx_b64_NN", k::Trans::kNo, k::Trans::kNo, 64, 256, 120},
    {"fc1_dw_b64_TN", k::Trans::kYes, k::Trans::kNo, 120, 256, 64},
    {"fc1_fwd_b4_NT", k::Trans::kNo, k::Trans::kYes, 4, 120, 400},
    {"fc1_dw_b4_TN", k::Trans::kYes, k::Trans::kNo, 120, 400, 4},
};

template <bool kBlas>
void run(benchmark::State& state) {
  const Case& c = kCases[state.range(0)];
  const int lda = c.ta == k::Trans::kNo ? c.kk : c.m, ldb = c.tb == k::Trans::kNo ? c.n : c.kk;
  std::vector<float> a(static_cast<size_t>(c.m) * c.kk, 0.5f), b(static_cast<size_t>(c.kk) * c.n, 0.25f),
      out(static_cast<size_t>(c.m) * c.n);
  for (auto _ : state) {
    if (kBlas)
      k::gemm_blas(c.ta, c.tb, c.m, c.n, c.kk, 1.0f, a.data(), lda, b.data(), ldb, 0.0f, out.data(), c.n);
    else
      k::gemm_blocked(c.ta, c.tb, c.m, c.n, c.kk, 1.0f, a.data(), lda, b.data(), ldb, 0.0f, out.data(), c.n);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetLabel(c.name);
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * c.m * c.n * c.kk, benchmark::Counter::kIsIterationInvariantRate,
                                                 benchmark::Counter::kIs1000);
}

}  // namespace

BENCHMARK_TEMPLATE(run, true)->Name("gemm_openblas")->DenseRange(0, 7);
BENCHMARK_TEMPLATE(run, false)->Name("gemm_blocked")->DenseRange(0, 7);
BENCHMARK_MAIN();
