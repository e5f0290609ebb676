// The headline feature: failures end in clear errors on every rank, within their bound, never a
// hang.
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "chorus/chorus.hpp"
#include "harness.h"

using chorus::test::contains;
using chorus::test::run_ranks;
using chorus::test::RunOptions;

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Runs `call`, expects a chorus::Error with `code` whose message holds `part`, within `seconds`.
template <typename F>
int expect_error(F call, chorusResult_t code, const std::string& part, double seconds,
                 chorusResult_t also = chorusSuccess) {
  double t0 = now();
  try {
    call();
  } catch (const chorus::Error& e) {
    double took = now() - t0;
    std::fprintf(stderr, "caught after %.2f s: %s\n", took, e.what());
    if (e.code() != code && e.code() != also) {
      std::fprintf(stderr, "expected code %d, got %d\n", code, e.code());
      return 2;
    }
    if (!contains(e.what(), part)) {
      std::fprintf(stderr, "message lacks '%s'\n", part.c_str());
      return 3;
    }
    if (took > seconds) {
      std::fprintf(stderr, "took %.2f s, bound %.2f s\n", took, seconds);
      return 4;
    }
    return 0;
  }
  std::fprintf(stderr, "no error raised\n");
  return 5;
}

void require_codes(const std::vector<chorus::test::RankResult>& res,
                   const std::vector<int>& codes) {
  for (size_t r = 0; r < res.size(); ++r) {
    INFO("rank " << r << " output:\n" << res[r].output);
    REQUIRE(res[r].exit_code == codes[r]);
  }
}

RunOptions on(const std::string& transport, double timeout = 30) {
  RunOptions o;
  o.env["CHORUS_TRANSPORT"] = transport;
  o.env["CHORUS_TIMEOUT"] = std::to_string(timeout);
  o.limit_seconds = 40;
  return o;
}

}  // namespace

TEST_CASE("mismatched calls fail at once on every rank, naming both ranks and both calls",
          "[failure][mismatch]") {
  auto transport = GENERATE(std::string("shm"), std::string("tcp"));
  const std::string both =
      "barrier #2 on rank 0 vs broadcast #2 (count 1000 f32, root 0) on rank 1";
  auto res = run_ranks(
      2,
      [&](int rank) {
        auto comm = chorus::Communicator::from_env();
        comm.barrier();  // #1 agrees
        std::vector<float> v(1000);
        if (rank == 0) return expect_error([&] { comm.barrier(); }, chorusMismatch, both, 5);
        return expect_error([&] { comm.broadcast(v.data(), v.size(), chorusFloat32, 0); },
                            chorusMismatch, both, 5);
      },
      on(transport));
  require_codes(res, {0, 0});
}

