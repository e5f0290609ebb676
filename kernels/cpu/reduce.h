// Element-wise reduction kernels used by the collectives (all-reduce, reduce, reduce-scatter).
//
// Contract, for every function here:
// - Pure compute: no global state, no allocation, thread-safe (callers may run them on any
//   number of threads over disjoint ranges). `count` is a number of elements, not bytes; with
//   count == 0 nothing is read or written and the pointers may be null.
// - Pointers need only the alignment of the element type (none for u8/f16/bf16 beyond 1/2 bytes).
// - Any output may be *exactly* the same pointer as any input (in-place); partial overlap of
//   two buffers is not allowed.
// - Dispatch on (dtype, op) happens once per call; an out-of-range enum value aborts (a bug).
// - Each call runs the instruction-set build chosen at start-up (isa.h); every build gives the
//   same bits as the scalar reference.
//
// Semantics (shared with the scalar reference in reduce_ref.h, which the tests compare bitwise):
// - Integers (i8, u8, i32, u32, i64, u64): sum and prod wrap modulo 2^bits (two's complement);
//   never UB. min / max compare as signed or unsigned, as the type says.
// - f16 and bf16: both inputs are widened to float, the op runs in float, and the result is
//   rounded back to the 16-bit type, to nearest even.
// - min / max: if `a` is NaN the result is `a`, else if `b` is NaN it is `b`, else
//   `a < b ? a : b` (min) / `a > b ? a : b` (max); so NaN propagates (like torch.minimum, unlike
//   fmin) and for -0 vs +0 the second operand `b` is returned.
// - NaN bit patterns are not part of the contract: a NaN result is some NaN (f16/bf16
//   results are always quiet; sum/prod give whatever the hardware gives). The tests require
//   bit-equality everywhere else and "both NaN" where the reference is NaN.
// - avg: reduce() and reduce_copy() treat RedOp::kAvg exactly as kSum. The division by the number
//   of ranks is a separate pass, scale_avg(), run once on the final sum (as PyTorch DDP and
//   NCCL's integer avg do). Floats divide (x / n, correctly rounded, not a multiply by 1/n);
//   f16/bf16 divide in float and round back; integers use C++ integer division (truncation
//   toward zero, so -7 / 2 == -3), like NCCL's ncclAvg on integer types.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace chorus::kernels {

// Values are stable (collectives/op.cc maps the C API's chorusFloat32 etc. onto these): the
// first seven are the types chorus started with, the last three came later.
enum class DType : int { kF32, kF64, kF16, kBF16, kI32, kI64, kU8, kI8, kU32, kU64 };
enum class RedOp : int { kSum, kProd, kMin, kMax, kAvg };

inline constexpr int kNumDTypes = 10;
inline constexpr int kNumRedOps = 5;

// Bytes per element: 4, 8, 2, 2, 4, 8, 1, 1, 4, 8.
size_t dtype_size(DType t);

// "f32" "f64" "f16" "bf16" "i32" "i64" "u8" "i8" "u32" "u64"; "sum" "prod" "min" "max" "avg".
const char* dtype_name(DType t);
const char* red_op_name(RedOp op);

// Accept the names above and the long spellings ("float32", "float", "float16", "half",
// "bfloat16", "float64", "double", "int8", "uint8", "int32", "uint32", "int64", "uint64";
// "product"). nullopt if unknown.
std::optional<DType> parse_dtype(std::string_view s);
std::optional<RedOp> parse_red_op(std::string_view s);

// out[i] = a[i] op b[i] for i < count.
void reduce(DType t, RedOp op, const void* a, const void* b, void* out, size_t count);

// out[i] = out2[i] = a[i] op b[i]: one pass that writes the result twice, for the
// recvReduceCopySend step (reduce into the user buffer and into the outgoing slot).
void reduce_copy(DType t, RedOp op, const void* a, const void* b, void* out, void* out2,
                 size_t count);

// buf[i] = buf[i] / nranks (see "avg" above). Precondition: nranks >= 1; nranks == 1 is a no-op.
void scale_avg(DType t, void* buf, size_t count, int nranks);

// The ordered fold of the deterministic collectives (chorus.h, "Deterministic reductions"):
// out[i] = (...((in[0][i] op in[1][i]) op in[2][i]) ... op in[w-1][i]), left to right in the
// compute type (float for f16/bf16, so those round once, at the end), then, when avg_n > 0,
// divided by avg_n in the compute type before that rounding (avg: op is kSum or kAvg).
// Element i of the result depends only on the w inputs at i, never on count or on where the
// element lies in the buffer. out may be exactly any in[k]. Precondition: w >= 1.
void reduce_fold(DType t, RedOp op, const void* const* in, int w, void* out, size_t count,
                 int avg_n);

}  // namespace chorus::kernels
