// Store failover (issue 17 item 2: nothing may depend on the process that hosted the bootstrap
// store): the ranks start as under torchrun (rank 0 hosts the store), rank 0 is killed, and the
// survivors move to a new store hosted by one of them, then shrink and go on -- also when the
// next candidate died with rank 0, when the new host dies as it takes over (test hook
// CHORUS_TEST_FAILOVER_DIE), when the store dies inside a shrink's agreement, and for a second
// death after the failover (the new store's watch channel) and a grow through the new store.
#include <catch2/catch.hpp>

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "chorus/chorus.hpp"
#include "harness.h"
#include "survivors.h"

using chorus::test::check_all_reduce;
using chorus::test::check_grown;
using chorus::test::contains;
using chorus::test::grow_for_newcomers;
using chorus::test::join_as_newcomer;
using chorus::test::kill_or_see_death;
using chorus::test::require_exits;
using chorus::test::run_ranks;
using chorus::test::RunOptions;
using chorus::test::shared_path;
using chorus::test::survivor_opts;

namespace {

// After the kill: shrink (the library finds the dead), check the new numbering and size, run
// all-reduces. 0 when right.
int shrink_and_check(chorus::Communicator& comm, int want_size, int want_rank, const char* what) {
  auto small = comm.shrink({}, CHORUS_SHRINK_AGREE);
  if (small.size() != want_size || small.rank() != want_rank) {
    std::fprintf(stderr, "%s: rank %d became %d of %d, expected %d of %d\n", what, comm.rank(),
                 small.rank(), small.size(), want_rank, want_size);
    return 3;
  }
  for (int i = 0; i < 3; ++i)
    if (check_all_reduce(small, what)) return 4;
  small.barrier();
  return 0;
}

}  // namespace

TEST_CASE("the store's host (rank 0) killed: the survivors move to a new store and shrink",
          "[failover]") {
  auto transport = GENERATE(std::string("shm"), std::string("tcp"));
  DYNAMIC_SECTION(transport) {
    RunOptions o = survivor_opts();
    o.env["CHORUS_TRANSPORT"] = transport;
    auto res = run_ranks(
        4,
        [](int rank) {
          auto comm = chorus::Communicator::from_env();
          if (!kill_or_see_death(comm, 0)) return 2;
          auto small = comm.shrink({}, CHORUS_SHRINK_AGREE);
          if (small.size() != 3 || small.rank() != rank - 1) return 3;
          if (check_all_reduce(small, "the three")) return 4;
          // A second death is news from the new store (its watch channel): the last two shrink
          // again, on it.
          if (!kill_or_see_death(small, 2)) return 5;
          return shrink_and_check(small, 2, rank - 1, "the two");
        },
        o);
    require_exits(res, {{0, -SIGKILL}, {3, -SIGKILL}, {1, 0}, {2, 0}});
  }
}

TEST_CASE("ranks 0 and 1 killed together: rank 2 hosts the new store", "[failover]") {
  auto res = run_ranks(
      5,
      [](int rank) {
        auto comm = chorus::Communicator::from_env();
        if (!kill_or_see_death(comm, {0, 1})) return 2;
        return shrink_and_check(comm, 3, rank - 2, "the three");
      },
      survivor_opts());
  require_exits(res, {{0, -SIGKILL}, {1, -SIGKILL}, {2, 0}, {3, 0}, {4, 0}});
  CHECK(contains(res[3].output, "the store moved to rank 2"));
}

TEST_CASE("the new host dies as it takes over: the next rank hosts", "[failover]") {
  RunOptions o = survivor_opts();
  o.env["CHORUS_TEST_FAILOVER_DIE"] = "1";
  auto res = run_ranks(
      4,
      [](int rank) {
        auto comm = chorus::Communicator::from_env();
        if (!kill_or_see_death(comm, 0)) return 2;
        return shrink_and_check(comm, 2, rank - 2, "the two");
      },
      o);
  require_exits(res, {{0, -SIGKILL}, {1, -SIGKILL}, {2, 0}, {3, 0}});
  CHECK(contains(res[3].output, "the store moved to rank 2"));
}

