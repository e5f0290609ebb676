// AVX2 (+ F16C) lane types for the reduction loop of isa/reduce.cc (included there, in the avx2
// build only; internal linkage, like everything under isa/). The same interface as
// reduce_avx512.h; AVX2 has no masked byte stores, so partial vectors go through a small buffer.
#pragma once

#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/cpu/reduce_elem.h"

namespace chorus::kernels::CHORUS_ISA_NS {
namespace {

// The first n (< kLanes) elements at p as a vector (the other lanes zero), and back.
template <class L>
typename L::V load_part_buffered(const typename L::S* p, size_t n) {
  alignas(32) typename L::S tmp[L::kLanes] = {};
  std::memcpy(tmp, p, n * sizeof(typename L::S));
  return L::load(tmp);
}
template <class L>
void store_part_buffered(typename L::S* p, size_t n, typename L::V v) {
  alignas(32) typename L::S tmp[L::kLanes];
  L::store(tmp, v);
  std::memcpy(p, tmp, n * sizeof(typename L::S));
}

struct F32Ops {
  using V = __m256;
  static V sum(V a, V b) { return _mm256_add_ps(a, b); }
  static V prod(V a, V b) { return _mm256_mul_ps(a, b); }
  // vminps returns its second operand when either is NaN or both are zero; patch in a NaN `a`.
  static V min(V a, V b) {
    return _mm256_blendv_ps(_mm256_min_ps(a, b), a, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
  }
  static V max(V a, V b) {
    return _mm256_blendv_ps(_mm256_max_ps(a, b), a, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
  }
  static V div(V x, int n) { return _mm256_div_ps(x, _mm256_set1_ps(float(n))); }
};

struct F32 : F32Ops {
  using S = float;
  static constexpr size_t kLanes = 8;
  static V load(const S* p) { return _mm256_loadu_ps(p); }
  static void store(S* p, V v) { _mm256_storeu_ps(p, v); }
  static V load_part(const S* p, size_t n) { return load_part_buffered<F32>(p, n); }
  static void store_part(S* p, size_t n, V v) { store_part_buffered<F32>(p, n, v); }
};

// f16: F16C converts (vcvtph2ps / vcvtps2ph round to nearest even, like half.h).
struct F16 : F32Ops {
  using S = elem::F16;
  static constexpr size_t kLanes = 8;
  static V load(const S* p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p)); }
  static void store(S* p, V v) {
    _mm_storeu_si128((__m128i*)p, _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }
  static V load_part(const S* p, size_t n) { return load_part_buffered<F16>(p, n); }
  static void store_part(S* p, size_t n, V v) { store_part_buffered<F16>(p, n, v); }
};

// bf16 widens with a shift and narrows with the integer rounding of float_to_bf16().
struct BF16 : F32Ops {
  using S = elem::BF16;
  static constexpr size_t kLanes = 8;
  static V widen(__m128i h) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  // u + 0x7fff + lsb, >> 16; NaN -> (u >> 16) | 0x40; then the eight low halves, in order.
  static __m128i narrow(V v) {
    __m256i u = _mm256_castps_si256(v);
    __m256i hi = _mm256_srli_epi32(u, 16);
    __m256i lsb = _mm256_and_si256(hi, _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(
        _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
    __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    r = _mm256_blendv_epi8(r, _mm256_or_si256(hi, _mm256_set1_epi32(0x40)), nan);
    // packus works per 128-bit half: [r0..r3 r0..r3 | r4..r7 r4..r7]; gather qwords 0 and 2.
    __m256i packed = _mm256_packus_epi32(r, r);
    return _mm256_castsi256_si128(_mm256_permute4x64_epi64(packed, 0x08));
  }
  static V load(const S* p) { return widen(_mm_loadu_si128((const __m128i*)p)); }
  static void store(S* p, V v) { _mm_storeu_si128((__m128i*)p, narrow(v)); }
  static V load_part(const S* p, size_t n) { return load_part_buffered<BF16>(p, n); }
  static void store_part(S* p, size_t n, V v) { store_part_buffered<BF16>(p, n, v); }
};

struct F64 {
  using S = double;
  using V = __m256d;
  static constexpr size_t kLanes = 4;
  static V load(const S* p) { return _mm256_loadu_pd(p); }
  static void store(S* p, V v) { _mm256_storeu_pd(p, v); }
  static V load_part(const S* p, size_t n) { return load_part_buffered<F64>(p, n); }
  static void store_part(S* p, size_t n, V v) { store_part_buffered<F64>(p, n, v); }
  static V sum(V a, V b) { return _mm256_add_pd(a, b); }
  static V prod(V a, V b) { return _mm256_mul_pd(a, b); }
  static V min(V a, V b) {
    return _mm256_blendv_pd(_mm256_min_pd(a, b), a, _mm256_cmp_pd(a, a, _CMP_UNORD_Q));
  }
  static V max(V a, V b) {
    return _mm256_blendv_pd(_mm256_max_pd(a, b), a, _mm256_cmp_pd(a, a, _CMP_UNORD_Q));
  }
  static V div(V x, int n) { return _mm256_div_pd(x, _mm256_set1_pd(double(n))); }
};

// Integers of 1, 4 or 8 bytes, signed or not. Sum and prod wrap (the instructions do).
template <class T>
struct Int {
  using S = T;
  using V = __m256i;
  static constexpr size_t kLanes = 32 / sizeof(T);
  static constexpr bool kSigned = std::is_signed_v<T>;
  static V load(const S* p) { return _mm256_loadu_si256((const __m256i*)p); }
  static void store(S* p, V v) { _mm256_storeu_si256((__m256i*)p, v); }
  static V load_part(const S* p, size_t n) { return load_part_buffered<Int>(p, n); }
  static void store_part(S* p, size_t n, V v) { store_part_buffered<Int>(p, n, v); }
  static V sum(V a, V b) {
    if constexpr (sizeof(T) == 1) return _mm256_add_epi8(a, b);
    if constexpr (sizeof(T) == 4) return _mm256_add_epi32(a, b);
    if constexpr (sizeof(T) == 8) return _mm256_add_epi64(a, b);
  }
  static V prod(V a, V b) {
    if constexpr (sizeof(T) == 1) {
      // No 8-bit multiply: multiply the even and the odd bytes as 16-bit lanes, keep low bytes.
      V even = _mm256_mullo_epi16(a, b);
      V odd = _mm256_mullo_epi16(_mm256_srli_epi16(a, 8), _mm256_srli_epi16(b, 8));
      return _mm256_or_si256(_mm256_and_si256(even, _mm256_set1_epi16(0x00ff)),
                             _mm256_slli_epi16(odd, 8));
    }
    if constexpr (sizeof(T) == 4) return _mm256_mullo_epi32(a, b);
    if constexpr (sizeof(T) == 8) {
      // No 64-bit multiply: a*b mod 2^64 = lo(a)*lo(b) + ((lo(a)*hi(b) + hi(a)*lo(b)) << 32).
      V cross = _mm256_add_epi64(_mm256_mul_epu32(a, _mm256_srli_epi64(b, 32)),
                                 _mm256_mul_epu32(_mm256_srli_epi64(a, 32), b));
      return _mm256_add_epi64(_mm256_mul_epu32(a, b), _mm256_slli_epi64(cross, 32));
    }
  }
  // a > b, as the type compares (64-bit: AVX2 has only the signed compare; bias unsigned ones).
  static V greater64(V a, V b) {
    if constexpr (kSigned) return _mm256_cmpgt_epi64(a, b);
    const V bias = _mm256_set1_epi64x(INT64_MIN);
    return _mm256_cmpgt_epi64(_mm256_xor_si256(a, bias), _mm256_xor_si256(b, bias));
  }
  static V min(V a, V b) {
    if constexpr (sizeof(T) == 1) return kSigned ? _mm256_min_epi8(a, b) : _mm256_min_epu8(a, b);
    if constexpr (sizeof(T) == 4) return kSigned ? _mm256_min_epi32(a, b) : _mm256_min_epu32(a, b);
    if constexpr (sizeof(T) == 8) return _mm256_blendv_epi8(a, b, greater64(a, b));
  }
  static V max(V a, V b) {
    if constexpr (sizeof(T) == 1) return kSigned ? _mm256_max_epi8(a, b) : _mm256_max_epu8(a, b);
    if constexpr (sizeof(T) == 4) return kSigned ? _mm256_max_epi32(a, b) : _mm256_max_epu32(a, b);
    if constexpr (sizeof(T) == 8) return _mm256_blendv_epi8(b, a, greater64(a, b));
  }
};

}  // namespace
}  // namespace chorus::kernels::CHORUS_ISA_NS
