// Tests for kernels::reduce_fold (reduce.h), the ordered fold of the deterministic collectives:
// every instruction-set build this CPU runs against the scalar reference ref::reduce_fold, bit
// for bit, for all ten types, five ops and 1 to 6 inputs, at counts around the kernel's 8 KiB
// block, with unaligned pointers and the output aliasing an input; and hand-picked values that
// show the fold is the left fold in input order, rounded once (16-bit floats) and divided once.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/half.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/reduce.h"
#include "kernels/cpu/reduce_ref.h"
#include "reduce_check.h"

using namespace chorus::kernels;
using namespace chorus::kernels::test;

namespace {

constexpr int kMaxInputs = 6;

// Elements per accumulator block of reduce_fold (8 KiB of the compute type).
size_t block_elems(DType t) {
  const bool half = t == DType::kF16 || t == DType::kBF16;
  return (8 << 10) / (half ? 4 : dtype_size(t));
}

// Small counts, then each side of one and two blocks, and a prime past three.
std::vector<size_t> counts(DType t) {
  const size_t b = block_elems(t);
  return {0, 1, 2, 3, 7, 13, 61, 127, b - 1, b, b + 1, 2 * b - 1, 2 * b + 1, 3 * b + 7};
}

// Order-sensitive inputs, kMaxInputs of them. Floats, per element, one of two patterns:
//   - mixed: ±(1 + u) * 2^e, e in -12..12 (f16: -7..7), so that three or more of them round
//     differently in another order; for prod, e in a range where the product of a few
//     overflows or not depending on the order (f32, bf16, f64);
//   - cancelling: one input is large, another its negation, the rest so small that they vanish
//     when added to the large one: in order they either vanish or survive the cancellation.
// Integers: any bits.
std::vector<std::vector<uint8_t>> mixed_inputs(DType t, RedOp op, size_t count, uint32_t seed) {
  std::mt19937_64 rng(seed);
  const size_t es = dtype_size(t);
  auto pick = [&](int lo, int hi) { return lo + int(rng() % uint64_t(hi - lo + 1)); };
  auto mant = [&] { return 1.0 + std::ldexp(double(rng() >> 12), -52); };
  const int e_mix = t == DType::kF16 ? 7 : 12;
  const int e_prod = t == DType::kF64 ? 800 : t == DType::kF16 ? 7 : 100;
  const int lost = t == DType::kF64 ? 54 : 25;  // below half an ulp of the large one's compute type
  std::vector<std::vector<uint8_t>> x(kMaxInputs, std::vector<uint8_t>(count * es + 1));
  double v[kMaxInputs];
  for (size_t i = 0; i < count; i++) {
    if (rng() % 2 == 0 || op == RedOp::kProd) {
      const int e = op == RedOp::kProd ? e_prod : e_mix;
      for (double& y : v) y = (rng() & 1 ? -1.0 : 1.0) * mant() * std::ldexp(1.0, pick(-e, e));
    } else {
      const int big = pick(0, kMaxInputs - 1), neg = (big + pick(1, kMaxInputs - 1)) % kMaxInputs;
      const int e = t == DType::kF16 ? pick(8, 14) : pick(-10, 10);
      for (double& y : v)
        y = (rng() & 1 ? -1.0 : 1.0) * mant() * std::ldexp(1.0, e - lost - pick(0, 3));
      v[big] = mant() * std::ldexp(1.0, e);
      v[neg] = -v[big];
    }
    for (int k = 0; k < kMaxInputs; k++) {
      uint8_t* p = x[k].data() + i * es;
      if (t == DType::kF32) {
        const float f = float(v[k]);
        std::memcpy(p, &f, 4);
      } else if (t == DType::kF64) {
        std::memcpy(p, &v[k], 8);
      } else if (t == DType::kF16 || t == DType::kBF16) {
        const float f = float(v[k]);
        const uint16_t h = t == DType::kF16 ? float_to_half(f) : float_to_bf16(f);
        std::memcpy(p, &h, 2);
      } else {
        const uint64_t bits = rng();
        std::memcpy(p, &bits, es);
      }
    }
  }
  return x;
}

enum class Layout { kOutOfPlace, kShifted, kOutIsFirst, kOutIsMiddle, kOutIsLast };
constexpr Layout kLayouts[] = {Layout::kOutOfPlace, Layout::kShifted, Layout::kOutIsFirst,
                               Layout::kOutIsMiddle, Layout::kOutIsLast};
const char* layout_name(Layout l) {
  const char* names[] = {"out-of-place", "shifted", "out==in[0]", "out==in[w/2]", "out==in[w-1]"};
  return names[int(l)];
}

// An element's bytes as hex, most significant first.
std::string hex(const uint8_t* p, size_t es) {
  static const char kDigits[] = "0123456789abcdef";
  std::string s = "0x";
  for (size_t j = es; j-- > 0;) {
    s += kDigits[p[j] >> 4];
    s += kDigits[p[j] & 15];
  }
  return s;
}

struct FoldCase {
  DType t;
  RedOp op;
  int w;
  size_t count;
  int avg_n;
};

// The fast fold in `layout` against the reference fold of the same inputs (out of place):
// the result bit for bit, two NaNs counting as equal (reduce.h: NaN bits are not part of the
// contract; a signalling NaN that min or max passes through comes out quiet or not depending
// on the compiler), nothing written outside out, inputs other than out untouched. Which NaN
// min and max pick is checked on quiet NaNs in "the left fold" below.
// Returns what went wrong, "" if nothing.
std::string check_fold(const FoldCase& c, const std::vector<std::vector<uint8_t>>& data,
                       Layout layout) {
  const size_t es = dtype_size(c.t), bytes = c.count * es;
  const size_t guard = 64;
  // Input k starts `shift(k)` bytes into its buffer (past a guard); out likewise.
  auto shift = [&](int k) { return guard + (layout == Layout::kShifted ? size_t(k + 1) * es : 0); };
  std::vector<std::vector<uint8_t>> in(c.w);
  std::vector<const void*> ptrs(c.w);
  for (int k = 0; k < c.w; k++) {
    in[k].assign(bytes + 2 * guard + kMaxInputs * es + 8, 0xa5);
    std::memcpy(in[k].data() + shift(k), data[k].data(), bytes);
    ptrs[k] = in[k].data() + shift(k);
  }
  std::vector<uint8_t> out_buf(bytes + 2 * guard + 8, 0xee);
  void* out = out_buf.data() + guard + (layout == Layout::kShifted ? 3 * es : 0);
  int alias = -1;
  if (layout == Layout::kOutIsFirst) alias = 0;
  if (layout == Layout::kOutIsMiddle) alias = c.w / 2;
  if (layout == Layout::kOutIsLast) alias = c.w - 1;
  if (alias >= 0) out = const_cast<void*>(ptrs[alias]);

  std::vector<const void*> want_in(c.w);
  for (int k = 0; k < c.w; k++) want_in[k] = data[k].data();
  std::vector<uint8_t> want(bytes + 1);
  ref::reduce_fold(c.t, c.op, want_in.data(), c.w, want.data(), c.count, c.avg_n);
  reduce_fold(c.t, c.op, ptrs.data(), c.w, out, c.count, c.avg_n);

  const auto* got = static_cast<const uint8_t*>(out);
  for (size_t i = 0; i < c.count; i++) {
    const bool same = std::memcmp(got + i * es, want.data() + i * es, es) == 0;
    const bool both_nan = is_nan_elem(c.t, got + i * es) && is_nan_elem(c.t, want.data() + i * es);
    if (same || both_nan) continue;
    std::string msg = "element " + std::to_string(i) + " is " + hex(got + i * es, es) + ", want " +
                      hex(want.data() + i * es, es) + "; inputs";
    for (int k = 0; k < c.w; k++) msg += " " + hex(data[k].data() + i * es, es);
    return msg;
  }
  for (int k = 0; k < c.w; k++) {
    if (k == alias) continue;
    if (std::memcmp(ptrs[k], data[k].data(), bytes) != 0)
      return "input " + std::to_string(k) + " was written";
  }
  // Guards: the bytes around out (its own buffer, or the input it aliases).
  const uint8_t fill = alias >= 0 ? 0xa5 : 0xee;
  const uint8_t* base = alias >= 0 ? in[alias].data() : out_buf.data();
  for (const uint8_t* p = base; p < got; p++)
    if (*p != fill) return "a byte before out was written";
  for (size_t j = 0; j < 8; j++)
    if (got[bytes + j] != fill) return "a byte past out was written";
  return "";
}

// avg_n for a case: the rank count for avg; for sum sometimes another divisor (the kernel
// divides by avg_n whatever it is); never for the other ops.
int avg_n_for(RedOp op, int w, size_t count_index) {
  if (op == RedOp::kAvg) return w;
  if (op == RedOp::kSum && count_index % 3 == 1) return w + 2;
  return 0;
}

// The right fold x0 op (x1 op (... op x(w-1))) in the compute type (float for f16/bf16, rounded
// once at the end), by the reference pairwise kernel.
std::vector<uint8_t> right_fold(DType t, RedOp op, const std::vector<std::vector<uint8_t>>& x,
                                int w, size_t count) {
  if (t != DType::kF16 && t != DType::kBF16) {
    std::vector<uint8_t> acc = x[w - 1];
    for (int k = w - 2; k >= 0; k--) ref::reduce(t, op, x[k].data(), acc.data(), acc.data(), count);
    return acc;
  }
  auto widen = [&](const std::vector<uint8_t>& h) {
    std::vector<float> f(count);
    for (size_t i = 0; i < count; i++) {
      uint16_t v;
      std::memcpy(&v, h.data() + 2 * i, 2);
      f[i] = t == DType::kF16 ? half_to_float(v) : bf16_to_float(v);
    }
    return f;
  };
  std::vector<float> acc = widen(x[w - 1]);
  for (int k = w - 2; k >= 0; k--)
    ref::reduce(DType::kF32, op, widen(x[k]).data(), acc.data(), acc.data(), count);
  std::vector<uint8_t> out(2 * count + 1);
  for (size_t i = 0; i < count; i++) {
    const uint16_t v = t == DType::kF16 ? float_to_half(acc[i]) : float_to_bf16(acc[i]);
    std::memcpy(out.data() + 2 * i, &v, 2);
  }
  return out;
}

template <class T>
T fold_one(DType t, RedOp op, std::vector<T> x, int avg_n = 0) {
  std::vector<const void*> p;
  for (const T& v : x) p.push_back(&v);
  T out{};
  reduce_fold(t, op, p.data(), int(p.size()), &out, 1, avg_n);
  return out;
}

}  // namespace

