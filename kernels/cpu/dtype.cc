// Sizes, names and parsing of the reduction element types and ops (declared in reduce.h).
#include "kernels/cpu/reduce.h"

namespace chorus::kernels {
namespace {

struct DTypeInfo {
  const char* name;
  size_t size;
};
constexpr DTypeInfo kDTypes[kNumDTypes] = {
    {"f32", 4}, {"f64", 8}, {"f16", 2}, {"bf16", 2}, {"i32", 4},
    {"i64", 8}, {"u8", 1},  {"i8", 1},  {"u32", 4},  {"u64", 8},
};
constexpr const char* kRedOps[kNumRedOps] = {"sum", "prod", "min", "max", "avg"};

struct Alias {
  std::string_view name;
  DType t;
};
constexpr Alias kDTypeAliases[] = {
    {"float32", DType::kF32},   {"float", DType::kF32},   {"float64", DType::kF64},
    {"double", DType::kF64},    {"float16", DType::kF16}, {"half", DType::kF16},
    {"bfloat16", DType::kBF16}, {"int8", DType::kI8},     {"uint8", DType::kU8},
    {"int32", DType::kI32},     {"uint32", DType::kU32},  {"int64", DType::kI64},
    {"uint64", DType::kU64},
};

}  // namespace

size_t dtype_size(DType t) {
  if (unsigned(t) >= unsigned(kNumDTypes)) __builtin_trap();
  return kDTypes[int(t)].size;
}

const char* dtype_name(DType t) {
  if (unsigned(t) >= unsigned(kNumDTypes)) return "?";
  return kDTypes[int(t)].name;
}

const char* red_op_name(RedOp op) {
  if (unsigned(op) >= unsigned(kNumRedOps)) return "?";
  return kRedOps[int(op)];
}

std::optional<DType> parse_dtype(std::string_view s) {
  for (int i = 0; i < kNumDTypes; i++)
    if (s == kDTypes[i].name) return DType(i);
  for (const Alias& a : kDTypeAliases)
    if (s == a.name) return a.t;
  return std::nullopt;
}

std::optional<RedOp> parse_red_op(std::string_view s) {
  for (int i = 0; i < kNumRedOps; i++)
    if (s == kRedOps[i]) return RedOp(i);
  if (s == "product") return RedOp::kProd;
  return std::nullopt;
}

}  // namespace chorus::kernels
