// Google Benchmark for the CPU reduction kernels (kernels/cpu/reduce.h), with a memcpy and a plain
// `c[i] = a[i] + b[i]` loop in the same binary so the ratio is measured side by side.
//
// S is the size of one array in bytes. The "bw" counter is decimal bytes per second, counted
// like the peer benchmark (shared/peers/comm/membw.cc): memcpy moves S, a two-input reduction
// moves 3*S (2 reads + 1 write) and reduce_copy 4*S; the label says which.
// reduce_then_memcpy (the two passes reduce_copy replaces) is also counted as 4*S, so the two
// compare directly.
// Timing is wall-clock (UseRealTime), as in the peer benchmark; Google Benchmark's JSON also
// carries CPU time, which on our 2 shared cores excludes the time other tasks stole.
// Run: build/bench/reduce-bench --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
// CHORUS_CPU_ISA=scalar|avx2|avx512 picks the kernel build (kernels/cpu/isa.h); the context
// line "kernels:" says which ran.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cpu/half.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/reduce.h"
#include "kernels/cpu/reduce_ref.h"

namespace ck = chorus::kernels;

namespace {

constexpr size_t kMiB = size_t(1) << 20;

// Page-aligned buffer, filled with `fill` repeated (pages faulted in before timing).
struct Buffer {
  explicit Buffer(size_t bytes, const void* fill = nullptr, size_t fill_size = 1) {
    size_t rounded = (bytes + 4095) / 4096 * 4096;
    p = static_cast<uint8_t*>(std::aligned_alloc(4096, rounded));
    for (size_t i = 0; i < rounded; i += fill_size) {
      if (fill && i + fill_size <= rounded)
        std::memcpy(p + i, fill, fill_size);
      else
        p[i] = 0;
    }
  }
  ~Buffer() { std::free(p); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  uint8_t* p;
};

// One element of `t` holding about `v` (exactly representable in every type used here).
std::vector<uint8_t> element(ck::DType t, double v) {
  std::vector<uint8_t> e(ck::dtype_size(t));
  switch (t) {
    case ck::DType::kF32: {
      float f = float(v);
      std::memcpy(e.data(), &f, 4);
      break;
    }
    case ck::DType::kF64:
      std::memcpy(e.data(), &v, 8);
      break;
    case ck::DType::kF16: {
      uint16_t h = ck::float_to_half(float(v));
      std::memcpy(e.data(), &h, 2);
      break;
    }
    case ck::DType::kBF16: {
      uint16_t h = ck::float_to_bf16(float(v));
      std::memcpy(e.data(), &h, 2);
      break;
    }
    case ck::DType::kI32: {
      int32_t i = int32_t(v);
      std::memcpy(e.data(), &i, 4);
      break;
    }
    case ck::DType::kI64: {
      int64_t i = int64_t(v);
      std::memcpy(e.data(), &i, 8);
      break;
    }
    case ck::DType::kU8:
    case ck::DType::kI8:
      e[0] = uint8_t(int(v));
      break;
    case ck::DType::kU32: {
      uint32_t u = uint32_t(v);
      std::memcpy(e.data(), &u, 4);
      break;
    }
    case ck::DType::kU64: {
      uint64_t u = uint64_t(v);
      std::memcpy(e.data(), &u, 8);
      break;
    }
  }
  return e;
}

void set_bw(benchmark::State& state, double bytes_per_op, const char* label) {
  state.counters["bw"] =
      benchmark::Counter(bytes_per_op * double(state.iterations()), benchmark::Counter::kIsRate);
  state.SetLabel(label);
}

__attribute__((noinline)) void sum_floats(float* __restrict c, const float* __restrict a,
                                          const float* __restrict b, size_t n) {
  for (size_t i = 0; i < n; i++) c[i] = a[i] + b[i];
}

void bm_memcpy(benchmark::State& state, size_t bytes) {
  Buffer src(bytes), dst(bytes);
  for (auto _ : state) {
    std::memcpy(dst.p, src.p, bytes);
    benchmark::ClobberMemory();
  }
  set_bw(state, double(bytes), "S");
}

void bm_plain_sum_f32(benchmark::State& state, size_t bytes) {
  float one = 1.5f, two = 2.25f;
  Buffer a(bytes, &one, 4), b(bytes, &two, 4), c(bytes);
  for (auto _ : state) {
    sum_floats(reinterpret_cast<float*>(c.p), reinterpret_cast<const float*>(a.p),
               reinterpret_cast<const float*>(b.p), bytes / 4);
    benchmark::ClobberMemory();
  }
  set_bw(state, 3.0 * double(bytes), "3S");
}

enum class Kind { kFast, kRef, kInPlace, kCopy, kThenMemcpy };

void bm_reduce(benchmark::State& state, ck::DType t, ck::RedOp op, size_t bytes, Kind kind) {
  auto ea = element(t, 1.5), eb = element(t, 2.0);
  size_t sz = ck::dtype_size(t), n = bytes / sz;
  Buffer a(bytes, ea.data(), sz), b(bytes, eb.data(), sz), c(bytes), d(bytes);
  for (auto _ : state) {
    switch (kind) {
      case Kind::kFast:
        ck::reduce(t, op, a.p, b.p, c.p, n);
        break;
      case Kind::kRef:
        ck::ref::reduce(t, op, a.p, b.p, c.p, n);
        break;
      case Kind::kInPlace:
        ck::reduce(t, op, c.p, b.p, c.p, n);
        break;  // c grows; stays finite
      case Kind::kCopy:
        ck::reduce_copy(t, op, a.p, b.p, c.p, d.p, n);
        break;
      case Kind::kThenMemcpy:  // what reduce_copy replaces: two passes
        ck::reduce(t, op, a.p, b.p, c.p, n);
        std::memcpy(d.p, c.p, bytes);
        break;
    }
    benchmark::ClobberMemory();
  }
  bool two_outputs = kind == Kind::kCopy || kind == Kind::kThenMemcpy;
  set_bw(state, (two_outputs ? 4.0 : 3.0) * double(bytes), two_outputs ? "4S" : "3S");
}

// Every benchmark reports wall-clock time (and rates derived from it).
void reg(const std::string& name, auto fn, auto... args) {
  benchmark::RegisterBenchmark(name.c_str(), fn, args...)->UseRealTime();
}

std::string size_name(size_t bytes) {
  return std::to_string(bytes / kMiB) + "MiB";
}

void register_all() {
  for (size_t s : {kMiB, 128 * kMiB}) {
    reg("memcpy/" + size_name(s), bm_memcpy, s);
    reg("plain_sum_f32/" + size_name(s), bm_plain_sum_f32, s);
    reg("reduce_f32_sum/" + size_name(s), bm_reduce, ck::DType::kF32, ck::RedOp::kSum, s,
        Kind::kFast);
    reg("reduce_f32_sum_inplace/" + size_name(s), bm_reduce, ck::DType::kF32, ck::RedOp::kSum, s,
        Kind::kInPlace);
  }
  for (ck::DType t :
       {ck::DType::kF16, ck::DType::kBF16, ck::DType::kF64, ck::DType::kI8, ck::DType::kU8,
        ck::DType::kI32, ck::DType::kU32, ck::DType::kI64, ck::DType::kU64}) {
    std::string name = std::string("reduce_") + ck::dtype_name(t) + "_sum/1MiB";
    reg(name, bm_reduce, t, ck::RedOp::kSum, kMiB, Kind::kFast);
  }
  // The ops AVX2 has no instruction for (8-bit and 64-bit multiply, 64-bit min/max).
  reg("reduce_i8_prod/1MiB", bm_reduce, ck::DType::kI8, ck::RedOp::kProd, kMiB, Kind::kFast);
  reg("reduce_i64_prod/1MiB", bm_reduce, ck::DType::kI64, ck::RedOp::kProd, kMiB, Kind::kFast);
  reg("reduce_u64_max/1MiB", bm_reduce, ck::DType::kU64, ck::RedOp::kMax, kMiB, Kind::kFast);
  reg("reduce_f32_max/1MiB", bm_reduce, ck::DType::kF32, ck::RedOp::kMax, kMiB, Kind::kFast);
  for (size_t s : {kMiB, 128 * kMiB}) {
    reg("reduce_copy_f32_sum/" + size_name(s), bm_reduce, ck::DType::kF32, ck::RedOp::kSum, s,
        Kind::kCopy);
    reg("reduce_then_memcpy_f32_sum/" + size_name(s), bm_reduce, ck::DType::kF32, ck::RedOp::kSum,
        s, Kind::kThenMemcpy);
  }
  reg("reduce_ref_f32_sum/1MiB", bm_reduce, ck::DType::kF32, ck::RedOp::kSum, kMiB, Kind::kRef);
  reg("reduce_ref_bf16_sum/1MiB", bm_reduce, ck::DType::kBF16, ck::RedOp::kSum, kMiB, Kind::kRef);
}

}  // namespace

int main(int argc, char** argv) {
  if (chorus::Status st = ck::init_isa(); !st.is_ok()) {
    std::fprintf(stderr, "reduce-bench: %s\n", st.message().c_str());
    return 2;
  }
  benchmark::AddCustomContext("kernels", ck::isa_name(ck::active_isa()));
  register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
