// The device path's failures on machines without a GPU (collectives/device_ops.cc): buffers are
// made "device memory" by the pointer-classifier test hook but the driver is the real one (none
// here), so chorusAllReduce takes the CUDA IPC path and its first step (exporting the buffers)
// fails. Every rank must then name the rank and the buffer, and the communicator go on; a rank
// alone on the device path must be named as a mismatch, never hang. The protocol itself, on an
// emulated GPU: test_device_ops.cc; on a real one: tests/gpu/device_allreduce_probe.cc.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "chorus/chorus.h"
#include "harness.h"
#include "kernels/cuda/memory.h"

using chorus::test::contains;
using chorus::test::run_ranks;
using chorus::test::RunOptions;
namespace kc = chorus::kernels::cuda;

namespace {

float g_dev[16];  // what the hook calls memory of CUDA device 0

kc::PointerInfo fake_device(const void* p) {
  if (p >= static_cast<const void*>(g_dev) && p < static_cast<const void*>(g_dev + 16))
    return {kc::MemSpace::kDevice, 0};
  return {};
}

RunOptions opts() {
  RunOptions o;
  o.env["CHORUS_TIMEOUT"] = "20";
  o.limit_seconds = 40;
  return o;
}

int fail_with(const char* what, const std::string& msg) {
  std::fprintf(stderr, "%s: %s\n", what, msg.c_str());
  return 1;
}

// A host all-reduce after the failure: the communicator still works.
int still_works(chorusComm_t comm, int n) {
  float x = 1;
  if (chorusAllReduce(&x, &x, 1, chorusFloat32, chorusSum, comm, nullptr) != chorusSuccess ||
      x != float(n))
    return fail_with("host all-reduce after the failure", chorusGetLastError(comm));
  chorusCommDestroy(comm);
  return 0;
}

}  // namespace

TEST_CASE("device buffers that cannot be shared: every rank names the rank and the buffer",
          "[device]") {
  auto res = run_ranks(
      3,
      [](int rank) {
        kc::set_pointer_classifier_for_test(fake_device);
        chorusComm_t comm;
        if (chorusCommInitFromEnv(&comm) != chorusSuccess)
          return fail_with("init", chorusGetLastError(nullptr));
        // A stream goes with device buffers (the host-buffer check would refuse it).
        chorusResult_t rc = chorusAllReduce(g_dev, g_dev, 16, chorusFloat32, chorusSum, comm,
                                            reinterpret_cast<chorusStream_t>(0x10));
        std::string why = chorusGetLastError(comm);
        std::fprintf(stderr, "rank %d: %s\n", rank, why.c_str());
        const std::string who = "chorusAllReduce on rank " + std::to_string(rank) + ": ";
        const std::string named = rank == 0 ? who + "sendbuff 0x" : who + "rank 0: sendbuff 0x";
        if (rc == chorusSuccess || !contains(why, named) ||
            !contains(why, "is device memory of CUDA device 0"))
          return fail_with("expected", named + "... is device memory of CUDA device 0");
        if (rank == 0 && rc != chorusInvalidArgument) return fail_with("code", why);
        if (rank != 0 && rc != chorusRemoteError) return fail_with("code", why);
        return still_works(comm, 3);
      },
      opts());
  for (size_t r = 0; r < res.size(); ++r) {
    INFO("rank " << r << ":\n" << res[r].output);
    CHECK(res[r].exit_code == 0);
  }
}

TEST_CASE("one rank alone on the device path is a mismatch named on every rank, not a hang",
          "[device]") {
  auto res = run_ranks(
      3,
      [](int rank) {
        if (rank == 1) kc::set_pointer_classifier_for_test(fake_device);
        chorusComm_t comm;
        if (chorusCommInitFromEnv(&comm) != chorusSuccess)
          return fail_with("init", chorusGetLastError(nullptr));
        float host[16] = {0};
        if (chorusAllReduce(host, host, 1, chorusFloat32, chorusSum, comm, nullptr) !=
            chorusSuccess)  // every rank past creation before the mismatch
          return fail_with("first all-reduce", chorusGetLastError(comm));
        float* buf = rank == 1 ? g_dev : host;
        chorusResult_t rc = chorusAllReduce(buf, buf, 16, chorusFloat32, chorusSum, comm, nullptr);
        std::string why = chorusGetLastError(comm);
        std::fprintf(stderr, "rank %d: %s\n", rank, why.c_str());
        if (rc == chorusSuccess || !contains(why, "rank 1"))
          return fail_with("expected an error naming rank 1", why);
        chorusCommDestroy(comm);
        return 0;
      },
      opts());
  for (size_t r = 0; r < res.size(); ++r) {
    INFO("rank " << r << ":\n" << res[r].output);
    CHECK(res[r].exit_code == 0);
    CHECK(res[r].seconds < 15);
  }
}

TEST_CASE("device buffers: chorusIsend refused by name; a process without a CUDA device named",
          "[device]") {
  auto res = run_ranks(
      2,
      [](int rank) {
        kc::set_pointer_classifier_for_test(fake_device);
        chorusComm_t comm;
        if (chorusCommInitFromEnv(&comm) != chorusSuccess)
          return fail_with("init", chorusGetLastError(nullptr));
        const std::string at = " on rank " + std::to_string(rank) + ": ";
        chorusRequest_t req = nullptr;
        if (chorusIsend(g_dev, 16, chorusFloat32, 1 - rank, 0, comm, &req) !=
                chorusInvalidArgument ||
            !contains(chorusGetLastError(comm),
                      "chorusIsend" + at + "device buffers are sent by chorusSend"))
          return fail_with("chorusIsend", chorusGetLastError(comm));
        // All-to-all takes the device path (since 2026-11-27); this process has no CUDA device
        // (the classifier is faked), which every rank names after the exchange.
        if (chorusAllToAll(g_dev, g_dev, 8, chorusFloat32, comm, nullptr) == chorusSuccess ||
            !contains(chorusGetLastError(comm), "chorusAllToAll" + at) ||
            !contains(chorusGetLastError(comm), "sendbuff 0x") ||
            !contains(chorusGetLastError(comm), "this process uses no CUDA device"))
          return fail_with("chorusAllToAll", chorusGetLastError(comm));
        return still_works(comm, 2);
      },
      opts());
  for (size_t r = 0; r < res.size(); ++r) {
    INFO("rank " << r << ":\n" << res[r].output);
    CHECK(res[r].exit_code == 0);
  }
}
