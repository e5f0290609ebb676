// Which ranks share a host (collectives/hosts.h), and what the tuner picks for all-reduce: the
// hierarchical algorithm across hosts, direct over shared memory (tuner.cc), on their own; and
// the lock-free cache of its last answer (TuneCache).
#include <atomic>
#include <chrono>
#include <thread>

#include <catch2/catch.hpp>

#include "collectives/hosts.h"
#include "collectives/tuner.h"

using namespace chorus;

TEST_CASE("host layout: hosts in order of their lowest rank, the ring host by host", "[hosts]") {
  const HostLayout l = HostLayout::from_hosts({"b", "a", "b", "c", "a", "b"});
  CHECK(l.nhosts() == 3);
  CHECK(l.max_local() == 3);
  CHECK(l.host_of == std::vector<int>{0, 1, 0, 2, 1, 0});
  CHECK(l.members == std::vector<std::vector<int>>{{0, 2, 5}, {1, 4}, {3}});
  CHECK(l.leaders == std::vector<int>{0, 1, 3});
  CHECK(l.ring == std::vector<int>{0, 2, 5, 1, 4, 3});
  for (int p = 0; p < 6; ++p) CHECK(l.ring_pos[l.ring[p]] == p);

  const HostLayout one = HostLayout::from_hosts({"h", "h"});
  CHECK(one.nhosts() == 1);
  CHECK(one.ring == std::vector<int>{0, 1});
  CHECK(one.leaders == std::vector<int>{0});
}

TEST_CASE("tuner: the hierarchical all-reduce where links between hosts are the bottleneck",
          "[hosts][tuner]") {
  const transport::LinkModel tcp{"tcp", 12e-6, 2.5e9, 256 << 10, 0};
  const transport::LinkModel shm{"shm", 1e-6, 6e9, 64 << 10, 2 << 20, true};
  TuneInput in{OpKind::kAllReduce, 16 << 20, 4, tcp, 1, 2, 2, shm};
  TunerConfig cfg;
  // A 1 Gbit/s network (CHORUS_BETA_GBPS=0.125): 2 hosts of 2 ranks move 1 buffer across
  // instead of the ring's 1.5.
  cfg.beta_gbps = 0.125;
  CHECK(tune(in, cfg).algo == Algo::kHier);
  // One rank per host, or one host: nothing to gain.
  TuneInput flat = in;
  flat.max_local = 1;
  flat.nhosts = 4;
  CHECK(tune(flat, cfg).algo != Algo::kHier);
  flat = in;
  flat.nhosts = 1;
  flat.max_local = 4;
  CHECK(tune(flat, cfg).algo != Algo::kHier);
  // Small messages: latency decides, the ring's or recursive doubling's.
  TuneInput small = in;
  small.bytes = 64;
  CHECK(tune(small, cfg).algo != Algo::kHier);
  // Forced.
  TunerConfig forced;
  forced.forced_algo = Algo::kHier;
  CHECK(tune(small, forced).algo == Algo::kHier);
}

TEST_CASE("tuner: direct by default for large all-reduces over shared memory", "[tuner]") {
  const transport::LinkModel tcp{"tcp", 12e-6, 2.5e9, 256 << 10, 0};
  const transport::LinkModel shm{"shm", 1e-6, 6e9, 64 << 10, 2 << 20, true};
  const TunerConfig cfg;
  for (int n : {2, 3, 4}) {
    INFO(n << " ranks");
    CHECK(tune({OpKind::kAllReduce, 16 << 20, n, shm, 1}, cfg).algo == Algo::kDirect);
    CHECK(tune({OpKind::kAllReduce, 2 << 20, n, shm, 1}, cfg).algo != Algo::kDirect);
    CHECK(tune({OpKind::kAllReduce, 16 << 20, n, tcp, 1}, cfg).algo != Algo::kDirect);
  }
  // Two ranks exchange whole buffers up to the link's crossover (2 MiB here); direct from 4 MiB.
  CHECK(tune({OpKind::kAllReduce, 2 << 20, 2, shm, 1}, cfg).algo == Algo::kRecursiveDoubling);
  CHECK(tune({OpKind::kAllReduce, 4 << 20, 2, shm, 1}, cfg).algo == Algo::kDirect);
  // A forced algorithm still wins.
  TunerConfig ring;
  ring.forced_algo = Algo::kRing;
  CHECK(tune({OpKind::kAllReduce, 16 << 20, 3, shm, 1}, ring).algo == Algo::kRing);
}

