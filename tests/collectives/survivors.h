// What the survive-and-continue tests (shrink, grow, store failover) share: an all-reduce whose
// every element depends on every member, "the victim dies, the others see it", the expected
// exit of each process, and an id handed from one process to others through a file.
#pragma once

#include <signal.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "chorus/chorus.hpp"
#include "harness.h"

namespace chorus::test {

// An all-reduce whose result depends on every member's rank: 0 when right.
inline int check_all_reduce(chorus::Communicator& comm, const char* what) {
  const size_t n = 100003;
  std::vector<double> in(n), out(n);
  for (size_t i = 0; i < n; ++i) in[i] = double(i % 97) + 1000.0 * comm.rank();
  comm.all_reduce(in.data(), out.data(), n, chorusFloat64, chorusSum);
  const double w = comm.size();
  for (size_t i = 0; i < n; ++i)
    if (out[i] != w * double(i % 97) + 1000.0 * w * (w - 1) / 2) {
      std::fprintf(stderr, "%s: element %zu is %g\n", what, i, out[i]);
      return 1;
    }
  return 0;
}

// Runs all-reduces until one fails (a peer died): true when it did within the bound. The first
// may fail already: the victim leaves an all-reduce as soon as it has its own result.
inline bool fails_soon(chorus::Communicator& comm) {
  for (int i = 0; i < 1000; ++i) {
    try {
      check_all_reduce(comm, "before");
    } catch (const chorus::Error& e) {
      std::fprintf(stderr, "the old communicator failed: %s\n", e.what());
      return true;
    }
  }
  return false;
}

// The victims finish an all-reduce (or see another victim's death in it) and kill themselves;
// the others run all-reduces until one fails: true once it did.
inline bool kill_or_see_death(chorus::Communicator& comm, const std::vector<int>& victims) {
  for (int v : victims)
    if (comm.rank() == v) {
      try {
        check_all_reduce(comm, "before the kill");
      } catch (const chorus::Error&) {
      }
      raise(SIGKILL);
    }
  return fails_soon(comm);
}

inline bool kill_or_see_death(chorus::Communicator& comm, int victim) {
  return kill_or_see_death(comm, std::vector<int>{victim});
}

// Each listed process's exit code (-SIGKILL: killed), with its output on failure.
inline void require_exits(const std::vector<RankResult>& res,
                          const std::vector<std::pair<int, int>>& expected) {
  for (auto [r, code] : expected) {
    INFO("process " << r << ":\n" << res[r].output);
    CHECK(res[r].exit_code == code);
  }
}

// The test's pid, taken when the test program starts, before it forks its processes.
inline const pid_t kTestPid = getpid();

// A file name the test and its forked processes share.
inline std::string shared_path(const std::string& name) {
  return "/tmp/chorus-test-" + std::to_string(kTestPid) + "-" + name;
}

// One process hands an id to others in a file (written whole, then renamed into place).
inline void put_id(const chorusUniqueId& id, const std::string& name) {
  const std::string tmp = shared_path(name) + ".tmp";
  std::ofstream(tmp, std::ios::binary).write(id.internal, sizeof id.internal);
  std::rename(tmp.c_str(), shared_path(name).c_str());
}

inline bool take_id(chorusUniqueId* id, const std::string& name, double seconds = 30) {
  auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
    std::ifstream in(shared_path(name), std::ios::binary);
    if (in && in.read(id->internal, sizeof id->internal)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

// The tests' options: a 20 s timeout, a 60 s limit; `members` processes start in the job (the
// others are newcomers), all of them when -1.
inline RunOptions survivor_opts(int members = -1) {
  RunOptions o;
  o.env["CHORUS_TIMEOUT"] = "20";
  o.limit_seconds = 60;
  o.world_size = members;
  return o;
}

// The members' side of a grow to `nranks`: the coordinator takes an id (chorusCommGetUniqueId)
// and hands it to the newcomers as `name`; every member grows.
inline chorus::Communicator grow_for_newcomers(chorus::Communicator& comm, int nranks,
                                               const std::string& name, int coordinator = 0) {
  chorusUniqueId id;
  if (comm.rank() == coordinator) {
    id = comm.grow_id();
    put_id(id, name);
  }
  return comm.grow(nranks, comm.rank() == coordinator ? &id : nullptr);
}

// A grown communicator, on a member or a newcomer: its size and this process's rank, then three
// all-reduces. 0 when right.
inline int check_grown(chorus::Communicator& big, int nranks, int rank) {
  if (big.size() != nranks || big.rank() != rank) {
    std::fprintf(stderr, "grown: rank %d of %d, expected %d of %d\n", big.rank(), big.size(), rank,
                 nranks);
    return 3;
  }
  for (int i = 0; i < 3; ++i)
    if (check_all_reduce(big, "the grown one")) return 4;
  return 0;
}

// A process outside the job: takes the id handed over as `name` and joins the grow as `rank` of
// `nranks`. Its exit code: 0 when right.
inline int join_as_newcomer(const std::string& name, int nranks, int rank) {
  chorusUniqueId id;
  if (!take_id(&id, name)) return 9;
  auto big = chorus::Communicator::join_grow(nranks, id, rank);
  return check_grown(big, nranks, rank);
}

}  // namespace chorus::test
