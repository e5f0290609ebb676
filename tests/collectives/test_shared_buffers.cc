// The all-reduce of chorusMemAlloc buffers (collectives/shared_allreduce.cc): bit for bit the
// rank-order fold of every rank's input (kernels::reduce_fold, the deterministic mode's result)
// for every type x op, in and out of place, at an offset, on 2-4 ranks; buffers freed and
// allocated again (a stale mapping would give the old numbers, and the peers' freed buffers must
// not stay mapped); a mapping held while its owner frees it stays until released; a rank that
// cannot map its peers' buffers (test hook) turns the path off on every rank and the results stay
// right; a rank that passes ordinary buffers while the others pass chorusMemAlloc ones fails every
// rank at once; chorusMemAlloc/chorusMemFree refuse bad arguments by name.
#include <catch2/catch.hpp>

#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "chorus/chorus.h"
#include "collectives/op.h"
#include "harness.h"
#include "kernels/cpu/reduce.h"
#include "transport/shm/shared_mem.h"
#include "typed_values.h"

using chorus::test::contains;
using chorus::test::run_ranks;
using chorus::test::RunOptions;
namespace ct = chorus::test;

namespace {

// Rank r's element i: eighths, so every type holds it exactly or by its own rounding.
double input(int rank, size_t i) {
  return double(int((rank * 7919 + i * 31) % 1000) - 500) / 8.0;
}

// Element i of rank `rank`'s input into buf: floats take the eighths, integers their integer
// part, wrapped to the type (a negative double into an unsigned type would be undefined).
void put_input(chorusDataType_t t, void* buf, size_t i, int rank) {
  const double v = input(rank, i);
  if (t == chorusFloat32 || t == chorusFloat64 || t == chorusFloat16 || t == chorusBfloat16)
    ct::put(t, buf, i, v);
  else
    ct::put(t, buf, i, static_cast<int64_t>(v));
}

int fail_with(const std::string& what) {
  std::fprintf(stderr, "FAIL %s\n", what.c_str());
  return 1;
}

// Every rank's input of type t, elements [0, most): built once per type. Building each rank's
// input element by element for every call was most of this suite's time under the sanitizers.
struct Inputs {
  chorusDataType_t t;
  std::vector<std::vector<char>> of;  // of[q]: rank q's input

  Inputs(chorusDataType_t type, int p, size_t most)
      : t(type), of(p, std::vector<char>(most * ct::esize(type))) {
    for (int q = 0; q < p; ++q)
      for (size_t i = 0; i < most; ++i) put_input(t, of[q].data(), i, q);
  }
};

// One all-reduce of `count` elements at element offset `off` of send/recv (chorusMemAlloc
// buffers, or one buffer in place), checked bit for bit against the rank-order fold.
int one(chorusComm_t comm, int rank, const Inputs& in, chorusRedOp_t op, size_t count, size_t off,
        char* send, char* recv) {
  const chorusDataType_t t = in.t;
  const int p = static_cast<int>(in.of.size());
  const size_t es = ct::esize(t);
  char* s = send + off * es;
  char* r = recv + off * es;
  std::memcpy(s, in.of[rank].data(), count * es);
  if (chorusAllReduce(s, r, count, t, op, comm, nullptr) != chorusSuccess)
    return fail_with(std::string("all-reduce: ") + chorusGetLastError(comm));
  std::vector<const void*> ins(p);
  for (int q = 0; q < p; ++q) ins[q] = in.of[q].data();
  std::vector<char> want(count * es);
  chorus::kernels::reduce_fold(*chorus::kernel_dtype(t), *chorus::kernel_redop(op), ins.data(), p,
                               want.data(), count, op == chorusAvg ? p : 0);
  if (std::memcmp(want.data(), r, count * es) != 0)
    return fail_with(std::string(ct::kTypeNames[t]) + " " + ct::kOpNames[op] + " count " +
                     std::to_string(count) + " offset " + std::to_string(off) +
                     (s == r ? " in place" : "") + ": not the rank-order fold");
  return 0;
}

RunOptions opts() {
  RunOptions o;
  o.env["CHORUS_TIMEOUT"] = "30";
  o.env["CHORUS_TRANSPORT"] = "shm";
  o.limit_seconds = 120;
  return o;
}

// How many chorusMemAlloc allocations this process has mapped, its own and its peers' (memfd
// "chorus-buffer"), from the kernel's list of its mappings.
int buffers_mapped() {
  std::ifstream maps("/proc/self/maps");
  int n = 0;
  for (std::string line; std::getline(maps, line);) n += contains(line, "memfd:chorus-buffer");
  return n;
}

void require_all_ok(const std::vector<chorus::test::RankResult>& res) {
  for (size_t r = 0; r < res.size(); ++r) {
    INFO("rank " << r << ":\n" << res[r].output);
    CHECK(res[r].exit_code == 0);
  }
}

}  // namespace

