// One-element reduction ops (the semantics of reduce.h, written once in scalar C++). Used by the
// scalar reference, by the scalar build's loops and by the tails of the vector builds; the AVX2
// and AVX-512 builds re-implement them with intrinsics and are tested against the reference.
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernels/cpu/half.h"
#include "kernels/cpu/isa_ns.h"
#include "kernels/cpu/reduce.h"
#include "kernels/hd.h"

namespace chorus::kernels {
inline namespace CHORUS_HELPERS_NS {
namespace elem {

// Storage type <-> compute type. f16/bf16 are stored as uint16_t bits and computed in float.
struct F16 {
  uint16_t bits;
};
struct BF16 {
  uint16_t bits;
};

template <class S>
struct Compute {
  using type = S;
};
template <>
struct Compute<F16> {
  using type = float;
};
template <>
struct Compute<BF16> {
  using type = float;
};

template <class S>
CHORUS_HD inline typename Compute<S>::type widen(S x) {
  return x;
}
CHORUS_HD inline float widen(F16 x) {
  return half_to_float(x.bits);
}
CHORUS_HD inline float widen(BF16 x) {
  return bf16_to_float(x.bits);
}

template <class S>
CHORUS_HD inline S narrow(typename Compute<S>::type x) {
  return x;
}
template <>
CHORUS_HD inline F16 narrow<F16>(float x) {
  return F16{float_to_half(x)};
}
template <>
CHORUS_HD inline BF16 narrow<BF16>(float x) {
  return BF16{float_to_bf16(x)};
}

template <class T>
CHORUS_HD inline bool is_nan(T x) {
  if constexpr (std::is_floating_point_v<T>) return x != x;
  return false;
}

// Integer sum/prod wrap: do them in the unsigned type of the same width.
template <class T>
CHORUS_HD inline T sum(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    return T(U(U(a) + U(b)));
  }
  return a + b;
}
template <class T>
CHORUS_HD inline T prod(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    using W = std::conditional_t<(sizeof(U) < sizeof(unsigned)), unsigned, U>;  // no int promotion
    return T(U(W(a) * W(b)));
  }
  return a * b;
}
template <class T>
CHORUS_HD inline T min(T a, T b) {
  if (is_nan(a)) return a;
  return a < b ? a : b;
}
template <class T>
CHORUS_HD inline T max(T a, T b) {
  if (is_nan(a)) return a;
  return a > b ? a : b;
}
// avg's division: floats divide (correctly rounded); integers truncate toward zero (C++ `/`),
// computed at 64 bits so that n need not fit the element type (i8 with 1000 ranks).
template <class T>
CHORUS_HD inline T div(T x, int n) {
  if constexpr (std::is_floating_point_v<T>) {
    return x / T(n);
  } else if constexpr (std::is_signed_v<T>) {
    return T(int64_t(x) / int64_t(n));
  } else {
    return T(uint64_t(x) / uint64_t(n));
  }
}

template <class T>
CHORUS_HD inline T apply(RedOp op, T a, T b) {
  switch (op) {
    case RedOp::kSum:
    case RedOp::kAvg:
      return sum(a, b);
    case RedOp::kProd:
      return prod(a, b);
    case RedOp::kMin:
      return min(a, b);
    case RedOp::kMax:
      return max(a, b);
  }
  return a;
}

// Calls f(S{}) with S the storage type of t; aborts on an out-of-range value.
template <class F>
inline void with_storage_type(DType t, F&& f) {
  switch (t) {
    case DType::kF32:
      return f(float{});
    case DType::kF64:
      return f(double{});
    case DType::kF16:
      return f(F16{});
    case DType::kBF16:
      return f(BF16{});
    case DType::kI32:
      return f(int32_t{});
    case DType::kI64:
      return f(int64_t{});
    case DType::kU8:
      return f(uint8_t{});
    case DType::kI8:
      return f(int8_t{});
    case DType::kU32:
      return f(uint32_t{});
    case DType::kU64:
      return f(uint64_t{});
  }
  __builtin_trap();
}

}  // namespace elem
}  // namespace CHORUS_HELPERS_NS
}  // namespace chorus::kernels