// A rank that is not part of a mismatch learns it from the watch channel. When the rank that
// hosts the store finds the mismatch and its process ends at once (as a test script's os._exit
// does), its news must already be out. Here the store's serving threads forward news 500 ms
// late, so without that rank 2 would hear only that rank 0 died. Rank 0 receives 8 floats where
// rank 1 sends 4; rank 2 waits for a message from rank 0 that never comes.
// Issue 19 item 3: each rank's GPU is exchanged at creation, and two ranks on one GPU are
// refused on every rank, naming both and the GPU, unless CHORUS_ALLOW_SHARED_GPU=1. The GPUs are
// faked (CHORUS_TEST_GPU_UUID): ranks 0 and 2 report one, rank 1 another, rank 3 none.
TEST_CASE("two ranks on one GPU are refused on every rank, naming both; the override allows it",
          "[failure][gpu]") {
  auto fake = [](int rank) {
    if (rank == 0 || rank == 2) setenv("CHORUS_TEST_GPU_UUID", "GPU-aaaa", 1);
    if (rank == 1) setenv("CHORUS_TEST_GPU_UUID", "GPU-bbbb", 1);
  };
  auto refused = run_ranks(4, [&](int rank) {
    fake(rank);
    return expect_error([&] { auto comm = chorus::Communicator::from_env(); }, chorusInvalidUsage,
                        "ranks 0 and 2 both use GPU GPU-aaaa", 10);
  });
  require_codes(refused, {0, 0, 0, 0});
  for (const auto& r : refused) CHECK(contains(r.output, "CHORUS_ALLOW_SHARED_GPU=1"));
  // Allowed: without an MPS daemon (no "control" pipe where CUDA_MPS_PIPE_DIRECTORY says), the
  // lower rank of the pair says the ranks will take turns and how to start one; with the pipe
  // there, nothing is said.
  char mps_template[] = "/tmp/chorus-mps-XXXXXX";
  const std::string mps = ::mkdtemp(mps_template);
  RunOptions allow;
  allow.env["CHORUS_ALLOW_SHARED_GPU"] = "1";
  allow.env["CUDA_MPS_PIPE_DIRECTORY"] = mps;
  const std::string hint =
      "ranks 0 and 2 share GPU GPU-aaaa and no MPS daemon was found (no " + mps + "/control)";
  for (bool daemon : {false, true}) {
    if (daemon) std::ofstream(mps + "/control").put('\n');
    auto allowed = run_ranks(
        4,
        [&](int rank) {
          fake(rank);
          auto comm = chorus::Communicator::from_env();
          float x = 1.0f;
          comm.all_reduce(&x, &x, 1, chorusFloat32, chorusSum);
          return x == 4.0f ? 0 : 1;
        },
        allow);
    require_codes(allowed, {0, 0, 0, 0});
    for (int r = 0; r < 4; ++r) {
      INFO("MPS daemon " << daemon << ", rank " << r << ":\n" << allowed[size_t(r)].output);
      CHECK(contains(allowed[size_t(r)].output, hint) == (r == 0 && !daemon));
    }
  }
  std::remove((mps + "/control").c_str());
  ::rmdir(mps.c_str());
  // Distinct GPUs (and ranks with none) need no override.
  auto distinct = run_ranks(3, [&](int rank) {
    if (rank < 2) setenv("CHORUS_TEST_GPU_UUID", rank == 0 ? "GPU-aaaa" : "GPU-bbbb", 1);
    auto comm = chorus::Communicator::from_env();
    comm.barrier();
    return 0;
  });
  require_codes(distinct, {0, 0, 0});
}

// Issue 17 item 2: chorusCommRevoke. Rank 1 revokes 200 ms after ranks 0 and 2 entered an
// all-reduce that waits for it: they fail with chorusRevoked naming rank 1 within 100 ms of the
// call (bound here 0.2 + 0.1 s, plus 0.5 s for a loaded machine -- 0.61 s was seen once under
// ASan beside two builds; the measured time is printed),
// and every later call fails at once, on the revoking rank too; the handle stays valid.
TEST_CASE("a revoke fails every rank's pending and later operations with chorusRevoked",
          "[failure][revoke]") {
  auto transport = GENERATE(std::string("shm"), std::string("tcp"));
  auto res = run_ranks(
      3,
      [&](int rank) {
        auto comm = chorus::Communicator::from_env();
        comm.barrier();
        std::vector<float> v(1000, 1.0f);
        auto all_reduce = [&] {
          comm.all_reduce(v.data(), v.data(), v.size(), chorusFloat32, chorusSum);
        };
        if (rank == 1) {
          usleep(200000);
          comm.revoke();
        } else if (int rc = expect_error(all_reduce, chorusRevoked,
                                         "rank 1 revoked the communicator", 0.8)) {
          return rc;
        }
        // "At once" is a flag check; 0.2 s leaves room for a descheduled process on 2 busy cores.
        if (int rc = expect_error(all_reduce, chorusRevoked, "revoked the communicator", 0.2))
          return 10 + rc;
        return comm.size() == 3 ? 0 : 20;  // the handle still answers
      },
      on(transport));
  require_codes(res, {0, 0, 0});
}

// ... and without the bootstrap store: ranks 1 and 2 share a communicator split off the world;
// rank 0, whose process hosts the store, is killed; then rank 1 revokes the split communicator
// while rank 2 waits in it. The news can only travel over their own link: shared memory, ib
// (emulated verbs: a zero-byte write with a revoke immediate) or tcp (the control socket).
TEST_CASE("a revoke reaches the peers over their link when the store's process is gone",
          "[failure][revoke]") {
  const std::string transport = GENERATE(std::string("shm"), std::string("ib"), std::string("tcp"));
  RunOptions o = on(transport);
  o.env["CHORUS_IB_EMULATE"] = "emu0";   // used by ib only
  o.env["CHORUS_STORE_FAILOVER"] = "0";  // (on, the news would also come from the next store)
  auto res = run_ranks(
      3,
      [&](int rank) {
        auto world = chorus::Communicator::from_env();
        auto pair = world.split(rank == 0 ? 0 : 1, rank);
        world.barrier();
        if (rank == 0) {
          usleep(100000);
          kill(getpid(), SIGKILL);
        }
        usleep(600000);  // the store is gone now; the split communicator does not include rank 0
        std::vector<float> v(1000, 1.0f);
        if (rank == 1) {
          usleep(200000);
          pair.revoke();
          usleep(500000);  // a survivor stays (to shrink, later)
          return 0;
        }
        return expect_error(
            [&] { pair.all_reduce(v.data(), v.data(), v.size(), chorusFloat32, chorusSum); },
            chorusRevoked, "rank 0 revoked the communicator (news over the", 0.5);
      },
      o);
  INFO(transport);
  require_codes(res, {-SIGKILL, 0, 0});
}

