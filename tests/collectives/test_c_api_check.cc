// The C API's argument table (collectives/c_api_check.h) on its own: every rule, every bound,
// and the exception boundary's translation, without a communicator.
#include <catch2/catch.hpp>

#include <chrono>
#include <climits>
#include <cmath>
#include <new>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>

#include "collectives/c_api_check.h"
#include "collectives/comm.h"
#include "kernels/cuda/ipc.h"
#include "kernels/cuda/memory.h"

using namespace chorus;
using namespace chorus::capi;

namespace {

const OpKind kAllKinds[] = {OpKind::kSend,      OpKind::kRecv,          OpKind::kBarrier,
                            OpKind::kBroadcast, OpKind::kAllReduce,     OpKind::kReduce,
                            OpKind::kAllGather, OpKind::kReduceScatter, OpKind::kGather,
                            OpKind::kScatter,   OpKind::kAllToAll,      OpKind::kAllToAllv};

float g_a[8], g_b[8];
// All-to-all-v over two ranks: blocks of 2 and 1 elements.
size_t g_scounts[2] = {2, 1}, g_sdispls[2] = {0, 2}, g_rcounts[2] = {2, 1}, g_rdispls[2] = {1, 4};

// Arguments every kind accepts: two buffers, a reducible type, a known op, ranks 0 and 1.
Args good() {
  Args a;
  a.sendbuff = g_a;
  a.recvbuff = g_b;
  a.count = 4;
  a.datatype = chorusFloat32;
  a.op = chorusSum;
  a.root = 0;
  a.peer = 1;
  a.sendcounts = g_scounts;
  a.sdispls = g_sdispls;
  a.recvcounts = g_rcounts;
  a.rdispls = g_rdispls;
  return a;
}

std::string refusal(OpKind kind, const Args& a, int rank = 0, int nranks = 2) {
  auto r = check_args({"chorusTest", kind, false}, a, rank, nranks);
  return r.is_ok() ? std::string("accepted") : r.status().message();
}

}  // namespace

TEST_CASE("c api table: every kind has a rule and takes good arguments", "[c_api]") {
  for (OpKind k : kAllKinds) {
    INFO(op_name(k));
    CHECK(rule_for(k).kind == k);
    CHECK(refusal(k, good()) == "accepted");
  }
  auto ag = check_args({"chorusAllGather", OpKind::kAllGather, false}, good(), 0, 3);
  REQUIRE(ag.is_ok());
  CHECK(ag->block_bytes == 16);
  CHECK(ag->total_bytes == 48);
}

TEST_CASE("c api table: op must be a chorusRedOp_t for reductions", "[c_api]") {
  for (int op : {-1, 5, INT_MIN, INT_MAX}) {
    Args a = good();
    a.op = op;
    for (OpKind k : {OpKind::kAllReduce, OpKind::kReduce, OpKind::kReduceScatter})
      CHECK_THAT(refusal(k, a), Catch::Contains("chorusTest on rank 0: op " + std::to_string(op) +
                                                " is not a chorusRedOp_t (sum 0, prod 1"));
    CHECK(refusal(OpKind::kBroadcast, a) == "accepted");  // no op taken
  }
}

TEST_CASE("c api table: datatype range, and reducible types from op.cc's table", "[c_api]") {
  for (int dt : {-1, int{chorusNumTypes}, 1000, INT_MIN}) {
    Args a = good();
    a.datatype = dt;
    for (OpKind k : kAllKinds) {
      if (k == OpKind::kBarrier) continue;
      CHECK_THAT(refusal(k, a), Catch::Contains("datatype " + std::to_string(dt) +
                                                " is not a chorusDataType_t (0..9)"));
    }
  }
  for (int dt = 0; dt < chorusNumTypes; ++dt) {
    Args a = good();
    a.datatype = dt;
    INFO(dtype_name(dt));
    CHECK(refusal(OpKind::kAllGather, a) == "accepted");
    const std::string r = refusal(OpKind::kAllReduce, a);
    if (kernel_dtype(dt))
      CHECK(r == "accepted");
    else
      CHECK_THAT(r, Catch::Contains(std::string("datatype ") + dtype_name(dt) + " (" +
                                    std::to_string(dt) + ") cannot be reduced (reducible: "));
  }
}

