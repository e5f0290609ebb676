// Gather, scatter, all-to-all and all-to-all-v on real processes: every byte of every block
// against what its rank sent, all ten types (by their sizes), every root, 1 to 4 ranks, shm and
// tcp, counts 0, 1, a prime and blocks larger than a 256 KiB staging slot; blocking and chorusI*
// forms, in place and out of place; uneven all-to-all-v with zero-count pairs and displacements
// in reverse order with gaps (left untouched). Small shm rings (two 4 KiB slots) keep every
// link full, so a schedule that could deadlock would.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include "chorus/chorus.hpp"
#include "harness.h"
#include "typed_values.h"

using chorus::test::esize;
using chorus::test::kTypeNames;
using chorus::test::kTypes;
using chorus::test::run_ranks;
using chorus::test::RunOptions;

namespace {

// Byte k of the block rank `src` sends rank `dst` (gather: dst is the root).
unsigned char pattern(int src, int dst, size_t k) {
  return static_cast<unsigned char>((src * 31 + dst * 17 + k * 7 + (k >> 8) + 1) & 0xff);
}
void fill(char* p, int src, int dst, size_t bytes) {
  for (size_t k = 0; k < bytes; ++k) p[k] = static_cast<char>(pattern(src, dst, k));
}
// The first byte of p that is not the block src sent dst, or -1.
long first_wrong(const char* p, int src, int dst, size_t bytes) {
  for (size_t k = 0; k < bytes; ++k)
    if (static_cast<unsigned char>(p[k]) != pattern(src, dst, k)) return static_cast<long>(k);
  return -1;
}
constexpr char kUntouched = static_cast<char>(0xEE);
bool untouched(const char* p, size_t bytes) {
  for (size_t k = 0; k < bytes; ++k)
    if (p[k] != kUntouched) return false;
  return true;
}

#define FAIL_RANK(...)                 \
  do {                                 \
    std::fprintf(stderr, __VA_ARGS__); \
    std::fprintf(stderr, "\n");        \
    return 1;                          \
  } while (0)

constexpr size_t kGuard = 16;  // bytes after every receive buffer that must stay untouched

int check_gather(chorus::Communicator& comm, chorusDataType_t t, size_t count, int root,
                 bool in_place, bool async) {
  const int n = comm.size(), r = comm.rank();
  const size_t block = count * esize(t);
  std::vector<char> send(block), recv(n * block + kGuard, kUntouched);
  fill(send.data(), r, root, block);
  const char* src = send.data();
  if (in_place && r == root) {
    if (block > 0) std::memcpy(recv.data() + root * block, send.data(), block);
    src = recv.data() + root * block;
  }
  if (async)  // off the root recvbuff is ignored: NULL will do
    comm.igather(src, r == root ? recv.data() : nullptr, count, t, root).wait();
  else
    comm.gather(src, recv.data(), count, t, root);
  if (r != root) {
    if (!untouched(recv.data(), recv.size())) FAIL_RANK("gather: wrote a non-root's recvbuff");
    return 0;
  }
  for (int q = 0; q < n; ++q)
    if (long k = first_wrong(recv.data() + q * block, q, root, block); k >= 0)
      FAIL_RANK("gather %s count %zu root %d%s%s: block %d byte %ld wrong", kTypeNames[t], count,
                root, in_place ? " in place" : "", async ? " async" : "", q, k);
  if (!untouched(recv.data() + n * block, kGuard)) FAIL_RANK("gather wrote past the end");
  return 0;
}

int check_scatter(chorus::Communicator& comm, chorusDataType_t t, size_t count, int root,
                  bool in_place, bool async) {
  const int n = comm.size(), r = comm.rank();
  const size_t block = count * esize(t);
  std::vector<char> send(n * block), recv(block + kGuard, kUntouched);
  if (r == root)
    for (int j = 0; j < n; ++j) fill(send.data() + j * block, root, j, block);
  char* dst = in_place && r == root ? send.data() + root * block : recv.data();
  if (async)  // off the root sendbuff is ignored
    comm.iscatter(r == root ? send.data() : nullptr, dst, count, t, root).wait();
  else
    comm.scatter(send.data(), dst, count, t, root);
  if (long k = first_wrong(dst, root, r, block); k >= 0)
    FAIL_RANK("scatter %s count %zu root %d%s%s: byte %ld wrong", kTypeNames[t], count, root,
              in_place ? " in place" : "", async ? " async" : "", k);
  if (!untouched(recv.data() + (dst == recv.data() ? block : 0), kGuard))
    FAIL_RANK("scatter wrote past the end");
  return 0;
}

int check_all_to_all(chorus::Communicator& comm, chorusDataType_t t, size_t count, bool in_place,
                     bool async) {
  const int n = comm.size(), r = comm.rank();
  const size_t block = count * esize(t);
  std::vector<char> send(n * block), recv(n * block + kGuard, kUntouched);
  char* src = in_place ? recv.data() : send.data();
  for (int j = 0; j < n; ++j) fill(src + j * block, r, j, block);
  if (async)
    comm.iall_to_all(src, recv.data(), count, t).wait();
  else
    comm.all_to_all(src, recv.data(), count, t);
  for (int q = 0; q < n; ++q)
    if (long k = first_wrong(recv.data() + q * block, q, r, block); k >= 0)
      FAIL_RANK("all_to_all %s count %zu%s%s: block %d byte %ld wrong", kTypeNames[t], count,
                in_place ? " in place" : "", async ? " async" : "", q, k);
  if (!untouched(recv.data() + n * block, kGuard)) FAIL_RANK("all_to_all wrote past the end");
  return 0;
}

// All-to-all-v's shape: rank src sends rank dst ((src + 2 dst) mod 3) * unit elements (so some
// pairs send nothing); a rank's send blocks lie in reverse rank order with a one-element gap
// before each, its receive blocks in rank order with two-element gaps.
struct Shape {
  std::vector<size_t> scounts, sdispls, rcounts, rdispls;
  size_t send_end = 0, recv_end = 0;  // elements
};
size_t pair_count(int src, int dst, size_t unit) {
  return static_cast<size_t>((src + 2 * dst) % 3) * unit;
}
Shape shape(int r, int n, size_t unit) {
  Shape s;
  s.scounts.resize(n), s.sdispls.resize(n), s.rcounts.resize(n), s.rdispls.resize(n);
  for (int j = n - 1; j >= 0; --j) {
    s.sdispls[j] = s.send_end + 1;
    s.scounts[j] = pair_count(r, j, unit);
    s.send_end = s.sdispls[j] + s.scounts[j];
  }
  for (int i = 0; i < n; ++i) {
    s.rdispls[i] = s.recv_end + 2;
    s.rcounts[i] = pair_count(i, r, unit);
    s.recv_end = s.rdispls[i] + s.rcounts[i];
  }
  return s;
}

// gated: the arrays are the call's to copy -- scribbled over and freed right after the I-call
// returns, while the operation still waits behind a barrier the other ranks join 50 ms late.
int check_all_to_all_v(chorus::Communicator& comm, chorusDataType_t t, size_t unit, bool in_place,
                       bool async, bool gated = false) {
  const int n = comm.size(), r = comm.rank();
  const size_t es = esize(t);
  Shape s = shape(r, n, unit);
  std::vector<char> send(s.send_end * es), recv(std::max(s.send_end, s.recv_end) * es + kGuard);
  std::fill(recv.begin(), recv.end(), kUntouched);
  char* src = in_place ? recv.data() : send.data();
  for (int j = 0; j < n; ++j) fill(src + s.sdispls[j] * es, r, j, s.scounts[j] * es);
  if (gated) {
    if (r != 0) usleep(50000);
    chorus::Work gate = comm.ibarrier();
    Shape copy = s;
    chorus::Work w = comm.iall_to_all_v(src, copy.scounts.data(), copy.sdispls.data(), recv.data(),
                                        copy.rcounts.data(), copy.rdispls.data(), t);
    for (auto* v : {&copy.scounts, &copy.sdispls, &copy.rcounts, &copy.rdispls})
      std::fill(v->begin(), v->end(), size_t{1} << 60);
    copy = Shape{};
    gate.wait();
    w.wait();
  } else if (async) {
    comm.iall_to_all_v(src, s.scounts.data(), s.sdispls.data(), recv.data(), s.rcounts.data(),
                       s.rdispls.data(), t)
        .wait();
  } else {
    comm.all_to_all_v(src, s.scounts.data(), s.sdispls.data(), recv.data(), s.rcounts.data(),
                      s.rdispls.data(), t);
  }
  for (int i = 0; i < n; ++i)
    if (long k = first_wrong(recv.data() + s.rdispls[i] * es, i, r, s.rcounts[i] * es); k >= 0)
      FAIL_RANK("all_to_all_v %s unit %zu%s%s: block %d byte %ld wrong", kTypeNames[t], unit,
                in_place ? " in place" : "", async ? " async" : "", i, k);
  if (in_place) return 0;  // the gaps hold what the input left there
  size_t at = 0;
  for (int i = 0; i < n; ++i) {
    if (!untouched(recv.data() + at * es, (s.rdispls[i] - at) * es))
      FAIL_RANK("all_to_all_v %s unit %zu: a gap before block %d was written", kTypeNames[t], unit,
                i);
    at = s.rdispls[i] + s.rcounts[i];
  }
  if (!untouched(recv.data() + at * es, recv.size() - at * es))
    FAIL_RANK("all_to_all_v wrote past the end");
  return 0;
}

// Every op: the ten types at counts 0, 1 and 13, every root, every form; then blocks larger
// than a slot for two types.
int run_matrix(int) {
  auto comm = chorus::Communicator::from_env();
  const int n = comm.size();
  int form = 0;  // cycles through (in place, async) so that each op meets all four
  auto next = [&form](bool* ip, bool* async) {
    *ip = form & 1;
    *async = form & 2;
    form = (form + 1) % 4;
  };
  for (auto t : kTypes)
    for (size_t count : {size_t{0}, size_t{1}, size_t{13}}) {
      bool ip, async;
      for (int root = 0; root < n; ++root) {
        next(&ip, &async);
        if (int rc = check_gather(comm, t, count, root, ip, async)) return rc;
        if (int rc = check_scatter(comm, t, count, root, !ip, async)) return rc;
      }
      for (int i = 0; i < 2; ++i) {
        next(&ip, &async);
        if (int rc = check_all_to_all(comm, t, count, ip, async)) return rc;
        if (int rc = check_all_to_all_v(comm, t, count, ip, async)) return rc;
      }
    }
  const size_t big = 70001;  // 280 KB of f32 per block, 140 KB of bf16 (x2 in all-to-all-v)
  for (auto t : {chorusFloat32, chorusBfloat16})
    for (bool ip : {false, true}) {
      if (int rc = check_gather(comm, t, big, n - 1, ip, ip)) return rc;
      if (int rc = check_scatter(comm, t, big, 0, ip, !ip)) return rc;
      if (int rc = check_all_to_all(comm, t, big, ip, !ip)) return rc;
      if (int rc = check_all_to_all_v(comm, t, big, ip, ip)) return rc;
    }
  if (int rc = check_all_to_all_v(comm, chorusInt64, 5, false, true, true)) return rc;
  comm.barrier();
  return 0;
}

void require_all_ok(const std::vector<chorus::test::RankResult>& res) {
  for (size_t r = 0; r < res.size(); ++r) {
    INFO("rank " << r << " output:\n" << res[r].output);
    REQUIRE(res[r].exit_code == 0);
  }
}

}  // namespace

