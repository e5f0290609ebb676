// DistributedSampler: PyTorch's partition, padding, drop_last and shuffle semantics.
#include <catch2/catch.hpp>

#include <algorithm>
#include <set>
#include <vector>

#include "ddp/data/sampler.h"

using namespace chorus;
using V = std::vector<int64_t>;

TEST_CASE("partitions are disjoint and cover the data set", "[sampler]") {
  for (int64_t n : {12, 13, 100, 101}) {
    for (int w : {1, 2, 3, 4, 7}) {
      std::multiset<int64_t> all;
      for (int r = 0; r < w; ++r) {
        DistributedSampler s(n, w, r, true, 5);
        s.set_epoch(3);
        auto idx = s.indices();
        CHECK(static_cast<int64_t>(idx.size()) == (n + w - 1) / w);
        all.insert(idx.begin(), idx.end());
      }
      CHECK(static_cast<int64_t>(all.size()) == ((n + w - 1) / w) * w);
      for (int64_t i = 0; i < n; ++i) CHECK(all.count(i) >= 1);
      if (n % w == 0)
        for (int64_t i = 0; i < n; ++i) CHECK(all.count(i) == 1);  // disjoint when even
    }
  }
}

TEST_CASE("padding repeats the first indices, as PyTorch", "[sampler]") {
  // torch DistributedSampler(range(10), num_replicas=4, rank=r, shuffle=False):
  // [0,4,8] [1,5,9] [2,6,0] [3,7,1]
  CHECK(DistributedSampler(10, 4, 0, false).indices() == V{0, 4, 8});
  CHECK(DistributedSampler(10, 4, 1, false).indices() == V{1, 5, 9});
  CHECK(DistributedSampler(10, 4, 2, false).indices() == V{2, 6, 0});
  CHECK(DistributedSampler(10, 4, 3, false).indices() == V{3, 7, 1});
  // Padding longer than the data: cyclic (range(2), 5 replicas -> 0,1,0,1,0).
  CHECK(DistributedSampler(2, 5, 2, false).indices() == V{0});
  CHECK(DistributedSampler(2, 5, 3, false).indices() == V{1});
  CHECK(DistributedSampler(2, 5, 4, false).indices() == V{0});
  // drop_last: num_samples = ceil((10 - 4) / 4) = 2, the tail dropped.
  CHECK(DistributedSampler(10, 4, 2, false, 0, true).indices() == V{2, 6});
  CHECK(DistributedSampler(10, 4, 3, false, 0, true).num_samples() == 2);
  CHECK(DistributedSampler(12, 4, 3, false, 0, true).indices() == V{3, 7, 11});
}

TEST_CASE("shuffle is identical on all ranks for a (seed, epoch) and changes with the epoch",
          "[sampler]") {
  auto global = [](uint64_t seed, int64_t epoch) {
    V order(40);
    for (int r = 0; r < 4; ++r) {
      DistributedSampler s(40, 4, r, true, seed);
      s.set_epoch(epoch);
      auto idx = s.indices();
      for (size_t i = 0; i < idx.size(); ++i) order[i * 4 + static_cast<size_t>(r)] = idx[i];
    }
    return order;
  };
  const V e0 = global(7, 0);
  V sorted = e0;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 40; ++i)
    CHECK(sorted[static_cast<size_t>(i)] == i);  // the ranks agreed on one permutation
  CHECK(global(7, 0) == e0);
  CHECK(global(7, 1) != e0);
  CHECK(global(8, 0) != e0);
  V identity(40);
  for (int64_t i = 0; i < 40; ++i) identity[static_cast<size_t>(i)] = i;
  CHECK(e0 != identity);
}

TEST_CASE("bad arguments are refused with the values", "[sampler]") {
  CHECK_THROWS_WITH(DistributedSampler(10, 2, 2), Catch::Contains("invalid rank 2"));
  CHECK_THROWS_WITH(DistributedSampler(10, 0, 0), Catch::Contains("num_replicas >= 1, got 0"));
}

// Elastic training: R ranks train k steps of batch B (positions [0, kBR) of the epoch's list),
// then the survivors re-divide the rest from position kBR. Every sample of the epoch is then seen
// exactly once, twice (a second loss) as once; the padding of the last, smaller world is the only
// repeat, as in an uninterrupted run of that world.
TEST_CASE("restart_at: the survivors take the rest of the epoch, nothing lost or repeated",
          "[sampler][elastic]") {
  struct Phase {
    int world;
    int64_t steps;  // steps trained in this world before the next loss (-1: to the end)
  };
  for (int64_t n : {96, 100, 101}) {
    const int64_t b = 4;
    for (auto phases :
         {std::vector<Phase>{{3, 2}, {2, -1}}, std::vector<Phase>{{4, 1}, {3, 3}, {1, -1}},
          std::vector<Phase>{{3, 0}, {2, -1}}}) {
      std::multiset<int64_t> seen;
      int64_t start = 0;
      int64_t last_padding = 0;
      for (const Phase& ph : phases) {
        int64_t pos = start;
        std::multiset<int64_t> phase_seen;
        for (int r = 0; r < ph.world; ++r) {
          DistributedSampler s(n, phases[0].world, std::min(r, phases[0].world - 1), true, 9);
          s.set_epoch(2);
          if (start > 0 || ph.world != phases[0].world) s.restart_at(start, ph.world, r);
          auto idx = s.indices();
          const int64_t take = ph.steps < 0 ? static_cast<int64_t>(idx.size()) : ph.steps * b;
          REQUIRE(take <= static_cast<int64_t>(idx.size()));
          phase_seen.insert(idx.begin(), idx.begin() + take);
          if (r == 0) pos = s.position_after(ph.steps < 0 ? 0 : ph.steps, b);
          if (ph.steps < 0) last_padding = s.num_samples() * ph.world - (n - start);
        }
        seen.insert(phase_seen.begin(), phase_seen.end());
        start = pos;
      }
      INFO("n " << n << ", " << phases.size() << " phases");
      CHECK(static_cast<int64_t>(seen.size()) == n + last_padding);
      int64_t repeated = 0;
      for (int64_t i = 0; i < n; ++i) {
        REQUIRE(seen.count(i) >= 1);
        repeated += static_cast<int64_t>(seen.count(i)) - 1;
      }
      CHECK(repeated == last_padding);
    }
  }
}