TEST_CASE("c api table: count * element size (* nranks) must fit in a buffer", "[c_api]") {
  Args a = good();
  a.count = (size_t{1} << 62) + 1;
  for (OpKind k : kAllKinds) {
    if (k == OpKind::kBarrier || k == OpKind::kAllToAllv) continue;  // no count (its arrays: below)
    CHECK_THAT(refusal(k, a),
               Catch::Contains("4611686018427387905 of f32 (4 bytes each) is more than a buffer "
                               "can hold (9223372036854775807 bytes)"));
  }
  a.count = kMaxBufferBytes / 4;  // the largest f32 count: fits
  CHECK(refusal(OpKind::kAllReduce, a) == "accepted");
  a.count += 1;
  CHECK(refusal(OpKind::kAllReduce, a) != "accepted");

  // All-gather's recvbuff and reduce-scatter's sendbuff hold nranks blocks.
  Args b = good();
  b.datatype = chorusUint8;
  b.count = kMaxBufferBytes / 2 + 1;
  CHECK(refusal(OpKind::kBroadcast, b) == "accepted");
  CHECK_THAT(
      refusal(OpKind::kAllGather, b),
      Catch::Contains(
          "sendcount 4611686018427387904 of u8 times 2 ranks is more than recvbuff can hold"));
  CHECK_THAT(
      refusal(OpKind::kReduceScatter, b),
      Catch::Contains(
          "recvcount 4611686018427387904 of u8 times 2 ranks is more than sendbuff can hold"));
  CHECK_THAT(refusal(OpKind::kGather, b), Catch::Contains("times 2 ranks is more than recvbuff"));
  CHECK_THAT(refusal(OpKind::kScatter, b), Catch::Contains("times 2 ranks is more than sendbuff"));
  CHECK_THAT(refusal(OpKind::kAllToAll, b),
             Catch::Contains("count 4611686018427387904 of u8 times 2 ranks is more than sendbuff "
                             "or recvbuff can hold"));
  b.count = kMaxBufferBytes / 2;
  CHECK(refusal(OpKind::kAllGather, b) == "accepted");
  CHECK(refusal(OpKind::kAllToAll, b) == "accepted");
}

TEST_CASE("c api table: all-to-all-v's arrays, their sizes, buffers and this rank's own block",
          "[c_api]") {
  auto v = check_args({"chorusAllToAllv", OpKind::kAllToAllv, false}, good(), 0, 2);
  REQUIRE(v.is_ok());
  CHECK(v->total_bytes == 5 * 4);  // recvbuff ends at rdispls[1] + recvcounts[1] = 5 f32
  for (int which = 0; which < 4; ++which) {
    Args a = good();
    const size_t** arr[] = {&a.sendcounts, &a.sdispls, &a.recvcounts, &a.rdispls};
    const char* name[] = {"sendcounts", "sdispls", "recvcounts", "rdispls"};
    *arr[which] = nullptr;
    CHECK(refusal(OpKind::kAllToAllv, a) ==
          std::string("chorusTest on rank 0: ") + name[which] + " is NULL (2 entries expected)");
  }
  size_t huge_counts[2] = {2, (size_t{1} << 62) + 1}, far_displs[2] = {0, kMaxBufferBytes / 4};
  Args a = good();
  a.sendcounts = huge_counts;
  CHECK(refusal(OpKind::kAllToAllv, a) ==
        "chorusTest on rank 0: sdispls[1] 2 + sendcounts[1] 4611686018427387905 elements of f32 "
        "(4 bytes each) end past what a buffer can hold (9223372036854775807 bytes)");
  a = good();
  a.rdispls = far_displs;  // displacement alone fits; with its count it does not
  CHECK_THAT(refusal(OpKind::kAllToAllv, a),
             Catch::Contains("rdispls[1] 2305843009213693951 + recvcounts[1] 1 elements of f32"));
  a = good();
  a.sendbuff = nullptr;
  CHECK(refusal(OpKind::kAllToAllv, a) ==
        "chorusTest on rank 0: sendbuff is NULL with sendcounts[0] 2");
  size_t zeros[2] = {0, 0};
  a.sendcounts = a.recvcounts = zeros;
  a.recvbuff = nullptr;
  CHECK(refusal(OpKind::kAllToAllv, a) == "accepted");  // nothing to move: NULL is fine
  a = good();
  a.recvcounts = zeros;  // rank 0 sends itself 2, expects 0 from itself
  CHECK(refusal(OpKind::kAllToAllv, a) ==
        "chorusTest on rank 0: sendcounts[0] 2 but recvcounts[0] 0 (this rank's block to itself "
        "must be the same size on both sides)");
  CHECK(refusal(OpKind::kAllToAllv, a, /*rank=*/1) ==
        "chorusTest on rank 1: sendcounts[1] 1 but "
        "recvcounts[1] 0 (this rank's block to "
        "itself must be the same size on both sides)");
}

