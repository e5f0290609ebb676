// Careless and hostile arguments through the public C API, on real processes: every one is
// refused with chorusInvalidArgument/chorusInvalidUsage and a message naming the call, the
// argument and its value -- never a crash (the negative op once died with SIGILL, a huge count
// with SIGSEGV), never a hang, and never a consumed sequence number (a valid call afterwards
// still agrees across ranks).
#include <catch2/catch.hpp>

#include <chrono>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "chorus/chorus.hpp"
#include "harness.h"

using chorus::test::contains;
using chorus::test::run_ranks;
using chorus::test::RunOptions;

namespace {

struct Bad {
  std::string what;  // for the failure message
  std::function<chorusResult_t()> call;
  chorusResult_t code;
  std::vector<std::string> parts;  // the message must hold each
};

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Runs every case; returns the number that failed (each printed).
int run_cases(const std::vector<Bad>& cases) {
  int failed = 0;
  for (const Bad& b : cases) {
    const chorusResult_t rc = b.call();
    const std::string msg = chorusGetLastError(nullptr);
    bool ok = rc == b.code;
    for (const std::string& p : b.parts) ok = ok && contains(msg, p);
    if (!ok) {
      std::fprintf(stderr, "%s: got code %d \"%s\", expected code %d with", b.what.c_str(), rc,
                   msg.c_str(), b.code);
      for (const std::string& p : b.parts) std::fprintf(stderr, " \"%s\"", p.c_str());
      std::fprintf(stderr, "\n");
      ++failed;
    }
  }
  return failed;
}

void require_ok(const std::vector<chorus::test::RankResult>& res) {
  for (size_t r = 0; r < res.size(); ++r) {
    INFO("rank " << r << " output:\n" << res[r].output);
    REQUIRE(res[r].exit_code == 0);
  }
}

RunOptions opts() {
  RunOptions o;
  o.env["CHORUS_TIMEOUT"] = "20";
  o.limit_seconds = 40;
  return o;
}

// After the refusals, a real all-reduce must still agree: nothing was half started.
int still_works(chorus::Communicator& comm) {
  std::vector<int32_t> v(5, comm.rank() + 1), out(5);
  comm.all_reduce(v.data(), out.data(), v.size(), chorusInt32, chorusSum);
  for (int32_t x : out)
    if (x != 3)
      return std::fprintf(stderr, "all-reduce after refusals gave %d, expected 3\n", x), 1;
  return 0;
}

const size_t kHuge = (size_t{1} << 62) + 1;                     // * 4 bytes wraps size_t
const size_t kHalf = static_cast<size_t>(PTRDIFF_MAX) / 2 + 1;  // fits alone, not * 2 ranks

}  // namespace

TEST_CASE("a reduction op outside chorusRedOp_t is refused, naming the call and the value",
          "[adversarial][args]") {
  auto res = run_ranks(
      2,
      [](int) {
        auto comm = chorus::Communicator::from_env();
        chorusComm_t c = comm.handle();
        float abuf[4] = {1, 2, 3, 4}, bbuf[8];
        float *a = abuf, *b = bbuf;  // lambdas copy the pointers
        chorusRequest_t req = nullptr;
        std::vector<Bad> cases;
        for (int op : {-1, 5, INT_MIN, INT_MAX}) {
          const auto o = static_cast<chorusRedOp_t>(op);
          const std::string v = "op " + std::to_string(op) + " is not a chorusRedOp_t";
          cases.push_back({"allreduce op " + std::to_string(op),
                           [=] { return chorusAllReduce(a, b, 4, chorusFloat32, o, c, nullptr); },
                           chorusInvalidArgument,
                           {"chorusAllReduce on rank", v}});
          cases.push_back({"reduce op",
                           [=] { return chorusReduce(a, b, 4, chorusFloat32, o, 0, c, nullptr); },
                           chorusInvalidArgument,
                           {"chorusReduce on rank", v}});
          cases.push_back(
              {"reduce_scatter op",
               [=] { return chorusReduceScatter(a, b, 2, chorusFloat32, o, c, nullptr); },
               chorusInvalidArgument,
               {"chorusReduceScatter on rank", v}});
          cases.push_back(
              {"iallreduce op",
               [=, &req] { return chorusIallReduce(a, b, 4, chorusFloat32, o, c, &req); },
               chorusInvalidArgument,
               {"chorusIallReduce on rank", v}});
          cases.push_back(
              {"ireduce op",
               [=, &req] { return chorusIreduce(a, b, 4, chorusFloat32, o, 1, c, &req); },
               chorusInvalidArgument,
               {"chorusIreduce on rank", v}});
          cases.push_back(
              {"ireduce_scatter op",
               [=, &req] { return chorusIreduceScatter(a, b, 2, chorusFloat32, o, c, &req); },
               chorusInvalidArgument,
               {"chorusIreduceScatter on rank", v}});
        }
        return run_cases(cases) + still_works(comm);
      },
      opts());
  require_ok(res);
}

