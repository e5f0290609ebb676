// The engine's test hooks reach the points they are meant to stir (collectives/engine.cc).
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstdio>

#include "chorus/chorus.hpp"
#include "collectives/c_api_internal.h"
#include "collectives/comm.h"
#include "harness.h"

using chorus::test::run_ranks;
using chorus::test::RunOptions;

// An 8-byte all-reduce of two ranks over direct slots is an eager exchange: a slot to write, the
// peer's message to read, then no link busy. Each of the three is a wait that CHORUS_TEST_JITTER_US
// may delay, also where a first look finds it over (a free slot, the message already in), which
// the eager path otherwise skips without setting up a wait.
TEST_CASE("CHORUS_TEST_JITTER_US draws at every wait of an 8-byte all-reduce", "[jitter]") {
  constexpr int kCalls = 200;
  for (const char* transport : {"shm", "tcp"}) {
    RunOptions o;
    o.env["CHORUS_TRANSPORT"] = transport;
    o.env["CHORUS_TEST_JITTER_US"] = "1";
    auto res = run_ranks(
        2,
        [](int rank) {
          auto comm = chorus::Communicator::from_env();
          chorusComm_t h = comm.handle();
          chorus::Result<chorus::CommImpl*> impl = chorus::capi::live(h, "test");
          if (!impl.is_ok()) return 2;
          const uint64_t before = (*impl)->jitter_points_for_test();
          for (int i = 0; i < kCalls; ++i) {
            double x = rank + 1;
            chorus::check(chorusAllReduce(&x, &x, 1, chorusFloat64, chorusSum, h, nullptr));
            if (x != 3.0) return 3;
          }
          const uint64_t points = (*impl)->jitter_points_for_test() - before;
          std::printf("rank %d: %llu jitter points in %d calls\n", rank,
                      static_cast<unsigned long long>(points), kCalls);
          return points >= 3u * kCalls ? 0 : 4;
        },
        o);
    for (int r = 0; r < 2; ++r) {
      INFO(transport << ", rank " << r << ":\n" << res[r].output);
      CHECK(res[r].exit_code == 0);
    }
  }
}
