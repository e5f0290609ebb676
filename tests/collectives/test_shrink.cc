// chorusCommShrink (issue 17, item 2): survivors of a kill -9 continue on a smaller communicator,
// with the failed ranks listed by the caller or found and agreed on by the library, also when a
// rank dies during the agreement itself (test hook CHORUS_TEST_SHRINK_DIE); bad arguments are
// refused by name; with the store's process dead and its failover turned off, shrink fails at
// once, saying so, instead of hanging (with failover on: test_failover.cc).
#include <catch2/catch.hpp>

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "chorus/chorus.hpp"
#include "harness.h"
#include "survivors.h"

using chorus::test::check_all_reduce;
using chorus::test::contains;
using chorus::test::fails_soon;
using chorus::test::kill_or_see_death;
using chorus::test::require_exits;
using chorus::test::run_ranks;
using chorus::test::RunOptions;
using chorus::test::survivor_opts;

namespace {

std::string marker(const std::string& name) {
  return "/tmp/chorus-test-shrink-" + std::to_string(getppid()) + "-" + name;
}

}  // namespace

TEST_CASE("shrink excluding a killed rank: the survivors continue, renumbered", "[shrink]") {
  auto flags = GENERATE(CHORUS_SHRINK_DEFAULT, CHORUS_SHRINK_ABORT, CHORUS_SHRINK_AGREE);
  auto transport = GENERATE(std::string("shm"), std::string("tcp"));
  DYNAMIC_SECTION(transport << ", flags " << flags) {
    RunOptions o = survivor_opts();
    o.env["CHORUS_TRANSPORT"] = transport;
    auto res = run_ranks(
        4,
        [flags](int rank) {
          auto comm = chorus::Communicator::from_env();
          if (!kill_or_see_death(comm, 2)) return 2;
          // The library's own list may only add rank 2; with it, the caller lists nobody.
          std::vector<int> exclude;
          if (!(flags & CHORUS_SHRINK_AGREE)) exclude = {2};
          auto small = comm.shrink(exclude, flags);
          if (small.size() != 3 || small.rank() != (rank < 2 ? rank : rank - 1)) {
            std::fprintf(stderr, "rank %d became %d of %d\n", rank, small.rank(), small.size());
            return 3;
          }
          for (int i = 0; i < 5; ++i)
            if (check_all_reduce(small, "the three")) return 4;
          small.barrier();
          return 0;
        },
        o);
    require_exits(res, {{2, -SIGKILL}, {0, 0}, {1, 0}, {3, 0}});
  }
}

TEST_CASE("agreement: a rank that dies before giving its view is excluded by every survivor",
          "[shrink][agree]") {
  RunOptions o = survivor_opts();
  o.env["CHORUS_TEST_SHRINK_DIE"] = "1:view";
  auto res = run_ranks(
      4,
      [](int) {
        auto comm = chorus::Communicator::from_env();
        if (!kill_or_see_death(comm, 3)) return 2;
        auto small = comm.shrink({}, CHORUS_SHRINK_AGREE);  // rank 1 dies in here
        if (small.size() != 2) return 3;
        for (int i = 0; i < 3; ++i)
          if (check_all_reduce(small, "the two")) return 4;
        return 0;
      },
      o);
  require_exits(res, {{3, -SIGKILL}, {1, -SIGKILL}, {0, 0}, {2, 0}});
}

TEST_CASE("agreement: the leader dies before deciding; the next one decides for all",
          "[shrink][agree]") {
  // Rank 0 hosts the store: the others exclude it (it stays alive, outside the new
  // communicator, until they are done), so rank 1 leads -- and dies at the decision.
  RunOptions o = survivor_opts();
  o.env["CHORUS_TEST_SHRINK_DIE"] = "1:decide";
  std::remove(marker("done2").c_str());
  std::remove(marker("done3").c_str());
  auto res = run_ranks(
      4,
      [](int rank) {
        auto comm = chorus::Communicator::from_env();
        if (check_all_reduce(comm, "all four")) return 1;
        if (rank == 0) {  // keep the store up until both survivors are through
          for (int i = 0; i < 400; ++i) {
            if (std::ifstream(marker("done2")) && std::ifstream(marker("done3"))) return 0;
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
          }
          return 5;
        }
        auto small = comm.shrink({0}, CHORUS_SHRINK_AGREE);
        if (small.size() != 2 || small.rank() != rank - 2) return 3;
        if (check_all_reduce(small, "ranks 2 and 3")) return 4;
        std::ofstream(marker("done" + std::to_string(rank))) << "ok";
        return 0;
      },
      o);
  std::remove(marker("done2").c_str());
  std::remove(marker("done3").c_str());
  require_exits(res, {{1, -SIGKILL}, {0, 0}, {2, 0}, {3, 0}});
}

TEST_CASE("shrink refuses bad arguments by name", "[shrink]") {
  auto res = run_ranks(
      2,
      [](int rank) {
        auto comm = chorus::Communicator::from_env();
        chorusComm_t out = reinterpret_cast<chorusComm_t>(1);
        const int self[] = {rank}, twice[] = {1 - rank, 1 - rank}, far[] = {7};
        struct {
          const int* list;
          int n;
          int flags;
          const char* part;
        } cases[] = {
            {self, 1, 0, "is in its own exclude list"},
            {twice, 2, 0, "is excluded twice"},
            {far, 1, 0, "excluded rank 7 is not a rank of this communicator"},
            {nullptr, 1, 0, "1 excluded ranks at"},
            {nullptr, 0, 0x10, "flags 0x10"},
        };
        for (auto& c : cases) {
          chorusResult_t r = chorusCommShrink(comm.handle(), c.list, c.n, &out, nullptr, c.flags);
          const std::string msg = chorusGetLastError(comm.handle());
          if (r == chorusSuccess || !contains(msg, c.part) || !contains(msg, "chorusCommShrink")) {
            std::fprintf(stderr, "case '%s': result %d, message '%s'\n", c.part, r, msg.c_str());
            return 1;
          }
          if (out != nullptr) return 2;
        }
        return 0;
      },
      survivor_opts());
  require_exits(res, {{0, 0}, {1, 0}});
}

TEST_CASE("with the store's process killed and failover off, shrink fails at once, saying why",
          "[shrink]") {
  RunOptions o = survivor_opts();
  o.env["CHORUS_TIMEOUT"] = "6";
  o.env["CHORUS_STORE_FAILOVER"] = "0";  // (on, the survivors move to a new store: test_failover)
  auto res = run_ranks(
      3,
      [](int) {
        auto comm = chorus::Communicator::from_env();
        if (!kill_or_see_death(comm, 0)) return 2;
        auto t0 = std::chrono::steady_clock::now();
        try {
          auto small = comm.shrink({0}, CHORUS_SHRINK_AGREE);
          return 3;
        } catch (const chorus::Error& e) {
          double took =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          std::fprintf(stderr, "shrink failed after %.2f s: %s\n", took, e.what());
          // Named as gone, or (when the watch channel has not told yet) as closed.
          if (!contains(e.what(), "bootstrap store")) return 5;
          return took < 2 ? 0 : 4;
        }
      },
      o);
  require_exits(res, {{0, -SIGKILL}, {1, 0}, {2, 0}});
}
