// Plain scalar reference for the reduction kernels in reduce.h: same signatures, same semantics,
// one element at a time. Used by the tests to check the vectorised path bit for bit.
#pragma once

#include "kernels/cpu/reduce.h"

namespace chorus::kernels::ref {

void reduce(DType t, RedOp op, const void* a, const void* b, void* out, size_t count);
void reduce_copy(DType t, RedOp op, const void* a, const void* b, void* out, void* out2,
                 size_t count);
void scale_avg(DType t, void* buf, size_t count, int nranks);
void reduce_fold(DType t, RedOp op, const void* const* in, int w, void* out, size_t count,
                 int avg_n);

}  // namespace chorus::kernels::ref
