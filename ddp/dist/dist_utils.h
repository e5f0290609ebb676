// Small helpers for multi-rank programs, over chorus's public C++ API: print from the primary
// rank only, a rank-0-first guard, and metric reductions across ranks.
#pragma once

#include <chorus/chorus.hpp>

#include <fmt/format.h>

#include <cstdio>
#include <functional>
#include <vector>

namespace chorus {

// Prints (and flushes) on rank 0 only; a null comm means a single process.
template <typename... Args>
void print_primary(Communicator* comm, fmt::format_string<Args...> f, Args&&... args) {
  if (comm && comm->rank() != 0) return;
  fmt::print(f, std::forward<Args>(args)...);
  std::fflush(stdout);
}

// Rank 0 runs fn while the others wait at a barrier; then the others run it (e.g. rank 0
// downloads or prepares a data set once, the rest then read the prepared copy). Collective.
void rank_zero_first(Communicator& comm, const std::function<void()>& fn);

// Collective: the mean of value over all ranks (every rank gets it).
double reduce_mean(Communicator& comm, double value);
// Collective: element-wise sums of values over all ranks, in place.
void reduce_sum(Communicator& comm, std::vector<double>& values);

}  // namespace chorus
