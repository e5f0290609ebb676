// Teardown races: chorusCommAbort from a watchdog thread and chorusCommDestroy while other
// threads are inside blocking collectives, abort racing destroy on one handle, a peer dying
// while its survivors tear down, many threads asking the tuner at once. Every case must end
// within CHORUS_TIMEOUT, without a crash, and stay clean under TSan and ASan.
// CHORUS_TEST_ITERATIONS scales the loops (default 200).
#include <catch2/catch.hpp>

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <random>
#include <thread>
#include <vector>

#include "chorus/chorus.h"
#include "harness.h"
#include "probes.h"

using namespace chorus::test;

namespace {

int iterations(int fallback) {
  const char* v = std::getenv("CHORUS_TEST_ITERATIONS");
  return v ? std::max(1, std::atoi(v)) : fallback;
}

// Blocking all-reduces until one fails (the communicator was aborted or destroyed).
void reduce_until_error(chorusComm_t comm, size_t count, std::atomic<bool>& done) {
  std::vector<float> buf(count, 1.0f);
  while (chorusAllReduce(buf.data(), buf.data(), count, chorusFloat32, chorusSum, comm, nullptr) ==
         chorusSuccess) {
  }
  done = true;
}

// Threads of the process before chorus starts any (a sanitizer runtime has its own).
const int kBaseThreads = [] {
  std::thread([] {}).join();
  usleep(20000);
  return live_threads();
}();

// Once every communicator and store of the earlier cases is gone, the process is down to its
// main thread again (and may fork: TSan refuses to fork a multi-threaded process).
bool single_threaded_within(double seconds) {
  double end = now_s() + seconds;
  while (live_threads() > kBaseThreads && now_s() < end) usleep(10000);
  if (live_threads() <= kBaseThreads) return true;
  std::fprintf(stderr, "threads left: %d\n", live_threads());
  (void)!std::system(("grep . /proc/" + std::to_string(getpid()) + "/task/*/comm /proc/" +
                      std::to_string(getpid()) + "/task/*/stat | cut -c1-200 >&2")
                         .c_str());
  return false;
}

bool wait_flag(const std::atomic<bool>& f, double seconds) {
  double end = now_s() + seconds;
  while (!f.load() && now_s() < end) usleep(200);
  return f.load();
}

}  // namespace

TEST_CASE("abort from a watchdog and destroy while threads are inside all-reduce never hang",
          "[adversarial][teardown]") {
  setenv("CHORUS_TIMEOUT", "5", 1);
  std::mt19937 rng(12345);
  const int n = iterations(200);
  double worst = 0;
  for (int it = 0; it < n; ++it) {
    chorusComm_t comms[2];
    REQUIRE(chorusCommInitAll(comms, 2, nullptr) == chorusSuccess);
    const size_t counts[] = {1, 1000, 65536};
    const size_t count = counts[it % 3];
    const int victim = it % 2;
    const bool both = it % 5 == 0;
    const int delay_us = static_cast<int>(rng() % 3000);
    std::atomic<bool> done[2] = {false, false};
    std::vector<std::thread> workers, watchdogs;
    chorusResult_t destroyed[2] = {chorusInternalError, chorusInternalError};
    double t0 = now_s();
    for (int r = 0; r < 2; ++r)
      workers.emplace_back(reduce_until_error, comms[r], count, std::ref(done[r]));
    for (int r = 0; r < 2; ++r)
      watchdogs.emplace_back([&, r] {
        if (r == victim || both) {
          usleep(delay_us);
          (void)chorusCommAbort(comms[r]);
        } else {
          wait_flag(done[r], 10);  // the peer's abort reaches this rank's operation
        }
        destroyed[r] = chorusCommDestroy(comms[r]);
      });
    for (auto& t : watchdogs) t.join();
    for (auto& t : workers) t.join();
    double took = now_s() - t0;
    worst = std::max(worst, took);
    INFO("iteration " << it << ": victim " << victim << ", count " << count << ", took " << took
                      << " s");
    REQUIRE(destroyed[0] == chorusSuccess);
    REQUIRE(destroyed[1] == chorusSuccess);
    REQUIRE(took < 5.0);
    // Calls after destroy are errors, not crashes.
    int rank = -1;
    REQUIRE(chorusCommUserRank(comms[0], &rank) == chorusInvalidUsage);
  }
  std::fprintf(stderr, "%d abort/destroy rounds, slowest %.3f s\n", n, worst);
}

