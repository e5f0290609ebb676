// The device operations (collectives/device_ops.cc) end to end on an emulated GPU
// (fake_gpu.h): every collective that takes device buffers x types x ops x counts x in/out of
// place on 2 and 3 ranks, with ranks on GPUs of their own (slices) and sharing one (one rank
// works), checked bit for bit against the rank-order fold; send/recv alone and in groups both
// ways; the barrier with a stream; chorusI* collectives; and the mismatches named on every
// rank. What it cannot check is the GPU itself: tests/gpu/ does, where one is lent.
#include <fmt/format.h>
#include <unistd.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "chorus/chorus.h"
#include "collectives/device_freed.h"
#include "collectives/device_ops.h"
#include "collectives/device_vmm.h"
#include "device_test.h"
#include "fake_gpu.h"
#include "harness.h"
#include "kernels/cpu/reduce.h"
#include "transport/shm/shared_mem.h"

using chorus::test::check_all;
using chorus::test::contains;
using chorus::test::fail_with;
using chorus::test::run_ranks;
using chorus::test::RunOptions;
namespace kn = chorus::kernels;
const auto init = chorus::test::device_init;

namespace {

const auto kStream = reinterpret_cast<chorusStream_t>(0x10);

int occurrences(const std::string& text, const std::string& part) {
  int n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

struct TypeCase {
  chorusDataType_t c;
  kn::DType k;
};
constexpr TypeCase kTypes[] = {{chorusFloat32, kn::DType::kF32},
                               {chorusFloat64, kn::DType::kF64},
                               {chorusInt32, kn::DType::kI32},
                               {chorusUint8, kn::DType::kU8}};
struct OpCase {
  chorusRedOp_t c;
  kn::RedOp k;
};
constexpr OpCase kOps[] = {
    {chorusSum, kn::RedOp::kSum}, {chorusMax, kn::RedOp::kMax}, {chorusAvg, kn::RedOp::kAvg}};

// Element j of rank q's input, written as type t into dst.
void put(kn::DType t, void* dst, size_t j, int q, int salt) {
  const int v = int((q * 131 + j * 7 + salt * 13) % 61) - 20;
  switch (t) {
    case kn::DType::kF32:
      static_cast<float*>(dst)[j] = float(v) * 0.375f;
      break;
    case kn::DType::kF64:
      static_cast<double*>(dst)[j] = double(v) * 0.125;
      break;
    case kn::DType::kI32:
      static_cast<int32_t*>(dst)[j] = v * 1000003;
      break;
    default:
      static_cast<uint8_t*>(dst)[j] = uint8_t(v);
      break;
  }
}

std::vector<char> input(kn::DType t, size_t n, int q, int salt) {
  std::vector<char> v(n * kn::dtype_size(t));
  for (size_t j = 0; j < n; ++j) put(t, v.data(), j, q, salt);
  return v;
}

// The rank-order fold of the ranks' inputs, elements [lo, lo + n).
std::vector<char> folded(kn::DType t, kn::RedOp op, const std::vector<std::vector<char>>& in,
                         size_t lo, size_t n) {
  const size_t es = kn::dtype_size(t);
  std::vector<const void*> ptrs;
  for (const auto& v : in) ptrs.push_back(v.data() + lo * es);
  std::vector<char> out(n * es);
  kn::reduce_fold(t, op, ptrs.data(), int(ptrs.size()), out.data(), n,
                  op == kn::RedOp::kAvg ? int(in.size()) : 0);
  return out;
}

enum class Coll {
  kAllReduce,
  kReduce,
  kBroadcast,
  kAllGather,
  kReduceScatter,
  kGather,
  kScatter,
  kAllToAll
};
constexpr Coll kColls[] = {Coll::kAllReduce, Coll::kReduce,  Coll::kBroadcast,     Coll::kAllGather,
                           Coll::kGather,    Coll::kScatter, Coll::kReduceScatter, Coll::kAllToAll};
bool reduces(Coll c) {
  return c == Coll::kAllReduce || c == Coll::kReduce || c == Coll::kReduceScatter;
}
const char* coll_name(Coll c) {
  switch (c) {
    case Coll::kAllReduce:
      return "all-reduce";
    case Coll::kReduce:
      return "reduce";
    case Coll::kBroadcast:
      return "broadcast";
    case Coll::kAllGather:
      return "all-gather";
    case Coll::kGather:
      return "gather";
    case Coll::kScatter:
      return "scatter";
    case Coll::kAllToAll:
      return "all-to-all";
    default:
      return "reduce-scatter";
  }
}

// Where a case puts its buffers: apart; in place (all-gather's and gather's sendbuff at the
// rank's block of recvbuff, reduce-scatter's and scatter's recvbuff at the rank's block of
// sendbuff, else the same pointer); or overlapping elsewhere (gather's and scatter's buffer at
// the next rank's block of the other, all-to-all's recvbuff one block past its sendbuff), which
// the device path must copy aside first.
enum class Place { kApart, kInPlace, kElsewhere };

std::string fmt_case(Coll coll, const TypeCase& ty, const OpCase& op, size_t n, Place place,
                     int root) {
  return fmt::format("{} {} {} count {}{} root {}", coll_name(coll), kn::dtype_name(ty.k),
                     kn::red_op_name(op.k), n,
                     place == Place::kInPlace     ? " in place"
                     : place == Place::kElsewhere ? " overlapping elsewhere"
                                                  : "",
                     root);
}

// One case on this rank: fills its input, runs the call, checks its output. 0 or 1.
int one_case(chorusComm_t comm, int r, int p, Coll coll, const TypeCase& ty, const OpCase& op,
             size_t n, Place place, int root, char* dev_send, char* dev_recv, int salt) {
  const size_t es = kn::dtype_size(ty.k);
  const bool send_blocks =
      coll == Coll::kReduceScatter || coll == Coll::kScatter || coll == Coll::kAllToAll;
  const bool recv_blocks =
      coll == Coll::kAllGather || coll == Coll::kGather || coll == Coll::kAllToAll;
  const size_t send_n = send_blocks ? n * p : n;
  const size_t recv_n = recv_blocks ? n * p : n;
  std::vector<std::vector<char>> ins;
  for (int q = 0; q < p; ++q) ins.push_back(input(ty.k, send_n, q, salt));
  char* send = dev_send;
  char* recv = dev_recv;
  const size_t block = (place == Place::kElsewhere ? (r + 1) % p : r) * n * es;
  if (place != Place::kApart) {
    if (coll == Coll::kAllGather || coll == Coll::kGather) {
      send = dev_recv + block;
    } else if (coll == Coll::kReduceScatter || coll == Coll::kScatter) {
      recv = dev_send + block;
    } else {
      recv = place == Place::kElsewhere ? send + n * es : send;
    }
  }
  std::memcpy(send, ins[r].data(), send_n * es);
  if (place == Place::kApart) std::memset(recv, 0x5a, recv_n * es);
  chorusResult_t rc = chorusSuccess;
  switch (coll) {
    case Coll::kAllReduce:
      rc = chorusAllReduce(send, recv, n, ty.c, op.c, comm, kStream);
      break;
    case Coll::kReduce:
      rc = chorusReduce(send, recv, n, ty.c, op.c, root, comm, kStream);
      break;
    case Coll::kBroadcast:
      rc = chorusBroadcast(send, recv, n, ty.c, root, comm, kStream);
      break;
    case Coll::kAllGather:
      rc = chorusAllGather(send, recv, n, ty.c, comm, kStream);
      break;
    case Coll::kReduceScatter:
      rc = chorusReduceScatter(send, recv, n, ty.c, op.c, comm, kStream);
      break;
    case Coll::kGather:
      rc = chorusGather(send, recv, n, ty.c, root, comm, kStream);
      break;
    case Coll::kScatter:
      rc = chorusScatter(send, recv, n, ty.c, root, comm, kStream);
      break;
    case Coll::kAllToAll:
      rc = chorusAllToAll(send, recv, n, ty.c, comm, kStream);
      break;
  }
  const std::string what = fmt_case(coll, ty, op, n, place, root);
  if (rc != chorusSuccess) return fail_with(r, what, chorusGetLastError(comm));
  std::vector<char> want;
  switch (coll) {
    case Coll::kAllReduce:
      want = folded(ty.k, op.k, ins, 0, n);
      break;
    case Coll::kReduce:
      if (r != root) return 0;
      want = folded(ty.k, op.k, ins, 0, n);
      break;
    case Coll::kBroadcast:
      want = ins[root];
      break;
    case Coll::kAllGather:
      for (int q = 0; q < p; ++q) want.insert(want.end(), ins[q].begin(), ins[q].end());
      break;
    case Coll::kReduceScatter:
      want = folded(ty.k, op.k, ins, r * n, n);
      break;
    case Coll::kGather:
      if (r != root) return 0;
      for (int q = 0; q < p; ++q) want.insert(want.end(), ins[q].begin(), ins[q].end());
      break;
    case Coll::kScatter:
      want.assign(ins[root].begin() + long(r * n * es), ins[root].begin() + long((r + 1) * n * es));
      break;
    case Coll::kAllToAll:
      for (int q = 0; q < p; ++q)
        want.insert(want.end(), ins[q].begin() + long(r * n * es),
                    ins[q].begin() + long((r + 1) * n * es));
      break;
  }
  if (std::memcmp(recv, want.data(), want.size()) != 0) {
    size_t at = 0;
    while (at < want.size() && recv[at] == want[at]) ++at;
    return fail_with(r, what, fmt::format("wrong byte {} of {}", at, want.size()));
  }
  return 0;
}

RunOptions opts(bool one_gpu, const char* die = nullptr) {
  RunOptions o;
  o.env = {{"CHORUS_TIMEOUT", "30"}};
  if (one_gpu)
    o.env.insert({{"CHORUS_TEST_GPU_UUID", "GPU-fake-0"}, {"CHORUS_ALLOW_SHARED_GPU", "1"}});
  if (die) o.env.insert({"CHORUS_TEST_DEVICE_DIE", die});
  o.limit_seconds = 240;
  return o;
}

}  // namespace

TEST_CASE("device collectives: every call x type x op x count x in place, bit for bit",
          "[device]") {
  struct Config {
    int p;
    bool one_gpu;
    bool two_hosts;  // ranks 0..p-2 on one host, the last on another: staged through the host
    // Ranks (bits) whose buffers CUDA IPC cannot map (VMM, cudaMallocAsync): through the bounce
    // buffer (collectives/device_bounce.h).
    unsigned unmapped = 0;
    // Ranks (bits) whose buffers are VMM memory that exports as a file descriptor: mapped by the
    // peers through it (collectives/device_vmm.h).
    unsigned vmm = 0;
  };
  for (Config c : {Config{2, false, false}, Config{2, true, false}, Config{3, false, false},
                   Config{3, true, false}, Config{3, false, true}, Config{2, false, false, 0b10},
                   Config{3, true, false, 0b111}, Config{3, true, false, 0, 0b011}}) {
    INFO(c.p << " ranks, " << (c.one_gpu ? "one GPU" : "a GPU each")
             << (c.two_hosts ? ", two hosts" : "") << ", unmapped memory on ranks (bits) "
             << c.unmapped << ", VMM memory on ranks (bits) " << c.vmm);
    RunOptions o = opts(c.one_gpu);
    if (c.unmapped || c.vmm) o.env["CHORUS_DEBUG"] = "INFO";
    auto res = run_ranks(
        c.p,
        [c](int r) {
          if (c.two_hosts) setenv("CHORUS_HOSTID", r == c.p - 1 ? "host-b" : "host-a", 1);
          chorusComm_t comm = init(r);
          if (!comm) return 1;
          constexpr size_t kMaxCount = 4099;
          auto alloc = c.unmapped >> r & 1 ? chorus::test::fake_unmapped_alloc
                       : c.vmm >> r & 1    ? chorus::test::fake_vmm_alloc
                                           : chorus::test::fake_device_alloc;
          // p + 1 blocks: an all-to-all's recvbuff may start one block past its sendbuff
          char* send = static_cast<char*>(alloc(kMaxCount * 8 * 4));
          char* recv = static_cast<char*>(alloc(kMaxCount * 8 * 4));
          int salt = 0, failures = 0, cases = 0;
          for (Coll coll : kColls)
            for (const TypeCase& ty : kTypes)
              for (const OpCase& op : kOps)
                for (size_t n : {size_t(1), size_t(5), size_t(1000), kMaxCount})
                  for (Place place : {Place::kApart, Place::kInPlace, Place::kElsewhere}) {
                    if (!reduces(coll) && op.k != kn::RedOp::kSum) continue;  // no op to vary
                    if (place == Place::kElsewhere && coll != Coll::kGather &&
                        coll != Coll::kScatter && coll != Coll::kAllToAll)
                      continue;
                    const int root = int((n + salt) % c.p);
                    ++cases;
                    failures +=
                        one_case(comm, r, c.p, coll, ty, op, n, place, root, send, recv, ++salt);
                    if (failures > 5) return 1;
                  }
          std::fprintf(stderr, "rank %d: %d cases, %d failed\n", r, cases, failures);
          chorus::test::fake_device_free(send);
          chorus::test::fake_device_free(recv);
          chorusCommDestroy(comm);
          // Each of the two allocations went to each peer once; the retains ended at destroy.
          const int exported = chorus::test::fake_vmm_exported(),
                    want = c.vmm >> r & 1 ? 2 * (c.p - 1) : 0;
          if (exported != want)
            return fail_with(r, "VMM",
                             fmt::format("{} descriptors exported, want {}", exported, want));
          if (chorus::test::fake_vmm_retained() != 0)
            return fail_with(r, "VMM", "allocations still retained after destroy");
          return failures == 0 ? 0 : 1;
        },
        o);
    check_all(res);
    for (int r = 0; r < c.p; ++r) {
      INFO("rank " << r << ":\n" << res[r].output);
      // Said once per communicator, by the ranks whose memory went through it.
      CHECK(occurrences(res[r].output, "through a bounce buffer") == int(c.unmapped >> r & 1));
      CHECK(occurrences(res[r].output, "map it through its file descriptor") ==
            int(c.vmm >> r & 1));
    }
  }
}

TEST_CASE("device copies move bytes as sent: signalling NaNs of f16 and bf16 stay signalling",
          "[device]") {
  // Rank q's element j: one of these bit patterns (bf16 and f16 signalling NaNs, a quiet NaN, an
  // infinity, a subnormal, ordinary values), shifted by rank; every copying call must deliver it.
  constexpr uint16_t kBits[] = {0x7f81, 0xff81, 0x7c01, 0xfc01, 0x7fc0,
                                0x7c00, 0x0001, 0x3c00, 0xc000, 0x1234};
  auto value = [&](int q, size_t j) { return kBits[(j + q * 3) % std::size(kBits)]; };
  for (bool one_gpu : {false, true}) {
    INFO((one_gpu ? "one GPU" : "a GPU each"));
    auto res = run_ranks(
        2,
        [&](int r) {
          chorusComm_t comm = init(r);
          if (!comm) return 1;
          constexpr size_t n = 37;  // odd: the blocks of the second rank start unaligned
          auto* send = static_cast<uint16_t*>(chorus::test::fake_device_alloc(2 * n * 2));
          auto* recv = static_cast<uint16_t*>(chorus::test::fake_device_alloc(2 * n * 2));
          for (chorusDataType_t t : {chorusFloat16, chorusBfloat16}) {
            for (const char* call :
                 {"broadcast", "all-gather", "gather", "scatter", "all-to-all"}) {
              const std::string c = call;
              for (size_t j = 0; j < 2 * n; ++j) send[j] = value(r, j), recv[j] = 0;
              chorusResult_t rc =
                  c == "broadcast"    ? chorusBroadcast(send, recv, n, t, 1, comm, kStream)
                  : c == "all-gather" ? chorusAllGather(send, recv, n, t, comm, kStream)
                  : c == "gather"     ? chorusGather(send, recv, n, t, 0, comm, kStream)
                  : c == "scatter"    ? chorusScatter(send, recv, n, t, 1, comm, kStream)
                                      : chorusAllToAll(send, recv, n, t, comm, kStream);
              if (rc != chorusSuccess) return fail_with(r, c, chorusGetLastError(comm));
              for (size_t j = 0; j < 2 * n; ++j) {
                const size_t b = j / n, e = j % n;  // block, element in it
                int want = -1;  // the bits expected at recv[j]; -1: untouched (0)
                if (c == "broadcast" && j < n) want = value(1, j);
                if (c == "all-gather" || (c == "gather" && r == 0)) want = value(int(b), e);
                if (c == "scatter" && j < n) want = value(1, r * n + j);
                if (c == "all-to-all") want = value(int(b), r * n + e);
                if (recv[j] != (want < 0 ? 0 : want))
                  return fail_with(
                      r, c + (t == chorusFloat16 ? " f16" : " bf16"),
                      fmt::format("element {}: bits {:#06x}, sent as {:#06x}", j, recv[j], want));
              }
            }
          }
          chorus::test::fake_device_free(send);
          chorus::test::fake_device_free(recv);
          chorusCommDestroy(comm);
          return 0;
        },
        opts(one_gpu));
    check_all(res);
  }
}

TEST_CASE(
    "device all-to-all-v: blocks where the arrays say, gaps kept, in place; counts that "
    "disagree named on every rank",
    "[device]") {
  struct Config {
    int p;
    bool one_gpu, two_hosts;
    unsigned unmapped;  // ranks (bits) whose memory goes through the bounce buffer
  };
  for (Config c :
       {Config{2, false, false, 0}, Config{3, false, false, 0}, Config{3, true, false, 0},
        Config{3, false, true, 0}, Config{3, true, false, 0b101}, Config{2, false, false, 0b10}}) {
    INFO(c.p << " ranks, " << (c.one_gpu ? "one GPU" : "a GPU each")
             << (c.two_hosts ? ", two hosts" : "") << ", unmapped memory on ranks (bits) "
             << c.unmapped);
    auto res = run_ranks(
        c.p,
        [c](int r) {
          if (c.two_hosts) setenv("CHORUS_HOSTID", r == c.p - 1 ? "host-b" : "host-a", 1);
          chorusComm_t comm = init(r);
          if (!comm) return 1;
          const int p = c.p;
          constexpr size_t kWords = 1 << 15;
          auto alloc = c.unmapped >> r & 1 ? chorus::test::fake_unmapped_alloc
                                           : chorus::test::fake_device_alloc;
          auto* a = static_cast<uint32_t*>(alloc(kWords * 4));
          auto* b = static_cast<uint32_t*>(alloc(kWords * 4));
          // Rank q's block to rank d in trial t: count(q, d, t) words (0 included; trial 4 large).
          auto count = [](int q, int d, int t) {
            return size_t((q * 7 + d * 3 + t * 5) % 11) * (t == 4 ? 700 : 1);
          };
          for (int t = 0; t < 6; ++t) {
            const bool in_place = t % 2 == 1;
            uint32_t* send = a;
            uint32_t* recv = in_place ? a : b;
            std::vector<size_t> sc(p), sd(p), rc(p), rd(p);
            size_t at = 0;
            for (int d = p - 1; d >= 0; --d) {  // blocks in reverse order, gaps of 1..3
              at += 1 + d % 3;
              sc[d] = count(r, d, t), sd[d] = at, at += sc[d];
            }
            // In place: trial 1 puts the recv blocks after the send ones, trials 3 and 5 over
            // them (so that the input must be read before any block is written).
            at = !in_place ? 2 : t == 1 ? at + 5 : 1;
            for (int q = 0; q < p; ++q) rc[q] = count(q, r, t), rd[q] = at, at += rc[q] + 2;
            for (size_t j = 0; j < kWords; ++j) a[j] = 0xabab0000u + uint32_t(j), b[j] = ~a[j];
            for (int d = 0; d < p; ++d)
              for (size_t j = 0; j < sc[d]; ++j) send[sd[d] + j] = uint32_t(r << 24 | d << 16 | j);
            std::vector<uint32_t> want(recv, recv + kWords);
            for (int q = 0; q < p; ++q)
              for (size_t j = 0; j < rc[q]; ++j) want[rd[q] + j] = uint32_t(q << 24 | r << 16 | j);
            if (chorusAllToAllv(send, sc.data(), sd.data(), recv, rc.data(), rd.data(),
                                chorusUint32, comm, kStream) != chorusSuccess)
              return fail_with(r, fmt::format("trial {}", t), chorusGetLastError(comm));
            for (size_t j = 0; j < kWords; ++j)
              if (recv[j] != want[j])
                return fail_with(r, fmt::format("trial {}{}", t, in_place ? " in place" : ""),
                                 fmt::format("word {}: {:#x}, want {:#x}", j, recv[j], want[j]));
          }
          // Rank 1 expects one element more from rank 0 than rank 0 sends it: every rank fails
          // naming the pair, before any GPU work; the communicator goes on. (Across hosts the
          // host path's check names it, as in host memory: after the call returned, which only
          // enqueues, as the communicator's error, which the next call reports.)
          std::vector<size_t> n(p, 4), d(p);
          for (int q = 0; q < p; ++q) d[q] = 4 * q;
          std::vector<size_t> rn = n;
          if (r == 1) rn[0] = 5;
          const chorusResult_t mismatch = chorusAllToAllv(a, n.data(), d.data(), b, rn.data(),
                                                          d.data(), chorusUint32, comm, kStream);
          const std::string why = chorusGetLastError(comm);
          if (c.two_hosts) {  // there the ranks of the pair fail (rank 2 may end first)
            if (r < 2) {
              if (mismatch != chorusSuccess) return fail_with(r, "mismatch across hosts", why);
              chorusResult_t async = chorusSuccess;
              for (int i = 0; i < 1000 && async == chorusSuccess; ++i) {
                chorusCommGetAsyncError(comm, &async);
                if (async == chorusSuccess) usleep(10000);
              }
              const chorusResult_t next =
                  chorusAllReduce(a, a, 1, chorusUint32, chorusSum, comm, kStream);
              const std::string said = chorusGetLastError(comm);
              if (async == chorusSuccess || next == chorusSuccess ||
                  !contains(said, "sends 4 to rank 1") || !contains(said, "expects 5 from rank 0"))
                return fail_with(r, "mismatch across hosts, the next call", said);
            }
            chorus::test::fake_device_free(a);
            chorus::test::fake_device_free(b);
            chorusCommDestroy(comm);
            return 0;
          }
          if (mismatch != chorusMismatch ||
              !contains(why, "rank 0 sends 4 elements to rank 1, which expects 5 from it"))
            return fail_with(r, "mismatch", why);
          a[0] = 1;
          if (chorusAllReduce(a, a, 1, chorusUint32, chorusSum, comm, kStream) != chorusSuccess ||
              a[0] != uint32_t(p))
            return fail_with(r, "after the mismatch", chorusGetLastError(comm));
          chorus::test::fake_device_free(a);
          chorus::test::fake_device_free(b);
          chorusCommDestroy(comm);
          return 0;
        },
        opts(c.one_gpu));
    check_all(res);
  }
}

TEST_CASE("device calls on one rank: each a copy of its block, all-to-all-v's gaps kept",
          "[device]") {
  auto res = run_ranks(
      1,
      [](int r) {
        chorusComm_t comm = init(r);
        if (!comm) return 1;
        auto* a = static_cast<float*>(chorus::test::fake_device_alloc(64 * 4));
        auto* b = static_cast<float*>(chorus::test::fake_device_alloc(64 * 4));
        const char* names[] = {"all-reduce",     "reduce",     "broadcast",
                               "all-gather",     "gather",     "scatter",
                               "reduce-scatter", "all-to-all", "all-to-all-v"};
        for (int c = 0; c < 9; ++c) {
          for (int j = 0; j < 64; ++j) a[j] = float(j), b[j] = -1;
          const size_t n = 7, counts[1] = {5}, sd[1] = {2}, rd[1] = {3};
          chorusResult_t rc =
              c == 0   ? chorusAllReduce(a, b, n, chorusFloat32, chorusSum, comm, kStream)
              : c == 1 ? chorusReduce(a, b, n, chorusFloat32, chorusSum, 0, comm, kStream)
              : c == 2 ? chorusBroadcast(a, b, n, chorusFloat32, 0, comm, kStream)
              : c == 3 ? chorusAllGather(a, b, n, chorusFloat32, comm, kStream)
              : c == 4 ? chorusGather(a, b, n, chorusFloat32, 0, comm, kStream)
              : c == 5 ? chorusScatter(a, b, n, chorusFloat32, 0, comm, kStream)
              : c == 6 ? chorusReduceScatter(a, b, n, chorusFloat32, chorusSum, comm, kStream)
              : c == 7
                  ? chorusAllToAll(a, b, n, chorusFloat32, comm, kStream)
                  : chorusAllToAllv(a, counts, sd, b, counts, rd, chorusFloat32, comm, kStream);
          if (rc != chorusSuccess) return fail_with(r, names[c], chorusGetLastError(comm));
          for (int j = 0; j < 64; ++j) {
            const bool v = c == 8;
            const bool copied = v ? j >= 3 && j < 8 : j < 7;
            const float want = !copied ? -1.0f : v ? float(j - 1) : float(j);
            if (b[j] != want)
              return fail_with(r, names[c], fmt::format("element {}: {}, want {}", j, b[j], want));
          }
        }
        chorus::test::fake_device_free(a);
        chorus::test::fake_device_free(b);
        chorusCommDestroy(comm);
        return 0;
      },
      opts(false));
  check_all(res);
}

TEST_CASE("device calls in a random sequence: kinds, placements, memory and streams mixed",
          "[device]") {
  // 3 ranks; the same sequence of 240 calls on every rank (one seed), each rank's memory for each
  // call drawn on its own (mapped by CUDA IPC, unmapped -- through the bounce buffer --, or VMM
  // by descriptor; ranks differ in one call), a barrier with a stream (or the legacy one) and an
  // all-to-all-v now and then; every result checked. On a GPU each, then one
  // shared (the leader-only meeting).
  for (bool one_gpu : {false, true}) {
    INFO((one_gpu ? "one GPU" : "a GPU each"));
    auto res = run_ranks(
        3,
        [](int r) {
          chorusComm_t comm = init(r);
          if (!comm) return 1;
          constexpr size_t kMax = 1500;
          char* bufs[3][2];  // [memory kind][send, recv]
          for (int m = 0; m < 3; ++m)
            for (char*& b : bufs[m]) {
              auto alloc = m == 0   ? chorus::test::fake_device_alloc
                           : m == 1 ? chorus::test::fake_unmapped_alloc
                                    : chorus::test::fake_vmm_alloc;
              b = static_cast<char*>(alloc(kMax * 8 * 4));
            }
          std::mt19937 shared(2026), own(77 + r);
          int failures = 0, made = 0;
          for (int i = 0; i < 240 && failures == 0; ++i) {
            const int pick = int(shared() % 12);
            ++made;
            const auto mem = own() % 3;
            if (pick == 10) {  // a barrier with a stream
              if (chorusBarrier(comm, shared() % 2 ? kStream : nullptr) != chorusSuccess)
                failures += fail_with(r, "barrier", chorusGetLastError(comm));
              continue;
            }
            if (pick == 11) {  // an all-to-all-v: blocks of 0..40 words, in reverse order
              auto* send = reinterpret_cast<uint32_t*>(bufs[mem][0]);
              auto* recv = reinterpret_cast<uint32_t*>(bufs[mem][1]);
              const uint32_t salt = uint32_t(shared());
              auto words = [&](int q, int d) { return size_t((salt >> (q * 3 + d)) % 41); };
              size_t sc[3], sd[3], rc[3], rd[3], at = 0;
              for (int d = 2; d >= 0; --d) sc[d] = words(r, d), sd[d] = at, at += sc[d] + 1;
              at = 0;
              for (int q = 0; q < 3; ++q) rc[q] = words(q, r), rd[q] = at, at += rc[q] + 1;
              for (int d = 0; d < 3; ++d)
                for (size_t j = 0; j < sc[d]; ++j) send[sd[d] + j] = salt + uint32_t(r << 8 | d);
              if (chorusAllToAllv(send, sc, sd, recv, rc, rd, chorusUint32, comm, kStream) !=
                  chorusSuccess) {
                failures += fail_with(r, "all-to-all-v", chorusGetLastError(comm));
                continue;
              }
              for (int q = 0; q < 3; ++q)
                for (size_t j = 0; j < rc[q]; ++j)
                  if (recv[rd[q] + j] != salt + uint32_t(q << 8 | r))
                    failures += fail_with(r, fmt::format("call {}: all-to-all-v", i), "wrong");
              continue;
            }
            const Coll coll = kColls[pick % std::size(kColls)];
            const TypeCase& ty = kTypes[shared() % std::size(kTypes)];
            const OpCase& op = kOps[shared() % std::size(kOps)];
            const size_t n = 1 + shared() % kMax;
            const Place place = Place(shared() % 3);
            const int root = int(shared() % 3);
            if (place == Place::kElsewhere && coll != Coll::kGather && coll != Coll::kScatter &&
                coll != Coll::kAllToAll)
              continue;
            failures +=
                one_case(comm, r, 3, coll, ty, op, n, place, root, bufs[mem][0], bufs[mem][1], i);
          }
          std::fprintf(stderr, "rank %d: %d calls made, %d failed\n", r, made, failures);
          for (auto& m : bufs)
            for (char* b : m) chorus::test::fake_device_free(b);
          chorusCommDestroy(comm);
          return failures == 0 && made > 200 ? 0 : 1;
        },
        opts(one_gpu));
    check_all(res);
  }
}

TEST_CASE("device gather, scatter and all-to-all(-v) in a group, and as chorusI* calls",
          "[device]") {
  auto res = run_ranks(
      3,
      [](int r) {
        chorusComm_t comm = init(r);
        if (!comm) return 1;
        auto* a = static_cast<int32_t*>(chorus::test::fake_device_alloc(64 * 4));
        auto* g = static_cast<int32_t*>(chorus::test::fake_device_alloc(64 * 4));
        auto* x = static_cast<int32_t*>(chorus::test::fake_device_alloc(64 * 4));
        auto* v = static_cast<int32_t*>(chorus::test::fake_device_alloc(64 * 4));
        for (int j = 0; j < 64; ++j) a[j] = 100 * r + j, g[j] = x[j] = v[j] = -1;
        const size_t counts[3] = {2, 2, 2}, displs[3] = {0, 2, 4};
        // Enqueued at End in call order: gather to rank 2, all-to-all, all-to-all-v.
        if (chorusGroupStart() != chorusSuccess ||
            chorusGather(a, g, 4, chorusInt32, 2, comm, kStream) != chorusSuccess ||
            chorusAllToAll(a, x, 4, chorusInt32, comm, kStream) != chorusSuccess ||
            chorusAllToAllv(a, counts, displs, v, counts, displs, chorusInt32, comm, kStream) !=
                chorusSuccess ||
            chorusGroupEnd() != chorusSuccess)
          return fail_with(r, "a group of device calls", chorusGetLastError(comm));
        for (int q = 0; q < 3; ++q)
          for (int j = 0; j < 4; ++j) {
            if (r == 2 && g[q * 4 + j] != 100 * q + j) return fail_with(r, "gather", "wrong");
            if (x[q * 4 + j] != 100 * q + r * 4 + j) return fail_with(r, "all-to-all", "wrong");
            if (j < 2 && v[q * 2 + j] != 100 * q + r * 2 + j)
              return fail_with(r, "all-to-all-v", "wrong");
          }
        // A non-blocking scatter: complete when it returns (enqueued), right.
        chorusRequest_t req = nullptr;
        if (chorusIscatter(a, x, 5, chorusInt32, 1, comm, &req) != chorusSuccess ||
            chorusWait(req, 1.0) != chorusSuccess)
          return fail_with(r, "chorusIscatter", chorusGetLastError(comm));
        chorusRequestFree(req);
        for (int j = 0; j < 5; ++j)
          if (x[j] != 100 + r * 5 + j) return fail_with(r, "chorusIscatter", "wrong");
        for (int32_t* p : {a, g, x, v}) chorus::test::fake_device_free(p);
        chorusCommDestroy(comm);
        return 0;
      },
      opts(false));
  check_all(res);
}

TEST_CASE("GPUs of one host that cannot reach each other: staged through host memory, named",
          "[device]") {
  // Faked identities UUID@BUS@PEERS (the PCI addresses whose memory the rank's GPU reaches):
  // none, one way only, both ways.
  struct Case {
    const char* a;
    const char* b;
    int named;  // the rank named as unable to reach, or -1: CUDA IPC
  };
  for (Case c : {Case{"GPU-a@0000:01:00.0", "GPU-b@0000:02:00.0", 0},
                 Case{"GPU-a@0000:01:00.0", "GPU-b@0000:02:00.0@0000:01:00.0", 0},
                 Case{"GPU-a@0000:01:00.0@0000:02:00.0", "GPU-b@0000:02:00.0", 1},
                 Case{"GPU-a@0000:01:00.0@0000:09:00.0,0000:02:00.0",
                      "GPU-b@0000:02:00.0@0000:01:00.0", -1}}) {
    INFO(c.a << " and " << c.b);
    RunOptions o = opts(false);
    o.env["CHORUS_DEBUG"] = "INFO";
    auto res = run_ranks(
        2,
        [c](int r) {
          setenv("CHORUS_TEST_GPU_UUID", r == 0 ? c.a : c.b, 1);
          chorusComm_t comm = init(r);
          if (!comm) return 1;
          auto* x = static_cast<float*>(chorus::test::fake_device_alloc(1000 * 4));
          for (int j = 0; j < 1000; ++j) x[j] = float(r + j);
          if (chorusAllReduce(x, x, 1000, chorusFloat32, chorusSum, comm, kStream) != chorusSuccess)
            return fail_with(r, "all-reduce", chorusGetLastError(comm));
          for (int j = 0; j < 1000; ++j)
            if (x[j] != float(1 + 2 * j)) return fail_with(r, "all-reduce", "wrong");
          chorus::test::fake_device_free(x);
          chorusCommDestroy(comm);
          return 0;
        },
        o);
    check_all(res);
    for (int r = 0; r < 2; ++r) {
      INFO("rank " << r << ":\n" << res[r].output);
      if (c.named < 0) {
        CHECK_FALSE(contains(res[r].output, "staged through host memory"));
      } else {
        const char* gpu = c.named == 0 ? "GPU GPU-a at 0000:01:00.0 (rank 0)"
                                       : "GPU GPU-b at 0000:02:00.0 (rank 1)";
        CHECK(contains(res[r].output, "staged through host memory"));
        CHECK(contains(res[r].output, std::string(gpu) + " cannot reach the memory of GPU"));
      }
    }
  }
}

TEST_CASE("device send/recv: alone, a ring in a group, both ways in a group", "[device]") {
  const bool two_hosts = GENERATE(false, true);  // rank 2 on a host of its own: staged
  // Memory that CUDA IPC cannot map on every rank: the sends through the bounce buffer, a piece
  // each (one for the two sends of `a`); or VMM memory, mapped by its descriptors.
  const int memory = GENERATE(0, 1, 2);
  const bool unmapped = memory == 1, vmm = memory == 2;
  INFO((two_hosts ? "two hosts" : "one host") << (unmapped ? ", unmapped memory"
                                                  : vmm    ? ", VMM memory"
                                                           : ""));
  auto res = run_ranks(
      3,
      [two_hosts, unmapped, vmm](int r) {
        if (two_hosts) setenv("CHORUS_HOSTID", r == 2 ? "host-b" : "host-a", 1);
        chorusComm_t comm = init(r);
        if (!comm) return 1;
        const int p = 3, right = (r + 1) % p, left = (r + p - 1) % p;
        const size_t n = 1001;
        auto alloc = unmapped ? chorus::test::fake_unmapped_alloc
                     : vmm    ? chorus::test::fake_vmm_alloc
                              : chorus::test::fake_device_alloc;
        auto* a = static_cast<float*>(alloc(n * 4));
        auto* b = static_cast<float*>(alloc(n * 4));
        auto* c = static_cast<float*>(alloc(n * 4));
        auto* d = static_cast<float*>(alloc(n * 4));
        auto* e = static_cast<float*>(alloc(n * 4));
        auto fill = [&](float* x, int q, int salt) {
          for (size_t j = 0; j < n; ++j) x[j] = float(q * 1000 + salt * 100) + float(j);
        };
        auto check = [&](const float* x, int q, int salt, const char* what) {
          for (size_t j = 0; j < n; ++j)
            if (x[j] != float(q * 1000 + salt * 100) + float(j))
              return fail_with(r, what, fmt::format("element {} wrong", j));
          return 0;
        };
        // Alone: rank 0 to rank 2.
        fill(a, r, 1);
        chorusResult_t rc = chorusSuccess;
        if (r == 0) rc = chorusSend(a, n, chorusFloat32, 2, comm, kStream);
        if (r == 2) rc = chorusRecv(b, n, chorusFloat32, 0, comm, kStream);
        if (rc != chorusSuccess) return fail_with(r, "send alone", chorusGetLastError(comm));
        if (r == 2 && check(b, 0, 1, "send alone") != 0) return 1;
        // A ring, receive posted first on odd ranks.
        fill(a, r, 2);
        chorusGroupStart();
        if (r % 2) chorusRecv(b, n, chorusFloat32, left, comm, kStream);
        chorusSend(a, n, chorusFloat32, right, comm, kStream);
        if (!(r % 2)) chorusRecv(b, n, chorusFloat32, left, comm, kStream);
        if (chorusGroupEnd() != chorusSuccess)
          return fail_with(r, "ring", chorusGetLastError(comm));
        if (check(b, left, 2, "ring") != 0) return 1;
        // Both ways with both neighbours, two messages to the right.
        fill(a, r, 3);
        fill(c, r, 4);
        chorusGroupStart();
        chorusSend(a, n, chorusFloat32, right, comm, kStream);
        chorusSend(c, n, chorusFloat32, right, comm, kStream);
        chorusSend(a, n, chorusFloat32, left, comm, kStream);
        chorusRecv(b, n, chorusFloat32, left, comm, kStream);
        chorusRecv(e, n, chorusFloat32, right, comm, kStream);
        chorusRecv(d, n, chorusFloat32, left, comm, kStream);
        if (chorusGroupEnd() != chorusSuccess)
          return fail_with(r, "both ways", chorusGetLastError(comm));
        // b, d: left's two messages in order; e: right's message to its left.
        if (check(b, left, 3, "both ways, first from the left") != 0 ||
            check(d, left, 4, "both ways, second from the left") != 0 ||
            check(e, right, 3, "both ways, from the right") != 0)
          return 1;
        chorusCommDestroy(comm);
        return 0;
      },
      opts(false));
  check_all(res);
}

// A grouped device send/recv's host exchange, call after call: each under 20 ms at the median.
// Its progress thread once slept the wait's whole 100 ms slice with the peer's record already in
// its ring; once a wait had slept, the spin budget halved and more waits slept, so about half of
// the runs paid 100 ms a call (10 ms a call on an H100, 2026-11-27: chorus-perf send_recv). Three
// fresh communicators (each its own spin budget), 60 calls each.
TEST_CASE("device send/recv in a group: the host exchange does not sleep through its peer",
          "[device]") {
  auto res = run_ranks(
      2,
      [](int r) {
        chorusComm_t world = init(r);
        if (!world) return 1;
        const size_t n = 4096;
        auto* a = static_cast<float*>(chorus::test::fake_device_alloc(n * 4));
        auto* b = static_cast<float*>(chorus::test::fake_device_alloc(n * 4));
        for (int trial = 0; trial < 3; ++trial) {
          chorusComm_t comm = nullptr;
          if (chorusCommSplit(world, 0, r, &comm) != chorusSuccess)
            return fail_with(r, "split", chorusGetLastError(world));
          std::vector<double> ms;
          for (int i = 0; i < 60; ++i) {
            const auto t0 = std::chrono::steady_clock::now();
            chorusGroupStart();
            chorusSend(a, n, chorusFloat32, 1 - r, comm, kStream);
            chorusRecv(b, n, chorusFloat32, 1 - r, comm, kStream);
            if (chorusGroupEnd() != chorusSuccess)
              return fail_with(r, "send/recv", chorusGetLastError(comm));
            ms.push_back(
                std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                    .count());
          }
          std::sort(ms.begin(), ms.end());
          if (ms[30] > 20)
            return fail_with(r, "send/recv",
                             fmt::format("communicator {}: median {:.1f} ms a call (slowest "
                                         "{:.1f} ms)",
                                         trial, ms[30], ms.back()));
          chorusCommDestroy(comm);
        }
        chorusCommDestroy(world);
        return 0;
      },
      opts(false));
  check_all(res);
}

TEST_CASE("VMM memory by descriptor: a reused address is a new allocation; a full registry bounces",
          "[device]") {
  RunOptions o = opts(false);
  o.env["CHORUS_DEBUG"] = "INFO";
  auto res = run_ranks(
      2,
      [](int r) {
        chorusComm_t comm = init(r);
        if (!comm) return 1;
        const size_t n = 1000;
        auto all_reduce = [&](float* x, int salt, const char* what) {
          for (size_t j = 0; j < n; ++j) x[j] = float(r + salt + j);
          if (chorusAllReduce(x, x, n, chorusFloat32, chorusSum, comm, kStream) != chorusSuccess)
            return fail_with(r, what, chorusGetLastError(comm));
          for (size_t j = 0; j < n; ++j)
            if (x[j] != float(2 * (salt + j) + 1))
              return fail_with(r, what, fmt::format("element {}: {}", j, x[j]));
          return 0;
        };
        // An allocation, freed, and another (at the same address, as often as not): the peer must
        // map the new one, not read the old.
        auto* a = static_cast<float*>(chorus::test::fake_vmm_alloc(n * 4));
        if (all_reduce(a, 1, "first allocation") != 0) return 1;
        chorus::test::fake_device_free(a);
        auto* b = static_cast<float*>(chorus::test::fake_vmm_alloc(n * 4));
        std::fprintf(stderr, "rank %d: second allocation %s\n", r,
                     a == b ? "at the first one's address" : "elsewhere");
        if (all_reduce(b, 2, "second allocation") != 0) return 1;
        if (all_reduce(b, 3, "second allocation again") != 0) return 1;
        if (chorus::test::fake_vmm_exported() != 2)
          return fail_with(
              r, "VMM",
              fmt::format("{} descriptors exported, want 2", chorus::test::fake_vmm_exported()));
        // More allocations alive at once than the registry keeps: the rest through the bounce
        // buffer, every result right.
        std::vector<float*> many;
        for (int i = 0; i < chorus::kMaxVmmLive + 4; ++i) {
          many.push_back(static_cast<float*>(chorus::test::fake_vmm_alloc(n * 4)));
          if (all_reduce(many.back(), 10 + i, "many allocations") != 0) return 1;
        }
        for (float* x : many) chorus::test::fake_device_free(x);
        chorus::test::fake_device_free(b);
        chorusCommDestroy(comm);
        if (chorus::test::fake_vmm_retained() != 0)
          return fail_with(r, "VMM", "allocations still retained after destroy");
        return 0;
      },
      o);
  check_all(res);
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r << ":\n" << res[r].output);
    CHECK(occurrences(res[r].output, "map it through its file descriptor") == 1);
    CHECK(occurrences(res[r].output, "the rest go through the bounce buffer") == 1);
  }
}

