// Fast reduction kernels: AVX-512 intrinsics when the build targets them (-march=native on our
// machines), otherwise portable loops over the scalar ops of reduce_elem.h that the compiler
// auto-vectorises. Semantics and contracts are in reduce.h; reduce_ref.cc is the reference.
//
// AVX-512 path: one loop template over (lane type L, op, copy?) chosen once per call. A masked
// head brings `out` to the store width's alignment, the body does two vectors per iteration,
// and a masked tail finishes, so there is no scalar remainder and every element sees the same
// instruction sequence. Each iteration loads its inputs before storing, so an output may alias
// an input exactly. f16 uses the F16C-style converts (vcvtph2ps / vcvtps2ph, round to nearest
// even); bf16 widens with a shift and narrows with integer round-to-nearest-even.
#include "kernels/cpu/reduce.h"

#include <cstdint>

#include "kernels/cpu/reduce_elem.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && defined(__AVX512VL__)
#define CHORUS_REDUCE_AVX512 1
#include <immintrin.h>
// GCC 12's AVX-512 headers trip -Wmaybe-uninitialized on their own _mm512_undefined_*()
// placeholders (GCC bug 105593); nothing in this file reads an uninitialised value.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace chorus::kernels {
namespace {

using ReduceFn = void (*)(const void* a, const void* b, void* out, void* out2, size_t count);

#if CHORUS_REDUCE_AVX512

// ---- lane types: storage S, register V, mask M, loads/stores and the four ops ----

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
  using M = __mmask16;
  static constexpr size_t kLanes = 16;
  static M mask(size_t n) { return M((1u << n) - 1); }
  static V load(const S* p) { return _mm512_loadu_ps(p); }
  static V load(const S* p, M m) { return _mm512_maskz_loadu_ps(m, p); }
  static void store(S* p, V v) { _mm512_storeu_ps(p, v); }
  static void store(S* p, M m, V v) { _mm512_mask_storeu_ps(p, m, v); }
};

struct F16 : F32Ops {
  using S = elem::F16;
  using M = __mmask16;
  static constexpr size_t kLanes = 16;
  static constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  static M mask(size_t n) { return M((1u << n) - 1); }
  static V load(const S* p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p)); }
  static V load(const S* p, M m) { return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p)); }
  static void store(S* p, V v) { _mm256_storeu_si256((__m256i*)p, _mm512_cvtps_ph(v, kRound)); }
  static void store(S* p, M m, V v) { _mm256_mask_storeu_epi16(p, m, _mm512_cvtps_ph(v, kRound)); }
};

struct BF16 : F32Ops {
  using S = elem::BF16;
  using M = __mmask16;
  static constexpr size_t kLanes = 16;
  static M mask(size_t n) { return M((1u << n) - 1); }
  static V widen(__m256i h) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  // Same arithmetic as float_to_bf16(): u + 0x7fff + lsb, >> 16; NaN -> (u >> 16) | 0x40.
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
  static V load(const S* p, M m) { return widen(_mm256_maskz_loadu_epi16(m, p)); }
  static void store(S* p, V v) { _mm256_storeu_si256((__m256i*)p, narrow(v)); }
  static void store(S* p, M m, V v) { _mm256_mask_storeu_epi16(p, m, narrow(v)); }
};

