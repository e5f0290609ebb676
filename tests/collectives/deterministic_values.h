// Inputs whose reduction depends on the order, and the canonical result they must give, for
// test_deterministic.cc. Every rank computes any rank's input element from (type, op, W, rank,
// index, seed) alone, so each rank builds the reference of the whole buffer locally: the left
// fold in rank order, ((x0 op x1) op x2) ... op x(W-1), in the accumulation type (float for
// f16/bf16, rounded once at the end), avg divided by W once before that rounding (chorus.h,
// "Deterministic reductions"). The reference is written here from the contract, not taken from
// the library's kernels.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "chorus/chorus.h"
#include "kernels/cpu/half.h"
#include "typed_values.h"

namespace chorus::test {

inline uint64_t mix64(uint64_t x) {  // splitmix64's finaliser
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

inline bool is_float_type(chorusDataType_t t) {
  return t == chorusFloat32 || t == chorusFloat64 || t == chorusFloat16 || t == chorusBfloat16;
}

// Bits of a value of a float type (stored in the low bytes).
inline uint64_t float_type_bits(chorusDataType_t t, double v) {
  switch (t) {
    case chorusFloat32:
      return kernels::float_bits(static_cast<float>(v));
    case chorusFloat16:
      return kernels::float_to_half(static_cast<float>(v));
    case chorusBfloat16:
      return kernels::float_to_bf16(static_cast<float>(v));
    default: {
      uint64_t u;
      std::memcpy(&u, &v, 8);
      return u;
    }
  }
}

// A quiet NaN of the type with `payload` (1..63) in the low mantissa bits: min and max pass it
// through, so the result tells which rank's NaN won.
inline uint64_t nan_bits(chorusDataType_t t, unsigned payload, bool negative) {
  switch (t) {
    case chorusFloat32:
      return (negative ? 0xffc00000u : 0x7fc00000u) | payload;
    case chorusFloat16:
      return (negative ? 0xfe00u : 0x7e00u) | payload;
    case chorusBfloat16:
      return (negative ? 0xffc0u : 0x7fc0u) | payload;
    default:
      return (negative ? 0xfff8000000000000ull : 0x7ff8000000000000ull) | payload;
  }
}

// Element `i` of rank `rank`'s input. Each element follows one pattern, the same on every rank
// (it hangs on i, not on the rank), chosen so that the order of the fold shows:
//   sum, avg: mixed magnitudes (±(1+u)·2^e, e in ±12), cancellation (one rank large, another
//             its negation, the rest below half an ulp of it), values around the smallest
//             normal (subnormals), values near the largest (a sum overflows, an average of
//             16-bit values must not), infinities and NaN, signed zeros;
//   prod:     wide exponents (whether a product overflows depends on the order), near-1
//             mantissas, zeros, infinities and NaN;
//   min, max: signed zeros (the later operand wins a tie), NaNs with the rank in their payload
//             (the first NaN in order wins), infinities, a few repeated values;
//   integers: any bits, or small values of either sign.
inline uint64_t input_bits(chorusDataType_t t, chorusRedOp_t op, int nranks, int rank, size_t i,
                           uint64_t seed) {
  const uint64_t p = mix64(seed ^ mix64(i * 0x100000001b3ull + t * 977u + op * 131u));
  uint64_t r = mix64(p + 0x632BE59BD9B4E019ull * static_cast<uint64_t>(rank + 1));
  auto next = [&] { return r = mix64(r); };
  auto pick = [&](int lo, int hi) { return lo + static_cast<int>(next() % (hi - lo + 1)); };
  auto mant = [&] { return 1.0 + std::ldexp(static_cast<double>(next() >> 12), -52); };
  auto sign = [&] { return next() & 1 ? -1.0 : 1.0; };
  if (!is_float_type(t)) return (p & 1) ? next() : static_cast<uint64_t>(pick(-16, 16));
  const bool f16 = t == chorusFloat16, f64 = t == chorusFloat64;
  const int kind = static_cast<int>((p >> 8) % 16);
  const int min_exp = f64 ? -1022 : f16 ? -14 : -126;  // smallest normal
  auto mixed = [&](int e) { return sign() * mant() * std::ldexp(1.0, pick(-e, e)); };
  if (op == chorusMin || op == chorusMax) {
    if (kind < 4) return float_type_bits(t, sign() * 0.0);
    if (kind < 8) {
      if (next() % 2) return nan_bits(t, 1 + rank, next() & 1);
      return float_type_bits(t, mixed(12));
    }
    if (kind < 10) return float_type_bits(t, sign() * INFINITY);
    if (kind < 12) return float_type_bits(t, pick(-2, 2));
    return float_type_bits(t, mixed(f16 ? 7 : 12));
  }
  if (op == chorusProd) {
    if (kind == 0) return float_type_bits(t, next() % 4 ? mixed(4) : (next() & 1 ? 0.0 : INFINITY));
    if (kind < 4) return float_type_bits(t, 1.0 + sign() * std::ldexp(mant(), -pick(8, 20)));
    return float_type_bits(t, mixed(f64 ? 800 : f16 ? 7 : 100));
  }
  if (kind < 6) return float_type_bits(t, mixed(f16 ? 7 : 12));
  if (kind < 12) {  // cancellation: `big` large, `neg` its negation, the others lost beside it
    const int big = static_cast<int>(p % nranks);
    const int neg =
        nranks > 1 ? (big + 1 + static_cast<int>((p >> 32) % (nranks - 1))) % nranks : big;
    uint64_t q = mix64(p + 1);
    const double large =
        (1.0 + std::ldexp(static_cast<double>(q >> 12), -52)) *
        std::ldexp(1.0, f16 ? 8 + static_cast<int>(q % 7) : static_cast<int>(q % 21) - 10);
    if (rank == big) return float_type_bits(t, large);
    if (rank == neg) return float_type_bits(t, -large);
    return float_type_bits(
        t, sign() * mant() * large * std::ldexp(1.0, -(f64 ? 54 : 25) - pick(0, 3)));
  }
  if (kind < 14)
    return float_type_bits(t, sign() * mant() * std::ldexp(1.0, min_exp + pick(-8, 2)));
  if (kind == 14 && (p >> 20) % 2) {  // near the largest finite value, one sign on every
    // rank: a sum of two overflows where their average (of 16-bit values: rounded once) does not
    const int max_exp = f64 ? 1023 : f16 ? 15 : 127;
    const double u = std::ldexp(static_cast<double>(next() >> 12), -52);
    return float_type_bits(
        t, ((p >> 40) & 1 ? -1.0 : 1.0) * (1.0 + 0.9 * u) * std::ldexp(1.0, max_exp));
  }
  if (kind == 14) {
    const int s = pick(0, 5);
    if (s == 0) return float_type_bits(t, INFINITY);
    if (s == 1) return float_type_bits(t, -INFINITY);
    if (s == 2) return nan_bits(t, 1 + rank, false);
    return float_type_bits(t, mixed(12));
  }
  return float_type_bits(t, sign() * 0.0);
}

namespace ref_detail {

template <class C>
C apply(chorusRedOp_t op, C a, C b) {
  if constexpr (std::is_integral_v<C>) {  // wrap: unsigned arithmetic of the same width
    using U = std::make_unsigned_t<C>;
    using W = std::conditional_t<(sizeof(U) < sizeof(unsigned)), unsigned, U>;
    if (op == chorusSum || op == chorusAvg)
      return static_cast<C>(static_cast<U>(W(U(a)) + W(U(b))));
    if (op == chorusProd) return static_cast<C>(static_cast<U>(W(U(a)) * W(U(b))));
  } else {
    if (op == chorusSum || op == chorusAvg) return a + b;
    if (op == chorusProd) return a * b;
    if (a != a) return a;  // min/max: a NaN first operand wins
  }
  if (op == chorusMin) return a < b ? a : b;  // a tie (-0 vs +0) returns b
  return a > b ? a : b;
}

template <class C>
C average(C sum, int n) {
  if constexpr (std::is_floating_point_v<C>) return sum / static_cast<C>(n);
  if constexpr (std::is_signed_v<C>) return static_cast<C>(static_cast<int64_t>(sum) / n);
  return static_cast<C>(static_cast<uint64_t>(sum) / static_cast<uint64_t>(n));
}

// S: how the bits are stored; C: the accumulation type; widen/narrow convert.
template <class S, class C, class Widen, class Narrow>
uint64_t fold(chorusRedOp_t op, int n, const uint64_t* x, Widen widen, Narrow narrow) {
  auto get = [&](int k) {
    S s;
    std::memcpy(&s, &x[k], sizeof s);
    return widen(s);
  };
  C acc = get(0);
  for (int k = 1; k < n; ++k) acc = apply<C>(op, acc, get(k));
  if (op == chorusAvg) acc = average<C>(acc, n);
  const S out = narrow(acc);
  uint64_t bits = 0;
  std::memcpy(&bits, &out, sizeof out);
  return bits;
}

template <class T>
uint64_t fold_plain(chorusRedOp_t op, int n, const uint64_t* x) {
  auto same = [](T v) { return v; };
  return fold<T, T>(op, n, x, same, same);
}

}  // namespace ref_detail

// The canonical result of x[0..n-1] (input bits of ranks 0..n-1), as bits of the type.
inline uint64_t canonical_bits(chorusDataType_t t, chorusRedOp_t op, int n, const uint64_t* x) {
  using namespace ref_detail;
  switch (t) {
    case chorusFloat32:
      return fold_plain<float>(op, n, x);
    case chorusFloat64:
      return fold_plain<double>(op, n, x);
    case chorusFloat16:
      return fold<uint16_t, float>(op, n, x, kernels::half_to_float, kernels::float_to_half);
    case chorusBfloat16:
      return fold<uint16_t, float>(op, n, x, kernels::bf16_to_float, kernels::float_to_bf16);
    case chorusInt8:
      return fold_plain<int8_t>(op, n, x);
    case chorusUint8:
      return fold_plain<uint8_t>(op, n, x);
    case chorusInt32:
      return fold_plain<int32_t>(op, n, x);
    case chorusUint32:
      return fold_plain<uint32_t>(op, n, x);
    case chorusInt64:
      return fold_plain<int64_t>(op, n, x);
    default:
      return fold_plain<uint64_t>(op, n, x);
  }
}

// Whether element bits `b` of type t are a NaN.
inline bool is_nan_bits(chorusDataType_t t, uint64_t b) {
  switch (t) {
    case chorusFloat32:
      return (b & 0x7fffffffu) > 0x7f800000u;
    case chorusFloat16:
      return (b & 0x7fffu) > 0x7c00u;
    case chorusBfloat16:
      return (b & 0x7fffu) > 0x7f80u;
    case chorusFloat64:
      return (b & 0x7fffffffffffffffull) > 0x7ff0000000000000ull;
    default:
      return false;
  }
}

// Bits of element i of buf (type t).
inline uint64_t element_bits(chorusDataType_t t, const void* buf, size_t i) {
  uint64_t b = 0;
  std::memcpy(&b, static_cast<const char*>(buf) + i * esize(t), esize(t));
  return b;
}

// got matches want: the same bits; for sum, prod and avg two NaNs also match (which NaN is
// not part of the contract there; min and max pass a NaN operand through, so there it is).
inline bool same_result(chorusDataType_t t, chorusRedOp_t op, uint64_t got, uint64_t want) {
  if (got == want) return true;
  const bool select = op == chorusMin || op == chorusMax;
  return !select && is_nan_bits(t, got) && is_nan_bits(t, want);
}

}  // namespace chorus::test