TEST_CASE("the store's host dies inside a shrink's agreement: the shrink starts over",
          "[failover]") {
  // Rank 3 dies first; rank 0, the store's host, kills itself in the agreement that follows,
  // before giving its view (CHORUS_TEST_SHRINK_DIE): the survivors 1 and 2 move to a new store
  // and agree there.
  RunOptions o = survivor_opts();
  o.env["CHORUS_TEST_SHRINK_DIE"] = "0:view";
  auto res = run_ranks(
      4,
      [](int rank) {
        auto comm = chorus::Communicator::from_env();
        if (!kill_or_see_death(comm, 3)) return 2;
        return shrink_and_check(comm, 2, rank - 1, "the two");
      },
      o);
  require_exits(res, {{0, -SIGKILL}, {3, -SIGKILL}, {1, 0}, {2, 0}});
}

TEST_CASE("the takeover starts late: the shrink waits for it instead of failing", "[failover]") {
  // Each survivor's watch thread is held 1.5 s between the news of the store's death (which
  // fails its communicator at once) and the start of its takeover, as a loaded machine may:
  // the shrink called meanwhile finds the store gone, and must wait for the takeover.
  RunOptions o = survivor_opts();
  o.env["CHORUS_TEST_FAILOVER_LATE_MS"] = "1500";
  auto res = run_ranks(
      3,
      [](int rank) {
        auto comm = chorus::Communicator::from_env();
        if (!kill_or_see_death(comm, 0)) return 2;
        return shrink_and_check(comm, 2, rank - 1, "the two");
      },
      o);
  require_exits(res, {{0, -SIGKILL}, {1, 0}, {2, 0}});
}

TEST_CASE(
    "a shrink that finds no takeover running, then the store gone while the takeover waits for "
    "its new host, waits for it (CI's interleaving)",
    "[failover]") {
  // Rank 2's takeover starts 300 ms after the news and waits for rank 1, whose own starts after
  // 1500 ms (CHORUS_TEST_FAILOVER_LATE_MS, per rank). Rank 2's shrink, called at once, finds no
  // takeover running, then pauses 1 s (CHORUS_TEST_AWAIT_STORE_LAG_MS), by when the store reads
  // as gone and the takeover runs. It must look again and wait, not fail with "the bootstrap
  // store is gone" (CI's collectives_failover failure under ASan).
  auto res = run_ranks(
      3,
      [](int rank) {
        if (rank == 1) setenv("CHORUS_TEST_FAILOVER_LATE_MS", "1500", 1);
        if (rank == 2) {
          setenv("CHORUS_TEST_FAILOVER_LATE_MS", "300", 1);
          setenv("CHORUS_TEST_AWAIT_STORE_LAG_MS", "1000", 1);
        }
        auto comm = chorus::Communicator::from_env();
        if (!kill_or_see_death(comm, 0)) return 2;
        return shrink_and_check(comm, 2, rank - 1, "the two");
      },
      survivor_opts());
  require_exits(res, {{0, -SIGKILL}, {1, 0}, {2, 0}});
}

TEST_CASE("after the failover a newcomer joins through the new store (grow)", "[failover]") {
  // Processes 0-2 are the job; process 3 is a restarted worker, outside it at the start.
  RunOptions o = survivor_opts(3);
  std::remove(shared_path("failover-grow").c_str());
  auto res = run_ranks(
      4,
      [](int proc) {
        if (proc == 3) return join_as_newcomer("failover-grow", 3, 2);
        auto comm = chorus::Communicator::from_env();
        if (!kill_or_see_death(comm, 0)) return 2;
        auto small = comm.shrink({}, CHORUS_SHRINK_AGREE);
        auto big = grow_for_newcomers(small, 3, "failover-grow");  // its id names the new store
        return check_grown(big, 3, small.rank());
      },
      o);
  std::remove(shared_path("failover-grow").c_str());
  require_exits(res, {{0, -SIGKILL}, {1, 0}, {2, 0}, {3, 0}});
}
