// Generator's conversions from raw 64-bit draws.
#include "ddp/tensor/random.h"

#include <cmath>
#include <numeric>
#include <utility>

namespace chorus {

float Generator::uniform(float lo, float hi) {
  const float u = static_cast<float>(next_u64() >> 40) * (1.0f / 16777216.0f);
  return lo + (hi - lo) * u;
}

float Generator::normal() {
  const double u1 = (static_cast<double>(next_u64() >> 11) + 1.0) * (1.0 / 9007199254740993.0);
  const double u2 = static_cast<double>(next_u64() >> 11) * (1.0 / 9007199254740992.0);
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}

uint64_t Generator::below(uint64_t n) {
  return static_cast<uint64_t>((static_cast<unsigned __int128>(next_u64()) * n) >> 64);
}

std::vector<int64_t> Generator::permutation(int64_t n) {
  std::vector<int64_t> p(static_cast<size_t>(n));
  std::iota(p.begin(), p.end(), 0);
  for (int64_t i = n - 1; i > 0; --i)
    std::swap(p[static_cast<size_t>(i)], p[below(static_cast<uint64_t>(i) + 1)]);
  return p;
}

}  // namespace chorus