TEST_CASE("abort and destroy racing on one handle", "[adversarial][teardown]") {
  setenv("CHORUS_TIMEOUT", "5", 1);
  const int n = iterations(200);
  for (int it = 0; it < n; ++it) {
    chorusComm_t comm;
    REQUIRE(chorusCommInitAll(&comm, 1, nullptr) == chorusSuccess);
    std::atomic<int> go{0};
    chorusResult_t a = chorusSuccess, d = chorusSuccess;
    std::thread ta([&] {
      ++go;
      while (go.load() < 2) {
      }
      a = chorusCommAbort(comm);
    });
    std::thread td([&] {
      ++go;
      while (go.load() < 2) {
      }
      d = chorusCommDestroy(comm);
    });
    ta.join();
    td.join();
    INFO("iteration " << it << ": abort " << a << ", destroy " << d);
    REQUIRE(d == chorusSuccess);
    REQUIRE((a == chorusSuccess || a == chorusInvalidUsage));  // too late: already destroyed
  }
}

TEST_CASE("many threads calling collectives of different sizes on one communicator",
          "[adversarial][teardown][tuner]") {
  chorusComm_t comm;
  REQUIRE(chorusCommInitAll(&comm, 1, nullptr) == chorusSuccess);
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      std::vector<float> in(100 + 700 * t, 2.0f), out(in.size());
      for (int i = 0; i < iterations(200) * 10; ++i) {
        size_t count = in.size() - (i % 7);
        if (chorusAllReduce(in.data(), out.data(), count, chorusFloat32, chorusSum, comm,
                            nullptr) != chorusSuccess ||
            out[count - 1] != 2.0f)
          ++wrong;
      }
    });
  for (auto& t : threads) t.join();
  REQUIRE(wrong.load() == 0);
  REQUIRE(chorusCommDestroy(comm) == chorusSuccess);
}

TEST_CASE(
    "processes: a watchdog aborts a sub-communicator in use, everyone destroys it, again and again",
    "[adversarial][teardown]") {
  RunOptions o;
  o.env = {{"CHORUS_TIMEOUT", "5"}};
  o.limit_seconds = 100;
  const int rounds = std::max(10, iterations(200) / 4);
  REQUIRE(single_threaded_within(3));
  auto res = run_ranks(
      2,
      [rounds](int rank) {
        chorusComm_t world;
        if (chorusCommInitFromEnv(&world) != chorusSuccess) return 10;
        std::mt19937 rng(777 + rank);
        for (int i = 0; i < rounds; ++i) {
          chorusComm_t sub;
          if (chorusCommSplit(world, 0, rank, &sub) != chorusSuccess) return 11;
          std::atomic<bool> done{false};
          std::thread worker(reduce_until_error, sub, size_t{1} << (i % 16), std::ref(done));
          double t0 = now_s();
          if (i % 2 == rank) {
            usleep(rng() % 3000);
            (void)chorusCommAbort(sub);
          } else if (!wait_flag(done, 6)) {
            return 12;  // the peer's abort never arrived
          }
          if (chorusCommDestroy(sub) != chorusSuccess) return 13;
          worker.join();
          if (now_s() - t0 > 5) return 14;
        }
        if (chorusBarrier(world, nullptr) != chorusSuccess) return 15;  // the world is unharmed
        return chorusCommDestroy(world) == chorusSuccess ? 0 : 16;
      },
      o);
  for (size_t r = 0; r < res.size(); ++r) {
    INFO("rank " << r << " output:\n" << res[r].output);
    REQUIRE(res[r].exit_code == 0);
    REQUIRE_FALSE(sanitizer_report(res[r].output));
  }
}

TEST_CASE("a peer dies while its survivors are destroying", "[adversarial][teardown]") {
  RunOptions o;
  o.env = {{"CHORUS_TIMEOUT", "5"}};
  o.limit_seconds = 30;
  REQUIRE(single_threaded_within(3));
  for (int round = 0; round < 6; ++round) {
    auto res = run_ranks(
        3,
        [round](int rank) {
          chorusComm_t comm;
          if (chorusCommInitFromEnv(&comm) != chorusSuccess) return 10;
          if (chorusBarrier(comm, nullptr) != chorusSuccess) return 11;
          std::atomic<bool> done{false};
          std::thread worker(reduce_until_error, comm, size_t{4096}, std::ref(done));
          usleep(1000 * (round % 3));
          if (rank == 2) kill(getpid(), SIGKILL);  // news of this death races the others' destroy
          double t0 = now_s();
          chorusResult_t rc = chorusCommDestroy(comm);
          worker.join();
          if (now_s() - t0 > 6) return 12;
          return rc == chorusSuccess ? 0 : 13;
        },
        o);
    for (int r = 0; r < 2; ++r) {
      INFO("round " << round << ", rank " << r << " output:\n" << res[r].output);
      REQUIRE(res[r].exit_code == 0);
      REQUIRE_FALSE(sanitizer_report(res[r].output));
    }
    REQUIRE(res[2].exit_code == -SIGKILL);
  }
}
