// Where the CUDA IPC path's flag words lie (collectives/device_words.h), on the emulated GPU
// (fake_gpu.h): in host memory shared with the peers by default, registered with CUDA once a
// rank in each process; in device memory with CHORUS_IPC_WORDS=device or where CUDA refuses the
// host memory; ranks of either kind in one communicator; and what host words are for: with every
// stream of a process on one hardware queue (as under CUDA_DEVICE_MAX_CONNECTIONS=1), a dead
// peer's survivors' streams still end, where a stream write's release would queue behind the
// very wait it must end.
#include <fmt/format.h>
#include <unistd.h>
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <string>
#include <thread>

#include "chorus/chorus.h"
#include "collectives/device_call.h"
#include "collectives/device_ops.h"
#include "collectives/device_words.h"
#include "device_test.h"
#include "fake_gpu.h"
#include "harness.h"
#include "kernels/cuda/ipc.h"
#include "transport/shm/shared_mem.h"

using chorus::test::check_all;
using chorus::test::check_ranks;
using chorus::test::contains;
using chorus::test::fail_with;
using chorus::test::run_ranks;
using chorus::test::RunOptions;

namespace {

constexpr size_t kN = 64;

RunOptions opts() {
  RunOptions o;
  o.env = {{"CHORUS_TIMEOUT", "30"}, {"CHORUS_DEBUG", "INFO"}};
  o.limit_seconds = 120;
  return o;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Three in-place all-reduces of 3 ranks on an asynchronous stream, checked; then how many host
// ranges this process registered with CUDA, as the exit code's complement (0 failures: 10 + n).
// Destroy unregisters the peers' words: `own` (1: its words are host words) stay registered.
int three_calls(int r, const char* words, int own) {
  if (words != nullptr) setenv("CHORUS_IPC_WORDS", words, 1);
  chorusComm_t comm = chorus::test::device_init(r);
  if (comm == nullptr) return 1;
  auto* buf = static_cast<float*>(chorus::test::fake_device_alloc(kN * 4));
  void* stream = chorus::test::fake_async_stream();
  for (size_t j = 0; j < kN; ++j) buf[j] = float(100 * r + j);
  for (int i = 0; i < 3; ++i)  // each sums the last one's results: 9 (300 + 3j) after three
    if (chorusAllReduce(buf, buf, kN, chorusFloat32, chorusSum, comm, stream) != chorusSuccess)
      return fail_with(r, fmt::format("call {}", i), chorusGetLastError(comm));
  if (int e = chorus::test::fake_stream_sync(stream); e != 0)
    return fail_with(r, "the stream", chorus::kernels::cuda::ipc().error_string(e));
  for (size_t j = 0; j < kN; ++j)
    if (buf[j] != 9 * float(300 + 3 * j))
      return fail_with(r, "the result", fmt::format("[{}] = {}", j, buf[j]));
  const int registered = chorus::test::fake_host_registered();
  chorusCommDestroy(comm);
  if (int left = chorus::test::fake_host_registered(); left != own)
    return fail_with(
        r, "destroy",
        fmt::format("{} of {} host ranges registered still, want {}", left, registered, own));
  return 10 + registered;
}

void check_registered(const std::vector<chorus::test::RankResult>& res,
                      std::initializer_list<int> registered) {
  int r = 0;
  for (int n : registered) {
    INFO("rank " << r << ":\n" << res[r].output);
    CHECK(res[r].exit_code == 10 + n);
    ++r;
  }
}

}  // namespace

TEST_CASE("CUDA IPC flag words: in shared host memory by default, in device memory on request",
          "[device]") {
  SECTION("the default: host words, each rank's own and its 2 peers' registered, right") {
    auto res = run_ranks(
        3, [](int r) { return three_calls(r, nullptr, 1); }, opts());
    check_registered(res, {3, 3, 3});
    for (const auto& x : res) CHECK(contains(x.output, "flag words in host memory shared"));
  }
  SECTION("CHORUS_IPC_WORDS=device: device memory, none registered, right, said why") {
    auto res = run_ranks(
        3, [](int r) { return three_calls(r, "device", 0); }, opts());
    check_registered(res, {0, 0, 0});
    for (const auto& x : res)
      CHECK(contains(x.output,
                     "flag words in device memory, released after a failure by stream "
                     "writes on a stream of their own (CHORUS_IPC_WORDS=device)"));
  }
  SECTION("rank 1 with device words among host ones: each maps the others' kind, right") {
    auto res = run_ranks(
        3, [](int r) { return three_calls(r, r == 1 ? "device" : "host", r == 1 ? 0 : 1); },
        opts());
    // Rank 1 registers its peers' host words only; ranks 0 and 2 their own and each other's.
    check_registered(res, {2, 2, 2});
  }
  SECTION("CUDA refuses the host memory: device memory instead, said why, right") {
    auto res = run_ranks(
        3,
        [](int r) {
          chorus::test::fake_host_register_fails(true);
          return three_calls(r, nullptr, 0);
        },
        opts());
    check_registered(res, {0, 0, 0});
    for (const auto& x : res) CHECK(contains(x.output, "(CUDA refused to map host memory:"));
  }
}

TEST_CASE(
    "CUDA IPC, one hardware queue: a rank killed during a device all-reduce, the survivors' "
    "streams end within 5 s, with the process's streams sharing one queue as under "
    "CUDA_DEVICE_MAX_CONNECTIONS=1 (a stream write's release would queue behind their waits)",
    "[device]") {
  RunOptions o = opts();
  o.env.insert({"CHORUS_TEST_DEVICE_DIE", "1"});  // in its second call, after the exchange
  auto res = run_ranks(
      3,
      [](int r) {
        chorusComm_t comm = chorus::test::device_init(r);
        if (comm == nullptr) return 1;
        auto* buf = static_cast<float*>(chorus::test::fake_device_alloc(kN * 4));
        void* stream = chorus::test::fake_async_stream();
        chorus::test::fake_one_queue(stream);
        if (chorusAllReduce(buf, buf, kN, chorusFloat32, chorusSum, comm, stream) != chorusSuccess)
          return fail_with(r, "the first call", chorusGetLastError(comm));
        if (int e = chorus::test::fake_stream_sync(stream); e != 0)
          return fail_with(r, "the first call's stream",
                           chorus::kernels::cuda::ipc().error_string(e));
        const auto t0 = std::chrono::steady_clock::now();
        // Returns once enqueued; its waits for rank 1 end when the communicator fails.
        (void)chorusAllReduce(buf, buf, kN, chorusFloat32, chorusSum, comm, stream);
        const int e = chorus::test::fake_stream_sync(stream);
        const double took = seconds_since(t0);
        std::fprintf(stderr, "rank %d: the stream ended after %.2f s (%s)\n", r, took,
                     e == 0 ? "ok" : chorus::kernels::cuda::ipc().error_string(e).c_str());
        if (e != 0 || took > 5)
          return fail_with(r, "the survivor's stream", fmt::format("{:.1f} s, error {}", took, e));
        const chorusResult_t rc =
            chorusAllReduce(buf, buf, kN, chorusFloat32, chorusSum, comm, stream);
        const std::string why = chorusGetLastError(comm);
        chorus::test::fake_one_queue(nullptr);
        std::this_thread::sleep_for(std::chrono::seconds(1));  // the other survivor hears first
        chorusCommDestroy(comm);
        if (rc == chorusSuccess || !contains(why, "rank 1"))
          return fail_with(r, "the next call: expected rank 1 named", why);
        return 0;
      },
      o);
  check_ranks(res, {0, 2});
  CHECK(res[1].exit_code != 0);
}

TEST_CASE(
    "CUDA IPC host words: 24 communicators one after another on 2 ranks (splits) share a "
    "descriptor, each with words of its own",
    "[device]") {
  auto res = run_ranks(
      2,
      [](int r) {
        auto fds = [] {
          auto it = std::filesystem::directory_iterator("/proc/self/fd");
          return int(std::distance(begin(it), end(it)));
        };
        auto* buf = static_cast<float*>(chorus::test::fake_device_alloc(kN * 4));
        void* stream = chorus::test::fake_async_stream();
        int before = -1;
        chorusComm_t parent = chorus::test::device_init(r);
        if (parent == nullptr) return 1;
        for (int c = 0; c < 24; ++c) {
          chorusComm_t comm = nullptr;
          if (chorusCommSplit(parent, 0, r, &comm) != chorusSuccess)
            return fail_with(r, "split", chorusGetLastError(parent));
          for (size_t j = 0; j < kN; ++j) buf[j] = float(r + c);
          if (chorusAllReduce(buf, buf, kN, chorusFloat32, chorusSum, comm, stream) !=
              chorusSuccess)
            return fail_with(r, fmt::format("communicator {}", c), chorusGetLastError(comm));
          if (int e = chorus::test::fake_stream_sync(stream); e != 0)
            return fail_with(r, "the stream", chorus::kernels::cuda::ipc().error_string(e));
          if (buf[0] != float(1 + 2 * c))
            return fail_with(r, fmt::format("communicator {}", c), fmt::format("{}", buf[0]));
          chorusCommDestroy(comm);
          if (c == 0) before = fds();
        }
        chorusCommDestroy(parent);
        // Own words registered for each communicator; the peer's unregistered at destroy.
        if (chorus::test::fake_host_registered() != 24)
          return fail_with(r, "registered", std::to_string(chorus::test::fake_host_registered()));
        if (fds() > before + 2)  // a memfd each: 23 more
          return fail_with(r, "descriptors",
                           fmt::format("{} after the first, {} now", before, fds()));
        return 0;
      },
      [] {
        RunOptions o = opts();
        o.env.erase("CHORUS_DEBUG");
        return o;
      }());
  check_all(res);
}

TEST_CASE(
    "CUDA IPC host words of another pid namespace: reached through /proc as another process's, "
    "refused by name with the way out on every rank, no stream waiting",
    "[device]") {
  auto res = run_ranks(
      2,
      [](int r) {
        chorusComm_t comm = chorus::test::device_init(r);
        if (comm == nullptr) return 1;
        auto* buf = static_cast<float*>(chorus::test::fake_device_alloc(kN * 4));
        void* stream = chorus::test::fake_async_stream();
        if (r == 1)
          chorus::capi::devcall::corrupt_next_record_for_test(
              chorus::capi::devcall::Spoil::kWordsPid);
        const auto t0 = std::chrono::steady_clock::now();
        chorusResult_t rc = chorusAllReduce(buf, buf, kN, chorusFloat32, chorusSum, comm, stream);
        std::string why = chorusGetLastError(comm);
        if (r == 1 && rc == chorusSuccess) {  // rank 0's abort reaches it
          std::this_thread::sleep_for(std::chrono::seconds(1));
          rc = chorusAllReduce(buf, buf, kN, chorusFloat32, chorusSum, comm, stream);
          why = chorusGetLastError(comm);
        }
        const int e = chorus::test::fake_stream_sync(stream);
        const double took = seconds_since(t0);
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        chorusCommDestroy(comm);
        if (rc == chorusSuccess || !contains(why, "rank 1's flag words") ||
            !contains(why, "/proc/1/fd/") || !contains(why, "CHORUS_IPC_WORDS=device"))
          return fail_with(r, "expected the words refused by name", why);
        if (e != 0 || took > 5)
          return fail_with(r, "the stream", fmt::format("error {} after {:.1f} s", e, took));
        return 0;
      },
      opts());
  check_all(res);
}

TEST_CASE(
    "CUDA IPC host words: a /proc path that reaches another memfd of the same size is refused "
    "(map_shared alone would map it)",
    "[device]") {
  chorus::test::install_fake_gpu();
  chorus::DeviceIpc st;
  REQUIRE(chorus::alloc_words(st, 0).is_ok());
  REQUIRE(st.host_words);
  chorus::kernels::cuda::IpcHandle h{};
  REQUIRE(chorus::export_words(st, st.flags, &h) == 0);
  chorus::transport::SharedRef ref;
  std::memcpy(&ref, h.bytes, sizeof ref);
  // Another memfd of this process, of the arena's size: what a pid of another namespace, or a
  // descriptor number reused, reaches instead.
  auto other = chorus::transport::shared_alloc(ref.size);
  REQUIRE(other.is_ok());
  const auto other_ref = chorus::transport::find_shared(*other, 1);
  REQUIRE(other_ref);
  chorus::kernels::cuda::IpcHandle wrong = h;
  chorus::transport::SharedRef spoilt = ref;
  spoilt.fd = other_ref->fd;
  spoilt.id = other_ref->id;
  std::memcpy(wrong.bytes, &spoilt, sizeof spoilt);
  auto at = chorus::open_words(st, 1, true, wrong);
  REQUIRE_FALSE(at.is_ok());
  CHECK(contains(at.status().message(), "is not its memory"));
  CHECK(chorus::transport::map_shared(spoilt, spoilt.size).is_ok());  // what the check stops
  // The right one maps (this process's own memfd through /proc: the same file).
  auto right = chorus::open_words(st, 2, true, h);
  REQUIRE(right.is_ok());
  CHECK(right.value() != nullptr);
}
