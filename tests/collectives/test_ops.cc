// Results of send/recv, barrier, broadcast and split, on shm, tcp and ib (emulated), 1 to 5
// real processes.
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstring>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "chorus/chorus.hpp"
#include "harness.h"

using chorus::test::run_ranks;
using chorus::test::RunOptions;

namespace {

RunOptions with_transport(const std::string& t, std::map<std::string, std::string> extra = {}) {
  RunOptions o;
  o.env = std::move(extra);
  o.env["CHORUS_TRANSPORT"] = t;
  if (t == "ib") o.env["CHORUS_IB_EMULATE"] = "emu0";  // verbs emulated in shared memory
  return o;
}

// Every rank's verdict and, for those that failed, its output (the first to fail is often not
// the one that explains it).
void require_all_ok(const std::vector<chorus::test::RankResult>& res) {
  bool ok = true;
  for (size_t r = 0; r < res.size(); ++r) {
    INFO("rank " << r << " (exit " << res[r].exit_code << ") output:\n" << res[r].output);
    CHECK(res[r].exit_code == 0);
    ok = ok && res[r].exit_code == 0;
  }
  REQUIRE(ok);
}

unsigned char pattern(size_t i, int salt) {
  return static_cast<unsigned char>((i * 131 + salt * 7 + (i >> 9)) & 0xff);
}

#define CHECK_OR_FAIL(cond, ...)         \
  do {                                   \
    if (!(cond)) {                       \
      std::fprintf(stderr, __VA_ARGS__); \
      std::fprintf(stderr, "\n");        \
      return 1;                          \
    }                                    \
  } while (0)

}  // namespace

TEST_CASE("send/recv moves every byte, any size, both links", "[p2p]") {
  auto transport = GENERATE(std::string("shm"), std::string("tcp"), std::string("ib"));
  auto res = run_ranks(
      2,
      [](int rank) {
        auto comm = chorus::Communicator::from_env();
        for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{4097}, (size_t{1} << 20) + 3,
                         size_t{3} << 20}) {
          std::vector<unsigned char> buf(n);
          if (rank == 0) {
            for (size_t i = 0; i < n; ++i) buf[i] = pattern(i, static_cast<int>(n));
            comm.send(buf.data(), n, chorusUint8, 1, /*tag=*/5);
          } else {
            comm.recv(buf.data(), n, chorusUint8, 0, /*tag=*/5);
            for (size_t i = 0; i < n; ++i)
              CHECK_OR_FAIL(buf[i] == pattern(i, static_cast<int>(n)), "size %zu: byte %zu wrong",
                            n, i);
          }
        }
        // Both directions at once (async), f64 values.
        std::vector<double> out(1000), in(1000);
        std::iota(out.begin(), out.end(), rank * 1000.0);
        auto s = comm.isend(out.data(), out.size(), chorusFloat64, 1 - rank);
        auto r = comm.irecv(in.data(), in.size(), chorusFloat64, 1 - rank);
        s.wait();
        r.wait();
        for (int i = 0; i < 1000; ++i)
          CHECK_OR_FAIL(in[i] == (1 - rank) * 1000.0 + i, "exchange: element %d wrong", i);
        return 0;
      },
      with_transport(transport));
  require_all_ok(res);
}

TEST_CASE("barrier and broadcast give every rank the root's data, 1 to 5 ranks",
          "[broadcast][barrier]") {
  auto transport = GENERATE(std::string("shm"), std::string("tcp"), std::string("ib"));
  for (int n = 1; n <= 5; ++n) {
    DYNAMIC_SECTION(transport << " with " << n << " ranks") {
      // Small chunks so that the pipeline has many stages.
      auto res = run_ranks(
          n,
          [](int rank) {
            auto comm = chorus::Communicator::from_env();
            const int size = comm.size();
            CHECK_OR_FAIL(comm.rank() == rank, "rank %d reports %d", rank, comm.rank());
            for (int i = 0; i < 3; ++i) comm.barrier();
            for (int root = 0; root < size; ++root) {
              for (size_t count : {size_t{0}, size_t{1}, size_t{13}, size_t{70001}}) {
                std::vector<float> buf(count), src(count);
                for (size_t i = 0; i < count; ++i) src[i] = static_cast<float>(i * 3 + root);
                if (rank == root) buf = src;
                // In place on even roots, out of place on odd ones.
                if (root % 2 == 0) {
                  comm.broadcast(buf.data(), count, chorusFloat32, root);
                } else {
                  std::vector<float> out(count, -1.f);
                  comm.ibroadcast(rank == root ? src.data() : nullptr, out.data(), count,
                                  chorusFloat32, root)
                      .wait();
                  buf = out;
                }
                for (size_t i = 0; i < count; ++i)
                  CHECK_OR_FAIL(buf[i] == src[i],
                                "root %d count %zu: element %zu is %f, expected %f", root, count, i,
                                buf[i], src[i]);
              }
            }
            comm.barrier();
            return 0;
          },
          with_transport(transport,
                         {{"CHORUS_CHUNK_BYTES", "4096"}, {"CHORUS_SHM_SLOT_BYTES", "8192"}}));
      require_all_ok(res);
    }
  }
}