TEST_CASE("VMM allocations freed: the owner says so and the peers unmap them, for any number",
          "[device]") {
  auto res = run_ranks(
      2,
      [](int r) {
        chorusComm_t comm = init(r);
        if (!comm) return 1;
        const size_t n = 1000;
        // More allocations over the communicator's life than the registry holds at once, each
        // freed after its call (four kept alive, so that new ones do not all come back at one
        // address): each goes by descriptor, and the peer unmaps the freed ones as it hears.
        const int rounds = 5 * chorus::kMaxVmmLive;
        std::vector<float*> alive;
        int most = 0;
        for (int i = 0; i < rounds; ++i) {
          auto* x = static_cast<float*>(chorus::test::fake_vmm_alloc(n * 4));
          for (size_t j = 0; j < n; ++j) x[j] = float(r + i + j % 3);
          if (chorusAllReduce(x, x, n, chorusFloat32, chorusSum, comm, kStream) != chorusSuccess)
            return fail_with(r, "all-reduce", chorusGetLastError(comm));
          for (size_t j = 0; j < n; ++j)
            if (x[j] != float(2 * (i + j % 3) + 1))
              return fail_with(r, fmt::format("round {}", i),
                               fmt::format("element {}: {}", j, x[j]));
          alive.push_back(x);
          if (alive.size() > 4) {
            chorus::test::fake_device_free(alive.front());
            alive.erase(alive.begin());
          }
          most = std::max(most, chorus::test::fake_vmm_mapped());
        }
        const int exported = chorus::test::fake_vmm_exported();
        for (float* x : alive) chorus::test::fake_device_free(x);
        chorusCommDestroy(comm);
        if (exported != rounds)
          return fail_with(r, "descriptors",
                           fmt::format("{} exported, want {} (one per allocation: none through "
                                       "the bounce buffer)",
                                       exported, rounds));
        const int bound = chorus::kMaxVmmLive + chorus::capi::devcall::kMaxAnnounced;
        if (most > bound)
          return fail_with(r, "mappings",
                           fmt::format("the peer's allocations mapped here reached {}, want at "
                                       "most {}",
                                       most, bound));
        return 0;
      },
      opts(false));
  check_all(res);
}