TEST_CASE("the store's host ending right after a mismatch: a third rank still names it",
          "[failure][mismatch]") {
  RunOptions o = on("shm");
  o.env["CHORUS_TEST_WATCH_DELAY_MS"] = "500";
  auto res = run_ranks(
      3,
      [&](int rank) {
        auto comm = chorus::Communicator::from_env();
        comm.barrier();
        std::vector<float> v(8, 1.0f);
        if (rank == 0) {
          const int rc = expect_error([&] { comm.recv(v.data(), 8, chorusFloat32, 1); },
                                      chorusMismatch, "rank 1", 5);
          std::fflush(nullptr);
          _exit(rc);  // no teardown: the store ends with this process
        }
        if (rank == 1) {
          comm.send(v.data(), 4, chorusFloat32, 0);
          usleep(2000000);  // stays until rank 2 has heard
          return 0;
        }
        return expect_error([&] { comm.recv(v.data(), 8, chorusFloat32, 0); }, chorusMismatch,
                            "on rank 0", 5);
      },
      o);
  require_codes(res, {0, 0, 0});
}

TEST_CASE("a count mismatch names both counts", "[failure][mismatch]") {
  auto res = run_ranks(
      3,
      [](int rank) {
        auto comm = chorus::Communicator::from_env();
        std::vector<float> v(1024);
        size_t count = rank == 2 ? 1024 : 1000;
        // The root's part may be complete before rank 2 sees the header: then its next call fails.
        return expect_error(
            [&] {
              comm.broadcast(v.data(), count, chorusFloat32, 0);
              comm.barrier();
            },
            chorusMismatch,
            "broadcast #1 (count 1000 f32, root 0) on rank 1 vs broadcast #1 (count 1024 f32, root "
            "0) on rank 2",
            5);
      },
      on("shm"));
  require_codes(res, {0, 0, 0});
}

TEST_CASE("a gather met by scatters fails at once on every rank, naming both calls",
          "[failure][mismatch][gather][scatter]") {
  auto transport = GENERATE(std::string("shm"), std::string("tcp"));
  auto res = run_ranks(
      3,
      [](int rank) {
        auto comm = chorus::Communicator::from_env();
        std::vector<float> send(3 * 4096), recv(3 * 4096);
        // Whichever pair is seen first, the message names rank 0's gather and a scatter. The
        // barrier (#1) agrees, but a rank may still be finishing it when two others have met at
        // #2 and failed the communicator: then its barrier fails with that news (seen under ASan).
        const std::string both =
            "gather #2 (count 4096 f32, root 0) on rank 0 vs scatter #2 (count 4096 f32, root 0) "
            "on rank ";
        if (rank == 0)
          return expect_error(
              [&] {
                comm.barrier();
                comm.gather(send.data(), recv.data(), 4096, chorusFloat32, 0);
              },
              chorusMismatch, both, 5);
        return expect_error(
            [&] {
              comm.barrier();
              comm.scatter(send.data(), recv.data(), 4096, chorusFloat32, 0);
            },
            chorusMismatch, both, 5);
      },
      on(transport));
  require_codes(res, {0, 0, 0});
}

// Neither is the root in its own view, both send a block that overflows their ring: each must
// still read the other's header rather than wait for a free slot.
TEST_CASE("two ranks that each take the other for the gather root fail at once",
          "[failure][mismatch][gather]") {
  RunOptions o = on("shm");
  o.env.insert({{"CHORUS_SHM_SLOT_BYTES", "4096"}, {"CHORUS_SHM_SLOTS", "2"}});
  auto res = run_ranks(
      2,
      [](int rank) {
        auto comm = chorus::Communicator::from_env();
        std::vector<char> send(1 << 20), recv(2 << 20);
        return expect_error(
            [&] { comm.gather(send.data(), recv.data(), send.size(), chorusUint8, 1 - rank); },
            chorusMismatch,
            "gather #1 (count 1048576 u8, root 1) on rank 0 vs gather #1 (count 1048576 u8, root "
            "0) on rank 1",
            5);
      },
      o);
  require_codes(res, {0, 0});
}

