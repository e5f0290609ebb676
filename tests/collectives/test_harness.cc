// The multi-rank harness itself: a rank that never ends is killed at the limit and reported as a
// hang, and the others' results are kept.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <chrono>
#include <csignal>

#include "harness.h"

using chorus::test::contains;
using chorus::test::run_ranks;
using chorus::test::RunOptions;

TEST_CASE("a hung rank is killed at the time limit and reported as a hang", "[harness]") {
  RunOptions opt;
  opt.limit_seconds = 1;
  const auto t0 = std::chrono::steady_clock::now();
  auto res = run_ranks(
      2,
      [](int rank) {
        if (rank == 1) {
          std::printf("rank 1 stuck\n");
          std::fflush(stdout);
          for (;;) pause();  // blocks until a signal: only SIGKILL ends it
        }
        return 3;
      },
      opt);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  REQUIRE(res.size() == 2);
  CHECK(res[0].exit_code == 3);
  CHECK(res[1].exit_code == -SIGKILL);
  CHECK(contains(res[1].output, "rank 1 stuck"));
  CHECK(contains(res[1].output, "killed after the time limit of 1 s: a hang"));
  CHECK(took < 10);
}