TEST_CASE("CUDA IPC buffers freed and allocated again where they were: the peers close the old",
          "[device]") {
  auto res = run_ranks(
      3,
      [](int r) {
        chorusComm_t comm = init(r);
        if (!comm) return 1;
        const size_t n = 5000;
        const int rounds = 8;
        auto* x = static_cast<float*>(chorus::test::fake_device_alloc(n * 4));
        const int before = chorus::transport::shared_peer_mappings();
        for (int round = 0; round < rounds; ++round) {
          // A stale mapping would give the first round's numbers.
          for (size_t j = 0; j < n; ++j) x[j] = float(r + round * 10 + j % 9);
          if (chorusAllReduce(x, x, n, chorusFloat32, chorusSum, comm, kStream) != chorusSuccess)
            return fail_with(r, "all-reduce", chorusGetLastError(comm));
          for (size_t j = 0; j < n; ++j)
            if (x[j] != float(3 * (round * 10 + j % 9) + 3))
              return fail_with(r, fmt::format("round {}", round),
                               fmt::format("element {}: {}", j, x[j]));
          void* old = x;
          chorus::test::fake_device_free(x);
          x = static_cast<float*>(chorus::test::fake_device_alloc_at(old, n * 4));
          if (x != old)
            return fail_with(r, "allocation", "the freed range was taken: the test needs it");
        }
        // Each round after the first: each peer's allocation where its last one lay, which this
        // process closes (and then unmaps, its owner having freed it).
        const int closes = chorus::test::fake_ipc_closes();
        const int mapped = chorus::transport::shared_peer_mappings() - before;
        chorus::test::fake_device_free(x);
        chorusCommDestroy(comm);
        if (closes != 2 * (rounds - 1))
          return fail_with(r, "closes", fmt::format("{}, want {}", closes, 2 * (rounds - 1)));
        if (mapped > 4)  // the 2 peers' flag words and their last buffers
          return fail_with(
              r, "mappings",
              fmt::format("{} peers' allocations still mapped, want at most 4", mapped));
        return 0;
      },
      opts(false));
  check_all(res);
}

