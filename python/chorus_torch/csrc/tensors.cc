// Tensors in and out of chorus (tensors.h).
#include "tensors.h"

#include <c10/util/Exception.h>

namespace chorus_torch {

void check_tensor(const at::Tensor& t, const char* call) {
  TORCH_CHECK(t.defined(), "chorus: ", call, ": a tensor is undefined (None)");
  TORCH_CHECK(!t.is_cuda(), "chorus: ", call, ": a CUDA tensor (", t.device(),
              ") was given, but this chorus_torch handles CPU tensors only: device tensors need "
              "chorus built with -Dcuda=enabled and its GPU collectives, which this build lacks");
  TORCH_CHECK(t.device().is_cpu(), "chorus: ", call, ": tensor on device ", t.device(),
              "; chorus_torch takes CPU tensors");
  TORCH_CHECK(t.layout() == at::kStrided, "chorus: ", call, ": a ", t.layout(),
              " tensor was given; chorus takes dense (strided) tensors");
}

Reduction reduction_for(const at::Tensor& t, const c10d::ReduceOp& rop, const char* call) {
  using R = c10d::ReduceOp;
  chorusRedOp_t op = chorusSum;
  switch (rop.op_) {
    case R::SUM:
      op = chorusSum;
      break;
    case R::AVG:
      op = chorusAvg;
      break;
    case R::PRODUCT:
      op = chorusProd;
      break;
    case R::MIN:
      op = chorusMin;
      break;
    case R::MAX:
      op = chorusMax;
      break;
    default:
      TORCH_CHECK(false, "chorus: ", call, ": ReduceOp.", torch_op_name(rop),
                  " is not supported by chorus (it has SUM, PRODUCT, MIN, MAX and AVG)");
  }
  switch (t.scalar_type()) {
    case at::kFloat:
      return {chorusFloat32, op};
    case at::kDouble:
      return {chorusFloat64, op};
    case at::kHalf:
      return {chorusFloat16, op};
    case at::kBFloat16:
      return {chorusBfloat16, op};
    case at::kChar:
      return {chorusInt8, op};
    case at::kByte:
      return {chorusUint8, op};
    case at::kInt:
      return {chorusInt32, op};
    case at::kLong:
      return {chorusInt64, op};
    case at::kBool:
      TORCH_CHECK(op != chorusAvg, "chorus: ", call,
                  ": ReduceOp.AVG of a bool tensor has no meaning");
      // or for SUM/MAX, and for PRODUCT/MIN: on 0/1 bytes these are max and min.
      return {chorusUint8, (op == chorusSum || op == chorusMax) ? chorusMax : chorusMin};
    case at::kComplexFloat:
    case at::kComplexDouble:
      TORCH_CHECK(op == chorusSum || op == chorusAvg, "chorus: ", call, ": ReduceOp.",
                  torch_op_name(rop), " of complex numbers has no order; SUM and AVG work");
      return {t.scalar_type() == at::kComplexFloat ? chorusFloat32 : chorusFloat64, op, 2};
    default:
      TORCH_CHECK(false, "chorus: ", call, ": dtype ", t.scalar_type(),
                  " cannot be reduced by chorus (it reduces float32, float64, float16, bfloat16, "
                  "int8, uint8, int32, int64, bool, complex64 and complex128)");
  }
}

Reduction moved_as(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat:
      return {chorusFloat32, chorusSum};
    case at::kDouble:
      return {chorusFloat64, chorusSum};
    case at::kHalf:
      return {chorusFloat16, chorusSum};
    case at::kBFloat16:
      return {chorusBfloat16, chorusSum};
    case at::kChar:
      return {chorusInt8, chorusSum};
    case at::kInt:
      return {chorusInt32, chorusSum};
    case at::kLong:
      return {chorusInt64, chorusSum};
    case at::kComplexFloat:
      return {chorusFloat32, chorusSum, 2};
    case at::kComplexDouble:
      return {chorusFloat64, chorusSum, 2};
    default:
      return {chorusUint8, chorusSum, static_cast<int64_t>(t.element_size())};
  }
}

void check_same(const std::vector<at::Tensor>& list, const at::Tensor& like, const char* call,
                const char* what) {
  for (size_t i = 0; i < list.size(); ++i) {
    check_tensor(list[i], call);
    TORCH_CHECK(list[i].scalar_type() == like.scalar_type(), "chorus: ", call, ": ", what, "[", i,
                "] has dtype ", list[i].scalar_type(), ", expected ", like.scalar_type());
    TORCH_CHECK(list[i].numel() == like.numel(), "chorus: ", call, ": ", what, "[", i, "] has ",
                list[i].numel(), " elements, expected ", like.numel());
  }
}

at::Tensor& single(std::vector<at::Tensor>& list, const char* call, const char* what) {
  TORCH_CHECK(list.size() == 1, "chorus: ", call, ": takes one ", what, " tensor per process, got ",
              list.size());
  check_tensor(list[0], call);
  return list[0];
}

Output::Output(const at::Tensor& t)
    : user(t), buffer(t.is_contiguous() ? t : at::empty(t.sizes(), t.options())) {}

void Output::finish() const {
  if (!buffer.is_same(user)) user.copy_(buffer);
}

at::Tensor flatten(const std::vector<at::Tensor>& list) {
  std::vector<at::Tensor> flat;
  flat.reserve(list.size());
  for (const at::Tensor& t : list) flat.push_back(t.reshape({-1}));
  return at::cat(flat);
}

void unflatten(const at::Tensor& block, const std::vector<at::Tensor>& list) {
  int64_t off = 0;
  for (const at::Tensor& t : list) {
    t.copy_(block.narrow(0, off, t.numel()).view(t.sizes()));
    off += t.numel();
  }
}

std::string torch_op_name(const c10d::ReduceOp& op) {
  using R = c10d::ReduceOp;
  switch (op.op_) {
    case R::SUM:
      return "SUM";
    case R::AVG:
      return "AVG";
    case R::PRODUCT:
      return "PRODUCT";
    case R::MIN:
      return "MIN";
    case R::MAX:
      return "MAX";
    case R::BAND:
      return "BAND";
    case R::BOR:
      return "BOR";
    case R::BXOR:
      return "BXOR";
    case R::PREMUL_SUM:
      return "PREMUL_SUM";
    default:
      return "UNUSED";
  }
}

}  // namespace chorus_torch