TEST_CASE("tuner: the measured choice of ring or direct for large all-reduces over shm",
          "[tuner]") {
  const transport::LinkModel tcp{"tcp", 12e-6, 2.5e9, 256 << 10, 0};
  const transport::LinkModel shm{"shm", 1e-6, 6e9, 64 << 10, 2 << 20, true};
  const TunerConfig cfg;
  for (int n : {2, 3, 4}) {
    INFO(n << " ranks");
    TuneInput in{OpKind::kAllReduce, 16 << 20, n, shm, 1, 1, n, shm, Algo::kRing};
    CHECK(takes_large_in_place(in, cfg));
    CHECK(tune(in, cfg).algo == Algo::kRing);
    in.large_in_place = Algo::kDirect;
    CHECK(tune(in, cfg).algo == Algo::kDirect);
    in.large_in_place = Algo::kNone;  // not measured (yet): direct
    CHECK(tune(in, cfg).algo == Algo::kDirect);
  }
  // Where other rules decide, nothing is measured.
  const TuneInput base{OpKind::kAllReduce, 16 << 20, 3, shm, 1, 1, 3, shm};
  TuneInput x = base;
  x.bytes = (4 << 20) - 4;
  CHECK_FALSE(takes_large_in_place(x, cfg));  // below 4 MiB
  x = base;
  x.nranks = 2;
  x.bytes = 2 << 20;
  CHECK_FALSE(takes_large_in_place(x, cfg));  // two ranks exchange whole buffers
  x = base;
  x.link = tcp;
  CHECK_FALSE(takes_large_in_place(x, cfg));  // staged links: the model decides
  x = base;
  x.nhosts = 2;
  CHECK_FALSE(takes_large_in_place(x, cfg));  // several hosts: hierarchical or ring
  x = base;
  x.kind = OpKind::kReduce;
  CHECK_FALSE(takes_large_in_place(x, cfg));
  TunerConfig det;
  det.deterministic = true;
  CHECK_FALSE(takes_large_in_place(base, det));  // the ordered algorithms only
  TunerConfig forced;
  forced.forced_algo = Algo::kRing;
  CHECK_FALSE(takes_large_in_place(base, forced));
  // The deterministic mode ignores a measured ring: its bits must not depend on it.
  TuneInput measured = base;
  measured.large_in_place = Algo::kRing;
  CHECK(tune(measured, det).algo != Algo::kRing);
}

TEST_CASE("tuner cache: hits only its own kind and size, and clears", "[tuner]") {
  TuneCache c;
  CHECK_FALSE(c.lookup(OpKind::kAllReduce, 0));  // empty: even a size of 0 misses
  REQUIRE(c.store(OpKind::kAllReduce, 1024, {Algo::kTree, 4096, 2}));
  std::optional<Tuned> t = c.lookup(OpKind::kAllReduce, 1024);
  REQUIRE(t);
  CHECK(t->algo == Algo::kTree);
  CHECK(t->piece == 4096);
  CHECK(t->nchannels == 2);
  CHECK_FALSE(c.lookup(OpKind::kAllReduce, 1025));
  CHECK_FALSE(c.lookup(OpKind::kBroadcast, 1024));
  REQUIRE(c.store(OpKind::kBroadcast, size_t{1} << 40, {Algo::kRing, 0xffffffffu, 255}));
  t = c.lookup(OpKind::kBroadcast, size_t{1} << 40);
  REQUIRE(t);
  CHECK(t->piece == 0xffffffffu);
  CHECK(t->nchannels == 255);
  CHECK_FALSE(c.lookup(OpKind::kAllReduce, 1024));  // one entry: the last store
  c.clear();
  CHECK_FALSE(c.lookup(OpKind::kBroadcast, size_t{1} << 40));
  // An answer that does not pack is not stored, and leaves nothing stale behind.
  REQUIRE(c.store(OpKind::kAllReduce, 8, {Algo::kRing, 1, 1}));
  CHECK_FALSE(c.store(OpKind::kAllReduce, 16, {Algo::kRing, 1, 256}));
  CHECK_FALSE(c.lookup(OpKind::kAllReduce, 16));
  CHECK_FALSE(c.lookup(OpKind::kAllReduce, 8));
}

// A reader racing a writer gets either the answer stored for its key or nothing -- never one
// entry's size with another's answer. Each entry's piece is its size, so a torn read shows; the
// test hook holds every write half done for 20 us, so readers meet half-done writes for sure.
TEST_CASE("tuner cache: a reader never sees half of a write", "[tuner]") {
  TuneCache c;
  TuneCache::test_mid_write = [] { std::this_thread::sleep_for(std::chrono::microseconds(20)); };
  std::atomic<bool> stop{false};
  std::atomic<long> writes{0};
  std::thread writer([&] {
    for (uint32_t i = 0; !stop.load(std::memory_order_relaxed); ++i) {
      const uint32_t size = 1000 + i % 2;
      (void)c.store(OpKind::kAllReduce, size, {Algo::kRing, size, 1});
      writes.fetch_add(1, std::memory_order_relaxed);
    }
  });
  long hits = 0, misses = 0, torn = 0;
  for (int i = 0; i < 200000 || hits == 0 || writes.load() < 100; ++i) {
    const size_t size = 1000 + i % 2;
    if (std::optional<Tuned> t = c.lookup(OpKind::kAllReduce, size)) {
      ++hits;
      if (t->piece != size) ++torn;
    } else {
      ++misses;
    }
  }
  stop = true;
  writer.join();
  TuneCache::test_mid_write = nullptr;
  INFO("hits " << hits << ", misses " << misses << ", writes " << writes.load());
  CHECK(torn == 0);
  CHECK(hits > 0);
}