TEST_CASE(
    "CUDA IPC buffers freed with nothing where they were: the owner says so, peers close them",
    "[device]") {
  auto res = run_ranks(
      3,
      [](int r) {
        chorusComm_t comm = init(r);
        if (!comm) return 1;
        const size_t n = 3000;
        const int rounds = 6;
        // Every buffer allocated at the start, so that none lies where a freed one lay: only the
        // owner's word can tell the peers that one was freed.
        std::vector<float*> x(rounds), sends(rounds);
        for (int i = 0; i < rounds; ++i) {
          x[i] = static_cast<float*>(chorus::test::fake_device_alloc(n * 4));
          sends[i] = static_cast<float*>(chorus::test::fake_device_alloc(n * 4));
        }
        auto* y = static_cast<float*>(chorus::test::fake_device_alloc(n * 4));
        auto all_reduce = [&](float* b, int salt) {
          for (size_t j = 0; j < n; ++j) b[j] = float(r + salt + j % 7);
          if (chorusAllReduce(b, b, n, chorusFloat32, chorusSum, comm, kStream) != chorusSuccess)
            return fail_with(r, "all-reduce", chorusGetLastError(comm));
          for (size_t j = 0; j < n; ++j)
            if (b[j] != float(3 * (salt + j % 7) + 3))
              return fail_with(r, fmt::format("all-reduce {}", salt),
                               fmt::format("element {}: {}", j, b[j]));
          return 0;
        };
        // y stays alive and in use throughout: closing it would end the process (fake_gpu.h).
        if (all_reduce(y, 100) != 0) return 1;
        for (int i = 0; i < rounds; ++i) {
          if (all_reduce(x[i], i) != 0) return 1;
          chorus::test::fake_device_free(x[i]);
        }
        // An owner checks a few of its exported allocations per call: three more calls find
        // every free here (at most four are watched at once).
        for (int i = 0; i < 3; ++i)
          if (all_reduce(y, 101 + i) != 0) return 1;
        const int closes = chorus::test::fake_ipc_closes();
        if (closes != 2 * rounds)
          return fail_with(r, "collectives", fmt::format("{} closes, want {}", closes, 2 * rounds));
        // Sends from rank 0 to rank 1, each from a buffer freed after it: the news goes in the
        // pair's records.
        for (int i = 0; i < rounds + 3 && r < 2; ++i) {
          float* b = i < rounds ? sends[i] : y;
          chorusResult_t rc = chorusSuccess;
          if (r == 0) {
            for (size_t j = 0; j < n; ++j) b[j] = float(i + j % 5);
            rc = chorusSend(b, n, chorusFloat32, 1, comm, kStream);
          } else {
            rc = chorusRecv(y, n, chorusFloat32, 0, comm, kStream);
            for (size_t j = 0; rc == chorusSuccess && j < n; ++j)
              if (y[j] != float(i + j % 5))
                return fail_with(r, fmt::format("receive {}", i),
                                 fmt::format("element {}: {}", j, y[j]));
          }
          if (rc != chorusSuccess) return fail_with(r, "send/recv", chorusGetLastError(comm));
          if (r == 0 && i < rounds) chorus::test::fake_device_free(sends[i]);
        }
        const int more = chorus::test::fake_ipc_closes() - closes;
        const int want = r == 1 ? rounds : 0;
        if (more != want)
          return fail_with(r, "sends", fmt::format("{} closes, want {}", more, want));
        if (chorusBarrier(comm, nullptr) != chorusSuccess)
          return fail_with(r, "barrier", chorusGetLastError(comm));
        for (float* s : sends)
          if (r != 0) chorus::test::fake_device_free(s);
        chorus::test::fake_device_free(y);
        chorusCommDestroy(comm);
        return 0;
      },
      opts(false));
  check_all(res);
}