TEST_CASE("counts whose bytes overflow are refused by every call", "[adversarial][args]") {
  auto res = run_ranks(
      2,
      [](int rank) {
        auto comm = chorus::Communicator::from_env();
        chorusComm_t c = comm.handle();
        float abuf[4] = {1, 2, 3, 4}, bbuf[8];
        float *a = abuf, *b = bbuf;  // lambdas copy the pointers
        chorusRequest_t req = nullptr;
        const int other = 1 - rank;
        const std::string huge =
            "count 4611686018427387905 of f32 (4 bytes each) is more than a buffer can hold";
        std::vector<Bad> cases = {
            {"allreduce",
             [=] { return chorusAllReduce(a, b, kHuge, chorusFloat32, chorusSum, c, nullptr); },
             chorusInvalidArgument,
             {"chorusAllReduce on rank", huge}},
            {"iallreduce",
             [=, &req] { return chorusIallReduce(a, b, kHuge, chorusFloat32, chorusSum, c, &req); },
             chorusInvalidArgument,
             {"chorusIallReduce on rank", huge}},
            {"reduce",
             [=] { return chorusReduce(a, b, kHuge, chorusFloat32, chorusMax, 0, c, nullptr); },
             chorusInvalidArgument,
             {"chorusReduce on rank", huge}},
            {"broadcast",
             [=] { return chorusBroadcast(a, b, kHuge, chorusFloat32, 0, c, nullptr); },
             chorusInvalidArgument,
             {"chorusBroadcast on rank", huge}},
            {"send",
             [=] { return chorusSend(a, kHuge, chorusFloat32, other, c, nullptr); },
             chorusInvalidArgument,
             {"chorusSend on rank", huge}},
            {"irecv",
             [=, &req] { return chorusIrecv(b, kHuge, chorusFloat32, other, 0, c, &req); },
             chorusInvalidArgument,
             {"chorusIrecv on rank", huge}},
            {"allgather",
             [=] { return chorusAllGather(a, b, kHuge, chorusFloat32, c, nullptr); },
             chorusInvalidArgument,
             {"chorusAllGather on rank", "sendcount 4611686018427387905 of f32"}},
            {"reduce_scatter",
             [=] { return chorusReduceScatter(a, b, kHuge, chorusFloat32, chorusSum, c, nullptr); },
             chorusInvalidArgument,
             {"chorusReduceScatter on rank", "recvcount 4611686018427387905 of f32"}},
            // One block fits; nranks of them do not.
            {"allgather x nranks",
             [=] { return chorusAllGather(a, b, kHalf, chorusUint8, c, nullptr); },
             chorusInvalidArgument,
             {"chorusAllGather on rank", "sendcount 4611686018427387904 of u8 times 2 ranks",
              "recvbuff"}},
            {"reduce_scatter x nranks",
             [=] { return chorusReduceScatter(a, b, kHalf, chorusUint8, chorusSum, c, nullptr); },
             chorusInvalidArgument,
             {"chorusReduceScatter on rank", "recvcount 4611686018427387904 of u8 times 2 ranks",
              "sendbuff"}},
        };
        return run_cases(cases) + still_works(comm);
      },
      opts());
  require_ok(res);
}

