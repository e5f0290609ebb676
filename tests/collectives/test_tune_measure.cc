// The tuner's measurement of ring against direct for large all-reduces over shared memory
// (collectives/tune_measure.cc): made to come out one way and then the other by a test hook
// that slows one algorithm by 250 ms per call (CHORUS_TEST_SLOW_ALGO), on 2 and 3 ranks; the
// chosen algorithm runs the user's call (the tuner's INFO line) and the result is right; the
// measurement runs once per communicator, never below 4 MiB, never with CHORUS_TUNE_MEASURE=0.
#include <catch2/catch.hpp>

#include <cstdio>
#include <string>
#include <vector>

#include "chorus/chorus.h"
#include "harness.h"

using chorus::test::contains;
using chorus::test::run_ranks;
using chorus::test::RunOptions;

namespace {

size_t count_of(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

// Each rank: all-reduces of 256 KiB, 4 MiB and 16 MiB (float sum, in place), each checked. (The
// tuner prints each distinct algorithm and piece once: 256 KiB cuts other pieces than 4 MiB.)
int rank_main(int rank) {
  chorusComm_t comm = nullptr;
  if (chorusCommInitFromEnv(&comm) != chorusSuccess) {
    std::fprintf(stderr, "init: %s\n", chorusGetLastError(nullptr));
    return 2;
  }
  int n = 0;
  chorusCommCount(comm, &n);
  for (size_t bytes : {size_t{256} << 10, size_t{4} << 20, size_t{16} << 20}) {
    std::vector<float> buf(bytes / sizeof(float));
    for (size_t i = 0; i < buf.size(); ++i) buf[i] = float(rank + 1) + float(i % 7);
    if (chorusAllReduce(buf.data(), buf.data(), buf.size(), chorusFloat32, chorusSum, comm,
                        nullptr) != chorusSuccess) {
      std::fprintf(stderr, "all-reduce of %zu bytes: %s\n", bytes, chorusGetLastError(comm));
      return 3;
    }
    for (size_t i = 0; i < buf.size(); ++i) {
      const float want = float(n * (n + 1) / 2) + float(n) * float(i % 7);
      if (buf[i] != want) {
        std::fprintf(stderr, "%zu bytes: element %zu is %g, expected %g\n", bytes, i, buf[i], want);
        return 4;
      }
    }
  }
  chorusCommDestroy(comm);
  return 0;
}

std::vector<chorus::test::RankResult> run(int n, const std::string& slow, const char* measure) {
  RunOptions o;
  o.limit_seconds = 120;
  o.env["CHORUS_TRANSPORT"] = "shm";
  o.env["CHORUS_DEBUG"] = "INFO";
  o.env["CHORUS_TEST_SLOW_ALGO"] = slow;
  if (measure) o.env["CHORUS_TUNE_MEASURE"] = measure;
  return run_ranks(n, rank_main, o);
}

}  // namespace

TEST_CASE("the tuner measures ring against direct once and runs the faster", "[tuner]") {
  for (int n : {2, 3}) {
    for (std::string slow : {"direct", "ring"}) {
      const std::string fast = slow == "ring" ? "direct" : "ring";
      INFO(n << " ranks, " << slow << " slowed");
      auto res = run(n, slow, nullptr);
      for (int r = 0; r < n; ++r) {
        INFO("rank " << r << " output:\n" << res[r].output);
        REQUIRE(res[r].exit_code == 0);
        const std::string& out = res[r].output;
        // Measured once (at the 4 MiB call, not at 256 KiB nor again at 16 MiB), on every rank.
        CHECK(count_of(out, "the slowest rank's best of 3") == 1);
        CHECK(contains(out, ": " + fast + " from 4194304 bytes"));
        // ... and the user's calls ran the faster one.
        CHECK(contains(out, "all_reduce of 4194304 bytes on " + std::to_string(n) +
                                " ranks (shm): algorithm " + fast));
        CHECK_FALSE(contains(out, "all_reduce of 16777216 bytes on " + std::to_string(n) +
                                      " ranks (shm): algorithm " + slow));
      }
    }
  }
}

TEST_CASE("CHORUS_TUNE_MEASURE=0: no measurement, direct for large all-reduces over shm",
          "[tuner]") {
  auto res = run(2, "ring", "0");
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r << " output:\n" << res[r].output);
    REQUIRE(res[r].exit_code == 0);
    CHECK_FALSE(contains(res[r].output, "the slowest rank's best"));
    CHECK(
        contains(res[r].output, "all_reduce of 4194304 bytes on 2 ranks (shm): algorithm direct"));
  }
}