TEST_CASE(
    "every build's reduce_fold matches the reference: types, ops, 1..6 inputs, counts, "
    "layouts",
    "[reduce][fold]") {
  for (Isa isa : isas()) {
    use(isa);
    for (DType t : kAllTypes) {
      const std::vector<size_t> cs = counts(t);
      const size_t most = cs.back();
      for (int data_kind = 0; data_kind < 2; data_kind++) {
        for (RedOp op : kAllOps) {
          std::vector<std::vector<uint8_t>> data(kMaxInputs);
          const uint32_t seed = uint32_t(int(t) * 100 + int(op) * 10);
          if (data_kind) data = mixed_inputs(t, op, most, seed);
          for (int k = 0; k < kMaxInputs && !data_kind; k++)
            data[k] = random_bytes(t, most, seed + k + 1);
          for (int w = 1; w <= kMaxInputs; w++) {
            for (size_t ci = 0; ci < cs.size(); ci++) {
              const FoldCase c{t, op, w, cs[ci], avg_n_for(op, w, ci)};
              for (Layout layout : kLayouts) {
                const std::string bad = check_fold(c, data, layout);
                if (bad.empty()) continue;  // one CHECK per failure only
                INFO(isa_name(isa)
                     << " " << dtype_name(t) << " " << red_op_name(op) << " w=" << w
                     << " count=" << c.count << " avg_n=" << c.avg_n << " " << layout_name(layout)
                     << (data_kind ? " mixed data" : " random data") << ": " << bad);
                CHECK(bad.empty());
              }
            }
          }
        }
      }
    }
  }
  use(best_isa());
}