TEST_CASE("datatypes, buffers, roots, peers, streams and requests are checked by every call",
          "[adversarial][args]") {
  auto res = run_ranks(
      2,
      [](int rank) {
        auto comm = chorus::Communicator::from_env();
        chorusComm_t c = comm.handle();
        float abuf[4] = {1, 2, 3, 4}, bbuf[8];
        float *a = abuf, *b = bbuf;  // lambdas copy the pointers
        chorusRequest_t req = nullptr;
        const int other = 1 - rank;
        auto stream = reinterpret_cast<chorusStream_t>(0x1);
        std::vector<Bad> cases;
        for (int dt : {-1, 10, 1000}) {
          const auto d = static_cast<chorusDataType_t>(dt);
          const std::string v = "datatype " + std::to_string(dt) + " is not a chorusDataType_t";
          cases.push_back({"send dt",
                           [=] { return chorusSend(a, 4, d, other, c, nullptr); },
                           chorusInvalidArgument,
                           {"chorusSend on rank", v}});
          cases.push_back({"ibroadcast dt",
                           [=, &req] { return chorusIbroadcast(a, b, 4, d, 0, c, &req); },
                           chorusInvalidArgument,
                           {"chorusIbroadcast on rank", v}});
          cases.push_back({"allreduce dt",
                           [=] { return chorusAllReduce(a, b, 4, d, chorusSum, c, nullptr); },
                           chorusInvalidArgument,
                           {"chorusAllReduce on rank", v}});
          cases.push_back({"iallgather dt",
                           [=, &req] { return chorusIallGather(a, b, 4, d, c, &req); },
                           chorusInvalidArgument,
                           {"chorusIallGather on rank", v}});
        }
        cases.push_back(
            {"allreduce NULL send",
             [=] { return chorusAllReduce(nullptr, b, 4, chorusFloat32, chorusSum, c, nullptr); },
             chorusInvalidArgument,
             {"chorusAllReduce on rank", "sendbuff is NULL with count 4"}});
        cases.push_back({"allgather NULL recv",
                         [=] { return chorusAllGather(a, nullptr, 2, chorusFloat32, c, nullptr); },
                         chorusInvalidArgument,
                         {"chorusAllGather on rank", "recvbuff is NULL with sendcount 2"}});
        cases.push_back(
            {"irecv NULL",
             [=, &req] { return chorusIrecv(nullptr, 3, chorusFloat32, other, 0, c, &req); },
             chorusInvalidArgument,
             {"chorusIrecv on rank", "recvbuff is NULL with count 3"}});
        for (int root : {-1, 2})
          cases.push_back(
              {"broadcast root",
               [=] { return chorusBroadcast(a, b, 4, chorusFloat32, root, c, nullptr); },
               chorusInvalidArgument,
               {"chorusBroadcast on rank", "root " + std::to_string(root) + " is outside 0..1"}});
        cases.push_back(
            {"ireduce root",
             [=, &req] { return chorusIreduce(a, b, 4, chorusFloat32, chorusSum, 7, c, &req); },
             chorusInvalidArgument,
             {"chorusIreduce on rank", "root 7 is outside 0..1"}});
        cases.push_back({"send peer",
                         [=] { return chorusSend(a, 4, chorusFloat32, -3, c, nullptr); },
                         chorusInvalidArgument,
                         {"chorusSend on rank", "peer -3 is outside 0..1"}});
        cases.push_back({"isend self",
                         [=, &req] { return chorusIsend(a, 4, chorusFloat32, rank, 0, c, &req); },
                         chorusInvalidUsage,
                         {"chorusIsend on rank", "is this rank"}});
        cases.push_back({"barrier stream",
                         [=] { return chorusBarrier(c, stream); },
                         chorusInvalidArgument,
                         {"chorusBarrier: stream 0x1 is not NULL"}});
        cases.push_back(
            {"reduce_scatter stream",
             [=] { return chorusReduceScatter(a, b, 2, chorusFloat32, chorusSum, c, stream); },
             chorusInvalidArgument,
             {"chorusReduceScatter: stream 0x1 is not NULL"}});
        cases.push_back({"ibarrier request",
                         [=] { return chorusIbarrier(c, nullptr); },
                         chorusInvalidArgument,
                         {"chorusIbarrier: request is NULL"}});
        cases.push_back(
            {"iallreduce request",
             [=] { return chorusIallReduce(a, b, 4, chorusFloat32, chorusSum, c, nullptr); },
             chorusInvalidArgument,
             {"chorusIallReduce: request is NULL"}});
        cases.push_back(
            {"allreduce NULL comm",
             [=] { return chorusAllReduce(a, b, 4, chorusFloat32, chorusSum, nullptr, nullptr); },
             chorusInvalidArgument,
             {"chorusAllReduce: comm is NULL"}});
        cases.push_back({"wait NULL",
                         [] { return chorusWait(nullptr, 1); },
                         chorusInvalidArgument,
                         {"chorusWait: request is NULL"}});
        cases.push_back({"free NULL",
                         [] { return chorusRequestFree(nullptr); },
                         chorusInvalidArgument,
                         {"chorusRequestFree: request is NULL"}});
        // Inside a group, a collective's bad arguments are refused at the call, and so is an
        // I-call (the group's End completes its calls), before either is queued.
        cases.push_back({"grouped allreduce root",
                         [=] {
                           chorusGroupStart();
                           const chorusResult_t rc =
                               chorusReduce(a, b, 4, chorusFloat32, chorusSum, 5, c, nullptr);
                           chorusGroupEnd();  // nothing queued: leaves the last error alone
                           return rc;
                         },
                         chorusInvalidArgument,
                         {"chorusReduce on rank", "root 5 is outside 0..1"}});
        cases.push_back({"grouped iallreduce",
                         [=, &req] {
                           chorusGroupStart();
                           const chorusResult_t rc =
                               chorusIallReduce(a, b, 4, chorusFloat32, chorusSum, c, &req);
                           chorusGroupEnd();
                           return rc;
                         },
                         chorusInvalidUsage,
                         {"chorusIallReduce on rank",
                          "inside a group use chorusAllReduce (chorusGroupEnd completes it)"}});
        return run_cases(cases) + still_works(comm);
      },
      opts());
  require_ok(res);
}