TEST_CASE("an all-to-all-v pair that disagrees on its count fails on every rank, naming both",
          "[failure][mismatch][all_to_all]") {
  auto transport = GENERATE(std::string("shm"), std::string("tcp"));
  auto res = run_ranks(
      3,
      [](int rank) {
        auto comm = chorus::Communicator::from_env();
        // Blocks of 4, except that rank 0 sends rank 1 five elements (rank 1 expects four).
        std::vector<size_t> scounts(3, 4), rcounts(3, 4), displs = {0, 8, 16};
        if (rank == 0) scounts[1] = 5;
        std::vector<int32_t> send(24, rank), recv(24, -1);
        return expect_error(
            [&] {
              // #1 agrees; rank 2 may learn of the mismatch before its part of it completes
              // (seen once under ASan), which is this test's ending too.
              comm.barrier();
              comm.all_to_all_v(send.data(), scounts.data(), displs.data(), recv.data(),
                                rcounts.data(), displs.data(), chorusInt32);
              comm.barrier();  // a rank whose part was done before the news fails here
            },
            chorusMismatch,
            "all_to_all_v #2 (i32, sends 5 to rank 1) on rank 0 vs all_to_all_v #2 (i32, expects "
            "4 from rank 0) on rank 1",
            5);
      },
      on(transport));
  require_codes(res, {0, 0, 0});
}

TEST_CASE("a peer's last message counts when the peer exits before the receiver looks again",
          "[failure][dead]") {
  // Rank 1 sends and exits while rank 0, about to sleep in the receive, is held by a test hook
  // before it checks its peers: it then finds rank 1 gone and the message there. Before the
  // fix it reported "rank 1 died" for a receive whose data had arrived. (The news of the death
  // breaks the communicator for later calls; the receive under way still ends with its data.)
  auto transport = GENERATE(std::string("shm"), std::string("tcp"));
  RunOptions o = on(transport);
  o.env["CHORUS_TEST_ALIVE_CHECK_LAG_MS"] = "600";
  o.env["CHORUS_STORE_FAILOVER"] = "0";
  chorus::test::RankBarrier both(2);  // no communicator: rank 0 is past the barrier's waits
  auto res = run_ranks(
      2,
      [&](int rank) -> int {
        auto comm = chorus::Communicator::from_env();
        comm.barrier();
        if (!both.arrive_and_wait()) return 5;
        int v = 0;
        if (rank == 1) {
          usleep(200000);  // rank 0 is in the hook by now
          v = 42;
          comm.send(&v, 1, chorusInt32, 0);
          _exit(0);  // no goodbye: gone as if killed, its message sent
        }
        try {
          comm.recv(&v, 1, chorusInt32, 1);
        } catch (const std::exception& e) {
          std::fprintf(stderr, "rank 0: recv failed: %s\n", e.what());
          _exit(3);
        }
        std::fprintf(stderr, "rank 0: got %d\n", v);
        _exit(v == 42 ? 0 : 4);
      },
      o);
  require_codes(res, {0, 0});
}

TEST_CASE("a peer killed with SIGKILL fails every survivor within 5 s, naming it",
          "[failure][dead]") {
  auto transport = GENERATE(std::string("shm"), std::string("tcp"));
  auto big = GENERATE(false, true);
  auto res = run_ranks(
      3,
      [&](int rank) {
        auto comm = chorus::Communicator::from_env();
        comm.barrier();
        // Only the large case needs a buffer; left uninitialised (a broadcast's bytes are any),
        // since filling 256 MiB on each rank took seconds under the sanitizers.
        const size_t bytes = big ? size_t{256} << 20 : 0;
        std::unique_ptr<unsigned char[]> buf(big ? new unsigned char[bytes] : nullptr);
        if (rank == 2) {
          if (big) {
            // Die in the middle of a large broadcast (after posting it, before it can finish).
            auto w = comm.ibroadcast(nullptr, buf.get(), bytes, chorusUint8, 0);
            usleep(50000);
          } else {
            usleep(300000);
          }
          kill(getpid(), SIGKILL);
        }
        if (big)
          return expect_error(
              [&] {
                for (int i = 0; i < 50; ++i) comm.broadcast(buf.get(), bytes, chorusUint8, 0);
              },
              chorusRemoteError, "rank 2", 5);
        return expect_error([&] { comm.barrier(); }, chorusRemoteError, "rank 2", 5);
      },
      on(transport));
  require_codes(res, {0, 0, -SIGKILL});
}