TEST_CASE("split makes sub-communicators ordered by key", "[split]") {
  auto res = run_ranks(4, [](int rank) {
    auto comm = chorus::Communicator::from_env();
    int color = rank % 2;
    auto sub = comm.split(color, /*key=*/-rank);  // reverse order inside each half
    CHECK_OR_FAIL(sub.size() == 2, "sub size %d", sub.size());
    int expect_rank = rank < 2 ? 1 : 0;
    CHECK_OR_FAIL(sub.rank() == expect_rank, "rank %d: sub rank %d, expected %d", rank, sub.rank(),
                  expect_rank);
    int v = sub.rank() == 0 ? 100 + color : -1;
    sub.broadcast(&v, 1, chorusInt32, 0);
    CHECK_OR_FAIL(v == 100 + color, "rank %d: got %d", rank, v);
    auto none = comm.split(rank == 3 ? CHORUS_SPLIT_NOCOLOR : 0, rank);
    CHECK_OR_FAIL(static_cast<bool>(none) == (rank != 3), "rank %d: nocolor split wrong", rank);
    comm.barrier();
    return 0;
  });
  require_all_ok(res);
}

TEST_CASE("work can be tested and waited on with a timeout", "[work]") {
  auto res = run_ranks(2, [](int rank) {
    auto comm = chorus::Communicator::from_env();
    int v = 0;
    if (rank == 1) {
      auto w = comm.irecv(&v, 1, chorusInt32, 0);
      CHECK_OR_FAIL(!w.wait(0.2), "recv finished before anything was sent");
      CHECK_OR_FAIL(!w.test(), "test() says done before the send");
      comm.barrier();  // queued behind the recv: lets rank 0 know we waited
      CHECK_OR_FAIL(w.wait(10), "recv did not finish");
      CHECK_OR_FAIL(v == 42, "got %d", v);
    } else {
      v = 42;
      usleep(400000);
      comm.send(&v, 1, chorusInt32, 1);
      comm.barrier();
    }
    return 0;
  });
  require_all_ok(res);
}

TEST_CASE("grouped send/recv exchange big messages around a ring without deadlock", "[group]") {
  auto transport = GENERATE(std::string("shm"), std::string("tcp"), std::string("ib"));
  auto res = run_ranks(
      3,
      [](int rank) {
        auto comm = chorus::Communicator::from_env();
        const int n = comm.size(), right = (rank + 1) % n, left = (rank + n - 1) % n;
        const size_t count = (8u << 20) / 4;
        std::vector<int32_t> out(count), in(count), out2(7, rank), in2(7, -1);
        for (size_t i = 0; i < count; ++i) out[i] = static_cast<int32_t>(rank * 1000003 + i);
        chorus::check(chorusGroupStart());
        chorus::check(chorusSend(out.data(), count, chorusInt32, right, comm.handle(), nullptr));
        chorus::check(chorusSend(out2.data(), 7, chorusInt32, right, comm.handle(),
                                 nullptr));  // same pair, second message
        chorus::check(chorusRecv(in.data(), count, chorusInt32, left, comm.handle(), nullptr));
        chorus::check(chorusRecv(in2.data(), 7, chorusInt32, left, comm.handle(), nullptr));
        chorus::check(chorusGroupEnd());
        for (size_t i = 0; i < count; ++i)
          CHECK_OR_FAIL(in[i] == static_cast<int32_t>(left * 1000003 + i), "element %zu wrong", i);
        for (int i = 0; i < 7; ++i) CHECK_OR_FAIL(in2[i] == left, "second message wrong");
        comm.barrier();
        return 0;
      },
      with_transport(transport));
  require_all_ok(res);
}

