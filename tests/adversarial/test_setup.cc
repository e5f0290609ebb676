// Resources and news while communicators are being set up: a rank that fails tells the others
// at once, a rank killed mid-set-up leaves no /dev/shm segment behind, and its peers say who died.
#include <catch2/catch.hpp>

#include <dirent.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <vector>

#include "chorus/chorus.hpp"
#include "harness.h"
#include "probes.h"

using namespace chorus::test;

namespace {

// Names in /dev/shm that start with `prefix`.
std::vector<std::string> shm_names(const std::string& prefix) {
  std::vector<std::string> out;
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* e = readdir(d))
      if (std::string(e->d_name).rfind(prefix, 0) == 0) out.push_back(e->d_name);
    closedir(d);
  }
  return out;
}

// Runs `call`, expects a chorus::Error whose message holds every part, within `seconds`.
template <typename F>
int expect_error(F call, const std::vector<std::string>& parts, double seconds) {
  double t0 = now_s();
  try {
    call();
  } catch (const chorus::Error& e) {
    double took = now_s() - t0;
    std::fprintf(stderr, "caught after %.2f s: %s\n", took, e.what());
    for (auto& p : parts)
      if (!contains(e.what(), p)) return 3;
    return took <= seconds ? 0 : 4;
  }
  return 5;
}

}  // namespace

TEST_CASE("a rank that fails while the communicator is created tells the others at once",
          "[adversarial][setup]") {
  RunOptions o;
  o.env = {{"CHORUS_TIMEOUT", "30"}};
  o.limit_seconds = 45;
  // Nobody ends before all have their error: rank 0's end takes the store with it, and a rank
  // still connecting then reads only that the store closed (seen once under ASan beside a busy
  // loop: rank 2, 0.19 s in).
  RankBarrier outside(3);
  auto res = run_ranks(
      3,
      [&](int rank) {
        if (rank == 1) setenv("CHORUS_NSOCKS", "banana", 1);
        // Before: ranks 0 and 2 waited out CHORUS_TIMEOUT (30 s), then said a key was not set.
        const int rc = rank == 1 ? expect_error([] { chorus::Communicator::from_env(); },
                                                {"CHORUS_NSOCKS='banana'"}, 5)
                                 : expect_error([] { chorus::Communicator::from_env(); },
                                                {"rank 1 failed while creating the communicator",
                                                 "CHORUS_NSOCKS='banana'"},
                                                5);
        return outside.arrive_and_wait() ? rc : 6;
      },
      o);
  for (size_t r = 0; r < res.size(); ++r) {
    INFO("rank " << r << " output:\n" << res[r].output);
    REQUIRE(res[r].exit_code == 0);
    REQUIRE_FALSE(sanitizer_report(res[r].output));
  }
}

TEST_CASE(
    "a rank killed while its links are set up leaves no shm segment, also while it is a zombie "
    "not yet reaped, and is named",
    "[adversarial][setup]") {
  RunOptions o;
  // Rank 2 kills itself the moment its segment exists, before it publishes the name (a thread
  // watching /dev/shm for it lost the race under load: the job was set up before it looked).
  o.env = {{"CHORUS_TIMEOUT", "30"}, {"CHORUS_TRANSPORT", "shm"}, {"CHORUS_TEST_SHM_DIE", "2"}};
  o.limit_seconds = 45;
  // Dead rank 2 stays a zombie until the survivors end, as under a launcher slow to reap it:
  // kill(pid, 0) still finds it (the survivors' clean-up took that for life, 1 TSan run in 30).
  o.reap_last = true;
  auto res = run_ranks(
      3,
      [](int rank) {
        std::printf("rank pid %d\n", getpid());
        std::fflush(stdout);
        if (rank == 2) {
          chorus::Communicator::from_env();
          return 9;  // not reached
        }
        return expect_error([] { chorus::Communicator::from_env(); }, {"rank 2", "died"}, 5);
      },
      o);
  for (size_t r = 0; r < 2; ++r) {
    INFO("rank " << r << " output:\n" << res[r].output);
    REQUIRE(res[r].exit_code == 0);
    REQUIRE_FALSE(sanitizer_report(res[r].output));
  }
  REQUIRE(res[2].exit_code == -SIGKILL);
  usleep(200000);
  // No segment of this job is left: not the dead rank's, not the survivors'.
  std::vector<std::string> ours;
  for (auto& r : res) {
    auto at = r.output.find("rank pid ");
    REQUIRE(at != std::string::npos);
    std::string pid = std::to_string(std::atoi(r.output.c_str() + at + 9));
    for (auto& n : shm_names("chorus-" + pid + "-")) ours.push_back(n);
  }
  INFO("left in /dev/shm: " << (ours.empty() ? std::string("nothing") : ours[0]));
  REQUIRE(ours.empty());
}
