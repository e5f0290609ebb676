// Shared by the reduction kernel tests (test_reduce.cc, test_reduce_fold.cc): the builds this CPU
// runs; the values and the comparison are in reduce_values.h.
#pragma once

#include <catch2/catch.hpp>

#include <vector>

#include "kernels/cpu/isa.h"
#include "reduce_values.h"

namespace chorus::kernels::test {

// The builds this CPU runs, lowest first; each test runs in all of them.
inline std::vector<Isa> isas() {
  std::vector<Isa> v;
  for (int i = 0; i < kNumIsas; i++)
    if (cpu_supports(Isa(i))) v.push_back(Isa(i));
  return v;
}

inline void use(Isa isa) {
  chorus::Status s = set_isa(isa);
  INFO(s.message());
  REQUIRE(s.is_ok());
}

}  // namespace chorus::kernels::test