TEST_CASE("reduce_fold with count 0 touches nothing, even with null pointers", "[reduce][fold]") {
  for (Isa isa : isas()) {
    use(isa);
    const void* none[kMaxInputs] = {};
    for (DType t : kAllTypes)
      for (RedOp op : kAllOps)
        for (int w = 1; w <= kMaxInputs; w++) {
          reduce_fold(t, op, none, w, nullptr, 0, op == RedOp::kAvg ? w : 0);
          ref::reduce_fold(t, op, none, w, nullptr, 0, op == RedOp::kAvg ? w : 0);
        }
  }
  use(best_isa());
}

TEST_CASE("reduce_fold is the left fold in input order, rounded once, divided once",
          "[reduce][fold]") {
  const Isa isa = GENERATE(Isa::kScalar, Isa::kAvx2, Isa::kAvx512);
  if (!cpu_supports(isa)) return;  // the others cover it; the qemu run has no avx-512 either
  use(isa);
  INFO("build " << isa_name(isa));
  SECTION("f32: (a + b) + c, not a + (b + c)") {
    // -1e8 + 1 rounds to -1e8 (the spacing there is 8), 1e8 - 1e8 is exact.
    CHECK(fold_one<float>(DType::kF32, RedOp::kSum, {1e8f, -1e8f, 1.0f}) == 1.0f);
    CHECK(fold_one<float>(DType::kF32, RedOp::kSum, {1.0f, 1e8f, -1e8f}) == 0.0f);
    CHECK(fold_one<float>(DType::kF32, RedOp::kSum, {-1e8f, 1.0f, 1e8f}) == 0.0f);
    // Products: 2^100 * 2^100 overflows f32 before 2^-100 could bring it back.
    const float big = std::ldexp(1.0f, 100), small = std::ldexp(1.0f, -100);
    CHECK(std::isinf(fold_one<float>(DType::kF32, RedOp::kProd, {big, big, small})));
    CHECK(fold_one<float>(DType::kF32, RedOp::kProd, {big, small, big}) == big);
  }
  SECTION("f64: 2^53 + 1 + 1 - 2^53 is 0 left to right; 1 + 1 + 2^53 - 2^53 is 2") {
    const double p53 = std::ldexp(1.0, 53);
    CHECK(fold_one<double>(DType::kF64, RedOp::kSum, {p53, 1.0, 1.0, -p53}) == 0.0);
    CHECK(fold_one<double>(DType::kF64, RedOp::kSum, {1.0, 1.0, p53, -p53}) == 2.0);
  }
  SECTION("bf16 sum accumulates in float and rounds once") {
    // 1 + 2^-8 is a tie in bf16 (rounds to 1), so rounding after each step would give 1;
    // the float sum 1 + 2^-7 is a bf16 value.
    const uint16_t one = 0x3f80, tiny = 0x3b80;  // 1, 2^-8
    CHECK(fold_one<uint16_t>(DType::kBF16, RedOp::kSum, {one, tiny, tiny}) == 0x3f81);
    // avg divides the float sum by 3 before the one rounding.
    const uint16_t avg = fold_one<uint16_t>(DType::kBF16, RedOp::kAvg, {one, tiny, tiny}, 3);
    const uint16_t want = float_to_bf16((1.0f + std::ldexp(1.0f, -7)) / 3.0f);
    const uint16_t rounded_sum_first = float_to_bf16(bf16_to_float(0x3f80) / 3.0f);
    REQUIRE(want != rounded_sum_first);  // the values tell the two apart
    CHECK(avg == want);
  }
  SECTION("f16 sum accumulates in float and rounds once") {
    // 2048 + 1 is a tie in f16 (rounds to 2048); 2048 + 1 + 1 = 2050 is an f16 value.
    const uint16_t h2048 = float_to_half(2048.0f), h1 = float_to_half(1.0f);
    CHECK(fold_one<uint16_t>(DType::kF16, RedOp::kSum, {h2048, h1, h1}) == float_to_half(2050.0f));
  }
  SECTION("min and max: on ±0 the later input wins; the first NaN in order wins") {
    const float nan1 = bits_float(0x7fc00001u), nan2 = bits_float(0x7fc00002u);
    CHECK(float_bits(fold_one<float>(DType::kF32, RedOp::kMin, {0.0f, -0.0f, 0.0f})) == 0u);
    CHECK(float_bits(fold_one<float>(DType::kF32, RedOp::kMin, {0.0f, 0.0f, -0.0f})) ==
          0x80000000u);
    CHECK(float_bits(fold_one<float>(DType::kF32, RedOp::kMax, {-0.0f, 0.0f, -0.0f})) ==
          0x80000000u);
    CHECK(float_bits(fold_one<float>(DType::kF32, RedOp::kMin, {1.0f, nan2, nan1})) == 0x7fc00002u);
    CHECK(float_bits(fold_one<float>(DType::kF32, RedOp::kMax, {nan1, 1.0f, nan2})) == 0x7fc00001u);
  }
  use(best_isa());
}

