// chorusCommGrow (issue 17, item 2): new processes join a running communicator -- more ranks, or
// a restarted rank after a kill -9 and a shrink -- and all continue with members keeping their
// ranks; bad ids and arguments are refused by name, an id serves one grow, and a coordinator
// that dies before the grow ends the members' waits naming it.
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
using chorus::test::check_grown;
using chorus::test::contains;
using chorus::test::grow_for_newcomers;
using chorus::test::join_as_newcomer;
using chorus::test::put_id;
using chorus::test::require_exits;
using chorus::test::run_ranks;
using chorus::test::RunOptions;
using chorus::test::shared_path;
using chorus::test::survivor_opts;
using chorus::test::take_id;

namespace {

bool expect_error(const std::function<void()>& fn, chorusResult_t code, const std::string& part) {
  try {
    fn();
  } catch (const chorus::Error& e) {
    std::fprintf(stderr, "as expected: %s\n", e.what());
    return e.code() == code && contains(e.what(), part);
  }
  std::fprintf(stderr, "no error (expected '%s')\n", part.c_str());
  return false;
}

}  // namespace

TEST_CASE("grow: three ranks take a newcomer, keep their ranks and continue", "[grow]") {
  auto transport = GENERATE(std::string("shm"), std::string("tcp"));
  DYNAMIC_SECTION(transport) {
    RunOptions o = survivor_opts(3);
    o.env["CHORUS_TRANSPORT"] = transport;
    auto res = run_ranks(
        4,
        [](int proc) {
          if (proc == 3) return join_as_newcomer("plain", 4, 3);
          auto comm = chorus::Communicator::from_env();
          if (check_all_reduce(comm, "the three")) return 2;
          auto big = grow_for_newcomers(comm, 4, "plain", 1);  // any member may coordinate
          if (int rc = check_grown(big, 4, comm.rank())) return rc;
          if (check_all_reduce(comm, "the three, after")) return 5;  // the old one still works
          return 0;
        },
        o);
    std::remove(shared_path("plain").c_str());
    require_exits(res, {{0, 0}, {1, 0}, {2, 0}, {3, 0}});
  }
}

TEST_CASE("grow after a kill -9: the survivors shrink, a restarted rank rejoins, all continue",
          "[grow][shrink]") {
  auto transport = GENERATE(std::string("shm"), std::string("tcp"));
  DYNAMIC_SECTION(transport) {
    RunOptions o = survivor_opts(3);
    o.env["CHORUS_TRANSPORT"] = transport;
    auto res = run_ranks(
        4,
        [](int proc) {
          if (proc == 3) return join_as_newcomer("restart", 3, 2);  // the restarted worker
          auto comm = chorus::Communicator::from_env();
          if (check_all_reduce(comm, "the three")) return 2;
          if (comm.rank() == 1) raise(SIGKILL);
          bool failed = false;
          for (int i = 0; i < 1000 && !failed; ++i) {
            try {
              check_all_reduce(comm, "before");
            } catch (const chorus::Error&) {
              failed = true;
            }
          }
          if (!failed) return 5;
          auto two = comm.shrink({}, CHORUS_SHRINK_AGREE);
          if (two.size() != 2) return 6;
          auto back = grow_for_newcomers(two, 3, "restart");
          return check_grown(back, 3, two.rank());
        },
        o);
    std::remove(shared_path("restart").c_str());
    require_exits(res, {{1, -SIGKILL}, {0, 0}, {2, 0}, {3, 0}});
  }
}

TEST_CASE("grow refuses bad ids and arguments by name; an id serves one grow", "[grow]") {
  RunOptions o = survivor_opts(2);
  auto res = run_ranks(
      3,
      [](int proc) {
        if (proc == 2) {
          chorusUniqueId id;
          if (!take_id(&id, "args")) return 9;
          if (!expect_error([&] { chorus::Communicator::join_grow(3, id, 1); },
                            chorusInvalidArgument, "expected 2..2"))
            return 20;
          if (!expect_error([&] { chorus::Communicator::join_grow(2, id, 2); },
                            chorusInvalidArgument, "must be more than the communicator's 2"))
            return 21;
          chorusUniqueId plain;
          if (chorusGetUniqueId(&plain) != chorusSuccess) return 22;
          if (!expect_error([&] { chorus::Communicator::join_grow(3, plain, 2); },
                            chorusInvalidArgument, "not from chorusCommGetUniqueId"))
            return 23;
          chorusComm_t c = nullptr;
          if (chorusCommGrow(nullptr, 3, nullptr, 2, &c, nullptr) != chorusInvalidArgument ||
              !contains(chorusGetLastError(nullptr), "needs the grow id"))
            return 24;
          auto big = chorus::Communicator::join_grow(3, id, 2);
          if (check_all_reduce(big, "the three")) return 25;
          big.barrier();  // the members have marked the id used
          bool used = expect_error([&] { chorus::Communicator::join_grow(3, id, 2); },
                                   chorusInvalidUsage, "used by a grow that has finished");
          put_id(id, "args.done");  // rank 0, whose process hosts the store, may go now
          return used ? 0 : 26;
        }
        auto comm = chorus::Communicator::from_env();
        chorusComm_t c = nullptr;
        if (chorusCommGrow(comm.handle(), 3, nullptr, 0, &c, nullptr) != chorusInvalidArgument ||
            !contains(chorusGetLastError(nullptr), "a member passes rank -1"))
          return 10;
        if (!expect_error([&] { comm.grow(2); }, chorusInvalidArgument,
                          "must be more than the communicator's 2"))
          return 11;
        chorusUniqueId id;
        if (comm.rank() == 0) {
          id = comm.grow_id();
          put_id(id, "args");
        }
        auto big = comm.grow(3, comm.rank() == 0 ? &id : nullptr);
        if (check_all_reduce(big, "the three")) return 12;
        big.barrier();
        if (comm.rank() == 0 &&
            !expect_error([&] { comm.grow(3, &id); }, chorusInvalidUsage, "used already"))
          return 13;
        if (comm.rank() == 0 && !take_id(&id, "args.done")) return 14;
        return 0;
      },
      o);
  std::remove(shared_path("args").c_str());
  std::remove(shared_path("args.done").c_str());
  require_exits(res, {{0, 0}, {1, 0}, {2, 0}});
}