TEST_CASE("gather, scatter, all-to-all and all-to-all-v refuse bad arguments",
          "[adversarial][args]") {
  auto res = run_ranks(
      2,
      [](int rank) {
        auto comm = chorus::Communicator::from_env();
        chorusComm_t c = comm.handle();
        float abuf[8] = {1, 2, 3, 4}, bbuf[8];
        float *a = abuf, *b = bbuf;  // lambdas copy the pointers
        chorusRequest_t req = nullptr;
        static size_t counts[2] = {1, 1}, displs[2] = {0, 1}, zero[2] = {0, 0};
        static size_t huge[2] = {kHuge, kHuge}, far[2] = {0, static_cast<size_t>(PTRDIFF_MAX)};
        const size_t *n1 = counts, *d1 = displs, *z = zero, *h = huge, *f = far;
        const auto f32 = chorusFloat32;
        std::vector<Bad> cases = {
            {"gather x nranks",
             [=] { return chorusGather(a, b, kHalf, chorusUint8, 0, c, nullptr); },
             chorusInvalidArgument,
             {"chorusGather on rank", "sendcount 4611686018427387904 of u8 times 2 ranks",
              "recvbuff"}},
            {"scatter huge",
             [=] { return chorusScatter(a, b, kHuge, f32, 1, c, nullptr); },
             chorusInvalidArgument,
             {"chorusScatter on rank", "recvcount 4611686018427387905 of f32"}},
            {"alltoall x nranks",
             [=] { return chorusAllToAll(a, b, kHalf, chorusUint8, c, nullptr); },
             chorusInvalidArgument,
             {"chorusAllToAll on rank", "times 2 ranks is more than sendbuff or recvbuff"}},
            {"igather root",
             [=, &req] { return chorusIgather(a, b, 2, f32, 2, c, &req); },
             chorusInvalidArgument,
             {"chorusIgather on rank", "root 2 is outside 0..1"}},
            {"scatter root",
             [=] { return chorusScatter(a, b, 2, f32, -1, c, nullptr); },
             chorusInvalidArgument,
             {"chorusScatter on rank", "root -1 is outside 0..1"}},
            {"gather NULL send",
             [=] { return chorusGather(nullptr, b, 2, f32, 0, c, nullptr); },
             chorusInvalidArgument,
             {"chorusGather on rank", "sendbuff is NULL with sendcount 2"}},
            {"scatter NULL recv",
             [=] { return chorusScatter(a, nullptr, 2, f32, 0, c, nullptr); },
             chorusInvalidArgument,
             {"chorusScatter on rank", "recvbuff is NULL with recvcount 2"}},
            {"iscatter request",
             [=] { return chorusIscatter(a, b, 2, f32, 0, c, nullptr); },
             chorusInvalidArgument,
             {"chorusIscatter: request is NULL"}},
            {"ialltoall dt",
             [=, &req] {
               return chorusIallToAll(a, b, 2, static_cast<chorusDataType_t>(11), c, &req);
             },
             chorusInvalidArgument,
             {"chorusIallToAll on rank", "datatype 11 is not a chorusDataType_t"}},
            {"alltoall stream",
             [=] { return chorusAllToAll(a, b, 2, f32, c, reinterpret_cast<chorusStream_t>(0x1)); },
             chorusInvalidArgument,
             {"chorusAllToAll: stream 0x1 is not NULL"}},
            {"alltoallv NULL sendcounts",
             [=] { return chorusAllToAllv(a, nullptr, d1, b, n1, d1, f32, c, nullptr); },
             chorusInvalidArgument,
             {"chorusAllToAllv on rank", "sendcounts is NULL (2 entries expected)"}},
            {"ialltoallv NULL rdispls",
             [=, &req] { return chorusIallToAllv(a, n1, d1, b, n1, nullptr, f32, c, &req); },
             chorusInvalidArgument,
             {"chorusIallToAllv on rank", "rdispls is NULL (2 entries expected)"}},
            {"alltoallv huge count",
             [=] { return chorusAllToAllv(a, h, d1, b, n1, d1, f32, c, nullptr); },
             chorusInvalidArgument,
             {"chorusAllToAllv on rank", "sdispls[0] 0 + sendcounts[0] 4611686018427387905",
              "end past what a buffer can hold"}},
            {"alltoallv far displacement",
             [=] { return chorusAllToAllv(a, n1, d1, b, n1, f, f32, c, nullptr); },
             chorusInvalidArgument,
             {"chorusAllToAllv on rank", "rdispls[1] 9223372036854775807 + recvcounts[1] 1"}},
            {"alltoallv NULL recvbuff",
             [=] { return chorusAllToAllv(a, n1, d1, nullptr, n1, d1, f32, c, nullptr); },
             chorusInvalidArgument,
             {"chorusAllToAllv on rank", "recvbuff is NULL with recvcounts[0] 1"}},
            {"alltoallv own block",
             [=] { return chorusAllToAllv(a, n1, d1, b, z, d1, f32, c, nullptr); },
             chorusInvalidArgument,
             {"chorusAllToAllv on rank " + std::to_string(rank),
              "sendcounts[" + std::to_string(rank) + "] 1 but recvcounts[" + std::to_string(rank) +
                  "] 0"}},
            {"grouped ialltoall",
             [=, &req] {
               chorusGroupStart();
               const chorusResult_t rc = chorusIallToAll(a, b, 2, f32, c, &req);
               chorusGroupEnd();
               return rc;
             },
             chorusInvalidUsage,
             {"chorusIallToAll on rank", "inside a group use chorusAllToAll"}},
        };
        return run_cases(cases) + still_works(comm);
      },
      opts());
  require_ok(res);
}

