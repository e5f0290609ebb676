// Tensors in and out of chorus: type and operation mapping, the checks every call makes, and
// staging for inputs and outputs that are not one contiguous block.
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "chorus/chorus.h"
#include "torch_version.h"

namespace chorus_torch {

// What a reduction runs as in chorus: type, op, and how many chorus elements one tensor element
// is (2 for complex numbers, summed as pairs of reals).
struct Reduction {
  chorusDataType_t dtype;
  chorusRedOp_t op;
  int64_t per_element = 1;
};

// Throws a RuntimeError naming the call when the tensor cannot go through chorus: not on the
// CPU (a CUDA tensor names the build option), sparse, or not dense.
void check_tensor(const at::Tensor& t, const char* call);
// The reduction for a dtype and op; BAND/BOR/BXOR, PREMUL_SUM and unsupported dtypes throw.
// bool: SUM and MAX are logical or, PRODUCT and MIN logical and (NCCL's backend does the same).
Reduction reduction_for(const at::Tensor& t, const c10d::ReduceOp& op, const char* call);
// How a tensor moves without arithmetic (broadcast, gathers, send/recv): its chorus type, so
// that chorus checks peers agree, or bytes for dtypes chorus lacks; per_element chorus elements
// per tensor element.
Reduction moved_as(const at::Tensor& t);
// Every tensor of a list has the dtype and element count of `like`.
void check_same(const std::vector<at::Tensor>& list, const at::Tensor& like, const char* call,
                const char* what);
// The list's single tensor; throws naming the call when there is not exactly one.
at::Tensor& single(std::vector<at::Tensor>& list, const char* call, const char* what);

// An output tensor chorus can write: the tensor itself when contiguous, otherwise a contiguous
// stand-in copied back by finish() once the operation succeeded.
struct Output {
  at::Tensor user;
  at::Tensor buffer;
  explicit Output(const at::Tensor& t);
  void finish() const;
};

// One contiguous block holding the tensors one after another (a copy).
at::Tensor flatten(const std::vector<at::Tensor>& list);
// The inverse: block pieces copied into each tensor of `list` in turn.
void unflatten(const at::Tensor& block, const std::vector<at::Tensor>& list);

std::string torch_op_name(const c10d::ReduceOp& op);

}  // namespace chorus_torch
