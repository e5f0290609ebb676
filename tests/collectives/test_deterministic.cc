// Deterministic reductions (chorus.h, "Deterministic reductions"): with CHORUS_DETERMINISTIC=1,
// every element of an all-reduce, reduce and reduce-scatter is, bit for bit, the left fold of
// the ranks' values in rank order, whatever the algorithm forced, the transport, the size and
// how it splits into slots and pieces, the buffers' offsets, in place or not, the channel count,
// the timing, and the kernel build each rank runs. The inputs are chosen so that the order
// shows (deterministic_values.h), and every rank checks every result against a reference it
// computes itself. W = 2..6 ranks, real processes; even ranks run the scalar kernels, odd ranks
// the best build this CPU has. The last case shows that the data catches an unordered
// algorithm: today's ring, with the mode off, gives other bits.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "chorus/chorus.hpp"
#include "deterministic_values.h"
#include "harness.h"
#include "kernels/cpu/isa.h"
#include "typed_values.h"

using chorus::test::esize;
using chorus::test::kOpNames;
using chorus::test::kOps;
using chorus::test::kTypeNames;
using chorus::test::kTypes;
using chorus::test::RunOptions;

namespace {

constexpr int kMaxRanks = 6;
const size_t kSmall[] = {0, 1, 2, 3, 5, 7, 13, 31, 61, 127, 257, 509, 1021, 2053, 4099};
constexpr size_t kNumSmall = sizeof kSmall / sizeof kSmall[0];
constexpr size_t kSlotBytes = 64 << 10;    // CHORUS_SHM_SLOT_BYTES of these jobs
constexpr size_t kPieceBytes = 256 << 10;  // a tcp link's staging piece (multi_exchange.h)

enum class Coll { kAllReduce, kReduce, kReduceScatter };
const char* coll_name(Coll c) {
  const char* names[] = {"all_reduce", "reduce", "reduce_scatter"};
  return names[static_cast<int>(c)];
}

// One collective call. count: elements of the result (reduce-scatter: per rank). Offsets are in
// elements past a 64-byte boundary (the kernels need only the element's alignment), so send and
// receive buffers start at different alignments of a vector register.
struct Call {
  Coll coll;
  chorusDataType_t t;
  chorusRedOp_t op;
  size_t count;
  bool in_place = false;
  int send_off = 0, recv_off = 0;
  int root = 0;
  uint64_t seed = 1;
};

std::string describe(const Call& c) {
  char s[200];
  std::snprintf(s, sizeof s, "%s %s %s count %zu %s send+%d recv+%d root %d seed %llu",
                coll_name(c.coll), kTypeNames[c.t], kOpNames[c.op], c.count,
                c.in_place ? "in place" : "out of place", c.send_off, c.recv_off, c.root,
                static_cast<unsigned long long>(c.seed));
  return s;
}

// A buffer of n elements of type t at element offset `off` past a 64-byte boundary, with
// guard bytes before and after.
struct Buffer {
  static constexpr size_t kGuard = 64;
  static constexpr unsigned char kFill = 0xa7;
  std::vector<char> bytes;
  char* data;
  size_t used;
  Buffer(chorusDataType_t t, size_t n, int off) : bytes(n * esize(t) + 3 * kGuard + 64, kFill) {
    char* base = bytes.data() + kGuard;
    base += (64 - reinterpret_cast<uintptr_t>(base) % 64) % 64;
    data = base + off * esize(t);
    used = n * esize(t);
  }
  bool guards_intact() const {
    for (const char* p = bytes.data(); p < data; ++p)
      if (static_cast<unsigned char>(*p) != kFill) return false;
    for (const char* p = data + used; p < bytes.data() + bytes.size(); ++p)
      if (static_cast<unsigned char>(*p) != kFill) return false;
    return true;
  }
};

// The canonical result of global element i (all W ranks' inputs folded in rank order).
uint64_t want_bits(const Call& c, int w, size_t i, uint64_t* inputs) {
  for (int q = 0; q < w; ++q) inputs[q] = chorus::test::input_bits(c.t, c.op, w, q, i, c.seed);
  return chorus::test::canonical_bits(c.t, c.op, w, inputs);
}

// Checks `out` (count elements, global elements first..first+count) against the reference;
// "" or what is wrong.
std::string check_result(const Call& c, int w, const char* out, size_t first) {
  uint64_t in[kMaxRanks];
  for (size_t i = 0; i < c.count; ++i) {
    const uint64_t got = chorus::test::element_bits(c.t, out, i);
    const uint64_t want = want_bits(c, w, first + i, in);
    if (chorus::test::same_result(c.t, c.op, got, want)) continue;
    std::string msg = "element " + std::to_string(first + i) + " is " + std::to_string(got) +
                      " (bits), want " + std::to_string(want) + "; inputs by rank:";
    for (int q = 0; q < w; ++q) msg += " " + std::to_string(in[q]);
    return msg;
  }
  return "";
}

// Runs one call on this rank and checks it; the result goes to *result (count elements, on
// every rank that has one) for the callers that compare results with one another.
std::string run_call(chorus::Communicator& comm, const Call& c, std::vector<char>* result) {
  const int w = comm.size(), r = comm.rank();
  const size_t es = esize(c.t);
  const size_t n_in = c.coll == Coll::kReduceScatter ? w * c.count : c.count;
  Buffer send(c.t, n_in, c.send_off), recv(c.t, c.count, c.recv_off);
  for (size_t i = 0; i < n_in; ++i) {
    const uint64_t b = chorus::test::input_bits(c.t, c.op, w, r, i, c.seed);
    std::memcpy(send.data + i * es, &b, es);
  }
  const std::vector<char> sent(send.data, send.data + send.used);
  char* out = recv.data;
  if (c.in_place) out = c.coll == Coll::kReduceScatter ? send.data + r * c.count * es : send.data;
  switch (c.coll) {
    case Coll::kAllReduce:
      comm.all_reduce(send.data, out, c.count, c.t, c.op);
      break;
    case Coll::kReduce:
      comm.reduce(send.data, out, c.count, c.t, c.op, c.root);
      break;
    case Coll::kReduceScatter:
      comm.reduce_scatter(send.data, out, c.count, c.t, c.op);
      break;
  }
  if (!send.guards_intact() || !recv.guards_intact()) return "a byte outside the buffers changed";
  if (!c.in_place && send.used > 0 && std::memcmp(sent.data(), send.data, send.used) != 0)
    return "the send buffer changed";
  if (c.coll == Coll::kReduce && r != c.root) return "";
  if (result) result->assign(out, out + c.count * es);
  return check_result(c, w, out, c.coll == Coll::kReduceScatter ? r * c.count : 0);
}

// A communicator's settings (variables read when it is created) and the calls it runs.
struct Config {
  std::string name;
  std::map<std::string, std::string> env;
  std::vector<Call> calls;
  bool whole_vs_pieces = false;  // also: the first all-reduce again, cut in irregular pieces
  bool scatter_vs_all = false;   // also: each reduce-scatter against the matching all-reduce
};

// Two results of c (count elements each) element by element: "" when they hold the same bits
// (two NaNs of sum, prod or avg count as the same, see same_result), else the first difference.
std::string compare(const Call& c, const char* a, const char* b) {
  for (size_t i = 0; i < c.count; ++i) {
    const uint64_t x = chorus::test::element_bits(c.t, a, i);
    const uint64_t y = chorus::test::element_bits(c.t, b, i);
    if (chorus::test::same_result(c.t, c.op, x, y)) continue;
    return "element " + std::to_string(i) + ": bits " + std::to_string(x) + " vs " +
           std::to_string(y);
  }
  return "";
}

// An all-reduce again, cut in irregular pieces (some of them across slots and staging
// pieces): the same bits as in one call.
std::string check_pieces(chorus::Communicator& comm, const Call& whole,
                         const std::vector<char>& whole_out) {
  const size_t es = esize(whole.t);
  const int r = comm.rank();
  Buffer send(whole.t, whole.count, 1), recv(whole.t, whole.count, 3);
  for (size_t i = 0; i < whole.count; ++i) {
    const uint64_t b = chorus::test::input_bits(whole.t, whole.op, comm.size(), r, i, whole.seed);
    std::memcpy(send.data + i * es, &b, es);
  }
  const size_t cuts[] = {1, 7, 1000, 3, kSlotBytes / es + 5, 13, 4099, kPieceBytes / es - 1};
  size_t at = 0;
  for (size_t k = 0; at < whole.count; ++k) {
    const size_t n = std::min(whole.count - at, cuts[k % (sizeof cuts / sizeof cuts[0])]);
    comm.all_reduce(send.data + at * es, recv.data + at * es, n, whole.t, whole.op);
    at += n;
  }
  if (std::string d = compare(whole, recv.data, whole_out.data()); !d.empty())
    return "in pieces vs in one call: " + d;
  return recv.guards_intact() ? "" : "in pieces: a byte outside the buffer changed";
}

// Each reduce-scatter's block equals the matching block of an all-reduce of the same input.
std::string check_scatter_block(chorus::Communicator& comm, const Call& rs,
                                const std::vector<char>& rs_out) {
  Call all = rs;
  all.coll = Coll::kAllReduce;
  all.count = rs.count * comm.size();
  all.in_place = false;
  std::vector<char> all_out;
  // The all-reduce of the reduce-scatter's whole input: its global elements are the same.
  std::string bad = run_call(comm, all, &all_out);
  if (!bad.empty()) return "all_reduce for the block: " + bad;
  const size_t es = esize(rs.t);
  if (std::string d = compare(rs, rs_out.data(), all_out.data() + comm.rank() * rs.count * es);
      !d.empty())
    return "reduce_scatter vs the all_reduce's block: " + d;
  return "";
}

int run_config(chorus::Communicator& world, const Config& cfg) {
  for (const auto& [k, v] : cfg.env) setenv(k.c_str(), v.c_str(), 1);
  chorus::Communicator comm = world.split(0, world.rank());
  for (const auto& [k, v] : cfg.env) unsetenv(k.c_str());
  bool pieces_done = false;
  for (size_t j = 0; j < cfg.calls.size(); ++j) {
    const Call& c = cfg.calls[j];
    std::vector<char> out;
    std::string bad = run_call(comm, c, &out);
    if (bad.empty() && cfg.whole_vs_pieces && !pieces_done && c.coll == Coll::kAllReduce) {
      pieces_done = true;
      bad = check_pieces(comm, c, out);
    }
    if (bad.empty() && cfg.scatter_vs_all && c.coll == Coll::kReduceScatter)
      bad = check_scatter_block(comm, c, out);
    if (bad.empty()) continue;
    std::fprintf(stderr, "rank %d of %d, config %s, call %zu: %s: %s\n", world.rank(), world.size(),
                 cfg.name.c_str(), j, describe(c).c_str(), bad.c_str());
    return 1;
  }
  comm.barrier();
  return 0;
}

uint64_t seed_of(int w, int config, size_t call) {
  return chorus::test::mix64((static_cast<uint64_t>(w) << 40) ^ (uint64_t(config) << 20) ^ call);
}

// Every type x op, each with an all-reduce, a reduce and a reduce-scatter; the count, offsets,
// in place or not and the root rotate with `k0` so that each algorithm meets every size.
// every > 1: one in `every` of the 50 type x op pairs, spread over all types and all ops.
std::vector<Call> matrix_calls(int w, int k0, int every = 1) {
  std::vector<Call> v;
  for (int j = 0; j < (50 + every - 1) / every; ++j) {
    const int c = every == 1 ? j : (7 * j) % 50;  // 7 and 50 are coprime: no pair twice
    const chorusDataType_t t = kTypes[c / 5];
    const chorusRedOp_t op = kOps[c % 5];
    const int k = c + k0;
    v.push_back({Coll::kAllReduce, t, op, kSmall[k % kNumSmall], k % 2 == 0, k % 4, (k / 4) % 3});
    v.push_back(
        {Coll::kReduce, t, op, kSmall[(k + 4) % kNumSmall], k % 2 == 1, (k / 2) % 3, k % 4, k % w});
    v.push_back(
        {Coll::kReduceScatter, t, op, kSmall[(k + 9) % kNumSmall], k % 3 == 0, k % 3, (k + 1) % 4});
  }
  return v;
}

// Sizes around a boundary of `bytes` (a slot, a staging piece), for a few types and ops: a
// whole buffer on each side of it (fold sends whole buffers), a reduce-scatter block on each
// side, and for f32 sum one direct slice on each side (direct cuts the buffer in w slices).
// nkinds: how many of the six type x op pairs (the first ones).
std::vector<Call> boundary_calls(int w, size_t bytes, int k0, int nkinds = 6) {
  const struct {
    chorusDataType_t t;
    chorusRedOp_t op;
  } kinds[] = {{chorusFloat32, chorusSum}, {chorusBfloat16, chorusAvg}, {chorusFloat64, chorusProd},
               {chorusFloat16, chorusSum}, {chorusFloat32, chorusMin},  {chorusInt32, chorusAvg}};
  std::vector<Call> v;
  int k = k0;
  for (int j = 0; j < nkinds; ++j) {
    const auto& kind = kinds[j];
    const size_t s = bytes / esize(kind.t);
    std::vector<size_t> counts = {s - 1, s + 1};
    if (kind.t == chorusFloat32 && kind.op == chorusSum)
      counts = {s - 1, s + 1, w * s - 1, w * s + 1};
    for (size_t count : counts) {
      const Coll coll = k % 2 ? Coll::kReduce : Coll::kAllReduce;
      v.push_back({coll, kind.t, kind.op, count, k % 3 == 0, k % 3, (k + 1) % 2, k % w});
      ++k;
    }
    v.push_back({Coll::kReduceScatter, kind.t, kind.op, s + (k % 2 ? 1 : -1), k % 2 == 0, 1, 0});
    ++k;
  }
  return v;
}

// At least 1 MiB: f32 sum all-reduce (the one that is also cut in pieces), bf16 avg reduce.
std::vector<Call> large_calls(int w) {
  return {{Coll::kAllReduce, chorusFloat32, chorusSum, (size_t{1} << 18) + 3, false, 1, 2},
          {Coll::kReduce, chorusBfloat16, chorusAvg, (size_t{1} << 19) + 1, true, 0, 0, w - 1}};
}

// Seeds every call of a config list uniquely.
std::vector<Config> seeded(int w, std::vector<Config> cfgs) {
  for (size_t j = 0; j < cfgs.size(); ++j)
    for (size_t i = 0; i < cfgs[j].calls.size(); ++i) cfgs[j].calls[i].seed = seed_of(w, j, i);
  return cfgs;
}

std::vector<Call> join(std::vector<Call> a, const std::vector<Call>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// The configurations a job of w ranks runs: every algorithm forced on shm with every type and
// op; tcp; sizes around slots and pieces everywhere; 1 MiB, 4 channels and jitter at some w.
std::vector<Config> plan(int w) {
  std::vector<Config> v;
  const bool large = w == 3 || w == 5;
  const char* algos[] = {"auto", "ring", "tree", "rd", "direct", "fold"};
  for (int a = 0; a < 6; ++a) {
    Config c{std::string("shm, CHORUS_ALGO=") + algos[a], {}, matrix_calls(w, 7 * a + w)};
    if (a > 0) c.env["CHORUS_ALGO"] = algos[a];
    if (a == 0 || a >= 4) c.calls = join(c.calls, boundary_calls(w, kSlotBytes, a));
    // direct all-reduces run in rounds of 2 MiB per rank's slice (ordered.cc): cross two
    // round boundaries, with a remainder.
    if (a == 4 && w == 3)
      c.calls.push_back(
          {Coll::kAllReduce, chorusFloat32, chorusSum, 2 * (size_t{1} << 19) * w + 7, false, 1, 2});
    if (a == 0) {  // the first all-reduce is also cut in pieces
      const size_t n = (large ? size_t{1} << 18 : w * (kSlotBytes / 4)) + 3;
      c.calls.insert(c.calls.begin(), {Coll::kAllReduce, chorusFloat32, chorusSum, n, false, 1, 2});
      if (large) c.calls.push_back(large_calls(w)[1]);
      c.whole_vs_pieces = c.scatter_vs_all = true;
    }
    v.push_back(c);
  }
  for (const char* algo : {"auto", "ring", "fold"}) {
    const std::string a = algo;
    Config c{"tcp, CHORUS_ALGO=" + a, {{"CHORUS_TRANSPORT", "tcp"}}, matrix_calls(w, w + 3, 4)};
    if (a != "auto") c.env["CHORUS_ALGO"] = a;
    if (a != "auto") c.calls = join(c.calls, boundary_calls(w, kPieceBytes, w, w < 5 ? 6 : 3));
    if (a == "auto" && w == 3) c.calls = join(large_calls(w), c.calls);
    if (a == "auto" && w == 2)  // past fold's reach: the tuner's two-rank ring on tcp
      c.calls =
          join(c.calls,
               {large_calls(w)[0],
                {Coll::kAllReduce, chorusBfloat16, chorusAvg, (size_t{1} << 18) + 5, true, 1, 0}});
    v.push_back(c);
  }
  if (large) {
    Config c{"shm, CHORUS_NCHANNELS=4", {{"CHORUS_NCHANNELS", "4"}}, large_calls(w)};
    c.whole_vs_pieces = true;
    v.push_back(c);
    for (const char* algo : {"direct", "fold"}) {
      v.push_back({std::string("shm, CHORUS_TEST_JITTER_US=300, CHORUS_ALGO=") + algo,
                   {{"CHORUS_TEST_JITTER_US", "300"}, {"CHORUS_ALGO", algo}},
                   join(matrix_calls(w, 11, 5), boundary_calls(w, kSlotBytes, 2))});
    }
  }
  if (w == 4)
    v.push_back({"tcp, CHORUS_TEST_JITTER_US=300",
                 {{"CHORUS_TRANSPORT", "tcp"}, {"CHORUS_TEST_JITTER_US", "300"}},
                 matrix_calls(w, 5, 5)});
  return seeded(w, v);
}

std::string best_isa_name() {
  return chorus::kernels::isa_name(chorus::kernels::best_isa());
}

// A light plan for the thread sanitizer (3 ranks): both ordered algorithms, tcp, two channels
// with jitter, a reduce-scatter against the all-reduce, pieces against one call.
std::vector<Config> light_plan(int w) {
  std::vector<Config> v;
  Config direct{"shm, CHORUS_ALGO=direct",
                {{"CHORUS_ALGO", "direct"}},
                join(matrix_calls(w, 3, 5), boundary_calls(w, kSlotBytes, 0))};
  direct.scatter_vs_all = true;
  v.push_back(direct);
  Config fold{"shm, CHORUS_ALGO=fold", {{"CHORUS_ALGO", "fold"}}, matrix_calls(w, 4, 5)};
  fold.calls.insert(fold.calls.begin(), {Coll::kAllReduce, chorusFloat32, chorusSum, 40009, true});
  fold.whole_vs_pieces = true;
  v.push_back(fold);
  v.push_back({"tcp", {{"CHORUS_TRANSPORT", "tcp"}}, matrix_calls(w, 5, 5)});
  v.push_back({"shm, CHORUS_NCHANNELS=2, CHORUS_TEST_JITTER_US=300",
               {{"CHORUS_NCHANNELS", "2"}, {"CHORUS_TEST_JITTER_US", "300"}},
               {{Coll::kAllReduce, chorusFloat32, chorusSum, (size_t{1} << 17) + 3, false, 1, 2},
                {Coll::kReduce, chorusBfloat16, chorusAvg, (size_t{1} << 18) + 1, true, 0, 0, 1}}});
  return seeded(w, v);
}

using PlanFn = std::vector<Config> (*)(int w);

int run_job(int rank, PlanFn plan_fn) {
  // Even ranks fold with the scalar kernels, odd ranks with the best build.
  setenv("CHORUS_CPU_ISA", rank % 2 ? best_isa_name().c_str() : "scalar", 1);
  auto world = chorus::Communicator::from_env();
  const std::vector<Config> cfgs = plan_fn(world.size());
  size_t calls = 0;
  for (const Config& c : cfgs) {
    const auto t0 = std::chrono::steady_clock::now();
    if (int rc = run_config(world, c)) return rc;
    calls += c.calls.size();
    if (rank == 0)
      std::printf("%s: %zu calls, %.2f s\n", c.name.c_str(), c.calls.size(),
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::printf("rank %d: %zu configs, %zu calls checked\n", rank, cfgs.size(), calls);
  return 0;
}

// The reductions' tuner lines (CHORUS_DEBUG=INFO) name only ordered algorithms, and both; at
// two ranks the ring too (it combines each element once, in rank order), and it must run.
void check_algorithms(const std::string& log, int w) {
  const std::regex line("tuner: (all_reduce|reduce|reduce_scatter) of .*algorithm ([a-z]+)");
  std::set<std::string> seen;
  for (std::sregex_iterator m(log.begin(), log.end(), line), end; m != end; ++m)
    seen.insert((*m)[2]);
  for (const std::string& a : seen) {
    INFO("algorithm " << a << " ran a reduction in deterministic mode");
    CHECK((a == "direct" || a == "fold" || (w == 2 && a == "ring")));
  }
  CHECK(seen.count("direct"));
  CHECK(seen.count("fold"));
  if (w == 2) CHECK(seen.count("ring"));
}

// Runs the plan on w ranks in deterministic mode; every rank must pass, run the kernel build
// it was given, and reduce with the ordered algorithms only.
void run_deterministic(int w, PlanFn plan_fn) {
  const std::string best = best_isa_name();
  RunOptions o;
  o.env["CHORUS_DETERMINISTIC"] = "1";
  o.env["CHORUS_TRANSPORT"] = "shm";
  o.env["CHORUS_SHM_SLOT_BYTES"] = "64K";
  o.env["CHORUS_DEBUG"] = "INFO";
  o.limit_seconds = 240;
  auto res = chorus::test::run_ranks(
      w, [&](int rank) { return run_job(rank, plan_fn); }, o);
  for (int r = 0; r < w; ++r) {
    INFO("rank " << r << " output:\n" << res[r].output);
    REQUIRE(res[r].exit_code == 0);
    const std::string isa = r % 2 ? best : "scalar";
    CHECK(chorus::test::contains(res[r].output, "kernels: " + isa + " build"));
    check_algorithms(res[r].output, w);
  }
}

}  // namespace

TEST_CASE(
    "deterministic reductions give the rank-order fold bit for bit, whatever the algorithm, "
    "transport, size, offsets, channels, timing and kernel build",
    "[deterministic][all_reduce][reduce][reduce_scatter]") {
  if (best_isa_name() == "scalar")
    WARN("this cpu runs only the scalar kernels: every rank runs them");
  for (int w = 2; w <= kMaxRanks; ++w) {
    DYNAMIC_SECTION(w << " ranks") {
      run_deterministic(w, plan);
    }
  }
}

// What the thread sanitizer runs (the test above takes it too long there).
TEST_CASE(
    "deterministic reductions, light: 3 ranks, both ordered algorithms, tcp, 2 channels, "
    "jitter",
    "[deterministic][light]") {
  run_deterministic(3, light_plan);
}

// Guards the test above: the same data through an unordered algorithm gives other bits.
TEST_CASE(
    "the data tells orders apart: with the mode off, the ring all-reduce of 3 ranks "
    "differs from the rank-order fold",
    "[deterministic][all_reduce]") {
  RunOptions o;
  o.env["CHORUS_ALGO"] = "ring";
  o.env["CHORUS_TRANSPORT"] = "shm";
  o.env["CHORUS_DEBUG"] = "INFO";
  auto res = chorus::test::run_ranks(
      3,
      [](int) {
        unsetenv("CHORUS_DETERMINISTIC");
        auto comm = chorus::Communicator::from_env();
        const Call c{Coll::kAllReduce, chorusFloat32, chorusSum, 3001};
        Buffer buf(c.t, c.count, 0);
        for (size_t i = 0; i < c.count; ++i) {
          const uint64_t b = chorus::test::input_bits(c.t, c.op, 3, comm.rank(), i, c.seed);
          std::memcpy(buf.data + i * 4, &b, 4);
        }
        comm.all_reduce(buf.data, buf.data, c.count, c.t, c.op);
        size_t differ = 0;
        uint64_t in[3];
        for (size_t i = 0; i < c.count; ++i)
          if (!chorus::test::same_result(c.t, c.op, chorus::test::element_bits(c.t, buf.data, i),
                                         want_bits(c, 3, i, in)))
            ++differ;
        std::printf("ring, mode off: %zu of %zu elements differ from the rank-order fold\n", differ,
                    c.count);
        return differ > 0 ? 0 : 2;
      },
      o);
  for (int r = 0; r < 3; ++r) {
    INFO("rank " << r << " output:\n" << res[r].output);
    CHECK(chorus::test::contains(res[r].output, "algorithm ring"));
    REQUIRE(res[r].exit_code == 0);
  }
}
