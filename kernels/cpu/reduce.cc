// Reduction kernels (reduce.h): each call runs the active instruction-set build (isa/reduce.cc).
#include "kernels/cpu/reduce.h"

#include <algorithm>
#include <cstring>

#include "kernels/cpu/isa/table.h"
#include "kernels/cpu/reduce_elem.h"

namespace chorus::kernels {

void reduce(DType t, RedOp op, const void* a, const void* b, void* out, size_t count) {
  cpu_kernels().pick_reduce(t, op, false)(a, b, out, nullptr, count);
}

void reduce_copy(DType t, RedOp op, const void* a, const void* b, void* out, void* out2,
                 size_t count) {
  cpu_kernels().pick_reduce(t, op, true)(a, b, out, out2, count);
}

void scale_avg(DType t, void* buf, size_t count, int nranks) {
  cpu_kernels().scale_avg(t, buf, count, nranks);
}

namespace {

constexpr size_t kFoldBlockBytes = 8 << 10;  // an accumulator block that stays in L1

// f16/bf16: widen into a float block, fold there with the f32 kernels (same semantics: the
// 16-bit ops are defined as the float op), round once.
template <class S>
void fold_half(RedOp op, const void* const* in, int w, S* out, size_t count, int avg_n) {
  constexpr size_t kB = kFoldBlockBytes / sizeof(float);
  alignas(64) float acc[kB];
  alignas(64) float next[kB];
  for (size_t b = 0; b < count; b += kB) {
    const size_t n = std::min(kB, count - b);
    const S* x0 = static_cast<const S*>(in[0]) + b;
    for (size_t i = 0; i < n; i++) acc[i] = elem::widen(x0[i]);
    for (int k = 1; k < w; k++) {
      const S* xk = static_cast<const S*>(in[k]) + b;
      for (size_t i = 0; i < n; i++) next[i] = elem::widen(xk[i]);
      reduce(DType::kF32, op, acc, next, acc, n);
    }
    if (avg_n > 0) scale_avg(DType::kF32, acc, n, avg_n);
    for (size_t i = 0; i < n; i++) out[b + i] = elem::narrow<S>(acc[i]);
  }
}

}  // namespace

// Other types compute in their storage type, so the left fold is a chain of pairwise
// reductions: block by block, through an L1-sized accumulator, the last step into out.
void reduce_fold(DType t, RedOp op, const void* const* in, int w, void* out, size_t count,
                 int avg_n) {
  if (w < 1) __builtin_trap();
  if (count == 0) return;
  // Two inputs need no accumulator: one pairwise pass is the fold (16-bit types too, whose
  // pairwise op rounds once; not for their avg, which must divide before that rounding).
  const bool half = t == DType::kF16 || t == DType::kBF16;
  if (w == 2 && !(half && avg_n > 0)) {
    reduce(t, op, in[0], in[1], out, count);
    if (avg_n > 0) scale_avg(t, out, count, avg_n);
    return;
  }
  if (t == DType::kF16) return fold_half(op, in, w, static_cast<elem::F16*>(out), count, avg_n);
  if (t == DType::kBF16) return fold_half(op, in, w, static_cast<elem::BF16*>(out), count, avg_n);
  const size_t es = dtype_size(t);
  if (w == 1) {
    if (out != in[0]) std::memmove(out, in[0], count * es);
    if (avg_n > 0) scale_avg(t, out, count, avg_n);
    return;
  }
  {
    const size_t kB = kFoldBlockBytes / es;
    alignas(64) char acc[kFoldBlockBytes];
    for (size_t b = 0; b < count; b += kB) {
      const size_t n = std::min(kB, count - b);
      auto at = [&](const void* p) { return static_cast<const char*>(p) + b * es; };
      char* o = static_cast<char*>(out) + b * es;
      const void* a = at(in[0]);
      for (int k = 1; k < w; k++) {
        void* dst = k == w - 1 ? static_cast<void*>(o) : acc;
        reduce(t, op, a, at(in[k]), dst, n);
        a = acc;
      }
      if (avg_n > 0) scale_avg(t, o, n, avg_n);
    }
  }
}

}  // namespace chorus::kernels
