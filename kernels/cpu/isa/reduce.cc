// Reduction kernels (reduce.h) of one instruction-set build: the scalar build loops over the
// element ops of reduce_elem.h (what the compiler vectorises for baseline x86-64); the AVX2 and
// AVX-512 builds run one loop template over lane types written with intrinsics
// (reduce_avx2.h, reduce_avx512.h). reduce_ref.cc is the reference every build is tested against.
//
// Vector loop: a partial head brings `out` to the vector width's alignment, the body does two
// vectors per iteration, and a partial tail finishes, so every element sees the same instruction
// sequence. Each iteration loads its inputs before storing, so an output may alias an input
// exactly.
#include <cstddef>
#include <cstdint>

#include "kernels/cpu/isa/entries.h"
#include "kernels/cpu/reduce_elem.h"

#if CHORUS_ISA_LEVEL == 2
#include "kernels/cpu/isa/reduce_avx512.h"
#elif CHORUS_ISA_LEVEL == 1
#include "kernels/cpu/isa/reduce_avx2.h"
#endif

namespace chorus::kernels::CHORUS_ISA_NS {
namespace {

struct OpSum {
  template <class L, class V>
  static V apply(V a, V b) {
    return L::sum(a, b);
  }
};
struct OpProd {
  template <class L, class V>
  static V apply(V a, V b) {
    return L::prod(a, b);
  }
};
struct OpMin {
  template <class L, class V>
  static V apply(V a, V b) {
    return L::min(a, b);
  }
};
struct OpMax {
  template <class L, class V>
  static V apply(V a, V b) {
    return L::max(a, b);
  }
};

#if CHORUS_ISA_LEVEL == 0

// Scalar lanes: one element, the ops of reduce_elem.h in the compute type.
template <class S>
struct Lanes {
  static auto sum(auto a, auto b) { return elem::sum(a, b); }
  static auto prod(auto a, auto b) { return elem::prod(a, b); }
  static auto min(auto a, auto b) { return elem::min(a, b); }
  static auto max(auto a, auto b) { return elem::max(a, b); }
};

template <class S, class Op, bool kCopy>
void reduce_loop(const void* va, const void* vb, void* vout, void* vout2, size_t n) {
  const S* a = static_cast<const S*>(va);
  const S* b = static_cast<const S*>(vb);
  S* out = static_cast<S*>(vout);
  S* out2 = static_cast<S*>(vout2);
  for (size_t i = 0; i < n; i++) {
    S r = elem::narrow<S>(Op::template apply<Lanes<S>>(elem::widen(a[i]), elem::widen(b[i])));
    out[i] = r;
    if constexpr (kCopy) out2[i] = r;
  }
}

template <class S, class Op, bool kCopy>
constexpr ReduceFn kLoop = reduce_loop<S, Op, kCopy>;

#else

// Elements before `p` reaches a vector-aligned address (capped at n); 0 if p is not even
// element-aligned.
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
    auto r = Op::template apply<L>(L::load_part(a + i, len), L::load_part(b + i, len));
    L::store_part(out + i, len, r);
    if constexpr (kCopy) L::store_part(out2 + i, len, r);
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

// Storage type -> lane type.
template <class S>
struct LaneType {
  using L = Int<S>;
};
template <>
struct LaneType<float> {
  using L = F32;
};
template <>
struct LaneType<double> {
  using L = F64;
};
template <>
struct LaneType<elem::F16> {
  using L = F16;
};
template <>
struct LaneType<elem::BF16> {
  using L = BF16;
};

template <class S, class Op, bool kCopy>
constexpr ReduceFn kLoop = reduce_simd<typename LaneType<S>::L, Op, kCopy>;

#endif

template <bool kCopy>
ReduceFn pick(DType t, RedOp op) {
  ReduceFn fn = nullptr;
  elem::with_storage_type(t, [&](auto tag) {
    using S = decltype(tag);
    switch (op) {
      case RedOp::kSum:
      case RedOp::kAvg:
        fn = kLoop<S, OpSum, kCopy>;
        return;
      case RedOp::kProd:
        fn = kLoop<S, OpProd, kCopy>;
        return;
      case RedOp::kMin:
        fn = kLoop<S, OpMin, kCopy>;
        return;
      case RedOp::kMax:
        fn = kLoop<S, OpMax, kCopy>;
        return;
    }
  });
  if (!fn) __builtin_trap();
  return fn;
}

template <class S>
void scale_loop(void* vbuf, size_t n, int nranks) {
  S* buf = static_cast<S*>(vbuf);
  for (size_t i = 0; i < n; i++) buf[i] = elem::narrow<S>(elem::div(elem::widen(buf[i]), nranks));
}

#if CHORUS_ISA_LEVEL > 0
template <class L>
void scale_simd(void* vbuf, size_t n, int nranks) {
  using S = typename L::S;
  constexpr size_t kW = L::kLanes;
  S* buf = static_cast<S*>(vbuf);
  size_t i = 0;
  for (; i + kW <= n; i += kW) L::store(buf + i, L::div(L::load(buf + i), nranks));
  if (i < n) L::store_part(buf + i, n - i, L::div(L::load_part(buf + i, n - i), nranks));
}
#endif

}  // namespace

ReduceFn pick_reduce(DType t, RedOp op, bool copy) {
  return copy ? pick<true>(t, op) : pick<false>(t, op);
}

void scale_avg(DType t, void* buf, size_t count, int nranks) {
  if (nranks == 1) return;
#if CHORUS_ISA_LEVEL > 0
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
      break;  // integer division has no vector instruction: the loop below
  }
#endif
  elem::with_storage_type(t, [&](auto tag) { scale_loop<decltype(tag)>(buf, count, nranks); });
}

}  // namespace chorus::kernels::CHORUS_ISA_NS