TEST_CASE("the mixed test data tells the left fold from the right fold", "[reduce][fold]") {
  // Guards the test above: if the kernel folded right to left, the comparison would see it.
  use(best_isa());
  const size_t count = 4099;
  for (DType t : {DType::kF32, DType::kF64, DType::kF16, DType::kBF16}) {
    for (RedOp op : {RedOp::kSum, RedOp::kProd}) {
      // Not f16 prod: up to six f16 values multiply in float without overflow and nearly
      // exactly (11-bit mantissas), so after the one rounding any order gives the same bits.
      if (t == DType::kF16 && op == RedOp::kProd) continue;
      for (int w = 3; w <= kMaxInputs; w++) {
        const std::vector<std::vector<uint8_t>> x = mixed_inputs(t, op, count, 7);
        std::vector<const void*> p(w);
        for (int k = 0; k < w; k++) p[k] = x[k].data();
        std::vector<uint8_t> left(count * dtype_size(t) + 1);
        reduce_fold(t, op, p.data(), w, left.data(), count, 0);
        const std::vector<uint8_t> right = right_fold(t, op, x, w, count);
        size_t differ = 0;
        for (size_t i = 0; i < count; i++) {
          const size_t es = dtype_size(t);
          if (std::memcmp(left.data() + i * es, right.data() + i * es, es) != 0) differ++;
        }
        INFO(dtype_name(t) << " " << red_op_name(op) << " w=" << w << ": " << differ << " of "
                           << count << " elements differ");
        CHECK(differ > count / 20);
      }
    }
  }
}
