// Tests for kernels/cpu/reduce.h: every instruction-set build this CPU runs (isa.h) against the
// scalar reference, bit for bit, for all ten types and five ops; hand-computed values; the
// 16-bit float conversions; names and parsing.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/half.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/reduce.h"
#include "kernels/cpu/reduce_ref.h"
#include "reduce_check.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

using namespace chorus::kernels;
using namespace chorus::kernels::test;
using chorus::Status;

namespace {

// Around every vector width (4..64 lanes) and alignment head, and one count much larger.
std::vector<size_t> counts() {
  return {0, 1, 2, 3, 7, 15, 16, 17, 31, 33, 63, 64, 65, 127, 129, 1000, 4097, (1u << 16) + 3};
}

enum class Layout { kOutOfPlace, kOutIsA, kOutIsB, kMisaligned };
const char* layout_name(Layout l) {
  const char* names[] = {"out-of-place", "out==a", "out==b", "misaligned"};
  return names[int(l)];
}

// Runs one fast and one reference call in the given layout; returns the mismatch index, -2 for a
// write before the start, count for a write past the end, or -1 when all is well.
long check_reduce(DType t, RedOp op, const std::vector<uint8_t>& a0, const std::vector<uint8_t>& b0,
                  size_t count, Layout layout, bool copy) {
  size_t sz = dtype_size(t);
  std::vector<uint8_t> a[2] = {a0, a0}, b[2] = {b0, b0};
  std::vector<uint8_t> out[2], out2[2];
  size_t shift = layout == Layout::kMisaligned ? sz : 0;
  for (int k = 0; k < 2; k++) {
    out[k].assign(count * sz + sz + 1, 0xee);
    out2[k].assign(count * sz + sz + 1, 0xdd);
    if (layout == Layout::kMisaligned) {  // a and out shifted by one element, b not
      a[k].insert(a[k].begin(), sz, 0);
    }
    const void* pa = a[k].data() + shift;
    const void* pb = b[k].data();
    void* po = out[k].data() + shift;
    if (layout == Layout::kOutIsA) po = a[k].data();
    if (layout == Layout::kOutIsB) po = b[k].data();
    void* po2 = out2[k].data() + sz;  // one element in: aligned differently from out
    if (copy) {
      (k ? ref::reduce_copy : reduce_copy)(t, op, pa, pb, po, po2, count);
    } else {
      (k ? ref::reduce : reduce)(t, op, pa, pb, po, count);
    }
    if (layout == Layout::kOutIsA) std::memcpy(out[k].data() + shift, a[k].data(), count * sz);
    if (layout == Layout::kOutIsB) std::memcpy(out[k].data() + shift, b[k].data(), count * sz);
  }
  long bad = first_mismatch(t, out[0].data() + shift, out[1].data() + shift, count);
  if (bad >= 0) return bad;
  if (copy) {
    bad = first_mismatch(t, out2[0].data() + sz, out2[1].data() + sz, count);
    if (bad >= 0) return bad;
    // out2 must equal out.
    bad = first_mismatch(t, out[0].data() + shift, out2[0].data() + sz, count);
    if (bad >= 0) return bad;
  }
  // Nothing written before the start or past the end.
  if (layout == Layout::kOutOfPlace || layout == Layout::kMisaligned) {
    for (size_t i = 0; i < shift; i++)
      if (out[0][i] != 0xee) return -2;
    if (out[0][count * sz + shift] != 0xee) return long(count);
  }
  for (size_t i = 0; i < sz; i++)
    if (out2[0][i] != 0xdd) return -2;
  if (out2[0][count * sz + sz] != 0xdd) return long(count);
  return -1;
}

// The active build's reduce of a and b, checked against the reference; returns the result.
template <class T>
std::vector<T> run_fast(DType t, RedOp op, std::vector<T> a, std::vector<T> b) {
  std::vector<T> out(a.size());
  reduce(t, op, a.data(), b.data(), out.data(), a.size());
  std::vector<T> want(a.size());
  ref::reduce(t, op, a.data(), b.data(), want.data(), a.size());
  CHECK(std::memcmp(out.data(), want.data(), a.size() * sizeof(T)) == 0);
  return out;
}

template <class T>
std::vector<T> run_avg(DType t, std::vector<T> x, int nranks) {
  std::vector<T> want = x;
  scale_avg(t, x.data(), x.size(), nranks);
  ref::scale_avg(t, want.data(), want.size(), nranks);
  CHECK(x == want);
  return x;
}

#if defined(__x86_64__)
// The F16C instructions (the AVX2 and AVX-512 builds' converts) against half.h, on every half and
// on floats around each rounding point; "" when all agree. Call only where the CPU has F16C.
__attribute__((target("f16c"))) std::string f16c_mismatch() {
  for (uint32_t h = 0; h < 0x10000; h++) {
    float sw = half_to_float(uint16_t(h));
    float hw = _cvtsh_ss(uint16_t(h));
    if (float_bits(sw) != float_bits(hw)) return "half_to_float(" + std::to_string(h) + ")";
  }
  // Every exponent and sign, with low mantissa bits around the rounding point.
  const uint32_t lows[] = {0x0000, 0x0001, 0x0fff, 0x1000, 0x1001, 0x1fff, 0x0800, 0x17ff};
  for (uint32_t hi = 0; hi < (1u << 19); hi++) {
    for (uint32_t lo : lows) {
      float f = bits_float((hi << 13) | lo);
      uint16_t sw = float_to_half(f);
      uint16_t hw = uint16_t(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
      if (sw != hw) return "float_to_half(bits " + std::to_string(float_bits(f)) + ")";
    }
  }
  return "";
}
#endif

}  // namespace

TEST_CASE("instruction-set builds: which this cpu runs, and the forced choice", "[reduce][isa]") {
  Status st = init_isa();
  INFO(st.message());
  REQUIRE(st.is_ok());
  // Printed for test_qemu.sh and test_isa_env.sh, which run this case with and without
  // CHORUS_CPU_ISA, natively and on a CPU without AVX-512.
  std::printf("kernels: active build %s, best build %s, this cpu runs %s\n", isa_name(active_isa()),
              isa_name(best_isa()), supported_isas().c_str());
  const char* forced = std::getenv("CHORUS_CPU_ISA");
  if (forced && *forced && std::string(forced) != "auto")
    CHECK(std::string(isa_name(active_isa())) == forced);
  else
    CHECK(active_isa() == best_isa());
  for (int i = 0; i < kNumIsas; i++) {
    Isa isa = Isa(i);
    REQUIRE(parse_isa(isa_name(isa)) == isa);
    Status s = set_isa(isa);
    INFO(isa_name(isa) << ": " << s.message());
    CHECK(s.is_ok() == cpu_supports(isa));
    if (s.is_ok()) CHECK(active_isa() == isa);
    if (!s.is_ok()) CHECK(s.message().find("cannot run the") != std::string::npos);
  }
  CHECK_FALSE(parse_isa("sse2").has_value());
  CHECK(cpu_supports(Isa::kScalar));
  if (cpu_supports(Isa::kAvx512)) CHECK(cpu_supports(Isa::kAvx2));
  use(best_isa());
}

TEST_CASE("every build's reduce matches the reference for every type, op, count and layout",
          "[reduce]") {
  for (Isa isa : isas()) {
    use(isa);
    for (DType t : kAllTypes) {
      for (size_t count : counts()) {
        auto a = random_bytes(t, count, uint32_t(count * 31 + int(t)));
        auto b = random_bytes(t, count, uint32_t(count * 17 + int(t) + 1000));
        for (RedOp op : kAllOps) {
          for (Layout layout :
               {Layout::kOutOfPlace, Layout::kOutIsA, Layout::kOutIsB, Layout::kMisaligned}) {
            for (bool copy : {false, true}) {
              long bad = check_reduce(t, op, a, b, count, layout, copy);
              if (bad == -1) continue;  // one CHECK per failure only: millions otherwise
              INFO(isa_name(isa) << " " << dtype_name(t) << " " << red_op_name(op)
                                 << " count=" << count << " " << layout_name(layout)
                                 << (copy ? " reduce_copy" : " reduce"));
              INFO("first mismatch at element " << bad);
              CHECK(bad == -1);
            }
          }
        }
      }
    }
  }
  use(best_isa());
}

TEST_CASE("every build's scale_avg matches the reference", "[reduce]") {
  for (Isa isa : isas()) {
    use(isa);
    for (DType t : kAllTypes) {
      for (size_t count : counts()) {
        auto x = random_bytes(t, count, uint32_t(count + 7 * int(t)));
        for (int nranks : {1, 2, 3, 4, 7, 1000}) {
          size_t sz = dtype_size(t);  // buffers offset by one element
          std::vector<uint8_t> fast(sz, 0);
          fast.insert(fast.end(), x.begin(), x.end());
          std::vector<uint8_t> slow = fast;
          scale_avg(t, fast.data() + sz, count, nranks);
          ref::scale_avg(t, slow.data() + sz, count, nranks);
          INFO(isa_name(isa) << " " << dtype_name(t) << " count=" << count << " nranks=" << nranks);
          CHECK(first_mismatch(t, fast.data() + sz, slow.data() + sz, count) == -1);
          if (nranks == 1) CHECK(first_mismatch(t, fast.data() + sz, x.data(), count) == -1);
        }
      }
    }
  }
  use(best_isa());
}

TEST_CASE("count 0 touches nothing, even with null pointers", "[reduce]") {
  for (Isa isa : isas()) {
    use(isa);
    for (DType t : kAllTypes) {
      for (RedOp op : kAllOps) {
        reduce(t, op, nullptr, nullptr, nullptr, 0);
        reduce_copy(t, op, nullptr, nullptr, nullptr, nullptr, 0);
        ref::reduce(t, op, nullptr, nullptr, nullptr, 0);
      }
      scale_avg(t, nullptr, 0, 3);
    }
  }
  use(best_isa());
}

TEST_CASE("hand-computed values", "[reduce]") {
  const Isa isa = GENERATE(Isa::kScalar, Isa::kAvx2, Isa::kAvx512);
  if (!cpu_supports(isa)) return;  // the qemu run covers avx2 without avx512
  use(isa);
  INFO("build " << isa_name(isa));
  SECTION("bf16 rounds ties to even") {
    // 1 + 2^-8 is halfway between 1 (0x3f80, even) and 1 + 2^-7 (0x3f81): rounds down.
    // (1 + 2^-7) + 2^-8 is halfway between 0x3f81 and 0x3f82 (even): rounds up.
    auto out = run_fast<uint16_t>(DType::kBF16, RedOp::kSum, {0x3f80, 0x3f81, 0x3f80},
                                  {0x3b80, 0x3b80, 0x3c00});
    CHECK(out == std::vector<uint16_t>{0x3f80, 0x3f82, 0x3f81});
  }
  SECTION("f16 overflows to inf") {
    // 65504 is the largest half. 65504 + 8 = 65512 stays; 65504 + 16 = 65520 is the tie -> inf.
    auto out = run_fast<uint16_t>(DType::kF16, RedOp::kSum, {0x7bff, 0x7bff, 0x7bff, 0xfbff},
                                  {0x7bff, 0x4800, 0x4c00, 0xfbff});
    CHECK(out == std::vector<uint16_t>{0x7c00, 0x7bff, 0x7c00, 0xfc00});
    // 256 * 256 = 65536 -> inf; 255.875^2 = 65472 is exact (0x7bfe).
    auto p = run_fast<uint16_t>(DType::kF16, RedOp::kProd, {0x5c00, 0x5bff}, {0x5c00, 0x5bff});
    CHECK(p == std::vector<uint16_t>{0x7c00, 0x7bfe});
  }
  SECTION("i32 sum and prod wrap around") {
    const int32_t kMax = std::numeric_limits<int32_t>::max();
    const int32_t kMin = std::numeric_limits<int32_t>::min();
    auto s = run_fast<int32_t>(DType::kI32, RedOp::kSum, {kMax, kMin, -5}, {1, -1, 3});
    CHECK(s == std::vector<int32_t>{kMin, kMax, -2});
    auto p = run_fast<int32_t>(DType::kI32, RedOp::kProd, {65536, -3, kMax}, {65536, 7, 2});
    CHECK(p == std::vector<int32_t>{0, -21, -2});
  }
  SECTION("u8 min, max, wrapping sum and prod") {
    std::vector<uint8_t> a = {200, 0, 255, 16, 15}, b = {100, 255, 1, 16, 17};
    CHECK(run_fast<uint8_t>(DType::kU8, RedOp::kMax, a, b) ==
          std::vector<uint8_t>{200, 255, 255, 16, 17});
    CHECK(run_fast<uint8_t>(DType::kU8, RedOp::kMin, a, b) ==
          std::vector<uint8_t>{100, 0, 1, 16, 15});
    CHECK(run_fast<uint8_t>(DType::kU8, RedOp::kSum, a, b) ==
          std::vector<uint8_t>{44, 255, 0, 32, 32});
    CHECK(run_fast<uint8_t>(DType::kU8, RedOp::kProd, a, b) ==
          std::vector<uint8_t>{32, 0, 255, 0, 255});
  }
  SECTION("i8 compares signed, wraps like two's complement") {
    std::vector<int8_t> a = {127, -128, -1, 100, -7}, b = {1, -1, 1, -100, 3};
    CHECK(run_fast<int8_t>(DType::kI8, RedOp::kSum, a, b) ==
          std::vector<int8_t>{-128, 127, 0, 0, -4});
    CHECK(run_fast<int8_t>(DType::kI8, RedOp::kProd, a, b) ==
          std::vector<int8_t>{127, -128, -1, -16, -21});  // -128 * -1 wraps; 100 * -100 = -10000
    CHECK(run_fast<int8_t>(DType::kI8, RedOp::kMin, a, b) ==
          std::vector<int8_t>{1, -128, -1, -100, -7});
    CHECK(run_fast<int8_t>(DType::kI8, RedOp::kMax, a, b) ==
          std::vector<int8_t>{127, -1, 1, 100, 3});
  }
  SECTION("u32 and u64 compare unsigned; i64 signed; 64-bit prod wraps") {
    const uint32_t kU32Max = std::numeric_limits<uint32_t>::max();
    std::vector<uint32_t> a = {kU32Max, 1, 0x80000000u}, b = {1, kU32Max, 2};
    CHECK(run_fast<uint32_t>(DType::kU32, RedOp::kMax, a, b) ==
          std::vector<uint32_t>{kU32Max, kU32Max, 0x80000000u});
    CHECK(run_fast<uint32_t>(DType::kU32, RedOp::kMin, a, b) == std::vector<uint32_t>{1, 1, 2});
    CHECK(run_fast<uint32_t>(DType::kU32, RedOp::kSum, a, b) ==
          std::vector<uint32_t>{0, 0, 0x80000002u});
    CHECK(run_fast<uint32_t>(DType::kU32, RedOp::kProd, a, b) ==
          std::vector<uint32_t>{kU32Max, kU32Max, 0});
    const uint64_t kBig = 0x8000000000000001ull, kOdd = 0x123456789abcdefull;
    std::vector<uint64_t> c = {kBig, 3, kOdd, 0xffffffffffffffffull}, d = {1, kBig, kOdd, 2};
    CHECK(run_fast<uint64_t>(DType::kU64, RedOp::kMax, c, d) ==
          std::vector<uint64_t>{kBig, kBig, kOdd, 0xffffffffffffffffull});
    CHECK(run_fast<uint64_t>(DType::kU64, RedOp::kMin, c, d) ==
          std::vector<uint64_t>{1, 3, kOdd, 2});
    CHECK(run_fast<uint64_t>(DType::kU64, RedOp::kProd, c, d) ==
          std::vector<uint64_t>{kBig, 0x8000000000000003ull, kOdd * kOdd, 0xfffffffffffffffeull});
    std::vector<int64_t> e = {-1, INT64_MIN, 5}, f = {1, -1, -5};
    CHECK(run_fast<int64_t>(DType::kI64, RedOp::kMin, e, f) ==
          std::vector<int64_t>{-1, INT64_MIN, -5});
    CHECK(run_fast<int64_t>(DType::kI64, RedOp::kMax, e, f) == std::vector<int64_t>{1, -1, 5});
    CHECK(run_fast<int64_t>(DType::kI64, RedOp::kProd, e, f) ==
          std::vector<int64_t>{-1, INT64_MIN, -25});  // INT64_MIN * -1 wraps to itself
  }
  SECTION("float min/max propagate NaN; on ±0 the second operand wins") {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    auto mn = run_fast<float>(DType::kF32, RedOp::kMin, {nan, 1.0f, -0.0f, 0.0f, 2.0f},
                              {1.0f, nan, 0.0f, -0.0f, -3.0f});
    CHECK(mn[0] != mn[0]);
    CHECK(mn[1] != mn[1]);
    CHECK(float_bits(mn[2]) == 0x00000000u);
    CHECK(float_bits(mn[3]) == 0x80000000u);
    CHECK(mn[4] == -3.0f);
    auto mx = run_fast<float>(DType::kF32, RedOp::kMax, {nan, 1.0f, 2.0f}, {1.0f, nan, -3.0f});
    CHECK(mx[0] != mx[0]);
    CHECK(mx[1] != mx[1]);
    CHECK(mx[2] == 2.0f);
  }
  SECTION("avg: sum, then scale_avg; integers truncate toward zero") {
    std::vector<float> f = {1.0f, 2.0f, 3.0f}, g = {2.0f, 2.0f, -4.0f};
    reduce(DType::kF32, RedOp::kAvg, f.data(), g.data(), f.data(), f.size());
    CHECK(run_avg(DType::kF32, f, 2) == std::vector<float>{1.5f, 2.0f, -0.5f});
    CHECK(run_avg<int32_t>(DType::kI32, {-7, 7, 9}, 2) == std::vector<int32_t>{-3, 3, 4});
    CHECK(run_avg<uint8_t>(DType::kU8, {255, 3}, 4) == std::vector<uint8_t>{63, 0});
    CHECK(run_avg<int8_t>(DType::kI8, {-128, 127, -7, 100}, 3) ==
          std::vector<int8_t>{-42, 42, -2, 33});
    CHECK(run_avg<int8_t>(DType::kI8, {-128, 127}, 1000) == std::vector<int8_t>{0, 0});
    CHECK(run_avg<int8_t>(DType::kI8, {-128, 127}, 100) == std::vector<int8_t>{-1, 1});
    CHECK(run_avg<uint32_t>(DType::kU32, {0xffffffffu, 5}, 2) ==
          std::vector<uint32_t>{0x7fffffffu, 2});
    CHECK(run_avg<uint64_t>(DType::kU64, {0xffffffffffffffffull}, 3) ==
          std::vector<uint64_t>{0x5555555555555555ull});
    CHECK(run_avg<int64_t>(DType::kI64, {INT64_MIN, -5}, 2) ==
          std::vector<int64_t>{INT64_MIN / 2, -2});
    CHECK(run_avg<uint16_t>(DType::kF16, {0x3c00 /*1.0*/, 0x4200 /*3.0*/}, 3) ==
          std::vector<uint16_t>{float_to_half(1.0f / 3.0f), 0x3c00});
  }
  use(best_isa());
}

TEST_CASE("16-bit float conversions", "[reduce][half]") {
  SECTION("bf16 known values") {
    CHECK(float_to_bf16(bits_float(0x3f808000u)) == 0x3f80);  // tie, round to even (down)
    CHECK(float_to_bf16(bits_float(0x3f818000u)) == 0x3f82);  // tie, round to even (up)
    CHECK(float_to_bf16(bits_float(0x3f808001u)) == 0x3f81);  // above the tie
    CHECK(float_to_bf16(bits_float(0x7f7fffffu)) == 0x7f80);  // FLT_MAX -> inf
    CHECK(float_to_bf16(bits_float(0x00018000u)) == 0x0002);  // subnormal tie, kept (no FTZ)
    CHECK(float_to_bf16(bits_float(0x7f800001u)) == 0x7fc0);  // signalling NaN -> quiet
    CHECK(float_to_bf16(bits_float(0xffc12345u)) == 0xffc1);
    CHECK(bf16_to_float(0xc0a0) == -5.0f);
  }
  SECTION("f16 known values") {
    CHECK(float_to_half(65504.0f) == 0x7bff);
    CHECK(float_to_half(65519.99f) == 0x7bff);
    CHECK(float_to_half(65520.0f) == 0x7c00);
    CHECK(float_to_half(bits_float(0x33800000u)) == 0x0001);  // 2^-24, smallest subnormal
    CHECK(float_to_half(bits_float(0x33000000u)) == 0x0000);  // 2^-25, tie -> 0
    CHECK(float_to_half(bits_float(0x33000001u)) == 0x0001);
    CHECK(float_to_half(-0.0f) == 0x8000);
    CHECK(half_to_float(0x0001) == bits_float(0x33800000u));
    CHECK(half_to_float(0xc000) == -2.0f);
  }
#if defined(__x86_64__)
  SECTION("f16 conversions agree with the F16C instructions") {
    if (!cpu_supports(Isa::kAvx2)) {
      WARN("skip: this cpu has no F16C (the avx2 build needs it)");
      return;
    }
    CHECK(f16c_mismatch() == "");
  }
#endif
}

TEST_CASE("names, sizes and parsing round-trip", "[reduce]") {
  for (DType t : kAllTypes) {
    REQUIRE(parse_dtype(dtype_name(t)) == t);
  }
  for (RedOp op : kAllOps) REQUIRE(parse_red_op(red_op_name(op)) == op);
  CHECK(std::string(dtype_name(DType::kBF16)) == "bf16");
  CHECK(std::string(red_op_name(RedOp::kSum)) == "sum");
  CHECK(dtype_size(DType::kF32) == 4);
  CHECK(dtype_size(DType::kF64) == 8);
  CHECK(dtype_size(DType::kF16) == 2);
  CHECK(dtype_size(DType::kBF16) == 2);
  CHECK(dtype_size(DType::kI32) == 4);
  CHECK(dtype_size(DType::kI64) == 8);
  CHECK(dtype_size(DType::kU8) == 1);
  CHECK(dtype_size(DType::kI8) == 1);
  CHECK(dtype_size(DType::kU32) == 4);
  CHECK(dtype_size(DType::kU64) == 8);
  CHECK(parse_dtype("int8") == DType::kI8);
  CHECK(parse_dtype("uint32") == DType::kU32);
  CHECK(parse_dtype("u64") == DType::kU64);
  CHECK(parse_dtype("float32") == DType::kF32);
  CHECK(parse_dtype("half") == DType::kF16);
  CHECK(parse_dtype("bfloat16") == DType::kBF16);
  CHECK(parse_red_op("product") == RedOp::kProd);
  CHECK_FALSE(parse_dtype("f8").has_value());
  CHECK_FALSE(parse_red_op("").has_value());
}