TEST_CASE(
    "rank 0, which hosts the bootstrap store, killed: survivors name rank 0 and their call within "
    "5 s",
    "[failure][dead]") {
  auto transport = GENERATE(std::string("shm"), std::string("tcp"));
  auto res = run_ranks(
      3,
      [&](int rank) {
        auto comm = chorus::Communicator::from_env();
        comm.barrier();
        if (rank == 0) {
          usleep(300000);
          kill(getpid(), SIGKILL);
        }
        // Before: "the bootstrap store closed the connection (the process hosting it died)".
        double t0 = now();
        try {
          comm.barrier();
        } catch (const chorus::Error& e) {
          std::fprintf(stderr, "caught after %.2f s: %s\n", now() - t0, e.what());
          if (e.code() != chorusRemoteError) return 2;
          if (!contains(e.what(), "rank 0 (pid ") || !contains(e.what(), "died")) return 3;
          if (!contains(e.what(), "barrier #2 on rank " + std::to_string(rank))) return 4;
          return now() - t0 <= 5 ? 0 : 5;
        }
        return 6;
      },
      on(transport));
  require_codes(res, {-SIGKILL, 0, 0});
}

TEST_CASE("a barrier reached by rank 0 alone ends in an error, not a hang (the forum's trap)",
          "[failure][forum]") {
  auto transport = GENERATE(std::string("shm"), std::string("tcp"));
  auto res = run_ranks(
      2,
      [](int rank) {
        auto comm = chorus::Communicator::from_env();
        comm.barrier();
        if (rank == 0) return expect_error([&] { comm.barrier(); }, chorusRemoteError, "rank 1", 5);
        return 0;  // rank 1 skips the barrier and exits cleanly
      },
      on(transport));
  require_codes(res, {0, 0});
}

// The store's host hears of another rank's error through its own store and ends at once (as a
// Python rank does when the error ends its script): the store forwards the news to the host's
// own clients last, so a third rank still hears it, not only that the store is gone. The forwards
// are spaced (CHORUS_TEST_WATCH_GAP_MS) so a host served first would have ended by then; whether
// it would be served first depends on the order the watch clients connected, which
// adversarial_store's "error news reaches other processes before the store's own" fixes.
TEST_CASE("the store's host ending as soon as it hears of an error: the others heard it first",
          "[failure][mismatch]") {
  RunOptions o = on("shm");
  o.env["CHORUS_TEST_WATCH_GAP_MS"] = "400";
  // Ranks 1 and 2 stay until rank 0 has its error: rank 0 waits on rank 2, and the news reaches
  // rank 0 last (800 ms after the first), so a rank 2 that ended on hearing it would be, to rank
  // 0, a peer gone before the news (as under a launcher that reaps its processes at once).
  chorus::test::RankBarrier ending(3);
  auto res = run_ranks(
      3,
      [&](int rank) {
        auto comm = chorus::Communicator::from_env();
        // Rank 2 may still be in the barrier when the news comes (the others left it once they
        // had its message), and that barrier then fails with it: either way rank 2 hears it.
        if (rank != 2) comm.barrier();
        std::vector<float> v(8, 1.0f);
        int rc = 0;
        if (rank == 0) {
          comm.send(v.data(), 4, chorusFloat32, 1);  // rank 1 expects 8
          rc = expect_error([&] { comm.recv(v.data(), 8, chorusFloat32, 2); }, chorusMismatch,
                            "on rank 1", 5);
          ending.arrive_and_wait(0);  // arrives; the others wait for it
          std::fflush(nullptr);
          _exit(rc);  // no teardown: the store ends with this process
        }
        if (rank == 1)
          rc = expect_error([&] { comm.recv(v.data(), 8, chorusFloat32, 0); }, chorusMismatch,
                            "rank 0", 5);
        else
          rc = expect_error(
              [&] {
                comm.barrier();
                comm.recv(v.data(), 8, chorusFloat32, 1);
              },
              chorusMismatch, "on rank 1", 5);
        ending.arrive_and_wait();
        return rc;
      },
      o);
  require_codes(res, {0, 0, 0});
}

