// Portable scalar conversions between float and the 16-bit float formats (IEEE binary16, bfloat16).
//
// Rounding is round-to-nearest-even in both directions of narrowing; subnormals are kept (no
// flush to zero); values too large for the format round to ±inf. NaNs keep their sign and the top
// mantissa bits and come out quiet, which is what the x86 hardware converters (F16C vcvtph2ps /
// vcvtps2ph) do, so a vectorised kernel using them and the scalar reference give the same bits.
// bf16 -> float is exact (a shift); float -> bf16 is done with integer arithmetic in both the
// scalar and the vector path (not vcvtneps2bf16, which flushes subnormals to zero).
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/cpu/isa_ns.h"
#include "kernels/hd.h"

namespace chorus::kernels {
inline namespace CHORUS_HELPERS_NS {

CHORUS_HD inline uint32_t float_bits(float f) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

CHORUS_HD inline float bits_float(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

// binary16: 1 sign, 5 exponent (bias 15), 10 mantissa bits.
CHORUS_HD inline float half_to_float(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) {  // inf or NaN; a signalling NaN comes out quiet
    uint32_t nan_quiet = mant ? 0x00400000u : 0u;
    return bits_float(sign | 0x7f800000u | (mant << 13) | nan_quiet);
  }
  if (exp == 0) {
    if (mant == 0) return bits_float(sign);  // ±0
    // Subnormal: value = mant * 2^-24, exactly representable as a normal float.
    float v = float(mant) * bits_float(0x33800000u);  // 2^-24
    return sign ? -v : v;
  }
  return bits_float(sign | ((exp + (127 - 15)) << 23) | (mant << 13));
}

CHORUS_HD inline uint16_t float_to_half(float f) {
  uint32_t u = float_bits(f);
  uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  uint32_t abs = u & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or NaN
    if (abs == 0x7f800000u) return sign | 0x7c00u;
    return uint16_t(sign | 0x7c00u | 0x0200u | ((abs >> 13) & 0x3ffu));
  }
  if (abs >= 0x477ff000u) return sign | 0x7c00u;      // >= 65520 rounds to inf
  if (abs >= 0x38800000u) {                           // normal half (>= 2^-14)
    uint32_t r = abs + 0x0fffu + ((abs >> 13) & 1u);  // round to nearest even at bit 13
    return uint16_t(sign | ((r - (uint32_t(127 - 15) << 23)) >> 13));
  }
  if (abs < 0x33000000u) return sign;  // < 2^-25 (half of the smallest subnormal): ±0
  // Subnormal half: shift the full significand right so that one unit is 2^-24, rounding to even.
  uint32_t exp = abs >> 23;                      // 102..112
  uint32_t sig = (abs & 0x7fffffu) | 0x800000u;  // 24-bit significand
  uint32_t shift = 126 - exp;                    // 14..24
  uint32_t q = sig >> shift;
  uint32_t rem = sig & ((1u << shift) - 1);
  uint32_t half_unit = 1u << (shift - 1);
  if (rem > half_unit || (rem == half_unit && (q & 1u))) q++;
  return uint16_t(sign | q);  // q == 0x400 carries into the smallest normal, as it should
}

// bfloat16: the top 16 bits of a float.
CHORUS_HD inline float bf16_to_float(uint16_t h) {
  return bits_float(uint32_t(h) << 16);
}

CHORUS_HD inline uint16_t float_to_bf16(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x0040u);  // quiet NaN
  return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);  // round to nearest even; may reach inf
}

}  // namespace CHORUS_HELPERS_NS
}  // namespace chorus::kernels
