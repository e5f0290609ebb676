// The cases both CUDA fold tests run (test_cuda_fold_host.cc on the CPU, test_cuda_reduce.cu on a
// GPU): every type x op x input count x length x alignment, each compared bit for bit (two NaNs
// equal) with the scalar reference kernels::ref::reduce_fold. `run` computes one case the way
// the test under check does; it gets host buffers and returns 0 on success.
#pragma once

#include <cstdio>
#include <functional>
#include <vector>

#include "kernels/cpu/reduce_ref.h"
#include "kernels/cuda/fold.cuh"
#include "reduce_values.h"

namespace chorus::kernels::test {

struct FoldCase {
  DType t;
  RedOp op;
  int w;
  size_t count;
  int avg_n;
  std::vector<size_t> in_offset;  // bytes into each input's allocation
  size_t out_offset;              // bytes into the output's allocation
  bool in_place;                  // the output is input 0
};

// run(case, inputs, out): inputs[k] and out point into host buffers laid out as the case says.
using FoldRunner = std::function<int(const FoldCase&, const std::vector<const void*>&, void* out)>;

inline const char* layout_name(const FoldCase& c) {
  if (c.in_place) return "in place";
  for (size_t o : c.in_offset)
    if (o % 16 != c.out_offset % 16) return "mixed offsets";
  return c.out_offset % 16 ? "shared offset" : "aligned";
}

// Runs every case; prints the first failures and returns how many cases failed.
inline int run_fold_cases(const FoldRunner& run, const std::vector<size_t>& counts,
                          const std::vector<int>& widths) {
  int failed = 0, cases = 0;
  uint32_t seed = 1;
  for (DType t : kAllTypes) {
    size_t sz = dtype_size(t);
    for (RedOp op : kAllOps)
      for (int w : widths)
        for (size_t count : counts)
          for (int layout = 0; layout < 4; layout++) {
            FoldCase c{t, op, w, count, op == RedOp::kAvg ? w : 0, {}, 0, layout == 3};
            for (int k = 0; k < w; k++)  // 0: aligned, 1: one shared offset, 2: mixed
              c.in_offset.push_back(layout == 0 ? 0 : layout == 2 ? sz * size_t(k % 3) : sz * 3);
            c.out_offset = layout == 0 ? 0 : sz * 3;
            if (c.in_place) c.in_offset[0] = c.out_offset;
            std::vector<std::vector<uint8_t>> bufs;
            std::vector<const void*> in;
            for (int k = 0; k < w; k++) {
              std::vector<uint8_t> b(c.in_offset[k] + count * sz + 16, 0xa5);
              std::vector<uint8_t> v = random_bytes(t, count, seed++);
              std::memcpy(b.data() + c.in_offset[k], v.data(), count * sz);
              bufs.push_back(std::move(b));
            }
            for (int k = 0; k < w; k++) in.push_back(bufs[size_t(k)].data() + c.in_offset[k]);
            std::vector<uint8_t> want(count * sz + 1);
            ref::reduce_fold(t, op, in.data(), w, want.data(), count, c.avg_n);
            std::vector<uint8_t> out_buf(c.out_offset + count * sz + 16, 0x5a);
            void* out = c.in_place ? const_cast<void*>(in[0]) : out_buf.data() + c.out_offset;
            std::vector<uint8_t> guard_after(16);
            uint8_t* end = static_cast<uint8_t*>(out) + count * sz;
            std::memcpy(guard_after.data(), end, 16);
            cases++;
            int rc = run(c, in, out);
            long bad = rc ? 0 : first_mismatch(t, static_cast<uint8_t*>(out), want.data(), count);
            bool overrun = std::memcmp(guard_after.data(), end, 16) != 0;
            if (rc || bad >= 0 || overrun) {
              if (failed < 10)
                std::printf("FAIL %s %s w=%d count=%zu %s: %s\n", dtype_name(t), red_op_name(op), w,
                            count, layout_name(c),
                            rc        ? "the run failed"
                            : overrun ? "wrote past the end"
                                      : "differs from the reference");
              if (bad >= 0 && failed < 10) std::printf("  first differing element %ld\n", bad);
              failed++;
            }
          }
  }
  std::printf("%d of %d fold cases passed\n", cases - failed, cases);
  return failed;
}

}  // namespace chorus::kernels::test
