// The device reduction kernels' element loop (kernels/cuda/fold.cuh) run on the CPU. It is
// __host__ __device__ code (plain C++ without nvcc), so it builds here in every build, the
// sanitizer builds included, and each "thread" of a grid is called in turn: the vector/head/tail
// split, the unrolled loads and the shared element arithmetic are checked against the scalar
// reference on every machine, GPU or not. The [cuda] test runs the same cases on a device.
#include <cstdio>

#include "fold_cases.h"

using namespace chorus::kernels;

namespace {

template <class S>
void emulate(RedOp op, const cuda::FoldArgs& a, size_t nthreads) {
  for (size_t tid = 0; tid < nthreads; tid++) {
    switch (op) {
      case RedOp::kSum:
      case RedOp::kAvg:
        cuda::fold_thread<S, RedOp::kSum>(a, tid, nthreads);
        break;
      case RedOp::kProd:
        cuda::fold_thread<S, RedOp::kProd>(a, tid, nthreads);
        break;
      case RedOp::kMin:
        cuda::fold_thread<S, RedOp::kMin>(a, tid, nthreads);
        break;
      case RedOp::kMax:
        cuda::fold_thread<S, RedOp::kMax>(a, tid, nthreads);
        break;
    }
  }
}

}  // namespace

int main() {
  int failed = 0;
  // Grids of 1 thread, of a few (tails shared unevenly) and of more threads than vectors.
  for (size_t nthreads : {size_t(1), size_t(3), size_t(64)}) {
    std::printf("grid of %zu threads:\n", nthreads);
    failed += test::run_fold_cases(
        [&](const test::FoldCase& c, const std::vector<const void*>& in, void* out) {
          cuda::FoldArgs a;
          for (int k = 0; k < c.w; k++) a.in[k] = in[size_t(k)];
          a.w = c.w;
          a.out[0] = out;
          a.nout = 1;
          a.count = c.count;
          a.avg_n = c.avg_n;
          // w - 1 more outputs (reduce_copy's second, a device all-reduce's peers'): each must
          // equal the first. Aligned as the first (vectors) when w is even, one element off
          // (every element alone) when it is odd.
          const size_t bytes = c.count * dtype_size(c.t);
          std::vector<std::vector<uint8_t>> more(size_t(c.w - 1), std::vector<uint8_t>(bytes + 32));
          const size_t off = reinterpret_cast<uintptr_t>(out) % 16;
          for (auto& m : more) {
            uint8_t* base = m.data() + (16 - reinterpret_cast<uintptr_t>(m.data()) % 16) % 16;
            a.out[a.nout++] = base + (c.w % 2 == 0 ? off : (off + dtype_size(c.t)) % 16);
          }
          elem::with_storage_type(c.t,
                                  [&](auto tag) { emulate<decltype(tag)>(c.op, a, nthreads); });
          for (int o = 1; o < a.nout; o++)
            if (std::memcmp(a.out[o], out, bytes) != 0) return 1;
          return 0;
        },
        {0, 1, 2, 7, 8, 15, 16, 17, 31, 33, 64, 100, 257, 1031}, {1, 2, 3, 5});
  }
  std::printf("%s\n", failed ? "FAILED" : "ok");
  return failed ? 1 : 0;
}
