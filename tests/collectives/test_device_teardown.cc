// What a communicator's device calls mapped of its peers -- their VMM allocations, their flag
// words in host memory -- unmapped at destroy once this rank's streams are past its calls
// (collectives/device_ops.h's close_peer_mappings), on the emulated GPU (fake_gpu.h): destroy
// waits for a stream that is behind (unmapped under it, the emulated stream would fault), and
// leaves everything mapped, said, where a stream never gets there or an end could not be marked.
#include <fmt/format.h>
#include <catch2/catch.hpp>

#include <chrono>
#include <string>
#include <vector>

#include "chorus/chorus.h"
#include "device_test.h"
#include "fake_gpu.h"
#include "harness.h"

using chorus::test::check_all;
using chorus::test::contains;
using chorus::test::fail_with;
using chorus::test::run_ranks;
using chorus::test::RunOptions;

namespace {

constexpr size_t kN = 4096;

RunOptions opts(const char* timeout = "30") {
  RunOptions o;
  o.env = {{"CHORUS_TIMEOUT", timeout}};
  o.limit_seconds = 120;
  return o;
}

enum class Ending { kBehind, kStuck, kUnmarked };

// Two ranks: in-place all-reduces of VMM memory (the peer's allocation mapped here by
// descriptor) on an asynchronous stream, the last one ended as `how` says, then destroy. What
// destroy left: the peer's VMM allocations mapped here, and host ranges registered (this rank's
// words, and the peer's while mapped). 0, or the failure said.
int calls_then_destroy(int r, Ending how) {
  chorusComm_t comm = chorus::test::device_init(r);
  if (!comm) return 1;
  void* stream = chorus::test::fake_async_stream();
  auto* x = static_cast<float*>(chorus::test::fake_vmm_alloc(kN * 4));
  for (size_t j = 0; j < kN; ++j) x[j] = float(r + j % 5);
  for (int k = 0; k < 3; ++k) {
    if (k == 2 && how == Ending::kBehind) chorus::test::fake_stream_delay(stream, 300);
    if (k == 2 && how == Ending::kUnmarked) chorus::test::fake_fail_marks(1);  // its end's mark
    if (chorusAllReduce(x, x, kN, chorusFloat32, chorusSum, comm, stream) != chorusSuccess)
      return fail_with(r, fmt::format("all-reduce {}", k), chorusGetLastError(comm));
    if (k == 1) {
      if (int e = chorus::test::fake_stream_sync(stream); e != 0)
        return fail_with(r, "the stream", fmt::format("error {}", e));
      if (chorus::test::fake_vmm_mapped() != 1 || chorus::test::fake_host_registered() != 2)
        return fail_with(
            r, "before destroy",
            fmt::format("{} VMM allocations mapped, {} host ranges registered; want "
                        "the peer's 1, its words and the peer's",
                        chorus::test::fake_vmm_mapped(), chorus::test::fake_host_registered()));
    }
  }
  if (how == Ending::kStuck) chorus::test::fake_marks_stuck(true);
  const auto t0 = std::chrono::steady_clock::now();
  chorusCommDestroy(comm);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  chorus::test::fake_marks_stuck(false);
  if (int e = chorus::test::fake_stream_sync(stream); e != 0)
    return fail_with(r, "the stream after destroy", fmt::format("error {}", e));
  for (size_t j = 0; j < kN; ++j)  // three sums of two ranks: 4 (1 + 2 (j % 5))
    if (x[j] != float(4 * (1 + 2 * (j % 5))))
      return fail_with(r, "the result", fmt::format("[{}] = {}", j, x[j]));
  const int mapped = chorus::test::fake_vmm_mapped(),
            registered = chorus::test::fake_host_registered();
  const bool unmapped = how == Ending::kBehind;
  if (mapped != (unmapped ? 0 : 1) || registered != (unmapped ? 1 : 2))
    return fail_with(r, "destroy",
                     fmt::format("left {} VMM allocations mapped, {} host ranges registered; "
                                 "want {} and {}",
                                 mapped, registered, unmapped ? 0 : 1, unmapped ? 1 : 2));
  if (how == Ending::kBehind && took < 0.2)
    return fail_with(r, "destroy", fmt::format("{:.2f} s: it did not wait for the stream", took));
  if (how == Ending::kStuck && took > 10)
    return fail_with(r, "destroy", fmt::format("{:.1f} s, past its 3 s timeout", took));
  return 0;
}

}  // namespace

TEST_CASE("destroy unmaps the peers' VMM allocations and host words once its stream is past them",
          "[device]") {
  check_all(run_ranks(
      2, [](int r) { return calls_then_destroy(r, Ending::kBehind); }, opts()));
}

TEST_CASE("destroy leaves the peers' memory mapped, said, while a stream may still use it",
          "[device]") {
  const auto stuck = run_ranks(
      2, [](int r) { return calls_then_destroy(r, Ending::kStuck); }, opts("3"));
  check_all(stuck);
  for (const auto& x : stuck)
    CHECK(contains(x.output, "the peers' memory its device calls mapped stays mapped: stream"));
  const auto unmarked = run_ranks(
      2, [](int r) { return calls_then_destroy(r, Ending::kUnmarked); }, opts());
  check_all(unmarked);
  for (const auto& x : unmarked)
    CHECK(contains(x.output, "stays mapped: the end of a call could not be marked"));
}
