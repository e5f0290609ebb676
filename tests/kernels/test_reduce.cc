// Tests for kernels/cpu/reduce.h: the fast kernels against the scalar reference (bit for bit),
// hand-computed values, the 16-bit float conversions, names and parsing.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/half.h"
#include "kernels/cpu/reduce.h"
#include "kernels/cpu/reduce_ref.h"

#if defined(__F16C__)
#include <immintrin.h>
#endif

using namespace chorus::kernels;

namespace {

constexpr DType kAllTypes[] = {DType::kF32, DType::kF64, DType::kF16, DType::kBF16,
                               DType::kI32, DType::kI64, DType::kU8};
constexpr RedOp kAllOps[] = {RedOp::kSum, RedOp::kProd, RedOp::kMin, RedOp::kMax, RedOp::kAvg};
constexpr size_t kCounts[] = {0,  1,  2,  3,  7,   15,   16,   17,
                              31, 33, 63, 65, 127, 1000, 4097, (1u << 20) + 3};

// Mostly ordinary values, with the special ones (NaN, inf, ±0, subnormals, extremes) mixed in.
std::vector<uint8_t> random_bytes(DType t, size_t count, uint32_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> buf(count * dtype_size(t) + 1);
  auto pick = [&](int n) { return int(rng() % uint64_t(n)); };
  auto small_float = [&] { return float(pick(129) - 64) / 8.0f; };  // ties and exact values
  for (size_t i = 0; i < count; i++) {
    void* p = buf.data() + i * dtype_size(t);
    bool special = pick(8) == 0;
    uint64_t bits = rng();
    switch (t) {
      case DType::kF32: {
        const float sp[] = {0.0f,
                            -0.0f,
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            bits_float(0x7fc01234u),
                            bits_float(0xff800001u),
                            bits_float(0x00000003u),
                            3.0e38f};
        float v = special ? sp[pick(8)] : (pick(2) ? small_float() : bits_float(uint32_t(bits)));
        std::memcpy(p, &v, 4);
        break;
      }
      case DType::kF64: {
        double v = special ? double(bits_float(uint32_t(bits))) : double(small_float()) / 3.0;
        if (pick(4) == 0) std::memcpy(&v, &bits, 8);
        std::memcpy(p, &v, 8);
        break;
      }
      case DType::kF16:
      case DType::kBF16: {
        uint16_t h = uint16_t(bits);
        if (!special)
          h = t == DType::kF16 ? float_to_half(small_float() * float(1 << pick(14)))
                               : float_to_bf16(small_float());
        std::memcpy(p, &h, 2);
        break;
      }
      case DType::kI32:
      case DType::kI64:
      case DType::kU8: {
        uint64_t v = special ? bits : uint64_t(int64_t(pick(33) - 16));
        std::memcpy(p, &v, dtype_size(t));
        break;
      }
    }
  }
  return buf;
}

bool is_nan_elem(DType t, const uint8_t* p) {
  switch (t) {
    case DType::kF32: {
      float f;
      std::memcpy(&f, p, 4);
      return f != f;
    }
    case DType::kF64: {
      double d;
      std::memcpy(&d, p, 8);
      return d != d;
    }
    case DType::kF16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return (h & 0x7fff) > 0x7c00;
    }
    case DType::kBF16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return (h & 0x7fff) > 0x7f80;
    }
    default:
      return false;
  }
}

// Index of the first element that differs (two NaNs count as equal), or -1.
long first_mismatch(DType t, const uint8_t* x, const uint8_t* y, size_t count) {
  size_t sz = dtype_size(t);
  for (size_t i = 0; i < count; i++) {
    const uint8_t* p = x + i * sz;
    const uint8_t* q = y + i * sz;
    if (std::memcmp(p, q, sz) == 0) continue;
    if (is_nan_elem(t, p) && is_nan_elem(t, q)) continue;
    return long(i);
  }
  return -1;
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

template <class T>
std::vector<T> run_fast(DType t, RedOp op, std::vector<T> a, std::vector<T> b) {
  std::vector<T> out(a.size());
  reduce(t, op, a.data(), b.data(), out.data(), a.size());
  std::vector<T> want(a.size());
  ref::reduce(t, op, a.data(), b.data(), want.data(), a.size());
  CHECK(std::memcmp(out.data(), want.data(), a.size() * sizeof(T)) == 0);
  return out;
}

}  // namespace