TEST_CASE("device send met by a send: named on both ranks, the communicator goes on", "[device]") {
  auto res = run_ranks(
      2,
      [](int r) {
        chorusComm_t comm = init(r);
        if (!comm) return 1;
        auto* a = static_cast<float*>(chorus::test::fake_device_alloc(64 * 4));
        chorusResult_t rc = chorusSend(a, 64, chorusFloat32, 1 - r, comm, kStream);
        const std::string why = chorusGetLastError(comm);
        std::fprintf(stderr, "rank %d: %s\n", r, why.c_str());
        if (rc != chorusInvalidUsage || !contains(why, "has no matching receive") ||
            !contains(why, fmt::format("rank {} sends count 64 of f32", 1 - r)) ||
            !contains(why, "chorusGroupStart/End"))
          return fail_with(r, "expected the mismatch named", why);
        // A count that differs.
        rc = r == 0 ? chorusSend(a, 64, chorusFloat32, 1, comm, kStream)
                    : chorusRecv(a, 32, chorusFloat32, 0, comm, kStream);
        if (rc != chorusInvalidUsage || !contains(chorusGetLastError(comm), "count 32"))
          return fail_with(r, "count mismatch", chorusGetLastError(comm));
        float x = 1;
        if (chorusAllReduce(&x, &x, 1, chorusFloat32, chorusSum, comm, nullptr) != chorusSuccess ||
            x != 2)
          return fail_with(r, "host all-reduce after", chorusGetLastError(comm));
        chorusCommDestroy(comm);
        return 0;
      },
      opts(false));
  check_all(res);
}

