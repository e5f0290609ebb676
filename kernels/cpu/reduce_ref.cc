// Scalar reference for the reduction kernels: one element at a time, no tricks.
#include "kernels/cpu/reduce_ref.h"

#include "kernels/cpu/reduce_elem.h"

namespace chorus::kernels::ref {
namespace {

template <class S>
void reduce_typed(RedOp op, const S* a, const S* b, S* out, S* out2, size_t count) {
  for (size_t i = 0; i < count; i++) {
    S r = elem::narrow<S>(elem::apply(op, elem::widen(a[i]), elem::widen(b[i])));
    out[i] = r;
    if (out2) out2[i] = r;
  }
}

template <class S>
void scale_typed(S* buf, size_t count, int nranks) {
  for (size_t i = 0; i < count; i++)
    buf[i] = elem::narrow<S>(elem::div(elem::widen(buf[i]), nranks));
}

template <class S>
void fold_typed(RedOp op, const void* const* in, int w, S* out, size_t count, int avg_n) {
  for (size_t i = 0; i < count; i++) {
    auto acc = elem::widen(static_cast<const S*>(in[0])[i]);
    for (int k = 1; k < w; k++)
      acc = elem::apply(op, acc, elem::widen(static_cast<const S*>(in[k])[i]));
    if (avg_n > 0) acc = elem::div(acc, avg_n);
    out[i] = elem::narrow<S>(acc);
  }
}

}  // namespace

void reduce_fold(DType t, RedOp op, const void* const* in, int w, void* out, size_t count,
                 int avg_n) {
  if (unsigned(op) >= unsigned(kNumRedOps) || w < 1) __builtin_trap();
  elem::with_storage_type(t, [&](auto tag) {
    using S = decltype(tag);
    fold_typed(op, in, w, static_cast<S*>(out), count, avg_n);
  });
}

void reduce_copy(DType t, RedOp op, const void* a, const void* b, void* out, void* out2,
                 size_t count) {
  if (unsigned(op) >= unsigned(kNumRedOps)) __builtin_trap();
  elem::with_storage_type(t, [&](auto tag) {
    using S = decltype(tag);
    reduce_typed(op, static_cast<const S*>(a), static_cast<const S*>(b), static_cast<S*>(out),
                 static_cast<S*>(out2), count);
  });
}

void reduce(DType t, RedOp op, const void* a, const void* b, void* out, size_t count) {
  ref::reduce_copy(t, op, a, b, out, nullptr, count);
}

void scale_avg(DType t, void* buf, size_t count, int nranks) {
  if (nranks == 1) return;
  elem::with_storage_type(t, [&](auto tag) {
    using S = decltype(tag);
    scale_typed(static_cast<S*>(buf), count, nranks);
  });
}

}  // namespace chorus::kernels::ref
