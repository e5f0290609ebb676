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
