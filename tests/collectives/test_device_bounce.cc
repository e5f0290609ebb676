// The bounce buffer of device calls on memory that CUDA IPC cannot map
// (collectives/device_bounce.h), on the emulated GPU (fake_gpu.h): calls on two streams ordered
// by its mark; the buffers freed at destroy once the GPU is past them, the peers' mappings closed
// at their next calls; left allocated, said, where a stream never gets there or a failed call
// could not mark its end.
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
const auto init = chorus::test::device_init;

namespace {

const auto kStream = reinterpret_cast<chorusStream_t>(0x10);

RunOptions opts(const char* timeout = "30") {
  RunOptions o;
  o.env = {{"CHORUS_TIMEOUT", timeout}};
  o.limit_seconds = 120;
  return o;
}

// Two all-reduces through the bounce buffer, the second larger than its first size (1 MiB):
// the buffer grows once. The sums checked; 0, or the rank's failure said.
int two_sizes(int r, chorusComm_t comm, void* stream) {
  for (size_t n : {size_t(1000), size_t(300000)}) {
    auto* a = static_cast<float*>(chorus::test::fake_unmapped_alloc(n * 4));
    for (size_t j = 0; j < n; ++j) a[j] = float(r + j % 7);
    if (chorusAllReduce(a, a, n, chorusFloat32, chorusSum, comm, stream) != chorusSuccess)
      return fail_with(r, fmt::format("all-reduce of {}", n), chorusGetLastError(comm));
    if (stream != kStream && chorus::test::fake_stream_sync(stream) != 0)
      return fail_with(r, "the stream", "failed");
    for (size_t j = 0; j < n; ++j)
      if (a[j] != float(1 + 2 * (j % 7)))
        return fail_with(r, fmt::format("all-reduce of {}", n), fmt::format("element {}", j));
    chorus::test::fake_device_free(a);
  }
  return 0;
}

}  // namespace

TEST_CASE("through the bounce buffer on two streams: each call waits for the last one's end",
          "[device]") {
  auto res = run_ranks(
      2,
      [](int r) {
        chorusComm_t comm = init(r);
        if (!comm) return 1;
        const auto kOther = reinterpret_cast<chorusStream_t>(0x20);
        const size_t n = 1000;
        auto* a = static_cast<float*>(chorus::test::fake_unmapped_alloc(n * 4));
        auto* b = static_cast<float*>(chorus::test::fake_device_alloc(n * 4));
        for (int call = 0; call < 4; ++call) {
          for (size_t j = 0; j < n; ++j) a[j] = float(r + call + j);
          const chorusStream_t s = call % 2 ? kOther : kStream;
          // Calls 0-2 through the bounce buffer (a is unmappable), call 3 not (b is not).
          float* buf = call < 3 ? a : b;
          if (call == 3)
            for (size_t j = 0; j < n; ++j) b[j] = float(r + call + j);
          if (chorusAllReduce(buf, buf, n, chorusFloat32, chorusSum, comm, s) != chorusSuccess)
            return fail_with(r, "all-reduce", chorusGetLastError(comm));
          for (size_t j = 0; j < n; ++j)
            if (buf[j] != float(2 * (call + j) + 1))
              return fail_with(r, "all-reduce", fmt::format("call {} element {} wrong", call, j));
        }
        const std::string s0 = fmt::format("{}", static_cast<void*>(kStream)),
                          s1 = fmt::format("{}", static_cast<void*>(kOther));
        // Each call also marks its end on its stream, for destroy (DeviceIpc::ends).
        const std::vector<std::string> want{
            "wait on " + s0 + " for none",
            "record on " + s0,
            "record on " + s0,
            "wait on " + s1 + " for the record on " + s0,
            "record on " + s1,
            "record on " + s1,
            "wait on " + s0 + " for the record on " + s1,
            "record on " + s0,
            "record on " + s0,
            "record on " + s1,
        };
        if (chorus::test::fake_mark_log() != want) {
          std::string got;
          for (const auto& x : chorus::test::fake_mark_log()) got += "\n  " + x;
          return fail_with(r, "marks", "asked for:" + got);
        }
        chorusCommDestroy(comm);
        return 0;
      },
      opts());
  check_all(res);
}