TEST_CASE(
    "capture into a CUDA graph on one rank only: named on every rank, for collectives and for "
    "sends and receives; the communicator goes on",
    "[device]") {
  for (bool one_gpu : {false, true}) {
    INFO((one_gpu ? "one GPU" : "a GPU each"));
    auto res = run_ranks(
        3,
        [](int r) {
          chorusComm_t comm = init(r);
          if (!comm) return 1;
          auto* a = static_cast<float*>(chorus::test::fake_device_alloc(64 * 4));
          auto* b = static_cast<float*>(chorus::test::fake_device_alloc(64 * 4));
          auto named = [&](chorusResult_t rc, const char* what, const char* words) {
            const std::string why = chorusGetLastError(comm);
            return rc != chorusSuccess && contains(why, words) ? 0 : fail_with(r, what, why);
          };
          if (r == 1) chorus::test::fake_capturing(kStream, true);
          for (int j = 0; j < 64; ++j) a[j] = float(r + 1);
          if (named(chorusAllReduce(a, a, 64, chorusFloat32, chorusSum, comm, kStream),
                    "all-reduce, rank 1 capturing",
                    "rank 1's stream is being captured into a CUDA graph") != 0)
            return 1;
          if (a[0] != float(r + 1)) return fail_with(r, "all-reduce, rank 1 capturing", "ran");
          // Send/recv in a group: ranks 0 and 1 only.
          if (r < 2) {
            chorusGroupStart();
            chorusSend(a, 64, chorusFloat32, 1 - r, comm, kStream);
            chorusRecv(b, 64, chorusFloat32, 1 - r, comm, kStream);
            if (named(chorusGroupEnd(), "send/recv, rank 1 capturing",
                      r == 0 ? "rank 0 sends count 64 of f32 to rank 1, not captured; rank 1 "
                               "receives count 64 of f32 from rank 0, captured into a CUDA "
                               "graph: both ranks capture a send and its receive into CUDA "
                               "graphs, or neither does"
                             : "or neither does") != 0)
              return 1;
          }
          if (r == 1) chorus::test::fake_capturing(kStream, false);
          if (chorusAllReduce(a, a, 64, chorusFloat32, chorusSum, comm, kStream) != chorusSuccess ||
              a[63] != 6.0f)
            return fail_with(r, "all-reduce after", chorusGetLastError(comm));
          chorusCommDestroy(comm);
          return 0;
        },
        opts(one_gpu));
    check_all(res);
  }
}

