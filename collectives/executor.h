// Executor: who performs a step's copies and reductions -- the seam between the step
// primitives (prims.h) and the hardware. The CPU kernels today; a GPU stream later.
//
// Contract: every call's output is complete when the call returns, so a step may publish it
// (send_commit) or hand it to a link at once. An executor whose work finishes later (a stream)
// will add a completion point here and the steps will wait on it before publishing.
// Pointers are host memory for the CPU executor; a device executor takes its device's.
#pragma once

#include <cstddef>

#include "kernels/cpu/reduce.h"

namespace chorus {

class Executor {
 public:
  virtual ~Executor() = default;
  virtual void copy(char* dst, const char* src, size_t bytes) = 0;
  // A copy into memory that will not be read soon (streaming stores, no read-for-ownership).
  virtual void copy_streaming(char* dst, const char* src, size_t bytes) = 0;
  // out = a op b, element-wise over `count` elements.
  virtual void reduce(kernels::DType t, kernels::RedOp op, const char* a, const char* b, char* out,
                      size_t count) = 0;
  // out = out2 = a op b, in one pass.
  virtual void reduce_copy(kernels::DType t, kernels::RedOp op, const char* a, const char* b,
                           char* out, char* out2, size_t count) = 0;
  // out = in[0] op in[1] op ... op in[w-1], folded left in that order (kernels::reduce_fold);
  // avg_n > 0: divided by avg_n before the result is rounded to the element type.
  virtual void reduce_fold(kernels::DType t, kernels::RedOp op, const char* const* in, int w,
                           char* out, size_t count, int avg_n) = 0;
};

// The CPU kernels (kernels/cpu/), one instance for the process.
Executor& cpu_executor();

}  // namespace chorus
