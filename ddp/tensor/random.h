// Generator: the seeded random source for initialisation, shuffling and synthetic data.
// Same seed -> same sequence on every machine (mt19937_64 plus our own float conversions; no
// std:: distributions, whose output differs between standard libraries).
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace chorus {

class Generator {
 public:
  explicit Generator(uint64_t seed = 0) : engine_(seed) {}
  uint64_t next_u64() { return engine_(); }
  float uniform(float lo, float hi);            // [lo, hi), 24 random bits
  float normal();                               // N(0, 1), Box-Muller
  uint64_t below(uint64_t n);                   // [0, n), multiply-shift
  std::vector<int64_t> permutation(int64_t n);  // Fisher-Yates

 private:
  std::mt19937_64 engine_;
};

}  // namespace chorus
