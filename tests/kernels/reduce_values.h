// Test values for the reduction kernels, without a test framework (the nvcc-built CUDA tests use
// them too): the types and ops, random inputs with the special values mixed in, and a bitwise
// comparison where two NaNs count as equal.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cpu/half.h"
#include "kernels/cpu/reduce.h"

namespace chorus::kernels::test {

inline constexpr DType kAllTypes[] = {DType::kF32, DType::kF64, DType::kF16, DType::kBF16,
                                      DType::kI32, DType::kI64, DType::kU8,  DType::kI8,
                                      DType::kU32, DType::kU64};
inline constexpr RedOp kAllOps[] = {RedOp::kSum, RedOp::kProd, RedOp::kMin, RedOp::kMax,
                                    RedOp::kAvg};

// Mostly ordinary values, with the special ones (NaN, inf, ±0, subnormals, extremes) mixed in.
inline std::vector<uint8_t> random_bytes(DType t, size_t count, uint32_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> buf(count * dtype_size(t) + 1);
  auto pick = [&](int n) { return int(rng() % uint64_t(n)); };
  auto small_float = [&] { return float(pick(129) - 64) / 8.0f; };  // ties and exact values
  for (size_t i = 0; i < count; i++) {
    void* p = buf.data() + i * dtype_size(t);
    bool special = pick(8) == 0;
    uint64_t bits = rng();
    switch (t) {
      case DType::kF32: {
        const float sp[] = {0.0f,
                            -0.0f,
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            bits_float(0x7fc01234u),
                            bits_float(0xff800001u),
                            bits_float(0x00000003u),
                            3.0e38f};
        float v = special ? sp[pick(8)] : (pick(2) ? small_float() : bits_float(uint32_t(bits)));
        std::memcpy(p, &v, 4);
        break;
      }
      case DType::kF64: {
        double v = special ? double(bits_float(uint32_t(bits))) : double(small_float()) / 3.0;
        if (pick(4) == 0) std::memcpy(&v, &bits, 8);
        std::memcpy(p, &v, 8);
        break;
      }
      case DType::kF16:
      case DType::kBF16: {
        uint16_t h = uint16_t(bits);
        if (!special)
          h = t == DType::kF16 ? float_to_half(small_float() * float(1 << pick(14)))
                               : float_to_bf16(small_float());
        std::memcpy(p, &h, 2);
        break;
      }
      default: {  // integers: small values of either sign, and any bits
        uint64_t v = special ? bits : uint64_t(int64_t(pick(33) - 16));
        std::memcpy(p, &v, dtype_size(t));
        break;
      }
    }
  }
  return buf;
}

inline bool is_nan_elem(DType t, const uint8_t* p) {
  switch (t) {
    case DType::kF32: {
      float f;
      std::memcpy(&f, p, 4);
      return f != f;
    }
    case DType::kF64: {
      double d;
      std::memcpy(&d, p, 8);
      return d != d;
    }
    case DType::kF16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return (h & 0x7fff) > 0x7c00;
    }
    case DType::kBF16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return (h & 0x7fff) > 0x7f80;
    }
    default:
      return false;
  }
}

// Index of the first element that differs (two NaNs count as equal), or -1.
inline long first_mismatch(DType t, const uint8_t* x, const uint8_t* y, size_t count) {
  size_t sz = dtype_size(t);
  for (size_t i = 0; i < count; i++) {
    const uint8_t* p = x + i * sz;
    const uint8_t* q = y + i * sz;
    if (std::memcmp(p, q, sz) == 0) continue;
    if (is_nan_elem(t, p) && is_nan_elem(t, q)) continue;
    return long(i);
  }
  return -1;
}

}  // namespace chorus::kernels::test
