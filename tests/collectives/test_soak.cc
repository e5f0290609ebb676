// A randomised soak: 2,000+ operations of random kind, size, type (all ten), op and algorithm,
// every result verified; and mismatch detection across the new operations.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#ifndef __has_feature
#define __has_feature(x) 0
#endif
#if defined(__SANITIZE_ADDRESS__) || __has_feature(address_sanitizer)
#include <sanitizer/asan_interface.h>
#define CHORUS_TEST_ASAN 1
#endif

#include "chorus/chorus.hpp"
#include "harness.h"
#include "kernels/cpu/half.h"
#include "typed_values.h"

using chorus::test::contains;
using chorus::test::esize;
using chorus::test::kTypeNames;
using chorus::test::kTypes;
using chorus::test::put;
using chorus::test::run_ranks;

namespace {

bool is_float(chorusDataType_t t) {
  return t == chorusFloat32 || t == chorusFloat64 || t == chorusFloat16 || t == chorusBfloat16;
}

// Every element travels as one of the ten types. Integers take values that overflow the narrow
// ones (so the reference wraps them like the kernels must); floats take small integers, exact in
// every float type, so any order of accumulation gives the same bits.
int64_t value(chorusDataType_t t, int rank, size_t i, int k) {
  if (is_float(t)) return static_cast<int64_t>(((rank + 1) * 7 + i % 13 + k) % 61) - 30;
  return (rank + 1) * 1000 + static_cast<int64_t>(i % 977) + k;
}

// The value as the type holds it (after the wrap), for min/max.
int64_t held(chorusDataType_t t, int64_t v) {
  switch (t) {
    case chorusInt8:
      return static_cast<int8_t>(v);
    case chorusUint8:
      return static_cast<uint8_t>(v);
    case chorusInt32:
      return static_cast<int32_t>(v);
    case chorusUint32:
      return static_cast<uint32_t>(v);
    default:
      return v;
  }
}

// The reduction of every rank's value at i, as it must arrive (wrapped by put()).
int64_t reduced(chorusDataType_t t, chorusRedOp_t op, int n, size_t i, int k) {
  int64_t acc = held(t, value(t, 0, i, k));
  for (int q = 1; q < n; ++q) {
    const int64_t v = held(t, value(t, q, i, k));
    if (op == chorusSum) acc += v;
    if (op == chorusMin) acc = std::min(acc, v);
    if (op == chorusMax) acc = std::max(acc, v);
  }
  return acc;
}

// Index of the first element of got that differs from want(i) stored in type t, or -1.
template <class F>
long first_wrong(chorusDataType_t t, const std::vector<char>& got, size_t count, F&& want) {
  std::vector<char> w(esize(t));
  for (size_t i = 0; i < count; ++i) {
    put(t, w.data(), 0, want(i));
    if (std::memcmp(got.data() + i * esize(t), w.data(), esize(t)) != 0)
      return static_cast<long>(i);
  }
  return -1;
}

// The calls' buffers are of the largest size; under ASan all past this call's `used` bytes is
// poisoned, so that a read or write past them is caught as with buffers of the call's own size.
void fit(std::vector<char>& v, size_t used) {
#ifdef CHORUS_TEST_ASAN
  ASAN_UNPOISON_MEMORY_REGION(v.data(), v.size());
  ASAN_POISON_MEMORY_REGION(v.data() + used, v.size() - used);
#else
  (void)v;
  (void)used;
#endif
}

int soak(int rank, int ops, unsigned seed) {
  auto world = chorus::Communicator::from_env();
  const int n = world.size();
  std::mt19937 rng(seed);  // same seed on every rank: the same sequence of calls
  // One communicator per algorithm (knobs are read at creation), small pieces on some.
  const char* algos[] = {"ring", "tree", "rd"};
  std::vector<chorus::Communicator> comms;
  for (int a = 0; a < 6; ++a) {
    setenv("CHORUS_ALGO", algos[a % 3], 1);
    if (a >= 3) setenv("CHORUS_CHUNK_BYTES", "8K", 1);
    comms.push_back(world.split(0, rank));
  }
  unsetenv("CHORUS_CHUNK_BYTES");
  const chorusRedOp_t ops_mix[] = {chorusSum, chorusMin, chorusMax};
  // One pair of buffers for every call, of the largest size: a new multi-megabyte pair per call
  // had the sanitizers clear their shadow of it each time (most of this test's time under TSan).
  const size_t most = 70000;  // elements per rank in a call, at most
  std::vector<char> in(most * n * 8), out(in.size());
  for (int k = 0; k < ops; ++k) {
    int kind = static_cast<int>(rng() % 5);
    size_t count = rng() % 4 == 0 ? rng() % most : rng() % 300;
    chorus::Communicator& comm = comms[rng() % comms.size()];
    int root = static_cast<int>(rng() % n);
    const chorusDataType_t t = kTypes[rng() % 10];
    const chorusRedOp_t op = ops_mix[rng() % 3];
    const size_t es = esize(t);
    fit(in, count * n * es);
    fit(out, count * n * es);
    std::fill(out.begin(), out.begin() + count * n * es, char(-1));
    for (size_t i = 0; i < count * n; ++i) put(t, in.data(), i, value(t, rank, i, k));
    long bad = -1;
    const char* what = "";
    if (kind == 0) {
      what = "all_reduce";
      comm.all_reduce(in.data(), out.data(), count, t, op);
      bad = first_wrong(t, out, count, [&](size_t i) { return reduced(t, op, n, i, k); });
    } else if (kind == 1) {
      what = "reduce";
      comm.reduce(in.data(), out.data(), count, t, op, root);
      if (rank == root)
        bad = first_wrong(t, out, count, [&](size_t i) { return reduced(t, op, n, i, k); });
    } else if (kind == 2) {
      what = "all_gather";
      comm.all_gather(in.data(), out.data(), count, t);
      bad = first_wrong(t, out, count * n, [&](size_t i) {
        return value(t, static_cast<int>(i / count), i % count, k);
      });
    } else if (kind == 3) {
      what = "reduce_scatter";
      comm.reduce_scatter(in.data(), out.data(), count, t, op);
      bad = first_wrong(t, out, count,
                        [&](size_t i) { return reduced(t, op, n, rank * count + i, k); });
    } else {
      what = "broadcast";
      if (rank == root) std::copy(in.begin(), in.begin() + count * es, out.begin());
      comm.broadcast(out.data(), count, t, root);
      bad = first_wrong(t, out, count, [&](size_t i) { return value(t, root, i, k); });
    }
    if (bad >= 0) {
      std::fprintf(stderr, "op %d %s count %zu %s op %d: element %ld wrong\n", k, what, count,
                   kTypeNames[t], op, bad);
      return 1;
    }
  }
  fit(in, in.size());
  fit(out, out.size());
  return 0;
}

}  // namespace

