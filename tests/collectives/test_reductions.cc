// All-reduce (ring, tree, recursive doubling), reduce, all-gather and reduce-scatter against a
// serial reference: all ten types, every op, 1 to 5 ranks, shm, tcp and ib (emulated verbs),
// counts 0, 1, primes, not divisible by the rank count, and large; in place and out of place.
// Integer sums and products that overflow wrap, and integer avg truncates, in every algorithm.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "chorus/chorus.hpp"
#include "harness.h"
#include "kernels/cpu/half.h"
#include "typed_values.h"

using chorus::test::esize;
using chorus::test::kOps;
using chorus::test::kTypeNames;
using chorus::test::kTypes;
using chorus::test::put;
using chorus::test::run_ranks;
using chorus::test::RunOptions;

namespace {

// Small integers: exact in every type, sums and products stay exact (bf16 up to 256).
int input_value(int rank, size_t i, chorusRedOp_t op) {
  if (op == chorusProd) return 1 + static_cast<int>((rank + i) % 2);
  return static_cast<int>(((rank + 1) * 3 + i * 7) % 5) + 1;
}

// The exact reduction of small integers, then avg's division done as the kernels do it.
double expected(chorusDataType_t t, chorusRedOp_t op, int n, size_t i) {
  long acc = input_value(0, i, op);
  for (int r = 1; r < n; ++r) {
    long v = input_value(r, i, op);
    if (op == chorusSum || op == chorusAvg) acc += v;
    if (op == chorusProd) acc *= v;
    if (op == chorusMax) acc = std::max(acc, v);
    if (op == chorusMin) acc = std::min(acc, v);
  }
  if (op != chorusAvg) return static_cast<double>(acc);
  switch (t) {
    case chorusFloat32:
      return static_cast<float>(acc) / static_cast<float>(n);
    case chorusFloat64:
      return static_cast<double>(acc) / n;
    case chorusFloat16:
      return chorus::kernels::half_to_float(
          chorus::kernels::float_to_half(static_cast<float>(acc) / n));
    case chorusBfloat16:
      return chorus::kernels::bf16_to_float(
          chorus::kernels::float_to_bf16(static_cast<float>(acc) / n));
    default:
      return static_cast<double>(acc / n);
  }
}

// Compares bit patterns: the expected value stored in the same type.
bool same(chorusDataType_t t, const void* buf, size_t i, double v) {
  char want[8];
  put(t, want, 0, v);
  return std::memcmp(static_cast<const char*>(buf) + i * esize(t), want, esize(t)) == 0;
}

#define FAIL_RANK(...)                 \
  do {                                 \
    std::fprintf(stderr, __VA_ARGS__); \
    std::fprintf(stderr, "\n");        \
    return 1;                          \
  } while (0)

int check_all_reduce(chorus::Communicator& comm, chorusDataType_t t, chorusRedOp_t op, size_t count,
                     bool in_place) {
  const int n = comm.size(), r = comm.rank();
  std::vector<char> send(count * esize(t) + 8), recv(count * esize(t) + 8, 0x55);
  for (size_t i = 0; i < count; ++i) put(t, send.data(), i, input_value(r, i, op));
  char* out = in_place ? send.data() : recv.data();
  comm.all_reduce(send.data(), out, count, t, op);
  for (size_t i = 0; i < count; ++i)
    if (!same(t, out, i, expected(t, op, n, i)))
      FAIL_RANK("all_reduce %s op %d count %zu %s algo %s: element %zu wrong", kTypeNames[t], op,
                count, in_place ? "in place" : "out of place", std::getenv("CHORUS_ALGO"), i);
  if (!in_place && recv[count * esize(t)] != 0x55) FAIL_RANK("all_reduce wrote past the end");
  return 0;
}

int check_reduce(chorus::Communicator& comm, chorusDataType_t t, chorusRedOp_t op, size_t count,
                 int root) {
  const int n = comm.size(), r = comm.rank();
  std::vector<char> send(count * esize(t) + 1), recv(count * esize(t) + 1);
  for (size_t i = 0; i < count; ++i) put(t, send.data(), i, input_value(r, i, op));
  comm.reduce(send.data(), recv.data(), count, t, op, root);
  if (r != root) return 0;
  for (size_t i = 0; i < count; ++i)
    if (!same(t, recv.data(), i, expected(t, op, n, i)))
      FAIL_RANK("reduce %s op %d count %zu root %d: element %zu wrong", kTypeNames[t], op, count,
                root, i);
  return 0;
}

int check_reduce_scatter(chorus::Communicator& comm, chorusDataType_t t, chorusRedOp_t op,
                         size_t count, bool in_place) {
  const int n = comm.size(), r = comm.rank();
  std::vector<char> send(n * count * esize(t) + 1), recv(count * esize(t) + 1);
  for (size_t i = 0; i < n * count; ++i) put(t, send.data(), i, input_value(r, i, op));
  char* out = in_place ? send.data() + r * count * esize(t) : recv.data();
  comm.reduce_scatter(send.data(), out, count, t, op);
  for (size_t i = 0; i < count; ++i)
    if (!same(t, out, i, expected(t, op, n, r * count + i)))
      FAIL_RANK("reduce_scatter %s op %d count %zu: element %zu wrong", kTypeNames[t], op, count,
                i);
  return 0;
}

int check_all_gather(chorus::Communicator& comm, chorusDataType_t t, size_t count, bool in_place) {
  const int n = comm.size(), r = comm.rank();
  std::vector<char> send(count * esize(t) + 1), recv(n * count * esize(t) + 1);
  for (size_t i = 0; i < count; ++i) put(t, send.data(), i, input_value(r, i, chorusSum));
  const char* src = send.data();
  if (in_place) {
    std::memcpy(recv.data() + r * count * esize(t), send.data(), count * esize(t));
    src = recv.data() + r * count * esize(t);
  }
  comm.all_gather(src, recv.data(), count, t);
  for (int q = 0; q < n; ++q)
    for (size_t i = 0; i < count; ++i)
      if (!same(t, recv.data() + q * count * esize(t), i, input_value(q, i, chorusSum)))
        FAIL_RANK("all_gather %s count %zu: block %d element %zu wrong", kTypeNames[t], count, q,
                  i);
  return 0;
}

// Large integer inputs whose sums and products overflow: the result is the two's-complement
// wrap of the exact one (sum and prod modulo 2^64, then cut to the type), and avg divides the
// wrapped sum, truncating toward zero.
uint64_t wrap_input(int rank, size_t i) {
  return 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(rank + 1) + i * 0x0123456789ull;
}

template <class T>
int check_wrap_typed(chorus::Communicator& comm, chorusDataType_t t, chorusRedOp_t op,
                     size_t count) {
  const int n = comm.size(), r = comm.rank();
  std::vector<T> buf(count);
  for (size_t i = 0; i < count; ++i) buf[i] = static_cast<T>(wrap_input(r, i));
  comm.all_reduce(buf.data(), buf.data(), count, t, op);
  for (size_t i = 0; i < count; ++i) {
    uint64_t acc = op == chorusProd ? 1 : 0;
    for (int q = 0; q < n; ++q) {
      const uint64_t v = static_cast<uint64_t>(static_cast<T>(wrap_input(q, i)));  // sign-extended
      acc = op == chorusProd ? acc * v : acc + v;
    }
    T want = static_cast<T>(acc);
    if (op == chorusAvg)
      want = static_cast<T>(std::is_signed_v<T> ? int64_t(want) / n : uint64_t(want) / uint64_t(n));
    if (buf[i] != want)
      FAIL_RANK("all_reduce %s op %d count %zu algo %s: element %zu is %lld, want %lld",
                kTypeNames[t], op, count, std::getenv("CHORUS_ALGO"), i,
                static_cast<long long>(buf[i]), static_cast<long long>(want));
  }
  return 0;
}

int check_wrap(chorus::Communicator& comm) {
  for (chorusRedOp_t op : {chorusSum, chorusProd, chorusAvg})
    for (size_t count : {size_t{1}, size_t{77}, size_t{3001}}) {
      int rc = check_wrap_typed<int8_t>(comm, chorusInt8, op, count);
      if (!rc) rc = check_wrap_typed<uint8_t>(comm, chorusUint8, op, count);
      if (!rc) rc = check_wrap_typed<int32_t>(comm, chorusInt32, op, count);
      if (!rc) rc = check_wrap_typed<uint32_t>(comm, chorusUint32, op, count);
      if (!rc) rc = check_wrap_typed<int64_t>(comm, chorusInt64, op, count);
      if (!rc) rc = check_wrap_typed<uint64_t>(comm, chorusUint64, op, count);
      if (rc) return rc;
    }
  return 0;
}

// One all-reduce algorithm (CHORUS_ALGO) through every type, op, count and placement.
int check_algorithm(chorus::Communicator& comm, const char* algo) {
  const size_t counts[] = {0, 1, 2, 7, 13, 101, 4099};
  // Knobs are read when a communicator is created: set them, then split off a fresh one.
  setenv("CHORUS_ALGO", algo, 1);
  auto sub = comm.split(0, comm.rank());
  for (auto t : kTypes)
    for (auto op : kOps)
      for (size_t count : counts)
        for (bool ip : {false, true})
          if (int rc = check_all_reduce(sub, t, op, count, ip)) return rc;
  if (int rc = check_wrap(sub)) return rc;
  // Large, with small pieces so every pipeline runs deep.
  setenv("CHORUS_CHUNK_BYTES", "16K", 1);
  auto deep = comm.split(0, comm.rank());
  if (int rc = check_all_reduce(deep, chorusFloat32, chorusSum, (size_t{1} << 20) + 3, false))
    return rc;
  if (int rc = check_all_reduce(deep, chorusBfloat16, chorusAvg, 300007, true)) return rc;
  unsetenv("CHORUS_CHUNK_BYTES");
  return 0;
}

int run_matrix(int rank) {
  (void)rank;
  auto comm = chorus::Communicator::from_env();
  const int n = comm.size();
  for (const char* algo : {"ring", "tree", "rd"})
    if (int rc = check_algorithm(comm, algo)) return rc;
  unsetenv("CHORUS_ALGO");
  for (auto t : kTypes)
    for (auto op : kOps)
      for (size_t count : {size_t{0}, size_t{1}, size_t{13}, size_t{1001}}) {
        for (int root = 0; root < n; ++root)
          if (int rc = check_reduce(comm, t, op, count, root)) return rc;
        for (bool ip : {false, true})
          if (int rc = check_reduce_scatter(comm, t, op, count, ip)) return rc;
      }
  for (auto t : kTypes)
    for (size_t count : {size_t{0}, size_t{1}, size_t{13}, size_t{1001}})
      for (bool ip : {false, true})
        if (int rc = check_all_gather(comm, t, count, ip)) return rc;
  setenv("CHORUS_CHUNK_BYTES", "8K", 1);
  auto deep = comm.split(0, comm.rank());
  if (int rc = check_reduce(deep, chorusFloat32, chorusSum, 500009, n - 1)) return rc;
  if (int rc = check_reduce_scatter(deep, chorusInt32, chorusMax, 200003, false)) return rc;
  if (int rc = check_all_gather(deep, chorusFloat64, 100003, true)) return rc;
  comm.barrier();
  return 0;
}

// Ranks on simulated hosts (CHORUS_HOSTID: one letter per rank, so links between hosts are
// tcp): the hierarchical all-reduce, and the ring in host order, against the reference.
int run_hosts(int rank, const char* hosts) {
  setenv("CHORUS_HOSTID", std::string(1, hosts[rank]).c_str(), 1);
  auto comm = chorus::Communicator::from_env();
  for (const char* algo : {"hier", "ring"})
    if (int rc = check_algorithm(comm, algo)) return rc;
  comm.barrier();
  return 0;
}

}  // namespace

