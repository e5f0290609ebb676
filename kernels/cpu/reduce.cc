// Reduction kernels (reduce.h): each call runs the active instruction-set build (isa/reduce.cc).
#include "kernels/cpu/reduce.h"

#include "kernels/cpu/isa/table.h"

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

}  // namespace chorus::kernels
