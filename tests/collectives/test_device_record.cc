// The records ranks exchange for a device call over CUDA IPC (collectives/device_call.h), checked
// as they arrive: each field that could send a reader out of bounds refused by name
// (check_record); and end to end on the emulated GPU (fake_gpu.h), a rank whose record arrives
// corrupt -- in an all-reduce on 3 ranks, in a send/recv pair -- fails every rank of the call
// at once, naming it, and no stream waits for ever (before, a corrupt call kind ended the process
// in an assertion); with the peers' streams behind, so that their earlier signals land on rank
// 1's words after the release of its waits (release_device_waits's keeper stores it again).
#include <fmt/format.h>
#include <catch2/catch.hpp>

#include <chrono>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "chorus/chorus.h"
#include "collectives/device_call.h"
#include "device_test.h"
#include "fake_gpu.h"
#include "harness.h"

using chorus::capi::devcall::check_record;
using chorus::capi::devcall::Record;
using chorus::test::check_all;
using chorus::test::contains;
using chorus::test::fail_with;
using chorus::test::run_ranks;
using chorus::test::RunOptions;

namespace {

Record good() {
  Record x{};
  x.kind = 5;  // all-reduce
  x.datatype = chorusFloat32;
  x.op = chorusSum;
  x.root = -1;
  x.ok = 1;
  x.graph = -1;
  std::snprintf(x.gpu, sizeof x.gpu, "GPU-fake-0");
  return x;
}

}  // namespace

TEST_CASE("a device call's record: every field a reader trusts checked, the bad one named",
          "[device]") {
  CHECK(check_record(good(), 1, 0, 3, "chorusAllReduce").is_ok());
  Record barrier = good();
  barrier.kind = 3;
  barrier.datatype = 0;
  barrier.op = -1;
  CHECK(check_record(barrier, 1, 0, 3, "chorusBarrier").is_ok());
  struct Bad {
    const char* named;
    std::function<void(Record&)> spoil;
  };
  const std::vector<Bad> bad = {
      {"ok is 7", [](Record& x) { x.ok = 7; }},
      {"a text runs past its field", [](Record& x) { std::memset(x.why, 'x', sizeof x.why); }},
      {"a text runs past its field", [](Record& x) { std::memset(x.gpu, 'g', sizeof x.gpu); }},
      {"call kind 0", [](Record& x) { x.kind = 0; }},
      {"call kind 13", [](Record& x) { x.kind = 13; }},
      {"call kind -5", [](Record& x) { x.kind = -5; }},
      {"data type 10", [](Record& x) { x.datatype = 10; }},
      {"data type -1", [](Record& x) { x.datatype = -1; }},
      {"reduction op 5", [](Record& x) { x.op = 5; }},
      {"reduction op -2", [](Record& x) { x.op = -2; }},
      {"root or peer 3 of 3 ranks", [](Record& x) { x.root = 3; }},
      {"root or peer -2 of 3 ranks", [](Record& x) { x.root = -2; }},
      {"graph slot 64", [](Record& x) { x.graph = 64; }},
      {"graph slot -2", [](Record& x) { x.graph = -2; }},
      {"9 and 0 freed allocations named, at most 8 fit", [](Record& x) { x.nfreed = 9; }},
      {"0 and 4294967295 freed", [](Record& x) { x.nvmm_gone = ~0u; }},
      {"host_words is 2", [](Record& x) { x.host_words = 2; }},
  };
  for (const Bad& b : bad) {
    Record x = good();
    b.spoil(x);
    const chorus::Status s = check_record(x, 2, 0, 3, "chorusAllReduce");
    INFO(b.named << " -> " << s.message());
    CHECK_FALSE(s.is_ok());
    CHECK(contains(s.message(),
                   "chorusAllReduce on rank 0: rank 2's record of the device call is "
                   "corrupt: "));
    CHECK(contains(s.message(), b.named));
  }
}

namespace {

RunOptions opts() {
  RunOptions o;
  o.env = {{"CHORUS_TIMEOUT", "30"}};
  o.limit_seconds = 60;
  return o;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The call (an all-reduce, or rank 0 sending to rank 1) with rank 1's record corrupted on the way:
// it fails on every rank taking part within 5 s, naming rank 1's record (rank 1 learns it from
// the abort), and the stream ends.
int corrupt_call(int r, bool p2p) {
  chorusComm_t comm = chorus::test::device_init(r);
  if (comm == nullptr) return 1;
  constexpr size_t n = 64;
  auto* buf = static_cast<float*>(chorus::test::fake_device_alloc(n * 4));
  void* stream = chorus::test::fake_async_stream();
  // The streams fall behind, rank 1's the most: the peers' first call's signals reach rank 1's
  // words after the release of its waits and before its stream gets to its second call's waits,
  // which they put back below (the keeper's case: release_device_waits).
  chorus::test::fake_stream_delay(stream, r == 1 ? 800 : 300);
  if (chorusAllReduce(buf, buf, n, chorusFloat32, chorusSum, comm, stream) != chorusSuccess)
    return fail_with(r, "the first call", chorusGetLastError(comm));
  if (r == 1) chorus::capi::devcall::corrupt_next_record_for_test();
  const auto t0 = std::chrono::steady_clock::now();
  chorusResult_t rc = chorusSuccess;
  if (!p2p)
    rc = chorusAllReduce(buf, buf, n, chorusFloat32, chorusSum, comm, stream);
  else if (r == 0)
    rc = chorusSend(buf, n, chorusFloat32, 1, comm, stream);
  else if (r == 1)
    rc = chorusRecv(buf, n, chorusFloat32, 0, comm, stream);
  std::string why = chorusGetLastError(comm);
  if (p2p && r == 2) {  // not in the call: its next call learns of the abort
    std::this_thread::sleep_for(std::chrono::seconds(1));
    rc = chorusAllReduce(buf, buf, n, chorusFloat32, chorusSum, comm, stream);
    why = chorusGetLastError(comm);
  } else if (r == 1 && rc == chorusSuccess) {  // its peers saw it: the abort reaches it
    std::this_thread::sleep_for(std::chrono::seconds(1));
    rc = chorusAllReduce(buf, buf, n, chorusFloat32, chorusSum, comm, stream);
    why = chorusGetLastError(comm);
  }
  const int e = chorus::test::fake_stream_sync(stream);
  const double took = seconds_since(t0);
  std::fprintf(stderr, "rank %d after %.2f s: %s\n", r, took, why.c_str());
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  chorusCommDestroy(comm);
  if (rc == chorusSuccess || !contains(why, "rank 1's record of the device call is corrupt"))
    return fail_with(r, "expected rank 1's record named", why);
  if (e != 0) return fail_with(r, "the stream", std::to_string(e));
  if (took > 5) return fail_with(r, "too slow", std::to_string(took));
  return 0;
}

}  // namespace

TEST_CASE("a rank's device record arrives corrupt: every rank fails naming it, no stream waits",
          "[device]") {
  SECTION("an all-reduce of 3 ranks") {
    check_all(run_ranks(
        3, [](int r) { return corrupt_call(r, false); }, opts()));
  }
  SECTION("rank 0 sends to rank 1, rank 2 takes part in no call") {
    check_all(run_ranks(
        3, [](int r) { return corrupt_call(r, true); }, opts()));
  }
}