struct F64 {
  using S = double;
  using V = __m512d;
  using M = __mmask8;
  static constexpr size_t kLanes = 8;
  static M mask(size_t n) { return M((1u << n) - 1); }
  static V load(const S* p) { return _mm512_loadu_pd(p); }
  static V load(const S* p, M m) { return _mm512_maskz_loadu_pd(m, p); }
  static void store(S* p, V v) { _mm512_storeu_pd(p, v); }
  static void store(S* p, M m, V v) { _mm512_mask_storeu_pd(p, m, v); }
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

struct IntBase {
  using V = __m512i;
  static V load(const void* p) { return _mm512_loadu_si512(p); }
  static void store(void* p, V v) { _mm512_storeu_si512(p, v); }
};

struct I32 : IntBase {
  using S = int32_t;
  using M = __mmask16;
  static constexpr size_t kLanes = 16;
  using IntBase::load, IntBase::store;
  static M mask(size_t n) { return M((1u << n) - 1); }
  static V load(const S* p, M m) { return _mm512_maskz_loadu_epi32(m, p); }
  static void store(S* p, M m, V v) { _mm512_mask_storeu_epi32(p, m, v); }
  static V sum(V a, V b) { return _mm512_add_epi32(a, b); }
  static V prod(V a, V b) { return _mm512_mullo_epi32(a, b); }
  static V min(V a, V b) { return _mm512_min_epi32(a, b); }
  static V max(V a, V b) { return _mm512_max_epi32(a, b); }
};

struct I64 : IntBase {
  using S = int64_t;
  using M = __mmask8;
  static constexpr size_t kLanes = 8;
  using IntBase::load, IntBase::store;
  static M mask(size_t n) { return M((1u << n) - 1); }
  static V load(const S* p, M m) { return _mm512_maskz_loadu_epi64(m, p); }
  static void store(S* p, M m, V v) { _mm512_mask_storeu_epi64(p, m, v); }
  static V sum(V a, V b) { return _mm512_add_epi64(a, b); }
  static V prod(V a, V b) { return _mm512_mullo_epi64(a, b); }
  static V min(V a, V b) { return _mm512_min_epi64(a, b); }
  static V max(V a, V b) { return _mm512_max_epi64(a, b); }
};

struct U8 : IntBase {
  using S = uint8_t;
  using M = __mmask64;
  static constexpr size_t kLanes = 64;
  using IntBase::load, IntBase::store;
  static M mask(size_t n) { return M((uint64_t(1) << n) - 1); }
  static V load(const S* p, M m) { return _mm512_maskz_loadu_epi8(m, p); }
  static void store(S* p, M m, V v) { _mm512_mask_storeu_epi8(p, m, v); }
  static V sum(V a, V b) { return _mm512_add_epi8(a, b); }
  // No 8-bit multiply: multiply the even and the odd bytes as 16-bit lanes, keep the low bytes.
  static V prod(V a, V b) {
    V even = _mm512_mullo_epi16(a, b);
    V odd = _mm512_mullo_epi16(_mm512_srli_epi16(a, 8), _mm512_srli_epi16(b, 8));
    return _mm512_mask_blend_epi8(0xAAAAAAAAAAAAAAAAull, even, _mm512_slli_epi16(odd, 8));
  }
  static V min(V a, V b) { return _mm512_min_epu8(a, b); }
  static V max(V a, V b) { return _mm512_max_epu8(a, b); }
};

struct OpSum {
  template <class L>
  static auto apply(auto a, auto b) {
    return L::sum(a, b);
  }
};
struct OpProd {
  template <class L>
  static auto apply(auto a, auto b) {
    return L::prod(a, b);
  }
};
struct OpMin {
  template <class L>
  static auto apply(auto a, auto b) {
    return L::min(a, b);
  }
};
struct OpMax {
  template <class L>
  static auto apply(auto a, auto b) {
    return L::max(a, b);
  }
};

// Elements before `p` reaches an aligned store (capped at n); 0 if p is not element-aligned.
template <class L>
size_t head_count(const void* p, size_t n) {
  constexpr size_t kBytes = L::kLanes * sizeof(typename L::S);
  uintptr_t addr = reinterpret_cast<uintptr_t>(p);
  if (addr % sizeof(typename L::S) != 0) return 0;
  size_t head = ((kBytes - addr % kBytes) % kBytes) / sizeof(typename L::S);
  return head < n ? head : n;
}

template <class L, class Op, bool kCopy>
void reduce_simd(const void* va, const void* vb, void* vout, void* vout2, size_t n) {
  using S = typename L::S;
  constexpr size_t kW = L::kLanes;
  const S* a = static_cast<const S*>(va);
  const S* b = static_cast<const S*>(vb);
  S* out = static_cast<S*>(vout);
  S* out2 = static_cast<S*>(vout2);
  auto partial = [&](size_t i, size_t len) {
    auto m = L::mask(len);
    auto r = Op::template apply<L>(L::load(a + i, m), L::load(b + i, m));
    L::store(out + i, m, r);
    if constexpr (kCopy) L::store(out2 + i, m, r);
  };
  size_t i = head_count<L>(out, n);
  if (i) partial(0, i);
  for (; i + 2 * kW <= n; i += 2 * kW) {
    auto r0 = Op::template apply<L>(L::load(a + i), L::load(b + i));
    auto r1 = Op::template apply<L>(L::load(a + i + kW), L::load(b + i + kW));
    L::store(out + i, r0);
    L::store(out + i + kW, r1);
    if constexpr (kCopy) {
      L::store(out2 + i, r0);
      L::store(out2 + i + kW, r1);
    }
  }
  if (i + kW <= n) {
    auto r = Op::template apply<L>(L::load(a + i), L::load(b + i));
    L::store(out + i, r);
    if constexpr (kCopy) L::store(out2 + i, r);
    i += kW;
  }
  if (i < n) partial(i, n - i);
}

template <class L>
void scale_simd(void* vbuf, size_t n, int nranks) {
  using S = typename L::S;
  constexpr size_t kW = L::kLanes;
  S* buf = static_cast<S*>(vbuf);
  size_t i = 0;
  for (; i + kW <= n; i += kW) L::store(buf + i, L::div(L::load(buf + i), nranks));
  if (i < n) {
    auto m = L::mask(n - i);
    L::store(buf + i, m, L::div(L::load(buf + i, m), nranks));
  }
}

template <class L, bool kCopy>
ReduceFn pick_op(RedOp op) {
  switch (op) {
    case RedOp::kSum:
    case RedOp::kAvg:
      return reduce_simd<L, OpSum, kCopy>;
    case RedOp::kProd:
      return reduce_simd<L, OpProd, kCopy>;
    case RedOp::kMin:
      return reduce_simd<L, OpMin, kCopy>;
    case RedOp::kMax:
      return reduce_simd<L, OpMax, kCopy>;
  }
  __builtin_trap();
}

template <bool kCopy>
ReduceFn pick(DType t, RedOp op) {
  switch (t) {
    case DType::kF32:
      return pick_op<F32, kCopy>(op);
    case DType::kF64:
      return pick_op<F64, kCopy>(op);
    case DType::kF16:
      return pick_op<F16, kCopy>(op);
    case DType::kBF16:
      return pick_op<BF16, kCopy>(op);
    case DType::kI32:
      return pick_op<I32, kCopy>(op);
    case DType::kI64:
      return pick_op<I64, kCopy>(op);
    case DType::kU8:
      return pick_op<U8, kCopy>(op);
  }
  __builtin_trap();
}

#else  // portable loops

template <class S, class Op, bool kCopy>
void reduce_loop(const void* va, const void* vb, void* vout, void* vout2, size_t n) {
  const S* a = static_cast<const S*>(va);
  const S* b = static_cast<const S*>(vb);
  S* out = static_cast<S*>(vout);
  S* out2 = static_cast<S*>(vout2);
  for (size_t i = 0; i < n; i++) {
    S r = elem::narrow<S>(Op::apply(elem::widen(a[i]), elem::widen(b[i])));
    out[i] = r;
    if constexpr (kCopy) out2[i] = r;
  }
}

struct OpSum {
  template <class T>
  static T apply(T a, T b) {
    return elem::sum(a, b);
  }
};
struct OpProd {
  template <class T>
  static T apply(T a, T b) {
    return elem::prod(a, b);
  }
};
struct OpMin {
  template <class T>
  static T apply(T a, T b) {
    return elem::min(a, b);
  }
};
struct OpMax {
  template <class T>
  static T apply(T a, T b) {
    return elem::max(a, b);
  }
};

template <bool kCopy>
ReduceFn pick(DType t, RedOp op) {
  ReduceFn fn = nullptr;
  elem::with_storage_type(t, [&](auto tag) {
    using S = decltype(tag);
    switch (op) {
      case RedOp::kSum:
      case RedOp::kAvg:
        fn = reduce_loop<S, OpSum, kCopy>;
        return;
      case RedOp::kProd:
        fn = reduce_loop<S, OpProd, kCopy>;
        return;
      case RedOp::kMin:
        fn = reduce_loop<S, OpMin, kCopy>;
        return;
      case RedOp::kMax:
        fn = reduce_loop<S, OpMax, kCopy>;
        return;
    }
  });
  if (!fn) __builtin_trap();
  return fn;
}

#endif

template <class S>
void scale_loop(void* vbuf, size_t n, int nranks) {
  S* buf = static_cast<S*>(vbuf);
  for (size_t i = 0; i < n; i++) buf[i] = elem::narrow<S>(elem::div(elem::widen(buf[i]), nranks));
}

}  // namespace

void reduce(DType t, RedOp op, const void* a, const void* b, void* out, size_t count) {
  pick<false>(t, op)(a, b, out, nullptr, count);
}

void reduce_copy(DType t, RedOp op, const void* a, const void* b, void* out, void* out2,
                 size_t count) {
  pick<true>(t, op)(a, b, out, out2, count);
}

void scale_avg(DType t, void* buf, size_t count, int nranks) {
  if (nranks == 1) return;
#if CHORUS_REDUCE_AVX512
  switch (t) {
    case DType::kF32:
      return scale_simd<F32>(buf, count, nranks);
    case DType::kF64:
      return scale_simd<F64>(buf, count, nranks);
    case DType::kF16:
      return scale_simd<F16>(buf, count, nranks);
    case DType::kBF16:
      return scale_simd<BF16>(buf, count, nranks);
    default:
      break;  // integer division has no SIMD instruction: scalar loop below
  }
#endif
  elem::with_storage_type(t, [&](auto tag) { scale_loop<decltype(tag)>(buf, count, nranks); });
}

}  // namespace chorus::kernels
