// CUDA reduction kernels (reduce.cu; their body is fold.cuh). Plain C++ interface: callers need
// no CUDA headers. Semantics are those of the CPU kernels (kernels/cpu/reduce.h) and of the
// scalar reference, bit for bit: every type (f32, f64, f16, bf16 in float rounded once, i8, u8,
// i32, u32, i64, u64) and op (sum, prod, min, max; avg is sum then a division by avg_n).
//
// Every function enqueues one kernel on `stream` (a cudaStream_t; nullptr: the legacy default
// stream) and returns without waiting; the result is the cudaError_t of the launch (0: launched),
// or cudaErrorInvalidValue (1) for arguments out of range. Pointers are device pointers (or
// mapped peer memory); they need only the alignment of their element type, and an output may be
// exactly one of the inputs.
#pragma once

#include <cstddef>

#include "kernels/cpu/reduce.h"

namespace chorus::kernels::cuda {

// out[i] = in[0][i] op ... op in[w-1][i] for i < count, divided by avg_n when avg_n > 0.
// 1 <= w <= kMaxFoldInputs (32).
int reduce_fold(DType t, RedOp op, const void* const* in, int w, void* out, size_t count, int avg_n,
                void* stream);

// The same result written to each of out[0..nout-1] in one pass, 1 <= nout <= kMaxFoldOutputs
// (32): a device all-reduce writes every rank's output at once. Outputs may be inputs.
int reduce_fold_to(DType t, RedOp op, const void* const* in, int w, void* const* out, int nout,
                   size_t count, int avg_n, void* stream);

// out[i] = a[i] op b[i] (and out2[i] too unless out2 is null); kAvg adds, as on the CPU.
int reduce_copy(DType t, RedOp op, const void* a, const void* b, void* out, void* out2,
                size_t count, void* stream);

// buf[i] /= nranks (floats divide, integers truncate toward zero); nothing for nranks == 1.
int scale_avg(DType t, void* buf, size_t count, int nranks, void* stream);

}  // namespace chorus::kernels::cuda