TEST_CASE("chorusWait: NaN is refused; INFINITY and 1e300 wait until the operation ends",
          "[adversarial][args]") {
  auto res = run_ranks(
      2,
      [](int rank) {
        auto comm = chorus::Communicator::from_env();
        chorusComm_t c = comm.handle();
        float a[4] = {1, 2, 3, 4}, b[4] = {};
        for (double t : {double{INFINITY}, 1e300}) {
          if (rank == 1) {
            std::this_thread::sleep_for(std::chrono::milliseconds(300));
            comm.send(a, 4, chorusFloat32, 0);
            continue;
          }
          chorusRequest_t req = nullptr;
          chorus::check(chorusIrecv(b, 4, chorusFloat32, 1, 0, c, &req));
          const double t0 = now();
          const chorusResult_t rc = chorusWait(req, t);
          const double took = now() - t0;
          chorusRequestFree(req);
          if (rc != chorusSuccess || took < 0.2 || b[3] != 4)
            return std::fprintf(
                       stderr,
                       "chorusWait(%g) gave %d after %.3f s (expected success after ~0.3 s)\n", t,
                       rc, took),
                   1;
        }
        chorusRequest_t req = nullptr;
        chorus::check(chorusIbarrier(c, &req));
        std::vector<Bad> nan_case = {{"wait NaN",
                                      [&] { return chorusWait(req, std::nan("")); },
                                      chorusInvalidArgument,
                                      {"chorusWait: timeout_seconds nan is not a number"}}};
        int failed = run_cases(nan_case);
        chorus::check(chorusWait(req, -1));
        chorusRequestFree(req);
        return failed;
      },
      opts());
  require_ok(res);
}

