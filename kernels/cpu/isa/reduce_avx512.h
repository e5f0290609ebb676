// AVX-512 lane types for the reduction loop of isa/reduce.cc (included there, in the avx512 build
// only; internal linkage, like everything under isa/). Each type gives: storage S, register V,
// kLanes, full and partial (masked) loads and stores, and sum / prod / min / max (div for the float
// types), each with exactly the semantics of reduce_elem.h.
#pragma once

#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "kernels/cpu/reduce_elem.h"

// GCC 12's AVX-512 headers trip -Wmaybe-uninitialized on their own _mm512_undefined_*()
// placeholders (GCC bug 105593); nothing here reads an uninitialised value.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace chorus::kernels::CHORUS_ISA_NS {
namespace {

// n in [0, lanes): the low n bits.
inline __mmask16 mask16(size_t n) {
  return __mmask16((1u << n) - 1);
}
inline __mmask8 mask8(size_t n) {
  return __mmask8((1u << n) - 1);
}
inline __mmask64 mask64(size_t n) {
  return __mmask64((uint64_t(1) << n) - 1);
}

struct F32Ops {
  using V = __m512;
  static V sum(V a, V b) { return _mm512_add_ps(a, b); }
  static V prod(V a, V b) { return _mm512_mul_ps(a, b); }
  // vminps returns its second operand when either is NaN or both are zero; patch in a NaN `a`.
  static V min(V a, V b) {
    return _mm512_mask_mov_ps(_mm512_min_ps(a, b), _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q), a);
  }
  static V max(V a, V b) {
    return _mm512_mask_mov_ps(_mm512_max_ps(a, b), _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q), a);
  }
  static V div(V x, int n) { return _mm512_div_ps(x, _mm512_set1_ps(float(n))); }
};

struct F32 : F32Ops {
  using S = float;
  static constexpr size_t kLanes = 16;
  static V load(const S* p) { return _mm512_loadu_ps(p); }
  static V load_part(const S* p, size_t n) { return _mm512_maskz_loadu_ps(mask16(n), p); }
  static void store(S* p, V v) { _mm512_storeu_ps(p, v); }
  static void store_part(S* p, size_t n, V v) { _mm512_mask_storeu_ps(p, mask16(n), v); }
};

// f16: the hardware converts (vcvtph2ps / vcvtps2ph round to nearest even, like half.h).
struct F16 : F32Ops {
  using S = elem::F16;
  static constexpr size_t kLanes = 16;
  static constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  static V load(const S* p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p)); }
  static V load_part(const S* p, size_t n) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask16(n), p));
  }
  static void store(S* p, V v) { _mm256_storeu_si256((__m256i*)p, _mm512_cvtps_ph(v, kRound)); }
  static void store_part(S* p, size_t n, V v) {
    _mm256_mask_storeu_epi16(p, mask16(n), _mm512_cvtps_ph(v, kRound));
  }
};

// bf16 widens with a shift and narrows with the integer rounding of float_to_bf16(): not
// vcvtneps2bf16, which flushes subnormals.
struct BF16 : F32Ops {
  using S = elem::BF16;
  static constexpr size_t kLanes = 16;
  static V widen(__m256i h) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  // u + 0x7fff + lsb, >> 16; NaN -> (u >> 16) | 0x40.
  static __m256i narrow(V v) {
    __m512i u = _mm512_castps_si512(v);
    __m512i hi = _mm512_srli_epi32(u, 16);
    __m512i lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(
        _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
    __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(hi, _mm512_set1_epi32(0x40)));
    return _mm512_cvtepi32_epi16(r);
  }
  static V load(const S* p) { return widen(_mm256_loadu_si256((const __m256i*)p)); }
  static V load_part(const S* p, size_t n) { return widen(_mm256_maskz_loadu_epi16(mask16(n), p)); }
  static void store(S* p, V v) { _mm256_storeu_si256((__m256i*)p, narrow(v)); }
  static void store_part(S* p, size_t n, V v) { _mm256_mask_storeu_epi16(p, mask16(n), narrow(v)); }
};

