// The ib backend in real multi-process jobs, on verbs emulated in shared memory: the registry's
// choice (ib across hosts, shm within one, tcp when no port qualifies) and what it prints at
// CHORUS_DEBUG=INFO; a peer's bad key and a peer that dies end every rank with an error naming
// the device and the peer, never a hang. (Results of every collective over ib: test_ops,
// test_exchange and test_reductions run their matrices on it too.)
#include <catch2/catch.hpp>

#include <signal.h>
#include <stdlib.h>

#include <numeric>
#include <vector>

#include "chorus/chorus.hpp"
#include "harness.h"

using chorus::test::contains;
using chorus::test::run_ranks;
using chorus::test::RunOptions;

namespace {

RunOptions emulated(std::map<std::string, std::string> extra = {}) {
  RunOptions o;
  o.env = std::move(extra);
  o.env["CHORUS_IB_EMULATE"] = "emu0:1=down,emu1:1";
  o.env["CHORUS_TIMEOUT"] = "20";
  o.limit_seconds = 60;
  return o;
}

// An all-reduce of 1 MiB + 3 floats; returns 0 when every element is right.
int all_reduce_once(chorus::Communicator& comm) {
  const size_t n = (1 << 18) + 3;
  std::vector<float> in(n), out(n);
  for (size_t i = 0; i < n; ++i) in[i] = static_cast<float>((i % 1000) + comm.rank());
  comm.all_reduce(in.data(), out.data(), n, chorusFloat32, chorusSum);
  const float ranks = static_cast<float>(comm.size() * (comm.size() - 1) / 2);
  for (size_t i = 0; i < n; ++i)
    if (out[i] != static_cast<float>(comm.size() * (i % 1000)) + ranks) {
      std::fprintf(stderr, "element %zu: %g\n", i, out[i]);
      return 1;
    }
  return 0;
}

}  // namespace

TEST_CASE("the registry: ib between hosts, shm within one, and INFO says which", "[ib]") {
  // Ranks 0,1 on host a, 2,3 on host b: a-b pairs over ib, pairs within a host over shm.
  auto res = run_ranks(
      4,
      [](int rank) {
        setenv("CHORUS_HOSTID", rank < 2 ? "a" : "b", 1);
        auto comm = chorus::Communicator::from_env();
        return all_reduce_once(comm);
      },
      emulated({{"CHORUS_DEBUG", "INFO"}}));
  for (int r = 0; r < 4; ++r) {
    INFO("rank " << r << ":\n" << res[r].output);
    REQUIRE(res[r].exit_code == 0);
    // The down port is skipped, the active one used.
    CHECK(contains(res[r].output, "ib: port emu1:1 (emulated, CHORUS_IB_EMULATE)"));
    const int mate = r ^ 1;
    CHECK(contains(res[r].output, "1 shm peer(s) (" + std::to_string(mate) + ")"));
    CHECK(contains(res[r].output, r < 2 ? "2 ib peer(s) (2,3)" : "2 ib peer(s) (0,1)"));
  }
}

TEST_CASE("no port allowed by CHORUS_IB_HCA: tcp across hosts; ib alone cannot connect", "[ib]") {
  auto res = run_ranks(
      2,
      [](int rank) {
        setenv("CHORUS_HOSTID", rank == 0 ? "a" : "b", 1);
        auto comm = chorus::Communicator::from_env();
        return all_reduce_once(comm);
      },
      emulated({{"CHORUS_DEBUG", "INFO"}, {"CHORUS_IB_HCA", "mlx5"}}));
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r << ":\n" << res[r].output);
    REQUIRE(res[r].exit_code == 0);
    CHECK(contains(res[r].output,
                   "ib: not used (ib: no active port allowed by "
                   "CHORUS_IB_HCA='mlx5'; ports: emu0:1 (not in CHORUS_IB_HCA), "
                   "emu1:1 (not in CHORUS_IB_HCA))"));
    CHECK(contains(res[r].output, "1 tcp peer(s)"));
  }
  auto only = run_ranks(
      2,
      [](int) {
        try {
          auto comm = chorus::Communicator::from_env();
        } catch (const chorus::Error& e) {
          std::fprintf(stderr, "%s\n", e.what());
          return 3;
        }
        return 0;
      },
      emulated({{"CHORUS_IB_HCA", "mlx5"}, {"CHORUS_TRANSPORT", "ib"}}));
  // Rank 0 says why; rank 1 fails too (it may hear first that rank 0's store is gone).
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r << ":\n" << only[r].output);
    CHECK(only[r].exit_code == 3);
  }
  CHECK(contains(only[0].output, "no transport connects rank 0"));
  CHECK(contains(only[0].output, "CHORUS_TRANSPORT=ib allows ib"));
}

TEST_CASE("a peer's bad remote key: every rank fails naming the device and the peer", "[ib]") {
  auto res = run_ranks(
      2,
      [](int rank) {
        if (rank == 1) setenv("CHORUS_TEST_IB_BAD_RKEY", "1", 1);
        try {
          auto comm = chorus::Communicator::from_env();
          return all_reduce_once(comm) ? 1 : 0;
        } catch (const chorus::Error& e) {
          std::fprintf(stderr, "caught: %s\n", e.what());
          return 3;
        }
      },
      emulated({{"CHORUS_TRANSPORT", "ib"}}));
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r << ":\n" << res[r].output);
    CHECK(res[r].exit_code == 3);
    CHECK(res[r].seconds < 30);
  }
  CHECK(contains(res[0].output, "ib: emu1:1 (emulated): an RDMA write to rank 1"));
  CHECK(contains(res[0].output, "remote access error (verbs status 10)"));
}

TEST_CASE("a peer killed mid-all-reduce over ib: the others fail naming it, no hang", "[ib]") {
  auto res = run_ranks(
      3,
      [](int rank) {
        try {
          auto comm = chorus::Communicator::from_env();
          if (all_reduce_once(comm)) return 1;
          if (rank == 2) raise(SIGKILL);
          for (int i = 0; i < 50; ++i)
            if (all_reduce_once(comm)) return 1;
          return 0;
        } catch (const chorus::Error& e) {
          std::fprintf(stderr, "caught: %s\n", e.what());
          return 3;
        }
      },
      emulated({{"CHORUS_TRANSPORT", "ib"}}));
  CHECK(res[2].exit_code == -SIGKILL);
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r << ":\n" << res[r].output);
    CHECK(res[r].exit_code == 3);
    CHECK(res[r].seconds < 30);
    CHECK(contains(res[r].output, "rank 2"));
  }
}