TEST_CASE("a randomised soak of 2,000+ verified operations", "[soak]") {
  chorus::test::RunOptions o;
  o.limit_seconds = 240;
  auto res = run_ranks(
      3, [](int rank) { return soak(rank, 1200, 17); }, o);
  for (auto& r : res) {
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
  }
  o.env["CHORUS_TRANSPORT"] = "tcp";
  auto res2 = run_ranks(
      4, [](int rank) { return soak(rank, 900, 29); }, o);
  for (auto& r : res2) {
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
  }
}

TEST_CASE("all_gather on one rank vs reduce_scatter on another fails clearly on both",
          "[failure][mismatch]") {
  auto res = run_ranks(2, [](int rank) {
    auto comm = chorus::Communicator::from_env();
    std::vector<float> a(64), b(128);
    try {
      if (rank == 0)
        comm.all_gather(a.data(), b.data(), 64, chorusFloat32);
      else
        comm.reduce_scatter(b.data(), a.data(), 64, chorusFloat32, chorusSum);
      comm.barrier();
    } catch (const chorus::Error& e) {
      std::fprintf(stderr, "%s\n", e.what());
      return e.code() == chorusMismatch &&
                     contains(e.what(),
                              "all_gather #1 (count 64 f32, ring) on rank 0 vs reduce_scatter #1 "
                              "(count 64 f32, sum, ring) on rank 1")
                 ? 0
                 : 2;
    }
    return 3;
  });
  for (auto& r : res) {
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
  }
}