TEST_CASE("a communicator size above CHORUS_MAX_RANKS is refused before anything is built",
          "[adversarial][args]") {
  auto res = run_ranks(
      1,
      [](int) {
        chorusUniqueId id;
        chorus::check(chorusGetUniqueId(&id));
        chorusComm_t c = nullptr;
        chorusComm_t comms[2];
        const double t0 = now();
        std::vector<Bad> cases = {
            {"init INT_MAX",
             [&] { return chorusCommInitRank(&c, INT_MAX, id, 0); },
             chorusInvalidArgument,
             {"chorusCommInitRank: nranks 2147483647 is outside 1..65536 (CHORUS_MAX_RANKS)"}},
            {"init max+1",
             [&] { return chorusCommInitRank(&c, CHORUS_MAX_RANKS + 1, id, 0); },
             chorusInvalidArgument,
             {"nranks 65537 is outside"}},
            {"init 0",
             [&] { return chorusCommInitRank(&c, 0, id, 0); },
             chorusInvalidArgument,
             {"nranks 0 is outside"}},
            {"init rank -1",
             [&] { return chorusCommInitRank(&c, 2, id, -1); },
             chorusInvalidArgument,
             {"chorusCommInitRank: rank -1 is outside 0..1 (nranks 2)"}},
            {"init NULL",
             [&] { return chorusCommInitRank(nullptr, 2, id, 0); },
             chorusInvalidArgument,
             {"chorusCommInitRank: comm is NULL"}},
            {"initall INT_MAX",
             [&] { return chorusCommInitAll(comms, INT_MAX, nullptr); },
             chorusInvalidArgument,
             {"chorusCommInitAll: ndev 2147483647 is outside 1..65536"}},
            {"initall -5",
             [&] { return chorusCommInitAll(comms, -5, nullptr); },
             chorusInvalidArgument,
             {"chorusCommInitAll: ndev -5 is outside"}},
        };
        int failed = run_cases(cases);
        if (now() - t0 > 2)
          return std::fprintf(stderr, "the refusals took %.1f s\n", now() - t0), 1;
        return failed;
      },
      opts());
  require_ok(res);
}