TEST_CASE("chorusMemAlloc buffers: every type x op, in and out of place, bit for bit", "[shared]") {
  const int p = GENERATE(2, 3, 4);
  INFO(p << " ranks");
  auto res = run_ranks(
      p,
      [p](int rank) {
        chorusComm_t comm;
        if (chorusCommInitFromEnv(&comm) != chorusSuccess)
          return fail_with(chorusGetLastError(nullptr));
        const size_t most = (size_t(1) << 17) + 64;
        void *send = nullptr, *recv = nullptr;
        if (chorusMemAlloc(&send, most * 8) != chorusSuccess ||
            chorusMemAlloc(&recv, most * 8) != chorusSuccess)
          return fail_with(chorusGetLastError(nullptr));
        char* s = static_cast<char*>(send);
        char* r = static_cast<char*>(recv);
        for (chorusDataType_t t : ct::kTypes) {
          const Inputs in(t, p, size_t(1) << 17);
          for (chorusRedOp_t op : ct::kOps)
            for (size_t count : {(size_t(64) << 10) / ct::esize(t) + 5, size_t(1) << 17}) {
              if (one(comm, rank, in, op, count, 0, s, r) ||
                  one(comm, rank, in, op, count, 1, s, s))
                return 1;
            }
        }
        chorusMemFree(send);
        chorusMemFree(recv);
        chorusCommDestroy(comm);
        return 0;
      },
      opts());
  require_all_ok(res);
}

TEST_CASE("chorusMemAlloc buffers: slices large enough for streaming stores", "[shared]") {
  auto res = run_ranks(
      2,
      [](int rank) {
        chorusComm_t comm;
        if (chorusCommInitFromEnv(&comm) != chorusSuccess)
          return fail_with(chorusGetLastError(nullptr));
        const size_t count = (size_t(10) << 20) / 4 + 3;  // a 5 MiB slice per rank
        void *send = nullptr, *recv = nullptr;
        if (chorusMemAlloc(&send, count * 4) != chorusSuccess ||
            chorusMemAlloc(&recv, count * 4) != chorusSuccess)
          return fail_with(chorusGetLastError(nullptr));
        const Inputs in(chorusFloat32, 2, count);
        for (chorusRedOp_t op : {chorusSum, chorusMax})
          if (one(comm, rank, in, op, count, 0, static_cast<char*>(send), static_cast<char*>(recv)))
            return 1;
        chorusCommDestroy(comm);
        return 0;
      },
      opts());
  require_all_ok(res);
}

TEST_CASE("chorusMemAlloc buffers freed and allocated again: no stale mapping", "[shared]") {
  auto res = run_ranks(
      3,
      [](int rank) {
        chorusComm_t comm;
        if (chorusCommInitFromEnv(&comm) != chorusSuccess)
          return fail_with(chorusGetLastError(nullptr));
        const size_t count = 40000;  // f64: 320 000 bytes
        for (int round = 0; round < 12; ++round) {
          void* buf = nullptr;
          if (chorusMemAlloc(&buf, count * 8) != chorusSuccess)
            return fail_with(chorusGetLastError(nullptr));
          double* d = static_cast<double*>(buf);
          for (size_t i = 0; i < count; ++i) d[i] = double(round * 100 + rank + i % 7);
          if (chorusAllReduce(d, d, count, chorusFloat64, chorusSum, comm, nullptr) !=
              chorusSuccess)
            return fail_with(chorusGetLastError(comm));
          for (size_t i = 0; i < count; ++i)
            if (d[i] != double(3 * (round * 100 + i % 7) + 3))
              return fail_with("round " + std::to_string(round) + ": element " + std::to_string(i) +
                               " is " + std::to_string(d[i]));
          chorusMemFree(buf);
          // Its own buffer is freed and each peer's is freed or about to be: the peers' buffers
          // of the rounds before this one are unmapped (at this round's new mappings).
          const int mapped = buffers_mapped();
          if (round > 0 && mapped > 2)
            return fail_with("round " + std::to_string(round) + ": " + std::to_string(mapped) +
                             " chorusMemAlloc buffers still mapped, at most 2 (this round's "
                             "peers') expected");
        }
        chorusCommDestroy(comm);
        return 0;
      },
      opts());
  require_all_ok(res);
}