// Without bounce_close every bounce buffer a communicator made stayed allocated for the process's
// life, and so did the peers' mappings of it.
TEST_CASE("bounce buffers freed at destroy, the old and the grown; the peers close theirs next",
          "[device]") {
  check_all(run_ranks(
      2,
      [](int r) {
        chorusComm_t comm = init(r);
        if (!comm) return 1;
        if (int rc = two_sizes(r, comm, kStream); rc != 0) return rc;
        chorusComm_t next = nullptr;  // made before: a process joins the job once
        if (chorusCommSplit(comm, 0, r, &next) != chorusSuccess)
          return fail_with(r, "split", chorusGetLastError(comm));
        if (chorus::test::fake_flags_frees() != 0)
          return fail_with(r, "before destroy", "a bounce buffer was freed under the communicator");
        if (chorusCommDestroy(comm) != chorusSuccess) return fail_with(r, "destroy", "failed");
        if (int freed = chorus::test::fake_flags_frees(); freed != 2)
          return fail_with(r, "destroy", fmt::format("freed {} bounce buffers, want 2", freed));
        // Another communicator: its calls' records tell the peer of the frees (device_freed.h),
        // and the peer closes its mappings (the emulation ends a process that closes one its
        // owner still holds).
        comm = next;
        auto* x = static_cast<float*>(chorus::test::fake_device_alloc(64 * 4));
        for (int k = 0; k < 4; ++k)
          if (chorusAllReduce(x, x, 64, chorusFloat32, chorusSum, comm, kStream) != chorusSuccess)
            return fail_with(r, "a later all-reduce", chorusGetLastError(comm));
        if (int closes = chorus::test::fake_ipc_closes(); closes != 2)
          return fail_with(r, "the peer's bounce buffers",
                           fmt::format("{} closed here, want 2", closes));
        chorusCommDestroy(comm);
        return 0;
      },
      opts()));
}

// Destroy waits for the stream to get past each buffer's last call, up to what is left of its
// timeout, and frees nothing the stream may still use: a stream behind by 300 ms, then one that
// never gets there; and a failed call whose end could not be marked.
TEST_CASE("bounce buffers at destroy: waited for, left allocated and said when never reached",
          "[device]") {
  const auto behind = run_ranks(
      2,
      [](int r) {
        chorusComm_t comm = init(r);
        if (!comm) return 1;
        void* stream = chorus::test::fake_async_stream();
        if (int rc = two_sizes(r, comm, stream); rc != 0) return rc;
        chorus::test::fake_stream_delay(stream, 300);
        auto* a = static_cast<float*>(chorus::test::fake_unmapped_alloc(4000));
        if (chorusAllReduce(a, a, 1000, chorusFloat32, chorusSum, comm, stream) != chorusSuccess)
          return fail_with(r, "the last all-reduce", chorusGetLastError(comm));
        chorusCommDestroy(comm);
        if (int freed = chorus::test::fake_flags_frees(); freed != 2)
          return fail_with(r, "destroy", fmt::format("freed {} bounce buffers, want 2", freed));
        return 0;
      },
      opts());
  check_all(behind);
  const auto stuck = run_ranks(
      2,
      [](int r) {
        chorusComm_t comm = init(r);
        if (!comm) return 1;
        if (int rc = two_sizes(r, comm, kStream); rc != 0) return rc;
        chorus::test::fake_marks_stuck(true);
        const auto t0 = std::chrono::steady_clock::now();
        chorusCommDestroy(comm);
        const double s =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (int freed = chorus::test::fake_flags_frees(); freed != 0 || s > 10)
          return fail_with(r, "destroy",
                           fmt::format("freed {} bounce buffers in {:.1f} s, want 0 within the "
                                       "3 s timeout",
                                       freed, s));
        return 0;
      },
      opts("3"));
  check_all(stuck);
  const auto unmarked = run_ranks(
      2,
      [](int r) {
        chorusComm_t comm = init(r);
        if (!comm) return 1;
        if (int rc = two_sizes(r, comm, kStream); rc != 0) return rc;
        auto* a = static_cast<float*>(chorus::test::fake_unmapped_alloc(4000));
        if (r == 0) chorus::test::fake_fail_marks(2);  // the call's end, then after the failure
        const chorusResult_t rc =
            chorusAllReduce(a, a, 1000, chorusFloat32, chorusSum, comm, kStream);
        if (r == 0 && rc == chorusSuccess)
          return fail_with(r, "the all-reduce", "succeeded with its end unmarked");
        chorusCommDestroy(comm);
        if (int freed = chorus::test::fake_flags_frees(); r == 0 && freed != 0)
          return fail_with(r, "destroy", fmt::format("freed {} bounce buffers, want 0", freed));
        return 0;
      },
      opts("5"));
  check_all(unmarked);
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r << ":\n" << stuck[r].output);
    CHECK(contains(stuck[r].output,
                   "bounce buffer of its device calls is left allocated: its "
                   "stream has not got past it"));
  }
  INFO(unmarked[0].output);
  CHECK(contains(unmarked[0].output, "a call that failed could not mark its end"));
}