// A rank that ends right after destroying its communicator says goodbye first, also when its
// watch thread holds the job at that moment (news being delivered; the test hook holds it
// 500 ms after each): that thread would drop the job last and tear it down on a thread of its
// own, which the exit ends before the goodbye, and the others would read the exit as a death
// (seen as a wrong error in the test above, 1 run in 20 on a loaded machine).
TEST_CASE("a rank that exits right after destroy says goodbye, also while news holds its job",
          "[failure]") {
  RunOptions o = on("shm");
  o.env["CHORUS_TEST_WATCH_HOLD_MS"] = "500";
  auto res = run_ranks(
      3,
      [&](int rank) {
        int rc = 0;
        {
          auto comm = chorus::Communicator::from_env();
          std::vector<float> v(8, 1.0f);
          if (rank == 1) {
            comm.barrier();
            comm.abort();  // the news: every rank's calls fail
            usleep(2500000);
            return 0;
          }
          // (The barrier too: the news may find a rank still in it.)
          rc = expect_error(
              [&] {
                comm.barrier();
                comm.recv(v.data(), 8, chorusFloat32, 1);
              },
              chorusRemoteError, "rank 1", 5, chorusAborted);
          if (rank == 0) usleep(2500000);  // the store's host: long enough to hear rank 2 go
        }
        return rc;  // rank 2 exits at once (_exit: nothing after destroy runs)
      },
      o);
  require_codes(res, {0, 0, 0});
  for (int r : {0, 1}) {
    INFO("rank " << r << " output:\n" << res[r].output);
    CHECK(!contains(res[r].output, "rank 2 (pid"));
    CHECK(!contains(res[r].output, "died"));
  }
}

TEST_CASE("a deadline lists the ranks that never arrived and what they were doing",
          "[failure][timeout]") {
  auto res = run_ranks(
      3,
      [](int rank) {
        auto comm = chorus::Communicator::from_env();
        comm.barrier();
        if (rank == 0)
          return expect_error([&] { comm.barrier(); }, chorusTimeout, "ranks that never arrived: 2",
                              6, chorusRemoteError);
        if (rank == 1)
          return expect_error([&] { comm.barrier(); }, chorusRemoteError, "timed out", 8,
                              chorusTimeout);
        usleep(4000000);  // rank 2 dawdles past CHORUS_TIMEOUT
        return expect_error([&] { comm.barrier(); }, chorusRemoteError, "timed out", 1);
      },
      on("shm", 2.0));
  require_codes(res, {0, 0, 0});
  // Rank 2 is late, not dead: alive, idle since its last call, and for how long.
  const std::regex late("rank 2: late: idle, last finished barrier #1 [0-9]+\\.[0-9] s ago");
  REQUIRE((std::regex_search(res[0].output, late) || std::regex_search(res[1].output, late)));
}

TEST_CASE("a rank that already left the call on its own deadline counts as arrived",
          "[failure][timeout]") {
  // The ordering a loaded machine makes now and then, forced: rank 1's deadline is shorter, so
  // when rank 0's deadline passes rank 1 has already timed out and left barrier #2, and the store
  // holds rank 1's error news back (CHORUS_TEST_WATCH_DELAY_MS) so rank 0 times out on its own.
  RunOptions o = on("shm", 2.0);
  o.env["CHORUS_TEST_WATCH_DELAY_MS"] = "1500";
  auto res = run_ranks(
      3,
      [](int rank) {
        if (rank == 1) setenv("CHORUS_TIMEOUT", "0.7", 1);
        auto comm = chorus::Communicator::from_env();
        comm.barrier();
        if (rank == 0)
          return expect_error([&] { comm.barrier(); }, chorusTimeout,
                              "ranks that never arrived: 2;", 6);
        if (rank == 1) {
          const int rc = expect_error([&] { comm.barrier(); }, chorusTimeout, "rank 2", 4);
          usleep(3000000);  // stays to answer rank 0's question
          return rc;
        }
        usleep(4000000);  // rank 2 dawdles past both deadlines
        return expect_error([&] { comm.barrier(); }, chorusRemoteError, "timed out", 1);
      },
      o);
  require_codes(res, {0, 0, 0});
  const std::regex left("rank 1: idle, last finished barrier #2 [0-9]+\\.[0-9] s ago");
  INFO("rank 0 output:\n" << res[0].output);
  REQUIRE(std::regex_search(res[0].output, left));
}

