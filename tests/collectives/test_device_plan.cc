// The device operations' plans (collectives/device_plan.h) alone, for 1..6 ranks: run on host
// memory they give every collective's result (gather, scatter and all-to-all included), in and
// out of place; and no task of one rank
// writes memory that another rank's task reads or writes (the ranks' tasks run at the same
// time, between the ready and done signals, with nothing ordering them).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <tuple>
#include <vector>

#include "collectives/device_plan.h"
#include "kernels/cpu/reduce.h"

using chorus::BufRef;
using chorus::DeviceTask;
using chorus::OpKind;

namespace {

struct Layout {
  size_t send_at, recv_at;  // element offsets in the rank's memory
};

// In place as each call allows it: all-gather's and gather's sendbuff at the rank's block of
// recvbuff, reduce-scatter's and scatter's recvbuff at the rank's block of sendbuff; an in-place
// all-to-all's input is copied aside by device_ops.cc first, so its plan sees them apart.
Layout layout(OpKind k, int r, size_t n, size_t send_n, bool in_place) {
  if (!in_place || k == OpKind::kAllToAll) return {0, send_n};
  if (k == OpKind::kAllGather || k == OpKind::kGather) return {r * n, 0};
  if (k == OpKind::kReduceScatter || k == OpKind::kScatter) return {0, r * n};
  return {0, 0};
}

struct Range {
  int rank;
  size_t lo, hi;  // elements of that rank's memory
  bool overlaps(const Range& o) const { return rank == o.rank && lo < o.hi && o.lo < hi; }
};

}  // namespace

TEST_CASE("device plans: results right and no rank races another", "[device]") {
  const OpKind kinds[] = {OpKind::kAllReduce,     OpKind::kReduce,  OpKind::kBroadcast,
                          OpKind::kAllGather,     OpKind::kGather,  OpKind::kScatter,
                          OpKind::kReduceScatter, OpKind::kAllToAll};
  int checked = 0;
  for (OpKind kind : kinds)
    for (int p = 1; p <= 6; ++p)
      for (bool one_gpu : {false, true})
        for (size_t n : {0, 1, 3, 17, 1000})
          for (bool in_place : {false, true}) {
            const int root = int(n % p);
            const size_t send_n = chorus::device_send_count(kind, n, p);
            const size_t recv_n = chorus::device_recv_count(kind, n, p);
            std::vector<Layout> lay;
            std::vector<std::vector<uint32_t>> mem(p);
            for (int q = 0; q < p; ++q) {
              lay.push_back(layout(kind, q, n, send_n, in_place));
              mem[q].assign(send_n + recv_n, 0xdeadbeef);
              for (size_t j = 0; j < send_n; ++j) mem[q][lay[q].send_at + j] = q * 1000003u + j;
            }
            const std::vector<std::vector<uint32_t>> before = mem;
            auto at = [&](const BufRef& b) {
              return b.elem + (b.recv ? lay[b.rank].recv_at : lay[b.rank].send_at);
            };
            // Every rank's tasks, with the ranges they read and write.
            struct Planned {
              int rank;
              DeviceTask t;
            };
            std::vector<Planned> all;
            for (int r = 0; r < p; ++r)
              for (DeviceTask& t : chorus::plan_device_op({.kind = kind,
                                   .nranks = p,
                                   .rank = r,
                                   .root = root,
                                   .count = n,
                                   .align = 4,
                                   .one_gpu = one_gpu}))
                all.push_back({r, t});
            // A copy's output that is its input (in place) is dropped by the executor
            // (device_ops.cc).
            auto self = [&](const DeviceTask& t, const BufRef& o) {
              return !t.reduce && t.in[0].rank == o.rank && at(t.in[0]) == at(o);
            };
            INFO("kind " << int(kind) << ", " << p << " ranks, one GPU " << one_gpu << ", count "
                         << n << ", in place " << in_place << ", root " << root);
            for (const Planned& a : all)
              for (const Planned& b : all) {
                if (a.rank == b.rank) continue;
                std::vector<Range> touched;
                for (const BufRef& o : b.t.out)
                  if (!self(b.t, o)) touched.push_back({o.rank, at(o), at(o) + b.t.count});
                for (const BufRef& in : b.t.in)
                  touched.push_back({in.rank, at(in), at(in) + b.t.count});
                for (const BufRef& o : a.t.out) {
                  if (self(a.t, o)) continue;
                  const Range w{o.rank, at(o), at(o) + a.t.count};
                  for (const Range& t : touched) REQUIRE_FALSE(w.overlaps(t));
                }
              }
            const bool rooted = kind == OpKind::kReduce || kind == OpKind::kBroadcast ||
                                kind == OpKind::kGather || kind == OpKind::kScatter;
            if (one_gpu)
              for (const Planned& a : all) REQUIRE(a.rank == (rooted ? root : 0));
            for (const Planned& a : all) {
              std::vector<const void*> in;
              for (const BufRef& b : a.t.in) in.push_back(mem[b.rank].data() + at(b));
              // As the kernel: every element read from every input, then written to every output.
              std::vector<uint32_t> result(a.t.count);
              chorus::kernels::reduce_fold(chorus::kernels::DType::kU32,
                                           chorus::kernels::RedOp::kSum, in.data(), int(in.size()),
                                           result.data(), a.t.count, 0);
              REQUIRE(!a.t.out.empty());
              for (const BufRef& o : a.t.out)
                std::copy(result.begin(), result.end(), mem[o.rank].begin() + long(at(o)));
            }
            for (int r = 0; r < p; ++r) {
              const uint32_t* got = mem[r].data() + lay[r].recv_at;
              for (size_t j = 0; j < recv_n; ++j) {
                uint32_t want = 0;
                auto input = [&](int q, size_t e) { return before[q][lay[q].send_at + e]; };
                switch (kind) {
                  case OpKind::kAllReduce:
                  case OpKind::kReduce:
                    for (int q = 0; q < p; ++q) want += input(q, j);
                    if (kind == OpKind::kReduce && r != root) want = before[r][lay[r].recv_at + j];
                    break;
                  case OpKind::kBroadcast:
                    want = input(root, j);
                    break;
                  case OpKind::kAllGather:
                    want = input(int(j / n), j % n);
                    break;
                  case OpKind::kGather:
                    want = r == root ? input(int(j / n), j % n) : before[r][lay[r].recv_at + j];
                    break;
                  case OpKind::kScatter:
                    want = input(root, r * n + j);
                    break;
                  case OpKind::kAllToAll:
                    want = input(int(j / n), r * n + j % n);
                    break;
                  case OpKind::kReduceScatter:
                    for (int q = 0; q < p; ++q) want += input(q, r * n + j);
                    break;
                  default:
                    FAIL("no expected result for kind " << int(kind));
                }
                REQUIRE(got[j] == want);
                ++checked;
              }
            }
          }
  CHECK(checked > 100000);
}