TEST_CASE("fast reduce matches the reference for every type, op, count and layout", "[reduce]") {
  for (DType t : kAllTypes) {
    for (size_t count : kCounts) {
      auto a = random_bytes(t, count, uint32_t(count * 31 + int(t)));
      auto b = random_bytes(t, count, uint32_t(count * 17 + int(t) + 1000));
      for (RedOp op : kAllOps) {
        for (Layout layout :
             {Layout::kOutOfPlace, Layout::kOutIsA, Layout::kOutIsB, Layout::kMisaligned}) {
          for (bool copy : {false, true}) {
            INFO(dtype_name(t) << " " << red_op_name(op) << " count=" << count << " "
                               << layout_name(layout) << (copy ? " reduce_copy" : " reduce"));
            long bad = check_reduce(t, op, a, b, count, layout, copy);
            INFO("first mismatch at element " << bad);
            CHECK(bad == -1);
          }
        }
      }
    }
  }
}

TEST_CASE("fast scale_avg matches the reference", "[reduce]") {
  for (DType t : kAllTypes) {
    for (size_t count : kCounts) {
      auto x = random_bytes(t, count, uint32_t(count + 7 * int(t)));
      for (int nranks : {1, 2, 3, 4, 7, 1000}) {
        size_t sz = dtype_size(t);  // buffers offset by one element
        std::vector<uint8_t> fast(sz, 0);
        fast.insert(fast.end(), x.begin(), x.end());
        std::vector<uint8_t> slow = fast;
        scale_avg(t, fast.data() + sz, count, nranks);
        ref::scale_avg(t, slow.data() + sz, count, nranks);
        INFO(dtype_name(t) << " count=" << count << " nranks=" << nranks);
        CHECK(first_mismatch(t, fast.data() + sz, slow.data() + sz, count) == -1);
        if (nranks == 1) CHECK(first_mismatch(t, fast.data() + sz, x.data(), count) == -1);
      }
    }
  }
}

TEST_CASE("count 0 touches nothing, even with null pointers", "[reduce]") {
  for (DType t : kAllTypes) {
    for (RedOp op : kAllOps) {
      reduce(t, op, nullptr, nullptr, nullptr, 0);
      reduce_copy(t, op, nullptr, nullptr, nullptr, nullptr, 0);
      ref::reduce(t, op, nullptr, nullptr, nullptr, 0);
    }
    scale_avg(t, nullptr, 0, 3);
  }
}

TEST_CASE("hand-computed values", "[reduce]") {
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
  SECTION("avg: sum, then scale_avg") {
    std::vector<float> f = {1.0f, 2.0f, 3.0f}, g = {2.0f, 2.0f, -4.0f};
    reduce(DType::kF32, RedOp::kAvg, f.data(), g.data(), f.data(), f.size());
    scale_avg(DType::kF32, f.data(), f.size(), 2);
    CHECK(f == std::vector<float>{1.5f, 2.0f, -0.5f});
    std::vector<int32_t> i = {-7, 7, 9};
    scale_avg(DType::kI32, i.data(), i.size(), 2);
    CHECK(i == std::vector<int32_t>{-3, 3, 4});
    std::vector<uint8_t> u = {255, 3};
    scale_avg(DType::kU8, u.data(), u.size(), 4);
    CHECK(u == std::vector<uint8_t>{63, 0});
    std::vector<uint16_t> h = {0x3c00 /*1.0*/, 0x4200 /*3.0*/};
    scale_avg(DType::kF16, h.data(), h.size(), 3);
    CHECK(h == std::vector<uint16_t>{float_to_half(1.0f / 3.0f), 0x3c00});
  }
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
#if defined(__F16C__)
  SECTION("f16 conversions agree with the F16C instructions") {
    for (uint32_t h = 0; h < 0x10000; h++) {
      float sw = half_to_float(uint16_t(h));
      float hw = _cvtsh_ss(uint16_t(h));
      if (float_bits(sw) != float_bits(hw)) FAIL("half_to_float(" << h << ")");
    }
    // Every exponent and sign, with low mantissa bits around the rounding point.
    const uint32_t lows[] = {0x0000, 0x0001, 0x0fff, 0x1000, 0x1001, 0x1fff, 0x0800, 0x17ff};
    for (uint32_t hi = 0; hi < (1u << 19); hi++) {
      for (uint32_t lo : lows) {
        float f = bits_float((hi << 13) | lo);
        uint16_t sw = float_to_half(f);
        uint16_t hw = uint16_t(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
        if (sw != hw) FAIL("float_to_half(0x" << std::hex << float_bits(f) << ")");
      }
    }
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
  CHECK(parse_dtype("float32") == DType::kF32);
  CHECK(parse_dtype("half") == DType::kF16);
  CHECK(parse_dtype("bfloat16") == DType::kBF16);
  CHECK(parse_red_op("product") == RedOp::kProd);
  CHECK_FALSE(parse_dtype("f8").has_value());
  CHECK_FALSE(parse_red_op("").has_value());
}