TEST_CASE("c api table: NULL buffers only with count 0 or where the root rule ignores them",
          "[c_api]") {
  Args a = good();
  a.sendbuff = nullptr;
  CHECK(refusal(OpKind::kAllReduce, a) == "chorusTest on rank 0: sendbuff is NULL with count 4");
  CHECK(refusal(OpKind::kAllGather, a) ==
        "chorusTest on rank 0: sendbuff is NULL with sendcount 4");
  CHECK(refusal(OpKind::kBroadcast, a, /*rank=*/0) != "accepted");  // the root sends
  CHECK(refusal(OpKind::kBroadcast, a, /*rank=*/1) == "accepted");  // the others do not
  CHECK(refusal(OpKind::kRecv, a) == "accepted");
  a.count = 0;
  CHECK(refusal(OpKind::kAllReduce, a) == "accepted");
  Args b = good();
  b.recvbuff = nullptr;
  CHECK(refusal(OpKind::kReduceScatter, b) ==
        "chorusTest on rank 0: recvbuff is NULL with recvcount 4");
  CHECK(refusal(OpKind::kReduce, b, /*rank=*/0) != "accepted");  // the root receives
  CHECK(refusal(OpKind::kReduce, b, /*rank=*/1) == "accepted");
  CHECK(refusal(OpKind::kSend, b) == "accepted");
  // Gather's recvbuff and scatter's sendbuff matter on the root only.
  CHECK(refusal(OpKind::kGather, b, /*rank=*/0) ==
        "chorusTest on rank 0: recvbuff is NULL with sendcount 4");
  CHECK(refusal(OpKind::kGather, b, /*rank=*/1) == "accepted");
  CHECK(refusal(OpKind::kScatter, b) == "chorusTest on rank 0: recvbuff is NULL with recvcount 4");
  CHECK(refusal(OpKind::kAllToAll, b) == "chorusTest on rank 0: recvbuff is NULL with count 4");
  Args c = good();
  c.sendbuff = nullptr;
  CHECK(refusal(OpKind::kScatter, c, /*rank=*/0) ==
        "chorusTest on rank 0: sendbuff is NULL with recvcount 4");
  CHECK(refusal(OpKind::kScatter, c, /*rank=*/1) == "accepted");
  CHECK(refusal(OpKind::kGather, c, /*rank=*/1) != "accepted");  // every rank sends
}

TEST_CASE("c api table: root and peer are ranks of the communicator", "[c_api]") {
  for (int root : {-1, 2, INT_MAX}) {
    Args a = good();
    a.root = root;
    CHECK(refusal(OpKind::kBroadcast, a) ==
          "chorusTest on rank 0: root " + std::to_string(root) + " is outside 0..1");
    CHECK(refusal(OpKind::kReduce, a) != "accepted");
    CHECK(refusal(OpKind::kGather, a) != "accepted");
    CHECK(refusal(OpKind::kScatter, a) != "accepted");
    CHECK(refusal(OpKind::kAllReduce, a) == "accepted");
    CHECK(refusal(OpKind::kAllToAll, a) == "accepted");
  }
  for (int peer : {-1, 2}) {
    Args a = good();
    a.peer = peer;
    CHECK(refusal(OpKind::kSend, a) ==
          "chorusTest on rank 0: peer " + std::to_string(peer) + " is outside 0..1");
  }
  Args self = good();
  self.peer = 0;
  CHECK_THAT(refusal(OpKind::kRecv, self), Catch::Contains("peer 0 is this rank"));
}

TEST_CASE("c api table: device buffers are refused by name, host and managed ones taken",
          "[c_api]") {
  namespace kc = chorus::kernels::cuda;
  // A fake driver: g_b is memory of CUDA device 1, g_a managed memory of device 0.
  kc::set_pointer_classifier_for_test([](const void* p) -> kc::PointerInfo {
    if (p == g_b) return {kc::MemSpace::kDevice, 1};
    if (p == g_a) return {kc::MemSpace::kManaged, 0};
    return {};
  });
  for (OpKind k : kAllKinds) {
    INFO(op_name(k));
    std::string why = refusal(k, good());
    if (k == OpKind::kBarrier || k == OpKind::kSend) {
      CHECK(why == "accepted");  // no recvbuff; send's sendbuff is managed memory
      continue;
    }
    CHECK_THAT(why, Catch::StartsWith("chorusTest on rank 0: recvbuff 0x") &&
                        Catch::Contains("is memory of CUDA device 1; device memory goes to "
                                        "all-reduce, reduce, broadcast"));
    // On the device path (device_ops.h) the same buffers pass the table.
    if (k == OpKind::kAllReduce || k == OpKind::kReduce || k == OpKind::kBroadcast ||
        k == OpKind::kAllGather || k == OpKind::kReduceScatter || k == OpKind::kRecv ||
        k == OpKind::kGather || k == OpKind::kScatter || k == OpKind::kAllToAll)
      CHECK(check_args({"chorusTest", k, false}, good(), 0, 2, /*spaces_known=*/true).is_ok());
  }
  Args send_dev = good();
  send_dev.sendbuff = g_b;
  send_dev.recvbuff = g_a;
  CHECK_THAT(refusal(OpKind::kAllReduce, send_dev), Catch::Contains(": sendbuff 0x"));
  Args managed = good();
  managed.recvbuff = g_a;
  CHECK(refusal(OpKind::kAllReduce, managed) == "accepted");
  kc::set_pointer_classifier_for_test(nullptr);
  CHECK(refusal(OpKind::kAllReduce, good()) == "accepted");
  // No CUDA here (or no device): every pointer is host memory.
  if (kc::device_count() == 0) CHECK(kc::classify_pointer(g_b).space == kc::MemSpace::kHost);
}

