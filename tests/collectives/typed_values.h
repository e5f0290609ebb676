// The ten C API types for the collective tests: their names and sizes, and storing a value into
// element i of a buffer as the type holds it (integers cut to the type: two's-complement wrap;
// f16/bf16 rounded from float). test_reductions.cc and test_soak.cc share it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "chorus/chorus.h"
#include "kernels/cpu/half.h"

namespace chorus::test {

inline constexpr chorusDataType_t kTypes[] = {
    chorusFloat32, chorusFloat64, chorusFloat16, chorusBfloat16, chorusInt8,
    chorusUint8,   chorusInt32,   chorusUint32,  chorusInt64,    chorusUint64};
// Indexed by chorusDataType_t.
inline constexpr const char* kTypeNames[] = {"i8",  "u8",  "i32", "u32", "i64",
                                             "u64", "f16", "f32", "f64", "bf16"};
// The five reduction ops, and their names indexed by chorusRedOp_t.
inline constexpr chorusRedOp_t kOps[] = {chorusSum, chorusProd, chorusMax, chorusMin, chorusAvg};
inline constexpr const char* kOpNames[] = {"sum", "prod", "max", "min", "avg"};
inline constexpr size_t kTypeSizes[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2};

inline size_t esize(chorusDataType_t t) {
  return kTypeSizes[t];
}

// Element i of buf <- v, V an integer or floating type.
template <class V>
void put(chorusDataType_t t, void* buf, size_t i, V v) {
  switch (t) {
    case chorusFloat32:
      static_cast<float*>(buf)[i] = static_cast<float>(v);
      break;
    case chorusFloat64:
      static_cast<double*>(buf)[i] = static_cast<double>(v);
      break;
    case chorusFloat16:
      static_cast<uint16_t*>(buf)[i] = kernels::float_to_half(static_cast<float>(v));
      break;
    case chorusBfloat16:
      static_cast<uint16_t*>(buf)[i] = kernels::float_to_bf16(static_cast<float>(v));
      break;
    case chorusInt8:
      static_cast<int8_t*>(buf)[i] = static_cast<int8_t>(v);
      break;
    case chorusUint8:
      static_cast<uint8_t*>(buf)[i] = static_cast<uint8_t>(v);
      break;
    case chorusInt32:
      static_cast<int32_t*>(buf)[i] = static_cast<int32_t>(v);
      break;
    case chorusUint32:
      static_cast<uint32_t*>(buf)[i] = static_cast<uint32_t>(v);
      break;
    case chorusInt64:
      static_cast<int64_t*>(buf)[i] = static_cast<int64_t>(v);
      break;
    default:
      static_cast<uint64_t*>(buf)[i] = static_cast<uint64_t>(v);
      break;
  }
}

}  // namespace chorus::test