TEST_CASE("an all_reduce with a different op or algorithm on one rank fails clearly",
          "[failure][mismatch]") {
  auto res = run_ranks(3, [](int rank) {
    auto comm = chorus::Communicator::from_env();
    std::vector<double> a(100, 1.0);
    try {
      comm.all_reduce(a.data(), a.data(), 100, chorusFloat64, rank == 2 ? chorusMax : chorusSum);
      comm.barrier();
    } catch (const chorus::Error& e) {
      std::fprintf(stderr, "%s\n", e.what());
      return e.code() == chorusMismatch && contains(e.what(), "max") &&
                     contains(e.what(), "on rank 2")
                 ? 0
                 : 2;
    }
    return 3;
  });
  for (auto& r : res) {
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
  }
}

TEST_CASE("several channels: large calls are cut into parts that run at once, results exact",
          "[channels]") {
  auto transport = GENERATE(std::string("shm"), std::string("tcp"));
  chorus::test::RunOptions o;
  o.env["CHORUS_TRANSPORT"] = transport;
  o.env["CHORUS_NCHANNELS"] = "3";
  o.limit_seconds = 120;
  auto res = run_ranks(
      3,
      [](int rank) {
        auto comm = chorus::Communicator::from_env();
        const int n = comm.size();
        for (const char* algo : {"ring", "tree", "rd"}) {
          setenv("CHORUS_ALGO", algo, 1);
          auto c = comm.split(0, rank);
          for (size_t count : {size_t{5}, size_t{300001}, size_t{1} << 20}) {
            std::vector<int32_t> in(count), out(count, -1);
            for (size_t i = 0; i < count; ++i) in[i] = static_cast<int32_t>(rank * 7 + i % 1013);
            c.all_reduce(in.data(), out.data(), count, chorusInt32, chorusSum);
            for (size_t i = 0; i < count; ++i)
              if (out[i] != static_cast<int32_t>(7 * n * (n - 1) / 2 + n * (i % 1013))) {
                std::fprintf(stderr, "%s all_reduce count %zu: element %zu is %d\n", algo, count, i,
                             out[i]);
                return 1;
              }
            std::vector<int32_t> red(count, -1);
            c.reduce(in.data(), red.data(), count, chorusInt32, chorusSum, n - 1);
            for (size_t i = 0; rank == n - 1 && i < count; ++i)
              if (red[i] != out[i]) {
                std::fprintf(stderr, "reduce element %zu\n", i);
                return 2;
              }
            std::vector<int32_t> b(count, rank == 1 ? 5 : 0);
            c.broadcast(b.data(), count, chorusInt32, 1);
            for (size_t i = 0; i < count; ++i)
              if (b[i] != 5) {
                std::fprintf(stderr, "broadcast element %zu\n", i);
                return 3;
              }
          }
        }
        return 0;
      },
      o);
  for (auto& r : res) {
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
  }
}

TEST_CASE("ranks that disagree on CHORUS_NCHANNELS are told so at init", "[channels][failure]") {
  chorus::test::RunOptions o;
  o.env["CHORUS_TIMEOUT"] = "10";
  auto res = run_ranks(
      2,
      [](int rank) {
        setenv("CHORUS_NCHANNELS", rank == 0 ? "2" : "1", 1);
        try {
          auto comm = chorus::Communicator::from_env();
        } catch (const chorus::Error& e) {
          std::fprintf(stderr, "%s\n", e.what());
          return contains(e.what(), "CHORUS_NCHANNELS is") ? 0 : 2;
        }
        return 3;
      },
      o);
  for (auto& r : res) {
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
  }
}