TEST_CASE("c api table: stream of blocking calls, request of asynchronous ones", "[c_api]") {
  Args a = good();
  CHECK(check_form({"chorusIallReduce", OpKind::kAllReduce, true}, a).message() ==
        "chorusIallReduce: request is NULL");
  CHECK(check_form({"chorusAllReduce", OpKind::kAllReduce, false}, a).is_ok());
  a.stream = reinterpret_cast<chorusStream_t>(0x10);
  CHECK_THAT(check_form({"chorusAllReduce", OpKind::kAllReduce, false}, a).message(),
             Catch::StartsWith("chorusAllReduce: stream 0x10 is not NULL"));
  // A barrier with a stream is the device barrier (device_ops.h) where the process uses a CUDA
  // device; elsewhere the stream is refused.
  CHECK(check_form({"chorusBarrier", OpKind::kBarrier, false}, a).is_ok() ==
        (chorus::kernels::cuda::ipc().current_device() >= 0));
}

TEST_CASE("c api table: world sizes and wait timeouts", "[c_api]") {
  CHECK(check_world("chorusCommInitRank", "nranks", CHORUS_MAX_RANKS, 0).is_ok());
  for (int n : {0, -1, CHORUS_MAX_RANKS + 1, INT_MAX})
    CHECK(check_world("chorusCommInitRank", "nranks", n, 0).message() ==
          "chorusCommInitRank: nranks " + std::to_string(n) +
              " is outside 1..65536 (CHORUS_MAX_RANKS)");
  CHECK(check_world("chorusCommInitRank", "nranks", 4, 4).message() ==
        "chorusCommInitRank: rank 4 is outside 0..3 (nranks 4)");
  CHECK(check_world("chorusCommInitRank", "nranks", 4, -1).code() == Code::kInvalidArgument);
  CHECK(check_world("chorusCommInitAll", "ndev", 4, std::nullopt).is_ok());

  CHECK_THAT(check_wait_timeout(std::nan("")).status().message(),
             Catch::StartsWith("chorusWait: timeout_seconds nan is not a number"));
  CHECK(*check_wait_timeout(INFINITY) < 0);
  CHECK(*check_wait_timeout(1e300) < 0);
  CHECK(*check_wait_timeout(-INFINITY) < 0);
  CHECK(*check_wait_timeout(2.5) == 2.5);
  CHECK(*check_wait_timeout(0) == 0);
}

TEST_CASE("c api boundary: exceptions become codes and messages naming the call", "[c_api]") {
  auto from = [](auto thrower) {
    try {
      thrower();
    } catch (...) {
      return status_from_exception("chorusX");
    }
    return Status::ok();
  };
  Status s = from([] { throw std::bad_alloc(); });
  CHECK(s.code() == Code::kSystemError);
  CHECK_THAT(s.message(), Catch::StartsWith("chorusX: out of memory"));
  s = from([] { throw std::system_error(EAGAIN, std::generic_category(), "thread"); });
  CHECK(s.code() == Code::kSystemError);
  CHECK_THAT(s.message(), Catch::StartsWith("chorusX: system error: thread"));
  s = from([] { throw std::logic_error("boom"); });
  CHECK(s.code() == Code::kInternalError);
  CHECK_THAT(s.message(), Catch::Contains("boom"));
  s = from([] { throw 42; });
  CHECK(s.code() == Code::kInternalError);
}

// The state behind chorusWait: a limit too large for the clock means "until done" (1e300 s and
// INFINITY once overflowed into an immediate "not done").
TEST_CASE("Request::wait with an unbounded limit waits until the operation ends", "[work]") {
  for (double limit : {-1.0, 1e300, HUGE_VAL, std::nan("")}) {
    Request w(OpDesc{});
    std::thread finisher([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
      w.finish(Status::ok());
    });
    INFO("limit " << limit);
    CHECK(w.wait(limit));
    finisher.join();
  }
  Request w(OpDesc{});
  CHECK_FALSE(w.wait(0.01));  // a finite limit still ends the wait
}
