// gemm_bench: OpenBLAS vs the hand-written blocked GEMM on the GEMM shapes of one training step
// of the tutorial CNN (conv2 per 6-image chunk, fc1 at batch 64 and 4). This is the measurement
// behind kernels/cpu gemm() choosing OpenBLAS; results in bench/RESULTS.md. Also the first conv
// layer's direct path (forward, and backward without dx as in training) of both tutorial nets.
// CHORUS_CPU_ISA=scalar|avx2|avx512 picks the kernel build; the context line "kernels:" says which.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <vector>

#include "kernels/cpu/conv2d.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/isa.h"

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
  std::vector<float> a(static_cast<size_t>(c.m) * c.kk, 0.5f),
      b(static_cast<size_t>(c.kk) * c.n, 0.25f), out(static_cast<size_t>(c.m) * c.n);
  for (auto _ : state) {
    if (kBlas)
      k::gemm_blas(c.ta, c.tb, c.m, c.n, c.kk, 1.0f, a.data(), lda, b.data(), ldb, 0.0f, out.data(),
                   c.n);
    else
      k::gemm_blocked(c.ta, c.tb, c.m, c.n, c.kk, 1.0f, a.data(), lda, b.data(), ldb, 0.0f,
                      out.data(), c.n);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetLabel(c.name);
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * c.m * c.n * c.kk, benchmark::Counter::kIsIterationInvariantRate,
                         benchmark::Counter::kIs1000);
}

// conv1 of the Fashion-MNIST net at batch 64 (range 0: 1x28x28, 24-wide rows) and of the CIFAR
// net at batch 4 (range 1: 3x32x32, 28-wide rows); 6 filters of 5x5.
template <bool kBackward>
void conv1(benchmark::State& state) {
  const bool cifar = state.range(0) == 1;
  k::Conv2dShape s;
  s.n = cifar ? 4 : 64, s.c = cifar ? 3 : 1, s.h = s.w = cifar ? 32 : 28, s.oc = 6, s.kh = s.kw = 5;
  std::vector<float> x(static_cast<size_t>(s.n) * s.c * s.h * s.w),
      w(static_cast<size_t>(s.oc) * s.patch()), b(6),
      y(static_cast<size_t>(s.n) * s.oc * s.oh() * s.ow()), dw(w.size()), db(6),
      work(k::conv2d_workspace_floats(s, s.n));
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 17) * 0.125f - 1.0f;
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i % 7) * 0.25f - 0.75f;
  for (size_t i = 0; i < y.size(); ++i) y[i] = static_cast<float>(i % 5) * 0.5f - 1.0f;
  for (auto _ : state) {
    if (kBackward)
      k::conv2d_backward(s, x.data(), w.data(), y.data(), nullptr, dw.data(), db.data(),
                         work.data(), s.n);
    else
      k::conv2d_forward(s, x.data(), w.data(), b.data(), y.data(), work.data(), s.n);
    benchmark::DoNotOptimize(y.data());
    benchmark::DoNotOptimize(dw.data());
  }
  state.SetLabel(cifar ? "cifar_b4" : "fmnist_b64");
}

}  // namespace

BENCHMARK_TEMPLATE(run, true)->Name("gemm_openblas")->DenseRange(0, 7);
BENCHMARK_TEMPLATE(run, false)->Name("gemm_blocked")->DenseRange(0, 7);
BENCHMARK_TEMPLATE(conv1, false)->Name("conv1_forward")->DenseRange(0, 1);
BENCHMARK_TEMPLATE(conv1, true)->Name("conv1_backward")->DenseRange(0, 1);

int main(int argc, char** argv) {
  if (chorus::Status st = chorus::kernels::init_isa(); !st.is_ok()) {
    std::fprintf(stderr, "gemm_bench: %s\n", st.message().c_str());
    return 2;
  }
  benchmark::AddCustomContext("kernels", chorus::kernels::isa_name(chorus::kernels::active_isa()));
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