TEST_CASE("CHORUS_DEVICE_TIMING=3: the first 3 device calls' stages timed and printed at destroy",
          "[device][timing]") {
  RunOptions o = opts(false);
  o.env.insert({"CHORUS_DEVICE_TIMING", "3"});
  auto res = run_ranks(
      2,
      [](int r) {
        chorusComm_t comm = init(r);
        if (!comm) return 1;
        auto* a = static_cast<float*>(chorus::test::fake_device_alloc(1000 * 4));
        auto* b = static_cast<float*>(chorus::test::fake_device_alloc(1000 * 4));
        bool ok =
            chorusAllReduce(a, b, 1000, chorusFloat32, chorusSum, comm, kStream) == chorusSuccess;
        ok = ok && (r == 0 ? chorusSend(a, 500, chorusFloat32, 1, comm, kStream)
                           : chorusRecv(b, 500, chorusFloat32, 0, comm, kStream)) == chorusSuccess;
        for (int i = 0; i < 2; ++i)  // the second is not timed
          ok = ok && chorusAllReduce(a, b, 1000, chorusFloat32, chorusSum, comm, kStream) ==
                         chorusSuccess;
        if (!ok) return fail_with(r, "a call", chorusGetLastError(comm));
        chorusCommDestroy(comm);
        return 0;
      },
      o);
  check_all(res);
  for (int r = 0; r < 2; ++r) {
    const std::string& out = res[size_t(r)].output;
    INFO("rank " << r << ":\n" << out);
    const std::string me = fmt::format("chorus: rank {}: device timing, ", r);
    CHECK(contains(out, me +
                            "call 1 (chorusAllReduce: all_reduce of count 1000 of f32 by sum)"
                            " | signal ready to rank " +
                            std::to_string(1 - r) + ": "));
    CHECK(contains(out, fmt::format(" | wait for rank {}'s ready: ", 1 - r)));
    CHECK(contains(out, " | reduction kernel (2000 bytes): "));
    CHECK(contains(out, fmt::format(" | wait for rank {}'s done: ", 1 - r)));
    CHECK(contains(out, r == 0 ? me + "call 2 (chorusSend: " : me + "call 2 (chorusRecv: "));
    CHECK(contains(
        out, r == 0 ? " | wait for rank 1's copied: " : " | copying from rank 0 (2000 bytes): "));
    CHECK(contains(out, me + "call 3 (chorusAllReduce"));
    CHECK(!contains(out, me + "call 4"));
    CHECK(contains(out, me + "median of 2 call(s) (chorusAllReduce: all_reduce of count 1000"));
    CHECK(contains(out, " ms | total "));
    CHECK(!contains(out, "not reached"));
  }
}

TEST_CASE("device collectives: disagreements named on every rank; I-calls, barrier, refusals",
          "[device]") {
  auto res = run_ranks(
      3,
      [](int r) {
        chorusComm_t comm = init(r);
        if (!comm) return 1;
        auto* a = static_cast<float*>(chorus::test::fake_device_alloc(300 * 4));
        auto* b = static_cast<float*>(chorus::test::fake_device_alloc(300 * 4));
        // Roots that differ.
        chorusResult_t rc =
            chorusBroadcast(a, a, 100, chorusFloat32, r == 2 ? 1 : 0, comm, kStream);
        std::string why = chorusGetLastError(comm);
        if (rc != chorusInvalidUsage || !contains(why, "ranks disagree") ||
            !contains(why, "with root 1") || !contains(why, "with root 0"))
          return fail_with(r, "roots", why);
        // A non-blocking all-reduce: complete when it returns (enqueued), right.
        for (int j = 0; j < 100; ++j) a[j] = float(r + j);
        chorusRequest_t req = nullptr;
        if (chorusIallReduce(a, b, 100, chorusFloat32, chorusSum, comm, &req) != chorusSuccess)
          return fail_with(r, "chorusIallReduce", chorusGetLastError(comm));
        int done = 0;
        if (chorusTest(req, &done) != chorusSuccess || !done ||
            chorusWait(req, 1.0) != chorusSuccess)
          return fail_with(r, "request", chorusGetLastError(comm));
        chorusRequestFree(req);
        for (int j = 0; j < 100; ++j)
          if (b[j] != float(3 + 3 * j)) return fail_with(r, "chorusIallReduce", "wrong sum");
        if (chorusBarrier(comm, kStream) != chorusSuccess)
          return fail_with(r, "barrier with a stream", chorusGetLastError(comm));
        // Refused by name, before any exchange.
        if (chorusIsend(a, 10, chorusFloat32, (r + 1) % 3, 0, comm, &req) !=
                chorusInvalidArgument ||
            !contains(chorusGetLastError(comm), "device buffers are sent by chorusSend"))
          return fail_with(r, "chorusIsend", chorusGetLastError(comm));
        // In a group: two all-reduces, a broadcast and a send/recv around the ring, enqueued at
        // End (the collectives in call order, then the sends and receives); an I-call refused.
        auto* c = static_cast<float*>(chorus::test::fake_device_alloc(300 * 4));
        for (int j = 0; j < 100; ++j)
          a[j] = float(r + j), a[100 + j] = float(100 * r + j), b[j] = float(r),
          c[j] = float(10 * r);
        if (chorusGroupStart() != chorusSuccess ||
            chorusRecv(c + 100, 100, chorusFloat32, (r + 2) % 3, comm, kStream) != chorusSuccess ||
            chorusAllReduce(a, a, 100, chorusFloat32, chorusSum, comm, kStream) != chorusSuccess ||
            chorusAllReduce(b, b, 100, chorusFloat32, chorusMax, comm, kStream) != chorusSuccess ||
            chorusBroadcast(c, c, 100, chorusFloat32, 2, comm, kStream) != chorusSuccess ||
            chorusSend(a + 100, 100, chorusFloat32, (r + 1) % 3, comm, kStream) != chorusSuccess ||
            chorusIallReduce(a, b, 10, chorusFloat32, chorusSum, comm, &req) !=
                chorusInvalidUsage ||
            !contains(chorusGetLastError(comm), "inside a group use chorusAllReduce") ||
            chorusGroupEnd() != chorusSuccess)
          return fail_with(r, "a group of device calls", chorusGetLastError(comm));
        for (int j = 0; j < 100; ++j)
          if (a[j] != float(3 + 3 * j) || b[j] != 2.0f || c[j] != 20.0f ||
              c[100 + j] != float(100 * ((r + 2) % 3) + j))
            return fail_with(r, "a group of device calls",
                             "a wrong result at " + std::to_string(j));
        chorus::test::fake_device_free(c);
        // Host buffers with a stream: refused.
        float x = 1;
        if (chorusAllReduce(&x, &x, 1, chorusFloat32, chorusSum, comm, kStream) !=
            chorusInvalidArgument)
          return fail_with(r, "host buffers with a stream", chorusGetLastError(comm));
        // Still working.
        if (chorusAllReduce(&x, &x, 1, chorusFloat32, chorusSum, comm, nullptr) != chorusSuccess ||
            x != 3)
          return fail_with(r, "host all-reduce after", chorusGetLastError(comm));
        chorusCommDestroy(comm);
        return 0;
      },
      opts(true));
  check_all(res);
}