// Collectives inside a group (as NCCL's): queued, run at End in call order, then the group's
// sends and receives; all-to-all-v's arrays may be freed as soon as the call returns. Rank 2's
// waits jitter (CHORUS_TEST_JITTER_US), so that it is often the last to end the group: the
// others go on to a group that fails only once it has (the failure would fail its group still
// under way: 1 run in 8 failed so before the barrier), and exit once every rank has its error.
TEST_CASE("collectives and send/recv in one group: each result right", "[group]") {
  chorus::test::RankBarrier outside(3);
  auto res = run_ranks(3, [&outside](int rank) {
    if (rank == 2) setenv("CHORUS_TEST_JITTER_US", "1000", 1);
    auto comm = chorus::Communicator::from_env();
    chorusComm_t h = comm.handle();
    const int n = comm.size(), right = (rank + 1) % n, left = (rank + n - 1) % n;
    std::vector<float> sum(1000), bcast(77, rank == 1 ? 5.0f : 0.0f);
    for (int i = 0; i < 1000; ++i) sum[i] = static_cast<float>(rank * 1000 + i);
    std::vector<int32_t> out(5, rank), in(5, -1), a2a_in(n, -1), a2a_out(n), big(300000);
    for (int j = 0; j < n; ++j) a2a_out[j] = rank * 10 + j;
    for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<int32_t>(i);
    chorus::check(chorusGroupStart());
    chorus::check(chorusSend(out.data(), 5, chorusInt32, right, h, nullptr));  // before: no matter
    chorus::check(
        chorusAllReduce(sum.data(), sum.data(), 1000, chorusFloat32, chorusSum, h, nullptr));
    {
      std::vector<size_t> counts(n, 1), displs(n);
      for (int j = 0; j < n; ++j) displs[j] = j;
      chorus::check(chorusAllToAllv(a2a_out.data(), counts.data(), displs.data(), a2a_in.data(),
                                    counts.data(), displs.data(), chorusInt32, h, nullptr));
    }  // the arrays are gone before End
    chorus::check(chorusBroadcast(bcast.data(), bcast.data(), 77, chorusFloat32, 1, h, nullptr));
    chorus::check(
        chorusAllReduce(big.data(), big.data(), big.size(), chorusInt32, chorusMax, h, nullptr));
    chorus::check(chorusRecv(in.data(), 5, chorusInt32, left, h, nullptr));
    chorus::check(chorusBarrier(h, nullptr));
    chorus::check(chorusGroupEnd());
    for (int i = 0; i < 1000; ++i)
      CHECK_OR_FAIL(sum[i] == static_cast<float>(3000 + 3 * i), "sum[%d] = %g", i, sum[i]);
    for (float v : bcast) CHECK_OR_FAIL(v == 5.0f, "broadcast got %g", v);
    for (int j = 0; j < n; ++j)
      CHECK_OR_FAIL(a2a_in[j] == j * 10 + rank, "all-to-all-v block %d: %d", j, a2a_in[j]);
    for (size_t i = 0; i < big.size(); i += 997)
      CHECK_OR_FAIL(big[i] == static_cast<int32_t>(i), "max[%zu] = %d", i, big[i]);
    for (int v : in) CHECK_OR_FAIL(v == left, "recv got %d", v);
    // A group that fails: its End says why, on every rank (here rank 1 reduces with another op).
    // A rank that comes late may hear of the mismatch from the others first: then the call it
    // queues fails at once, saying the same.
    float x = 1;
    CHECK_OR_FAIL(outside.arrive_and_wait(), "rank %d: the others never ended the group", rank);
    chorus::check(chorusGroupStart());
    const chorusResult_t queued =
        chorusAllReduce(&x, &x, 1, chorusFloat32, rank == 1 ? chorusMax : chorusSum, h, nullptr);
    const chorusResult_t rc = chorusGroupEnd();
    CHECK_OR_FAIL(queued != chorusSuccess || rc != chorusSuccess, "a mismatched group succeeded");
    CHECK_OR_FAIL(std::string(chorusGetLastError(h)).find("rank 1") != std::string::npos,
                  "the error names no rank: %s", chorusGetLastError(h));
    CHECK_OR_FAIL(outside.arrive_and_wait(), "rank %d: the others never had their error", rank);
    return 0;
  });
  require_all_ok(res);
}

TEST_CASE("chorusCommInitAll makes communicators in one process that reduce together",
          "[init_all]") {
  const int n = 3;
  chorusComm_t comms[n];
  REQUIRE(chorusCommInitAll(comms, n, nullptr) == chorusSuccess);
  std::vector<std::vector<float>> data(n, std::vector<float>(1000));
  std::vector<std::thread> threads;
  std::vector<chorusResult_t> rcs(n);
  for (int r = 0; r < n; ++r) {
    for (int i = 0; i < 1000; ++i) data[r][i] = static_cast<float>(r + i);
    threads.emplace_back([&, r] {
      rcs[r] = chorusAllReduce(data[r].data(), data[r].data(), 1000, chorusFloat32, chorusSum,
                               comms[r], nullptr);
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) {
    REQUIRE(rcs[r] == chorusSuccess);
    for (int i = 0; i < 1000; i += 97) REQUIRE(data[r][i] == static_cast<float>(3 + 3 * i));
  }
  // One thread drives all three in a group, as NCCL's single-process users do: every call is
  // queued before End waits for any (run one by one, the first would wait for the others).
  for (int r = 0; r < n; ++r)
    for (int i = 0; i < 1000; ++i) data[r][i] = static_cast<float>(r * i);
  REQUIRE(chorusGroupStart() == chorusSuccess);
  for (int r = 0; r < n; ++r)
    REQUIRE(chorusAllReduce(data[r].data(), data[r].data(), 1000, chorusFloat32, chorusSum,
                            comms[r], nullptr) == chorusSuccess);
  REQUIRE(chorusGroupEnd() == chorusSuccess);
  for (int r = 0; r < n; ++r)
    for (int i = 0; i < 1000; i += 97) REQUIRE(data[r][i] == static_cast<float>(3 * i));
  std::vector<std::thread> closers;
  for (int r = 0; r < n; ++r) closers.emplace_back([&, r] { chorusCommDestroy(comms[r]); });
  for (auto& t : closers) t.join();
}