TEST_CASE("grow: members that disagree on the size fail at once, naming the coordinator",
          "[grow]") {
  RunOptions o = survivor_opts(3);
  // Nobody ends before all have their error: rank 0's end takes the store with it, and a rank
  // slow to start its grow would find no store (seen once under TSan: rank 1 failed so).
  chorus::test::RankBarrier outside(3);
  auto res = run_ranks(
      3,
      [&](int) {
        auto comm = chorus::Communicator::from_env();
        chorusUniqueId id;
        if (comm.rank() == 0) id = comm.grow_id();
        const auto t0 = std::chrono::steady_clock::now();
        const int n = comm.rank() == 2 ? 5 : 4;
        bool ok = expect_error([&] { comm.grow(n, comm.rank() == 0 ? &id : nullptr); },
                               comm.rank() == 2 ? chorusInvalidArgument : chorusRemoteError,
                               "nRanks is 5 here but 4 on rank 0 (the coordinator)");
        double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (!outside.arrive_and_wait()) return 2;
        return ok && s < 10 ? 0 : 1;  // well within the 20 s timeout
      },
      o);
  require_exits(res, {{0, 0}, {1, 0}, {2, 0}});
}

TEST_CASE(
    "grow: a coordinator that dies first ends the members' wait naming it; the newcomer "
    "gives up within its timeout, saying why",
    "[grow]") {
  RunOptions o = survivor_opts(3);
  o.env["CHORUS_TIMEOUT"] = "4";
  auto res = run_ranks(
      4,
      [](int proc) {
        if (proc == 3) {
          chorusUniqueId id;
          if (!take_id(&id, "dead")) return 9;
          return expect_error([&] { chorus::Communicator::join_grow(4, id, 3); }, chorusTimeout,
                              "the members did not start this grow")
                     ? 0
                     : 1;
        }
        auto comm = chorus::Communicator::from_env();
        if (comm.rank() == 1) {
          put_id(comm.grow_id(), "dead");
          raise(SIGKILL);
        }
        const auto t0 = std::chrono::steady_clock::now();
        bool ok = expect_error([&] { comm.grow(4); }, chorusRemoteError, "rank 1");
        double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        // Rank 0 hosts the store: it stays until the newcomer's wait has ended.
        if (comm.rank() == 0) std::this_thread::sleep_for(std::chrono::seconds(6));
        return ok && s < 3 ? 0 : 1;
      },
      o);
  std::remove(shared_path("dead").c_str());
  require_exits(res, {{1, -SIGKILL}, {0, 0}, {2, 0}, {3, 0}});
}

TEST_CASE("communicators derived again and again keep working: names stay short", "[grow]") {
  // Each split, shrink and grow names its communicator after its parent; /dev/shm names are at
  // most 255 bytes, which 50 generations of plain suffixes would pass.
  RunOptions o = survivor_opts(2);
  o.env["CHORUS_TRANSPORT"] = "shm";
  auto res = run_ranks(
      3,
      [](int proc) {
        if (proc == 2) return join_as_newcomer("deep", 3, 2);
        auto comm = chorus::Communicator::from_env();
        std::vector<chorus::Communicator> line;
        for (int i = 0; i < 60; ++i)
          line.push_back((line.empty() ? comm : line.back()).split(0, comm.rank()));
        if (check_all_reduce(line.back(), "the 60th split")) return 2;
        auto big = grow_for_newcomers(line.back(), 3, "deep");
        return check_grown(big, 3, comm.rank());
      },
      o);
  std::remove(shared_path("deep").c_str());
  require_exits(res, {{0, 0}, {1, 0}, {2, 0}});
}