TEST_CASE("a rank killed during a device all-reduce: the survivors' waits end, named in 5 s",
          "[device]") {
  // Rank 1 dies in the second call, after the exchange, before it signals. With VMM memory the
  // second call's buffer is a new allocation, so the survivors are passing descriptors with
  // rank 1 when it dies: over the pair's socket of the first call (1), or (2: the first call's
  // memory was cudaMalloc's) while they set it up -- ended by the communicator's failure, not at
  // its timeout.
  const int vmm = GENERATE(0, 1, 2);
  INFO((vmm == 0 ? "cudaMalloc memory" : vmm == 1 ? "VMM memory" : "VMM memory from the 2nd call"));
  RunOptions o = opts(false, "1");
  o.limit_seconds = 60;
  auto res = run_ranks(
      3,
      [vmm](int r) {
        chorusComm_t comm = init(r);
        if (!comm) return 1;
        auto alloc = vmm == 1 ? chorus::test::fake_vmm_alloc : chorus::test::fake_device_alloc;
        auto* a = static_cast<float*>(alloc(1000 * 4));
        if (chorusAllReduce(a, a, 1000, chorusFloat32, chorusSum, comm, kStream) != chorusSuccess)
          return fail_with(r, "the first all-reduce", chorusGetLastError(comm));
        if (vmm) a = static_cast<float*>(chorus::test::fake_vmm_alloc(1000 * 4));
        const auto t0 = std::chrono::steady_clock::now();
        chorusResult_t rc = chorusAllReduce(a, a, 1000, chorusFloat32, chorusSum, comm, kStream);
        const double took =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        const std::string why = chorusGetLastError(comm);
        std::fprintf(stderr, "rank %d after %.2f s: %s\n", r, took, why.c_str());
        // The other survivor must hear of rank 1 before it hears of this one's exit.
        std::this_thread::sleep_for(std::chrono::seconds(1));
        // Destroyed (rank 0's store joins its connection threads: an exit with a finished one
        // not joined is a thread leak under TSan).
        chorusCommDestroy(comm);
        // VMM: the pair's descriptor socket ends with rank 1 (or, before it exists, the
        // communicator's failure ends the wait for it); the message adds why.
        if (rc == chorusSuccess || !contains(why, "rank 1") ||
            !contains(why, vmm == 0 ? "results are void" : "the communicator failed"))
          return fail_with(r, "expected the death named", why);
        if (took > 5) return fail_with(r, "too slow", std::to_string(took) + " s");
        return 0;
      },
      o);
  for (size_t r = 0; r < res.size(); ++r) {
    INFO("rank " << r << ":\n" << res[r].output);
    if (r == 1) {
      CHECK(res[r].exit_code != 0);
    } else {
      CHECK(res[r].exit_code == 0);
    }
  }
}

TEST_CASE("the values that release a failed rank's stream waits end every wait, counts wrapped too",
          "[device]") {
  // A stream wait ends when (int32_t)(word - awaited) >= 0: CUDA's cyclic comparison, which the
  // emulated GPU applies too. Blocks: ready, done (the collectives), tx ready (receives from q),
  // rx ready and rx done (sends to q).
  auto ends = [](uint32_t word, uint32_t awaited) {
    return static_cast<int32_t>(word - awaited) >= 0;
  };
  for (uint32_t base : {0u, 1u, 0x7ffffff0u, 0x80000005u, 0xfffffff0u}) {
    chorus::DeviceIpc st;
    st.seq.store(base);
    for (int q = 0; q < chorus::kMaxDeviceRanks; ++q) {
      st.tx_seq[q].store(base + 1000u * q);
      st.rx_seq[q].store(base ^ (0x40000000u * (q % 4)));
    }
    const auto v = chorus::device_release_values(st);
    for (int q = 0; q < chorus::kMaxDeviceRanks; ++q) {
      const uint32_t awaited[5] = {base, base, st.rx_seq[q].load(), st.tx_seq[q].load(),
                                   st.tx_seq[q].load()};
      for (int b = 0; b < 5; ++b)
        for (uint32_t ahead : {0u, 1u, 64u, 1u << 20}) {  // waits enqueued so far and still to come
          INFO("base " << base << ", block " << b << ", rank " << q << ", ahead " << ahead);
          CHECK(ends(v[b * chorus::kMaxDeviceRanks + q], awaited[b] + ahead));
          CHECK(ends(v[b * chorus::kMaxDeviceRanks + q], awaited[b] - (ahead > 0)));
        }
    }
  }
  CHECK_FALSE(ends(0xffffffffu, 1u));  // the value that left an H200's survivors waiting
}

TEST_CASE(
    "device calls of ranks that are threads of one process go through host memory (CUDA IPC "
    "refuses a process's own handles), right, saying why",
    "[device]") {
  RunOptions o;
  o.env = {{"CHORUS_DEBUG", "INFO"}, {"CHORUS_ALLOW_SHARED_GPU", "1"}, {"CHORUS_TIMEOUT", "30"}};
  auto res = run_ranks(
      1,
      [](int) {
        chorus::test::install_fake_gpu();
        chorusComm_t comms[2] = {nullptr, nullptr};
        if (chorusCommInitAll(comms, 2, nullptr) != chorusSuccess)
          return fail_with(0, "chorusCommInitAll", chorusGetLastError(nullptr));
        constexpr size_t n = 64;
        int failed = 0;
        auto rank = [&](int r) {
          auto* buf = static_cast<float*>(chorus::test::fake_device_alloc(n * 4));
          void* stream = chorus::test::fake_async_stream();
          for (size_t j = 0; j < n; ++j) buf[j] = float(r * 100 + j);
          for (int k = 0; k < 3; ++k)  // in place: each call sums the last one's results
            if (chorusAllReduce(buf, buf, n, chorusFloat32, chorusSum, comms[r], stream) !=
                chorusSuccess)
              return fail_with(r, "the all-reduce", chorusGetLastError(comms[r]));
          if (chorus::test::fake_stream_sync(stream) != 0)
            return fail_with(r, "the stream", "failed");
          for (size_t j = 0; j < n; ++j)  // (100 + 2j) after one call, doubled by the next two
            if (buf[j] != 4 * float(100 + 2 * j))
              return fail_with(r, "the result", fmt::format("[{}] = {}", j, buf[j]));
          return 0;
        };
        std::thread other([&] { failed += rank(1); });
        const int mine = rank(0);
        other.join();
        for (chorusComm_t c : comms) chorusCommDestroy(c);
        return mine + failed;
      },
      o);
  chorus::test::check_all(res);
  CHECK(contains(res[0].output, "ranks 0 and 1 are threads of one process"));
}