TEST_CASE("joining times out naming the ranks that never came", "[failure][join]") {
  RunOptions o = on("shm", 2.0);
  o.world_size = 3;  // only 2 of 3 start
  auto res = run_ranks(
      2,
      [](int) {
        return expect_error([] { chorus::Communicator::from_env(); }, chorusTimeout,
                            "of 3 never joined", 8);
      },
      o);
  require_codes(res, {0, 0});
}

// Rank 0 hosts the store (launched as torchrun would) and its process ends while rank 2 waits in
// the start barrier for rank 1, which never comes. Rank 2 must say that the store's host ended
// before every rank had joined, naming rank 0, not only that a connection closed. Rank 0 ends 2 s
// after rank 2 starts joining: time enough to connect on a loaded machine.
TEST_CASE("the store's host ending while a rank is still joining: the rank names it",
          "[failure][join]") {
  chorus::test::RankBarrier starting(2);  // ranks 0 and 2
  auto res = run_ranks(
      3,
      [&](int rank) {
        if (rank == 1) return 0;
        if (rank == 0) {
          std::thread([&] {
            starting.arrive_and_wait();
            usleep(2000000);
            _exit(7);  // as a script's os._exit, or a crash, would end it
          }).detach();
          (void)chorus::Communicator::from_env();
          return 1;
        }
        starting.arrive_and_wait();
        return expect_error([] { chorus::Communicator::from_env(); }, chorusRemoteError,
                            "rank 0, which hosted the bootstrap store", 5);
      },
      on("shm", 20));
  require_codes(res, {7, 0, 0});
}

TEST_CASE("strangers, wrong secrets, garbage and truncated handshakes are refused; the job goes on",
          "[failure][handshake]") {
  RunOptions o = on("tcp", 20);
  o.port = chorus::test::free_port();
  o.env["CHORUS_JOB_SECRET"] = "0123456789abcdef0123456789abcdef";
  int port = o.port;
  auto res = run_ranks(
      2,
      [port](int rank) {
        if (rank == 1) {
          usleep(200000);  // let rank 0 listen
          auto raw = [port](const char* bytes, size_t n) {
            int fd = socket(AF_INET, SOCK_STREAM, 0);
            sockaddr_in a{};
            a.sin_family = AF_INET;
            a.sin_port = htons(port);
            a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
            if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return false;
            (void)!write(fd, bytes, n);
            char reply[256];
            shutdown(fd, SHUT_WR);
            while (read(fd, reply, sizeof reply) > 0) {
            }
            close(fd);
            return true;
          };
          std::string http = "GET / HTTP/1.1\r\nHost: x\r\n\r\n" + std::string(64, 'x');
          if (!raw(http.data(), http.size())) return 10;
          if (!raw("\x53\x52\x48\x43\x01\x00", 6)) return 11;  // truncated hello
          // Another job's process (different secret) tries to join as rank 1.
          pid_t p = fork();
          if (p == 0) {
            setenv("CHORUS_JOB_SECRET", "ffffffffffffffffffffffffffffffff", 1);
            setenv("CHORUS_TIMEOUT", "3", 1);
            _exit(expect_error([] { chorus::Communicator::from_env(); }, chorusRemoteError,
                               "wrong job secret", 6));
          }
          int st = 0;
          waitpid(p, &st, 0);
          if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) return 12;
        }
        auto comm = chorus::Communicator::from_env();
        int v = rank == 0 ? 7 : 0;
        comm.broadcast(&v, 1, chorusInt32, 0);
        return v == 7 ? 0 : 13;
      },
      o);
  require_codes(res, {0, 0});
  REQUIRE(contains(res[0].output, "not a chorus peer"));
  REQUIRE(contains(res[0].output, "incomplete handshake"));
  REQUIRE(contains(res[0].output, "wrong job secret"));
}

TEST_CASE("two processes claiming the same rank: the second is told so", "[failure][join]") {
  RunOptions o = on("shm", 5);
  o.world_size = 2;
  auto res = run_ranks(
      3,
      [](int rank) {
        if (rank == 2) {
          usleep(300000);
          setenv("RANK", "1", 1);
          return expect_error([] { chorus::Communicator::from_env(); }, chorusInvalidUsage,
                              "rank 1 joined twice", 8);
        }
        auto comm = chorus::Communicator::from_env();
        comm.barrier();
        usleep(600000);  // stay joined while the impostor knocks
        return 0;
      },
      o);
  require_codes(res, {0, 0, 0});
}