TEST_CASE("device all-to-all-v plans: every block where the arrays say, gaps untouched",
          "[device]") {
  std::mt19937 rng(5);
  int checked = 0;
  for (int p = 1; p <= 6; ++p)
    for (bool one_gpu : {false, true})
      for (int trial = 0; trial < 20; ++trial) {
        // Rank q's arrays: counts 0..9 (sendcounts[d] of q is recvcounts[q] of d), blocks laid out
        // in a shuffled order with gaps of 0..3 elements.
        std::vector<std::vector<size_t>> sc(p, std::vector<size_t>(p)), sd = sc, rc = sc, rd = sc;
        for (int q = 0; q < p; ++q)
          for (int d = 0; d < p; ++d) sc[q][d] = rc[d][q] = rng() % 10;
        std::vector<size_t> send_end(p), recv_end(p);
        for (int q = 0; q < p; ++q)
          for (auto [counts, displs, end] : {std::tuple{&sc[q], &sd[q], &send_end[q]},
                                             std::tuple{&rc[q], &rd[q], &recv_end[q]}}) {
            std::vector<int> order(p);
            std::iota(order.begin(), order.end(), 0);
            std::shuffle(order.begin(), order.end(), rng);
            size_t at = 0;
            for (int j : order) {
              at += rng() % 4;
              (*displs)[j] = at;
              at += (*counts)[j];
            }
            *end = at + rng() % 3;
          }
        std::vector<chorus::PerRankCounts> all(p);
        for (int q = 0; q < p; ++q)
          all[q] = {sc[q].data(), sd[q].data(), rc[q].data(), rd[q].data()};
        INFO(p << " ranks, one GPU " << one_gpu << ", trial " << trial);
        REQUIRE(chorus::device_alltoallv_mismatch(all) == std::pair{-1, -1});
        // Memory: rank q's sendbuff holds q * 1000 + element; recvbuff starts at a marker.
        std::vector<std::vector<uint32_t>> send(p), recv(p);
        for (int q = 0; q < p; ++q) {
          for (size_t j = 0; j < send_end[q]; ++j) send[q].push_back(uint32_t(q * 1000 + j));
          recv[q].assign(recv_end[q], 0xdeadbeef);
        }
        for (int r = 0; r < p; ++r) {
          const std::vector<DeviceTask> tasks = chorus::plan_device_alltoallv(p, r, one_gpu, all);
          if (one_gpu && r != 0) REQUIRE(tasks.empty());
          for (const DeviceTask& t : tasks) {
            REQUIRE(!t.reduce);
            REQUIRE(t.in.size() == 1);
            REQUIRE(t.out.size() == 1);
            REQUIRE(!t.in[0].recv);
            REQUIRE(t.out[0].recv);
            REQUIRE((one_gpu || t.out[0].rank == r));  // own output only
            REQUIRE(t.count > 0);
            const BufRef &in = t.in[0], &out = t.out[0];
            REQUIRE(in.elem + t.count <= send_end[in.rank]);
            REQUIRE(out.elem + t.count <= recv_end[out.rank]);
            std::copy_n(send[in.rank].begin() + long(in.elem), t.count,
                        recv[out.rank].begin() + long(out.elem));
          }
        }
        for (int d = 0; d < p; ++d) {
          std::vector<uint32_t> want(recv_end[d], 0xdeadbeef);
          for (int q = 0; q < p; ++q)
            for (size_t j = 0; j < rc[d][q]; ++j)
              want[rd[d][q] + j] = uint32_t(q * 1000 + sd[q][d] + j);
          REQUIRE(recv[d] == want);
          ++checked;
        }
      }
  CHECK(checked == 2 * 20 * 21);
  // A pair that disagrees: rank 1 sends 3 to rank 0, which expects 2.
  std::vector<size_t> s0{1, 2}, s1{3, 4}, r0{1, 2}, r1{2, 4}, z{0, 0};
  const chorus::PerRankCounts bad[] = {{s0.data(), z.data(), r0.data(), z.data()},
                                       {s1.data(), z.data(), r1.data(), z.data()}};
  CHECK(chorus::device_alltoallv_mismatch(bad) == std::pair{1, 0});
  // Arrays out of range (as a corrupt peer's would arrive): named by rank, the limit exact.
  CHECK(chorus::device_alltoallv_out_of_range(bad, 5) == -1);
  CHECK(chorus::device_alltoallv_out_of_range(bad, 3) == 1);  // rank 1 sends 4
  std::vector<size_t> far{0, SIZE_MAX - 1};
  const chorus::PerRankCounts wrap[] = {{s0.data(), z.data(), r0.data(), far.data()},
                                        {s1.data(), z.data(), r1.data(), z.data()}};
  CHECK(chorus::device_alltoallv_out_of_range(wrap, size_t(1) << 40) == 0);  // 2 + (2^64 - 2)
}