TEST_CASE("the hierarchical all-reduce and the host-ordered ring match the serial reference",
          "[all_reduce][hosts]") {
  // Even hosts; uneven, interleaved ranks; a host of one; one host.
  for (const char* hosts : {"aabb", "abacb", "aab", "aaa"}) {
    const int n = static_cast<int>(std::strlen(hosts));
    DYNAMIC_SECTION("hosts " << hosts) {
      RunOptions o;
      o.env["CHORUS_SHM_SLOT_BYTES"] = "64K";
      o.env["CHORUS_DEBUG"] = "INFO";
      o.limit_seconds = 240;
      auto res = run_ranks(
          n, [&](int rank) { return run_hosts(rank, hosts); }, o);
      for (int r = 0; r < n; ++r) {
        INFO("rank " << r << " output:\n" << res[r].output);
        REQUIRE(res[r].exit_code == 0);
        CHECK(chorus::test::contains(res[r].output, "algorithm hier"));
        if (std::string(hosts) == "aabb") {  // shm inside a host, tcp across
          CHECK(chorus::test::contains(res[r].output, "1 shm peer(s)"));
          CHECK(chorus::test::contains(res[r].output, "2 tcp peer(s)"));
        }
      }
    }
  }
}

TEST_CASE("reductions and gathers match the serial reference",
          "[reduce][all_reduce][all_gather][reduce_scatter]") {
  auto transport = GENERATE(std::string("shm"), std::string("tcp"), std::string("ib"));
  for (int n = 1; n <= 5; ++n) {
    DYNAMIC_SECTION(transport << " with " << n << " ranks") {
      RunOptions o;
      o.env["CHORUS_TRANSPORT"] = transport;
      o.env["CHORUS_IB_EMULATE"] = "emu0";  // used by ib only: verbs emulated in shared memory
      o.env["CHORUS_IB_SLOT_BYTES"] = "64K";
      o.env["CHORUS_SHM_SLOT_BYTES"] = "64K";
      o.limit_seconds = 240;
      auto res = run_ranks(n, run_matrix, o);
      for (int r = 0; r < n; ++r) {
        INFO("rank " << r << " output:\n" << res[r].output);
        REQUIRE(res[r].exit_code == 0);
      }
    }
  }
}