TEST_CASE("calls on a destroyed or aborted communicator are errors, not crashes",
          "[failure][lifecycle]") {
  auto res = run_ranks(
      2,
      [](int rank) {
        auto comm = chorus::Communicator::from_env();
        comm.barrier();
        auto sub = comm.split(0, rank);
        sub.destroy();
        int v = 0;
        int rc = expect_error([&] { sub.broadcast(&v, 1, chorusInt32, 0); }, chorusInvalidUsage,
                              "destroyed", 1);
        if (rc) return rc;
        rc = expect_error([&] { sub.destroy(); }, chorusInvalidUsage, "destroyed", 1);
        if (rc) return rc;
        comm.barrier();
        if (rank == 0) {
          comm.abort();
          return expect_error([&] { comm.barrier(); }, chorusInvalidUsage, "aborted", 1);
        }
        // The peer hears of the abort at once.
        return expect_error([&] { comm.barrier(); }, chorusRemoteError, "aborted", 5);
      },
      on("shm"));
  require_codes(res, {0, 0});
  // Bad arguments name the call, the rank and the values.
  auto bad = run_ranks(1, [](int) {
    auto comm = chorus::Communicator::from_env();
    int v = 0;
    return expect_error([&] { comm.broadcast(&v, 1, chorusInt32, 3); }, chorusInvalidArgument,
                        "chorusBroadcast on rank 0: root 3 is outside 0..0", 1);
  });
  require_codes(bad, {0});
}

TEST_CASE(
    "a communicator's config sets its timeout in place of CHORUS_TIMEOUT; bad configs are "
    "refused",
    "[failure][timeout][config]") {
  // Rank 0 makes the id (its store thread must live in a rank, not in this parent, whose
  // threads a fork does not copy) and hands it over in a file.
  const std::string path = "/tmp/chorus_config_id_" + std::to_string(getpid());
  RunOptions o = on("shm", 60.0);  // the config's 1.5 s must win over CHORUS_TIMEOUT's 60 s
  auto res = run_ranks(
      2,
      [&](int rank) {
        chorusUniqueId id;
        if (rank == 0) {
          id = chorus::Communicator::unique_id();
          FILE* f = std::fopen((path + ".tmp").c_str(), "wb");
          if (!f || std::fwrite(&id, sizeof id, 1, f) != 1 || std::fclose(f) != 0) return 13;
          std::rename((path + ".tmp").c_str(), path.c_str());
        } else {
          FILE* f = nullptr;
          for (int i = 0; i < 1000 && !(f = std::fopen(path.c_str(), "rb")); ++i) usleep(10000);
          if (!f || std::fread(&id, sizeof id, 1, f) != 1) return 14;
          std::fclose(f);
        }
        chorusComm_t c = nullptr;
        chorusConfig_t bad = CHORUS_CONFIG_INITIALIZER;
        bad.size = 4;
        if (chorusCommInitRankConfig(&c, 2, id, rank, &bad) != chorusInvalidArgument ||
            !contains(chorusGetLastError(nullptr), "config->size is 4, expected"))
          return 10;
        bad = CHORUS_CONFIG_INITIALIZER;
        bad.timeout_seconds = -1;
        if (chorusCommInitRankConfig(&c, 2, id, rank, &bad) != chorusInvalidArgument ||
            !contains(chorusGetLastError(nullptr), "config->timeout_seconds is -1"))
          return 11;
        if (chorusCommInitRankConfig(&c, 2, id, rank, nullptr) != chorusInvalidArgument) return 12;
        auto comm = chorus::Communicator::init(2, id, rank, 1.5);
        comm.barrier();
        if (rank == 1) {
          usleep(4000000);  // rank 0 waits alone past the config's 1.5 s
          return expect_error([&] { comm.barrier(); }, chorusRemoteError, "timed out", 1,
                              chorusTimeout);
        }
        return expect_error([&] { comm.barrier(); }, chorusTimeout,
                            "timed out after 1.5 s waiting for rank 1 (the communicator's config)",
                            3.5, chorusRemoteError);
      },
      o);
  require_codes(res, {0, 0});
}