TEST_CASE("a peer's buffer held while its owner frees it stays mapped until released", "[shared]") {
  namespace tr = chorus::transport;
  // This process stands for both sides: the owner (shared_alloc/free) and the peer mapping it
  // through /proc (map_shared).
  const int before = tr::shared_peer_mappings();
  chorus::Result<void*> a = tr::shared_alloc(1 << 16);
  REQUIRE(a.is_ok());
  const tr::SharedRef ra = *tr::find_shared(*a, 1 << 16);
  chorus::Result<char*> ma = tr::map_shared(ra, 1 << 16);
  REQUIRE(ma.is_ok());
  ma.value()[5] = 42;
  CHECK(static_cast<char*>(*a)[5] == 42);  // the same memory
  REQUIRE(tr::shared_free(*a).is_ok());
  chorus::Result<void*> b = tr::shared_alloc(1 << 16);
  REQUIRE(b.is_ok());
  const tr::SharedRef rb = *tr::find_shared(*b, 1 << 16);
  REQUIRE(tr::map_shared(rb, 1 << 16).is_ok());
  CHECK(tr::shared_peer_mappings() == before + 2);  // a's is held: still mapped
  CHECK(ma.value()[5] == 42);
  tr::release_shared(ra);
  chorus::Result<void*> c = tr::shared_alloc(1 << 16);
  REQUIRE(c.is_ok());
  const tr::SharedRef rc = *tr::find_shared(*c, 1 << 16);
  REQUIRE(tr::map_shared(rc, 1 << 16).is_ok());
  CHECK(tr::shared_peer_mappings() == before + 2);  // a's went; b's (held, alive) and c's stay
  tr::release_shared(rb);
  tr::release_shared(rc);
  chorus::Result<void*> d = tr::shared_alloc(1 << 16);
  REQUIRE(d.is_ok());
  const tr::SharedRef rd = *tr::find_shared(*d, 1 << 16);
  REQUIRE(tr::map_shared(rd, 1 << 16).is_ok());
  CHECK(tr::shared_peer_mappings() == before + 3);  // b and c are still their owner's
  tr::release_shared(rd);
  for (void* p : {*b, *c, *d}) REQUIRE(tr::shared_free(p).is_ok());
}

TEST_CASE("a rank that cannot map its peers' buffers turns the path off everywhere; results right",
          "[shared]") {
  RunOptions o = opts();
  o.env["CHORUS_DEBUG"] = "INFO";
  auto res = run_ranks(
      3,
      [](int rank) {
        if (rank == 1) setenv("CHORUS_TEST_SHARED_MAP_FAIL", "1", 1);
        chorusComm_t comm;
        if (chorusCommInitFromEnv(&comm) != chorusSuccess)
          return fail_with(chorusGetLastError(nullptr));
        void *send = nullptr, *recv = nullptr;
        const size_t count = 50000;
        chorusMemAlloc(&send, count * 4);
        chorusMemAlloc(&recv, count * 4);
        const Inputs in(chorusFloat32, 3, count);
        for (int k = 0; k < 3; ++k)
          if (one(comm, rank, in, chorusSum, count, 0, static_cast<char*>(send),
                  static_cast<char*>(recv)))
            return 1;
        chorusCommDestroy(comm);
        return 0;
      },
      o);
  require_all_ok(res);
  CHECK(contains(res[1].output, "rank 1: chorusMemAlloc buffers: cannot map rank 0's buffers"));
  CHECK(contains(res[1].output, "refused by the test hook"));
  CHECK(contains(res[0].output, "rank 0: rank 1 cannot map chorusMemAlloc buffers"));
}

TEST_CASE("one rank with ordinary buffers among chorusMemAlloc ones: every rank fails at once",
          "[shared]") {
  auto res = run_ranks(
      3,
      [](int rank) {
        chorusComm_t comm;
        if (chorusCommInitFromEnv(&comm) != chorusSuccess)
          return fail_with(chorusGetLastError(nullptr));
        float one_float = 1;  // every rank past creation before the mismatch
        if (chorusAllReduce(&one_float, &one_float, 1, chorusFloat32, chorusSum, comm, nullptr) !=
            chorusSuccess)
          return fail_with(chorusGetLastError(comm));
        const size_t count = 50000;
        std::vector<float> ordinary(count, 1.0f);
        void* shared = nullptr;
        chorusMemAlloc(&shared, count * 4);
        float* buf = rank == 2 ? ordinary.data() : static_cast<float*>(shared);
        chorusResult_t rc =
            chorusAllReduce(buf, buf, count, chorusFloat32, chorusSum, comm, nullptr);
        std::string why = chorusGetLastError(comm);
        std::fprintf(stderr, "rank %d: %s\n", rank, why.c_str());
        if (rc == chorusSuccess || !contains(why, "rank 2")) return fail_with("not named: " + why);
        chorusCommDestroy(comm);
        return 0;
      },
      opts());
  require_all_ok(res);
  for (const auto& r : res) CHECK(r.seconds < 20);
}

TEST_CASE("chorusMemAlloc and chorusMemFree refuse bad arguments by name", "[shared]") {
  void* p = nullptr;
  CHECK(chorusMemAlloc(nullptr, 64) == chorusInvalidArgument);
  CHECK(std::string(chorusGetLastError(nullptr)) == "chorusMemAlloc: ptr is NULL");
  CHECK(chorusMemAlloc(&p, 0) == chorusInvalidArgument);
  CHECK(std::string(chorusGetLastError(nullptr)) == "chorusMemAlloc: size is 0");
  REQUIRE(chorusMemAlloc(&p, 100) == chorusSuccess);
  CHECK(reinterpret_cast<uintptr_t>(p) % 4096 == 0);
  CHECK(static_cast<char*>(p)[99] == 0);
  int on_stack = 0;
  CHECK(chorusMemFree(&on_stack) == chorusInvalidArgument);
  CHECK(contains(chorusGetLastError(nullptr), "was not returned by chorusMemAlloc"));
  CHECK(chorusMemFree(p) == chorusSuccess);
  CHECK(chorusMemFree(p) == chorusInvalidArgument);  // twice
  CHECK(chorusMemFree(nullptr) == chorusSuccess);
}
