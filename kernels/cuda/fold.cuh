// The body of the device reduction kernels, as a __host__ __device__ function of (thread index,
// thread count), so that the same lines run on the CPU in the tests of every machine
// (tests/cuda/test_fold_host.cu) and on the GPU in the kernels of reduce.cu.
//
// out[i] = in[0][i] op in[1][i] op ... op in[w-1][i], accumulated in the compute type of
// reduce_elem.h (float for f16/bf16) and rounded once; divided by avg_n when avg_n > 0 (avg);
// written to every one of the nout outputs (a device all-reduce writes each rank's output in one
// pass: each input byte read once, each output byte written once).
// Semantics are those of kernels::ref::reduce_fold, bit for bit (the tests compare).
//
// Access pattern: when every pointer has the same offset within 16 bytes, a scalar head up to
// the boundary, then 16-byte vectors (kUnroll of them in flight per thread, grid-stride), then a
// scalar tail; otherwise element by element (still coalesced across a warp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/reduce_elem.h"
#include "kernels/hd.h"

namespace chorus::kernels::cuda {

// Inputs and outputs per kernel launch: the pointers travel in the launch's parameter block.
inline constexpr int kMaxFoldInputs = 32;
inline constexpr int kMaxFoldOutputs = 32;
inline constexpr int kUnroll = 4;

struct FoldArgs {
  const void* in[kMaxFoldInputs] = {};
  int w = 0;
  void* out[kMaxFoldOutputs] = {};  // each gets the whole result
  int nout = 0;
  size_t count = 0;
  int avg_n = 0;
};

namespace detail {

struct alignas(16) Bytes16 {
  unsigned char b[16];
};

template <class S>
union Pack {
  Bytes16 raw;
  S e[16 / sizeof(S)];
};

template <class S>
CHORUS_HD inline Pack<S> load16(const void* base, size_t vec) {
  Pack<S> p;
#ifdef __CUDA_ARCH__
  p.raw = static_cast<const Bytes16*>(base)[vec];
#else
  std::memcpy(&p.raw, static_cast<const unsigned char*>(base) + vec * 16, 16);
#endif
  return p;
}

template <class S>
CHORUS_HD inline void store16(void* base, size_t vec, const Pack<S>& p) {
#ifdef __CUDA_ARCH__
  static_cast<Bytes16*>(base)[vec] = p.raw;
#else
  std::memcpy(static_cast<unsigned char*>(base) + vec * 16, &p.raw, 16);
#endif
}

template <class S, RedOp Op>
CHORUS_HD inline S fold_one(const FoldArgs& a, size_t i) {
  auto acc = elem::widen(static_cast<const S*>(a.in[0])[i]);
  for (int k = 1; k < a.w; k++)
    acc = elem::apply(Op, acc, elem::widen(static_cast<const S*>(a.in[k])[i]));
  if (a.avg_n > 0) acc = elem::div(acc, a.avg_n);
  return elem::narrow<S>(acc);
}

template <class S, RedOp Op>
CHORUS_HD inline void fold_scalar(const FoldArgs& a, size_t begin, size_t end, size_t tid,
                                  size_t nthreads) {
  for (size_t i = begin + tid; i < end; i += nthreads) {
    S r = fold_one<S, Op>(a, i);
    for (int o = 0; o < a.nout; o++) static_cast<S*>(a.out[o])[i] = r;
  }
}

// Elements before the first 16-byte boundary when every pointer shares one offset within 16
// bytes; -1 when they do not (then the whole range goes element by element).
CHORUS_HD inline long common_head(const FoldArgs& a, size_t elem_size) {
  uintptr_t off = reinterpret_cast<uintptr_t>(a.out[0]) % 16;
  for (int o = 1; o < a.nout; o++)
    if (reinterpret_cast<uintptr_t>(a.out[o]) % 16 != off) return -1;
  for (int k = 0; k < a.w; k++)
    if (reinterpret_cast<uintptr_t>(a.in[k]) % 16 != off) return -1;
  if (off % elem_size) return -1;  // not element-aligned: no vectors
  return long(((16 - off) % 16) / elem_size);
}

}  // namespace detail

// The work of thread `tid` of `nthreads` (grid-stride over the whole range).
template <class S, RedOp Op>
CHORUS_HD inline void fold_thread(const FoldArgs& a, size_t tid, size_t nthreads) {
  using namespace detail;
  using C = typename elem::Compute<S>::type;
  constexpr size_t V = 16 / sizeof(S);
  long h = common_head(a, sizeof(S));
  if (h < 0 || a.count < V + size_t(h)) {
    fold_scalar<S, Op>(a, 0, a.count, tid, nthreads);
    return;
  }
  size_t head = size_t(h);
  size_t nvec = (a.count - head) / V;
  fold_scalar<S, Op>(a, 0, head, tid, nthreads);
  // Vector j covers elements head + j*V ... head + j*V + V-1 (16-byte aligned from `head` on).
  const unsigned char* in0 = static_cast<const unsigned char*>(a.in[0]) + head * sizeof(S);
  for (size_t first = tid; first < nvec; first += nthreads * kUnroll) {
    C acc[kUnroll][V] = {};
    for (int u = 0; u < kUnroll; u++) {
      size_t j = first + size_t(u) * nthreads;
      if (j >= nvec) break;
      Pack<S> p = load16<S>(in0, j);
      for (size_t e = 0; e < V; e++) acc[u][e] = elem::widen(p.e[e]);
    }
    for (int k = 1; k < a.w; k++) {
      const unsigned char* ink = static_cast<const unsigned char*>(a.in[k]) + head * sizeof(S);
      for (int u = 0; u < kUnroll; u++) {
        size_t j = first + size_t(u) * nthreads;
        if (j >= nvec) break;
        Pack<S> p = load16<S>(ink, j);
        for (size_t e = 0; e < V; e++) acc[u][e] = elem::apply(Op, acc[u][e], elem::widen(p.e[e]));
      }
    }
    for (int u = 0; u < kUnroll; u++) {
      size_t j = first + size_t(u) * nthreads;
      if (j >= nvec) break;
      Pack<S> p;
      for (size_t e = 0; e < V; e++) {
        C x = acc[u][e];
        if (a.avg_n > 0) x = elem::div(x, a.avg_n);
        p.e[e] = elem::narrow<S>(x);
      }
      for (int o = 0; o < a.nout; o++)
        store16<S>(static_cast<unsigned char*>(a.out[o]) + head * sizeof(S), j, p);
    }
  }
  fold_scalar<S, Op>(a, head + nvec * V, a.count, tid, nthreads);
}

}  // namespace chorus::kernels::cuda