struct F64 {
  using S = double;
  using V = __m512d;
  static constexpr size_t kLanes = 8;
  static V load(const S* p) { return _mm512_loadu_pd(p); }
  static V load_part(const S* p, size_t n) { return _mm512_maskz_loadu_pd(mask8(n), p); }
  static void store(S* p, V v) { _mm512_storeu_pd(p, v); }
  static void store_part(S* p, size_t n, V v) { _mm512_mask_storeu_pd(p, mask8(n), v); }
  static V sum(V a, V b) { return _mm512_add_pd(a, b); }
  static V prod(V a, V b) { return _mm512_mul_pd(a, b); }
  static V min(V a, V b) {
    return _mm512_mask_mov_pd(_mm512_min_pd(a, b), _mm512_cmp_pd_mask(a, a, _CMP_UNORD_Q), a);
  }
  static V max(V a, V b) {
    return _mm512_mask_mov_pd(_mm512_max_pd(a, b), _mm512_cmp_pd_mask(a, a, _CMP_UNORD_Q), a);
  }
  static V div(V x, int n) { return _mm512_div_pd(x, _mm512_set1_pd(double(n))); }
};

// Integers of 1, 4 or 8 bytes, signed or not. Sum and prod wrap (the instructions do).
template <class T>
struct Int {
  using S = T;
  using V = __m512i;
  static constexpr size_t kLanes = 64 / sizeof(T);
  static constexpr bool kSigned = std::is_signed_v<T>;
  static V load(const S* p) { return _mm512_loadu_si512(p); }
  static void store(S* p, V v) { _mm512_storeu_si512(p, v); }
  static V load_part(const S* p, size_t n) {
    if constexpr (sizeof(T) == 1) return _mm512_maskz_loadu_epi8(mask64(n), p);
    if constexpr (sizeof(T) == 4) return _mm512_maskz_loadu_epi32(mask16(n), p);
    if constexpr (sizeof(T) == 8) return _mm512_maskz_loadu_epi64(mask8(n), p);
  }
  static void store_part(S* p, size_t n, V v) {
    if constexpr (sizeof(T) == 1) _mm512_mask_storeu_epi8(p, mask64(n), v);
    if constexpr (sizeof(T) == 4) _mm512_mask_storeu_epi32(p, mask16(n), v);
    if constexpr (sizeof(T) == 8) _mm512_mask_storeu_epi64(p, mask8(n), v);
  }
  static V sum(V a, V b) {
    if constexpr (sizeof(T) == 1) return _mm512_add_epi8(a, b);
    if constexpr (sizeof(T) == 4) return _mm512_add_epi32(a, b);
    if constexpr (sizeof(T) == 8) return _mm512_add_epi64(a, b);
  }
  static V prod(V a, V b) {
    if constexpr (sizeof(T) == 1) {
      // No 8-bit multiply: multiply the even and the odd bytes as 16-bit lanes, keep low bytes.
      V even = _mm512_mullo_epi16(a, b);
      V odd = _mm512_mullo_epi16(_mm512_srli_epi16(a, 8), _mm512_srli_epi16(b, 8));
      return _mm512_mask_blend_epi8(0xAAAAAAAAAAAAAAAAull, even, _mm512_slli_epi16(odd, 8));
    }
    if constexpr (sizeof(T) == 4) return _mm512_mullo_epi32(a, b);
    if constexpr (sizeof(T) == 8) return _mm512_mullo_epi64(a, b);
  }
  static V min(V a, V b) {
    if constexpr (sizeof(T) == 1) return kSigned ? _mm512_min_epi8(a, b) : _mm512_min_epu8(a, b);
    if constexpr (sizeof(T) == 4) return kSigned ? _mm512_min_epi32(a, b) : _mm512_min_epu32(a, b);
    if constexpr (sizeof(T) == 8) return kSigned ? _mm512_min_epi64(a, b) : _mm512_min_epu64(a, b);
  }
  static V max(V a, V b) {
    if constexpr (sizeof(T) == 1) return kSigned ? _mm512_max_epi8(a, b) : _mm512_max_epu8(a, b);
    if constexpr (sizeof(T) == 4) return kSigned ? _mm512_max_epi32(a, b) : _mm512_max_epu32(a, b);
    if constexpr (sizeof(T) == 8) return kSigned ? _mm512_max_epi64(a, b) : _mm512_max_epu64(a, b);
  }
};

}  // namespace
}  // namespace chorus::kernels::CHORUS_ISA_NS