TEST_CASE("gather, scatter, all-to-all and all-to-all-v deliver every block, 1 to 4 ranks",
          "[gather][scatter][all_to_all]") {
  auto transport = GENERATE(std::string("shm"), std::string("tcp"), std::string("ib"));
  for (int n = 1; n <= 4; ++n) {
    DYNAMIC_SECTION(transport << " with " << n << " ranks") {
      RunOptions o;
      o.env["CHORUS_TRANSPORT"] = transport;
      if (transport == "ib") o.env["CHORUS_IB_EMULATE"] = "emu0";
      o.env["CHORUS_TIMEOUT"] = "60";
      o.limit_seconds = 120;
      require_all_ok(run_ranks(n, run_matrix, o));
    }
  }
}

TEST_CASE("all-to-all never deadlocks when every shm ring is full", "[all_to_all]") {
  for (int n : {2, 3, 4}) {
    DYNAMIC_SECTION(n << " ranks, two 4 KiB slots per ring") {
      RunOptions o;
      o.env = {{"CHORUS_TRANSPORT", "shm"},
               {"CHORUS_SHM_SLOT_BYTES", "4096"},
               {"CHORUS_SHM_SLOTS", "2"},
               {"CHORUS_TIMEOUT", "30"}};
      o.limit_seconds = 60;
      require_all_ok(run_ranks(
          n,
          [](int) {
            auto comm = chorus::Communicator::from_env();
            for (bool ip : {false, true}) {
              if (int rc = check_all_to_all(comm, chorusFloat64, 40009, ip, false)) return rc;
              if (int rc = check_all_to_all_v(comm, chorusInt32, 30011, ip, false)) return rc;
              if (int rc = check_gather(comm, chorusUint8, 100003, 1 % comm.size(), ip, false))
                return rc;
              if (int rc = check_scatter(comm, chorusUint8, 100003, 0, ip, false)) return rc;
            }
            comm.barrier();
            return 0;
          },
          o));
    }
  }
}