TEST_CASE("device meetings: every wait has its signal; on one GPU only the leader and each peer",
          "[device]") {
  for (int p = 1; p <= 6; ++p)
    for (int leader = 0; leader < p; ++leader)
      for (bool star : {false, true})
        for (bool barrier : {false, true}) {
          INFO(p << " ranks, leader " << leader << ", star " << star << ", barrier " << barrier);
          for (int r = 0; r < p; ++r) {
            int ops = 0;
            for (int q = 0; q < p; ++q) {
              if (q == r) continue;
              const chorus::DeviceMeet mine = chorus::device_meet(r, q, leader, star, barrier),
                                       theirs = chorus::device_meet(q, r, leader, star, barrier);
              // A wait that no signal ends would hang the stream; a signal that no one waits for
              // would let the signalling rank's writes race (its peer goes on unordered).
              REQUIRE(mine.wait_ready == theirs.signal_ready);
              REQUIRE(mine.wait_done == theirs.signal_done);
              if (barrier) REQUIRE_FALSE((mine.signal_done || mine.wait_done));
              // Whoever writes or reads a rank's buffers (the leader on one GPU, everyone
              // otherwise) waits for its ready, and it waits for their done.
              const bool touches = !star || barrier || r == leader;
              if (!barrier) REQUIRE(mine.wait_ready == touches);
              if (!barrier && (!star || q == leader)) REQUIRE(mine.wait_done);
              ops += mine.signal_ready + mine.wait_ready + mine.signal_done + mine.wait_done;
            }
            if (star && !barrier) REQUIRE(ops == (r == leader ? 2 * (p - 1) : 2));
            if (!star || barrier) REQUIRE(ops == (barrier ? 2 : 4) * (p - 1));
          }
        }
}
