// The staged path of device calls (collectives/device_staged.cc, device_stage.h) on an emulated
// GPU whose stream runs on a thread of its own (fake_gpu.h's async stream), so that what the host
// call waits for shows: ranks on two hosts (CHORUS_HOSTID), whose device calls go through host
// memory. The host call only enqueues -- it returns before a late peer has called, and before
// the stream's earlier work is done -- the host part starts after that work and the stream's
// later work waits for the host part; host buffers' calls keep their place in the order; the
// page-locked buffers are reused and freed; a peer killed, a stream whose earlier work never
// ends and a mismatch are each named after the call returned, with no stream waiting for ever.
#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>
#include <catch2/catch.hpp>

#include <chrono>
#include <cstring>
#include <initializer_list>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "chorus/chorus.h"
#include "device_test.h"
#include "fake_gpu.h"
#include "harness.h"
#include "kernels/cuda/ipc.h"

using chorus::test::check_all;
using chorus::test::check_ranks;
using chorus::test::contains;
using chorus::test::fail_with;
using chorus::test::run_ranks;
using chorus::test::RunOptions;

namespace {

chorusComm_t init(int rank) {
  setenv("CHORUS_HOSTID", rank == 2 ? "host-b" : "host-a", 1);  // rank 2 apart: staged
  return chorus::test::device_init(rank);
}

RunOptions opts(const char* timeout = "30") {
  RunOptions o;
  o.env = {{"CHORUS_TIMEOUT", timeout}, {"CHORUS_DEBUG", "INFO"}};
  o.limit_seconds = 120;
  return o;
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// `count` floats of emulated device memory.
float* dev(size_t count) {
  return static_cast<float*>(chorus::test::fake_device_alloc(count * 4));
}

float value(int q, size_t j, int salt) {
  return float(q * 1000 + salt * 100) + float(j % 97);
}

// Replay k of `graph` on rank r's stream: value(r, j, k) copied into `in` first, and rank 1's
// stream held back 40 ms before every third replay, so that the ranks are out of step.
bool replay(void* graph, void* stream, float* in, size_t n, int r, int k) {
  std::vector<float> input(n);
  for (size_t j = 0; j < n; ++j) input[j] = value(r, j, k);
  if (chorus::kernels::cuda::ipc().to_device(in, input.data(), n * 4, stream) != 0) return false;
  if (r == 1 && k % 3 == 0) chorus::test::fake_stream_delay(stream, 40);
  return chorus::test::fake_graph_launch(graph, stream) == 0;
}

// Until the communicator has an error (at most 10 s); its code.
chorusResult_t async_error(chorusComm_t comm) {
  chorusResult_t e = chorusSuccess;
  for (int i = 0; i < 1000 && e == chorusSuccess; ++i) {
    chorusCommGetAsyncError(comm, &e);
    if (e == chorusSuccess) usleep(10000);
  }
  return e;
}

}  // namespace

TEST_CASE(
    "staged device calls only enqueue: ordered after the stream's earlier work, before its "
    "later work, and among host calls; their flag word in host memory (stored into: no stream "
    "write) or, with CHORUS_STAGE_WORDS=device, device memory",
    "[device]") {
  const bool host_words = GENERATE(true, false);
  RunOptions o = opts();
  o.env["CHORUS_STAGE_WORDS"] = host_words ? "host" : "device";
  auto res = run_ranks(
      3,
      [host_words](int r) {
        chorusComm_t comm = init(r);
        if (!comm) return 1;
        const int releases = chorus::test::fake_flags_releases();
        int capturable = -1;  // staged: replays run host parts
        if (chorusCommCapturable(comm, &capturable) != chorusSuccess || capturable != 0)
          return fail_with(r, "chorusCommCapturable", fmt::format("{}, want 0", capturable));
        const chorus::kernels::cuda::IpcBackend& gpu = chorus::kernels::cuda::ipc();
        constexpr int p = 3;
        constexpr size_t n = 1001;
        void* stream = chorus::test::fake_async_stream();
        auto dev = [](size_t bytes) { return chorus::test::fake_device_alloc(bytes); };
        auto* in = static_cast<float*>(dev(n * 4));
        auto* sum = static_cast<float*>(dev(n * 4));
        auto* later =
            static_cast<float*>(dev(n * 4));  // the stream's copy of `sum`, enqueued later
        auto* gathered = static_cast<float*>(dev(p * n * 4));
        auto* bcast = static_cast<float*>(dev(n * 4));
        auto* ring = static_cast<float*>(dev(n * 4));
        auto* gate = static_cast<uint32_t*>(dev(4));
        std::vector<float> mine(n);
        for (size_t j = 0; j < n; ++j) mine[j] = value(r, j, 1);
        for (size_t j = 0; j < n; ++j) in[j] = -1.0f;  // until the stream writes `mine`
        if (r == 0) usleep(1500 * 1000);               // the late peer
        const auto start = std::chrono::steady_clock::now();
        // The stream's earlier work: held by a gate that this thread opens after the calls, then
        // the input's write.
        if (gpu.wait_u32_geq(stream, gate, 1) != 0 ||
            gpu.to_device(in, mine.data(), n * 4, stream) != 0)
          return fail_with(r, "enqueueing the earlier work", "failed");
        chorusResult_t rc = chorusAllReduce(in, sum, n, chorusFloat32, chorusSum, comm, stream);
        const void* src[] = {sum};
        void* dst[] = {later};
        if (rc == chorusSuccess &&
            gpu.fold(chorus::kernels::DType::kF32, chorus::kernels::RedOp::kSum, src, 1, dst, 1, n,
                     0, stream) != 0)
          return fail_with(r, "enqueueing the later work", "failed");
        if (rc == chorusSuccess) rc = chorusAllGather(in, gathered, n, chorusFloat32, comm, stream);
        if (rc == chorusSuccess) rc = chorusBroadcast(in, bcast, n, chorusFloat32, 2, comm, stream);
        if (rc == chorusSuccess) {  // a ring of device sends in a group
          chorusGroupStart();
          chorusSend(sum, n, chorusFloat32, (r + 1) % p, comm, stream);
          chorusRecv(ring, n, chorusFloat32, (r + p - 1) % p, comm, stream);
          rc = chorusGroupEnd();
        }
        if (rc == chorusSuccess) rc = chorusBarrier(comm, stream);
        const double enqueued = seconds_since(start);
        if (rc != chorusSuccess) return fail_with(r, "the calls", chorusGetLastError(comm));
        // Before the peers called (rank 0 is 1.5 s late) and before the stream's earlier work.
        if (r != 0 && enqueued > 1.0)
          return fail_with(r, "enqueueing", fmt::format("took {:.2f} s: it waited", enqueued));
        // A host call after them all: it waits for its turn, behind the staged ones.
        __atomic_store_n(gate, 1u, __ATOMIC_RELEASE);
        int host_in = r + 1, host_out = 0;
        if (chorusAllReduce(&host_in, &host_out, 1, chorusInt32, chorusSum, comm, nullptr) !=
                chorusSuccess ||
            host_out != 6)
          return fail_with(r, "the host call among them", chorusGetLastError(comm));
        if (int e = chorus::test::fake_stream_sync(stream); e != 0)
          return fail_with(r, "the stream", gpu.error_string(e));
        for (size_t j = 0; j < n; ++j) {
          const float want = value(0, j, 1) + value(1, j, 1) + value(2, j, 1);
          if (sum[j] != want || later[j] != want || bcast[j] != value(2, j, 1) || ring[j] != want)
            return fail_with(r, "results",
                             fmt::format("element {}: sum {} later {} bcast {} ring {}, want {} "
                                         "{} {} {}",
                                         j, sum[j], later[j], bcast[j], ring[j], want, want,
                                         value(2, j, 1), want));
          for (int q = 0; q < p; ++q)
            if (gathered[q * n + j] != value(q, j, 1))
              return fail_with(r, "all-gather", fmt::format("block {} element {}", q, j));
        }
        // An I-call (on the legacy default stream, which the emulation runs at once): its
        // request is complete when the call returns, as in NCCL.
        chorusRequest_t req = nullptr;
        int done = 0;
        if (chorusIallReduce(in, in, n, chorusFloat32, chorusMax, comm, &req) != chorusSuccess ||
            chorusTest(req, &done) != chorusSuccess || done != 1 ||
            chorusRequestFree(req) != chorusSuccess)
          return fail_with(r, "the I-call", chorusGetLastError(comm));
        for (size_t j = 0; j < n; ++j)
          if (in[j] != value(2, j, 1))
            return fail_with(r, "the I-call", fmt::format("element {}: {}", j, in[j]));
        // Many calls, the stream synchronised between them: the buffers of the calls above (in
        // flight together, a buffer each) again and again, none more.
        const int before = chorus::test::fake_pinned_live();
        for (int i = 0; i < 20; ++i) {
          if (chorusAllReduce(sum, sum, n, chorusFloat32, chorusMax, comm, stream) != chorusSuccess)
            return fail_with(r, "call " + std::to_string(i), chorusGetLastError(comm));
          if (chorus::test::fake_stream_sync(stream) != 0) return fail_with(r, "sync", "failed");
        }
        const int live = chorus::test::fake_pinned_live();
        if (before != 4 || live != before)
          return fail_with(
              r, "host buffers",
              fmt::format("{} allocated after the first calls, {} after 20 more", before, live));
        // Calls larger than every buffer, within CHORUS_STAGED_MAX_BYTES: new buffers, none
        // freed before destroy (cudaFreeHost may wait for the whole device).
        const int frees = chorus::test::fake_pinned_frees();
        auto* big = static_cast<float*>(dev(8 * n * 4));
        for (size_t m : {2 * n, 4 * n, 8 * n}) {
          if (chorusAllReduce(big, big, m, chorusFloat32, chorusMax, comm, stream) != chorusSuccess)
            return fail_with(r, fmt::format("a call of {} floats", m), chorusGetLastError(comm));
          if (chorus::test::fake_stream_sync(stream) != 0) return fail_with(r, "sync", "failed");
        }
        if (chorus::test::fake_pinned_frees() != frees ||
            chorus::test::fake_pinned_live() != live + 3)
          return fail_with(r, "host buffers of larger calls",
                           fmt::format("{} freed, {} allocated (want 0 freed, {})",
                                       chorus::test::fake_pinned_frees() - frees,
                                       chorus::test::fake_pinned_live(), live + 3));
        // Host words: every call ended by a store of the progress thread's, none by a stream
        // write (which a hardware queue shared with the waiting stream could hold back).
        const int written = chorus::test::fake_flags_releases() - releases;
        if (host_words ? written != 0 : written < 20)
          return fail_with(r, "the calls' ends", fmt::format("{} stream writes", written));
        chorusCommDestroy(comm);
        if (chorus::test::fake_pinned_live() != 0)
          return fail_with(r, "host buffers", "still allocated after destroy");
        return 0;
      },
      o);
  check_all(res);
  for (const auto& rr : res) {
    CHECK(contains(rr.output, "staged through host memory (2 hosts"));
    CHECK(contains(rr.output, host_words ? "flag word in mapped host memory"
                                         : "flag word in device memory, written on a stream of "
                                           "its own (CHORUS_STAGE_WORDS=device)"));
  }
}

TEST_CASE(
    "staged device calls hold at most CHORUS_STAGED_MAX_BYTES of host memory: a call past it "
    "waits for an earlier one's stream",
    "[device]") {
  RunOptions o = opts();
  o.env["CHORUS_STAGED_MAX_BYTES"] = "10000";  // one call of 1000 floats (8032 bytes) at a time
  auto res = run_ranks(
      3,
      [](int r) {
        chorusComm_t comm = init(r);
        if (!comm) return 1;
        const chorus::kernels::cuda::IpcBackend& gpu = chorus::kernels::cuda::ipc();
        constexpr size_t n = 1000;
        void* stream = chorus::test::fake_async_stream();
        auto* gate = static_cast<uint32_t*>(chorus::test::fake_device_alloc(4));
        std::vector<float*> bufs;
        for (int i = 0; i < 3; ++i) {
          bufs.push_back(static_cast<float*>(chorus::test::fake_device_alloc(n * 4)));
          for (size_t j = 0; j < n; ++j) bufs[i][j] = value(r, j, i);
        }
        // The stream's earlier work holds it for 0.5 s: the first call's buffer stays in use.
        if (gpu.wait_u32_geq(stream, gate, 1) != 0) return fail_with(r, "the gate", "failed");
        std::thread opener([gate] {
          usleep(500 * 1000);
          __atomic_store_n(gate, 1u, __ATOMIC_RELEASE);
        });
        const auto start = std::chrono::steady_clock::now();
        double first = 0;
        for (float* b : bufs) {
          if (chorusAllReduce(b, b, n, chorusFloat32, chorusSum, comm, stream) != chorusSuccess) {
            opener.join();
            return fail_with(r, "a call", chorusGetLastError(comm));
          }
          if (first == 0) first = seconds_since(start);
        }
        const double all = seconds_since(start);
        opener.join();
        if (first > 0.3 || all < 0.4)
          return fail_with(r, "the wait",
                           fmt::format("first call {:.2f} s, all three {:.2f} s: want the first at "
                                       "once, the second after the gate",
                                       first, all));
        if (int e = chorus::test::fake_stream_sync(stream); e != 0)
          return fail_with(r, "the stream", gpu.error_string(e));
        for (int i = 0; i < 3; ++i)
          for (size_t j = 0; j < n; ++j)
            if (bufs[i][j] != value(0, j, i) + value(1, j, i) + value(2, j, i))
              return fail_with(r, "results", fmt::format("call {} element {}", i, j));
        if (chorus::test::fake_pinned_live() != 1)
          return fail_with(r, "host buffers",
                           fmt::format("{} allocated, want 1", chorus::test::fake_pinned_live()));
        chorusCommDestroy(comm);
        return 0;
      },
      o);
  check_all(res);
}

// A staged call that fails after its input's copy was enqueued (here: the mark after it) leaves
// its host buffer to that copy: a call on another stream meanwhile takes another buffer, not the
// one the pending copy will write into.
TEST_CASE("a staged call failed after its copy was enqueued keeps its buffer until the copy",
          "[device]") {
  check_all(run_ranks(
      3,
      [](int r) {
        chorusComm_t comm = init(r);
        if (!comm) return 1;
        const chorus::kernels::cuda::IpcBackend& gpu = chorus::kernels::cuda::ipc();
        constexpr size_t n = 1000;
        void* held = chorus::test::fake_async_stream();
        void* other = chorus::test::fake_async_stream();
        auto* gate = static_cast<uint32_t*>(chorus::test::fake_device_alloc(4));
        float *a = dev(n), *b = dev(n);
        for (size_t j = 0; j < n; ++j) b[j] = value(r, j, 1);
        if (gpu.wait_u32_geq(held, gate, 1) != 0) return fail_with(r, "the gate", "failed");
        chorus::test::fake_fail_marks(1);  // on every rank: none runs the first call's host part
        if (chorusAllReduce(a, a, n, chorusFloat32, chorusSum, comm, held) == chorusSuccess ||
            !contains(chorusGetLastError(comm), "marking the input's copy"))
          return fail_with(r, "the failed call", chorusGetLastError(comm));
        if (chorusAllReduce(b, b, n, chorusFloat32, chorusSum, comm, other) != chorusSuccess)
          return fail_with(r, "the call after", chorusGetLastError(comm));
        const int live = chorus::test::fake_pinned_live();
        __atomic_store_n(gate, 1u, __ATOMIC_RELEASE);
        if (int e = chorus::test::fake_stream_sync(other); e != 0)
          return fail_with(r, "the other stream", gpu.error_string(e));
        if (int e = chorus::test::fake_stream_sync(held); e != 0)
          return fail_with(r, "the held stream", gpu.error_string(e));
        if (live != 2)
          return fail_with(r, "host buffers",
                           fmt::format("{} allocated while the failed call's copy was pending, "
                                       "want 2 (its own and the next call's)",
                                       live));
        for (size_t j = 0; j < n; ++j)
          if (b[j] != value(0, j, 1) + value(1, j, 1) + value(2, j, 1))
            return fail_with(r, "the call after", fmt::format("element {}: {}", j, b[j]));
        chorusCommDestroy(comm);
        return 0;
      },
      opts()));
}

// Staged calls captured into a CUDA graph (device_staged_graph.cc): each replay's host part runs
// on the replays' communicator when the stream reaches the graph's host node; 10 replays with
// rank 1's stream held back before every third and eager staged calls between, all right; the
// first staged call is the captured one; the graph freed gives its slots back (70 captures in
// all), and its page-locked memory to the next capture, with no free during a capture.
TEST_CASE(
    "staged device calls captured into a CUDA graph: every replay right, ranks out of step, "
    "eager calls between, slots given back",
    "[device][graph]") {
  auto res = run_ranks(
      3,
      [](int r) {
        chorusComm_t comm = init(r);
        if (!comm) return 1;
        constexpr int p = 3, kReplays = 10;
        constexpr size_t n = 257;
        void* stream = chorus::test::fake_async_stream();
        float *in = dev(n), *sum = dev(n), *bc = dev(n), *ag = dev(p * n), *eager = dev(n);
        std::vector<std::vector<float>> sums(kReplays, std::vector<float>(n)),
            bcs = sums, ags(kReplays, std::vector<float>(p * n)), eagers = sums;
        // No eager call first: the stage word is made during the capture.
        chorus::test::fake_capture_begin(stream);
        chorusResult_t rc = chorusAllReduce(in, sum, n, chorusFloat32, chorusSum, comm, stream);
        if (rc == chorusSuccess) rc = chorusBroadcast(in, bc, n, chorusFloat32, 2, comm, stream);
        if (rc == chorusSuccess) rc = chorusAllGather(in, ag, n, chorusFloat32, comm, stream);
        void* graph = chorus::test::fake_capture_end(stream);
        if (rc != chorusSuccess) return fail_with(r, "the capture", chorusGetLastError(comm));
        const chorus::kernels::cuda::IpcBackend& gpu = chorus::kernels::cuda::ipc();
        for (int k = 0; k < kReplays; ++k) {
          if (!replay(graph, stream, in, n, r, k)) return fail_with(r, "a replay", "failed");
          // The results read back on the stream (page-locked: read when the stream gets there).
          if (gpu.to_host_async(sums[k].data(), sum, n * 4, stream) != 0 ||
              gpu.to_host_async(bcs[k].data(), bc, n * 4, stream) != 0 ||
              gpu.to_host_async(ags[k].data(), ag, p * n * 4, stream) != 0)
            return fail_with(r, "reading back", "failed");
          if (k % 4 == 3 && chorusAllReduce(in, eager, n, chorusFloat32, chorusMax, comm, stream) !=
                                chorusSuccess)
            return fail_with(r, "an eager call", chorusGetLastError(comm));
          if (k % 4 == 3 && gpu.to_host_async(eagers[k].data(), eager, n * 4, stream) != 0)
            return fail_with(r, "reading back", "failed");
        }
        if (int e = chorus::test::fake_stream_sync(stream); e != 0)
          return fail_with(r, "the stream", gpu.error_string(e));
        for (int k = 0; k < kReplays; ++k)
          for (size_t j = 0; j < n; ++j) {
            float want = 0, most = value(0, j, k);
            for (int q = 0; q < p; ++q) want += value(q, j, k);
            for (int q = 1; q < p; ++q) most = std::max(most, value(q, j, k));
            bool ok = sums[k][j] == want && bcs[k][j] == value(2, j, k) &&
                      (k % 4 != 3 || eagers[k][j] == most);
            for (int q = 0; q < p; ++q) ok = ok && ags[k][q * n + j] == value(q, j, k);
            if (!ok)
              return fail_with(r, fmt::format("replay {}", k),
                               fmt::format("element {}: sum {} (want {}), broadcast {} (want {})",
                                           j, sums[k][j], want, bcs[k][j], value(2, j, k)));
          }
        chorus::test::fake_graph_free(graph);
        const int pinned = chorus::test::fake_pinned_live();
        for (int k = 0; k < 70; ++k) {  // more captures than slots: each comes back at the free
          chorus::test::fake_capture_begin(stream);
          rc = chorusAllReduce(in, sum, n, chorusFloat32, chorusSum, comm, stream);
          graph = chorus::test::fake_capture_end(stream);
          if (rc != chorusSuccess)
            return fail_with(r, fmt::format("capture {}", k), chorusGetLastError(comm));
          if (chorus::test::fake_graph_launch(graph, stream) != 0 ||
              chorus::test::fake_stream_sync(stream) != 0)
            return fail_with(r, fmt::format("capture {}'s replay", k), "failed");
          chorus::test::fake_graph_free(graph);
        }
        // Each capture took the page-locked memory of the graph freed before it, and none was
        // freed during a capture.
        if (int frees = chorus::test::fake_frees_in_capture(); frees != 0)
          return fail_with(r, "70 captures", fmt::format("{} frees during captures", frees));
        if (int live = chorus::test::fake_pinned_live(); live > pinned + 1)
          return fail_with(
              r, "70 captures",
              fmt::format("{} page-locked blocks live after, {} before", live, pinned));
        chorusCommDestroy(comm);
        return 0;
      },
      opts());
  check_all(res);
  for (const chorus::test::RankResult& x : res)  // every graph was freed before destroy
    CHECK(!contains(x.output, "still held by CUDA graphs"));
}

// Staged sends and receives captured into a CUDA graph (device_staged_graph.cc), before an
// all-reduce in the same capture: a ring exchange in a group (send to the right, receive from the
// left) and a send from rank 0 to rank 2 alone, replayed 8 times with rank 1's stream held back
// before every third replay and an eager exchange between replays, all right.
TEST_CASE(
    "staged device sends and receives captured into a CUDA graph before any collective, every "
    "replay right",
    "[device][graph]") {
  auto res = run_ranks(
      3,
      [](int r) {
        chorusComm_t comm = init(r);
        if (!comm) return 1;
        constexpr int p = 3, kReplays = 8;
        constexpr size_t n = 129;
        void* stream = chorus::test::fake_async_stream();
        float *in = dev(n), *sum = dev(n), *left = dev(n), *solo = dev(n), *eager = dev(n);
        const int right_of = (r + 1) % p, left_of = (r + p - 1) % p;
        auto ring = [&](float* into) {
          chorusGroupStart();
          chorusSend(in, n, chorusFloat32, right_of, comm, stream);
          chorusRecv(into, n, chorusFloat32, left_of, comm, stream);
          return chorusGroupEnd();
        };
        // The sends and receives first: each pair's replays communicator is made for them.
        chorus::test::fake_capture_begin(stream);
        chorusResult_t rc = ring(left);
        if (rc == chorusSuccess && r == 0) rc = chorusSend(in, n, chorusFloat32, 2, comm, stream);
        if (rc == chorusSuccess && r == 2) rc = chorusRecv(solo, n, chorusFloat32, 0, comm, stream);
        if (rc == chorusSuccess)
          rc = chorusAllReduce(in, sum, n, chorusFloat32, chorusSum, comm, stream);
        void* graph = chorus::test::fake_capture_end(stream);
        if (rc != chorusSuccess) return fail_with(r, "the capture", chorusGetLastError(comm));
        const chorus::kernels::cuda::IpcBackend& gpu = chorus::kernels::cuda::ipc();
        std::vector<std::vector<float>> sums(kReplays, std::vector<float>(n)),
            lefts = sums, solos = sums, eagers = sums;
        for (int k = 0; k < kReplays; ++k) {
          if (!replay(graph, stream, in, n, r, k)) return fail_with(r, "a replay", "failed");
          if (gpu.to_host_async(sums[k].data(), sum, n * 4, stream) != 0 ||
              gpu.to_host_async(lefts[k].data(), left, n * 4, stream) != 0 ||
              gpu.to_host_async(solos[k].data(), solo, n * 4, stream) != 0)
            return fail_with(r, "reading back", "failed");
          if (k % 3 == 1) {  // the same exchange eager, between replays
            if (ring(eager) != chorusSuccess)
              return fail_with(r, "an eager exchange", chorusGetLastError(comm));
            if (gpu.to_host_async(eagers[k].data(), eager, n * 4, stream) != 0)
              return fail_with(r, "reading back", "failed");
          }
        }
        if (int e = chorus::test::fake_stream_sync(stream); e != 0)
          return fail_with(r, "the stream", gpu.error_string(e));
        for (int k = 0; k < kReplays; ++k)
          for (size_t j = 0; j < n; ++j) {
            float want = 0;
            for (int q = 0; q < p; ++q) want += value(q, j, k);
            const bool ok = sums[k][j] == want && lefts[k][j] == value(left_of, j, k) &&
                            (r != 2 || solos[k][j] == value(0, j, k)) &&
                            (k % 3 != 1 || eagers[k][j] == value(left_of, j, k));
            if (!ok)
              return fail_with(
                  r, fmt::format("replay {}", k),
                  fmt::format("element {}: sum {} (want {}), from the left {} (want "
                              "{}), from rank 0 {}",
                              j, sums[k][j], want, lefts[k][j], value(left_of, j, k), solos[k][j]));
          }
        if (int frees = chorus::test::fake_frees_in_capture(); frees != 0)
          return fail_with(r, "the captures", fmt::format("{} frees during captures", frees));
        // The graph outlives the communicator: destroy warns that its replays would wait, and
        // frees no page-locked memory (a free may wait for the device, hence for such a replay).
        const int frees = chorus::test::fake_pinned_frees();
        chorusCommDestroy(comm);
        if (int more = chorus::test::fake_pinned_frees() - frees; more != 0)
          return fail_with(r, "destroy", fmt::format("{} page-locked frees, want 0", more));
        chorus::test::fake_graph_free(graph);
        return 0;
      },
      opts());
  check_all(res);
  for (int r = 0; r < 3; ++r)  // the ring exchange, rank 0's and 2's pair, and the all-reduce
    CHECK(contains(res[r].output,
                   fmt::format("chorusCommDestroy on rank {}: {} captured call(s) of this "
                               "communicator are still held by CUDA graphs not destroyed",
                               r, r == 1 ? 2 : 3)));
}

TEST_CASE(
    "staged sends and receives matched across graphs: rank 0's group in its graph A meets rank "
    "1's graph B and rank 2's graph A, so rank 0's capture ends only after rank 2's has; no "
    "capture waits for a pair communicator's making; every replay right",
    "[device][graph]") {
  auto res = run_ranks(
      3,
      [](int r) {
        chorusComm_t comm = init(r);
        if (!comm) return 1;
        constexpr int kReplays = 6;
        constexpr size_t n = 77;
        void* stream = chorus::test::fake_async_stream();
        float *in = dev(n), *from0 = dev(n), *from1 = dev(n);
        // A: rank 0 sends to 1 and 2 (a group), rank 1 sends to 2, rank 2 receives from 0.
        // B: rank 1 receives from 0, rank 2 from 1. Rank 2 ends A's capture first, then waits in
        // B's for rank 1, which waits in A's for rank 2's B, while rank 0 waits in A's for rank
        // 1's B: a capture that waited for its pair communicator (rank 2's with rank 0) would
        // never end.
        chorusResult_t rc = chorusSuccess;
        chorus::test::fake_capture_begin(stream);
        if (r == 0) {
          chorusGroupStart();
          chorusSend(in, n, chorusFloat32, 1, comm, stream);
          chorusSend(in, n, chorusFloat32, 2, comm, stream);
          rc = chorusGroupEnd();
        }
        if (r == 1) rc = chorusSend(in, n, chorusFloat32, 2, comm, stream);
        if (r == 2) rc = chorusRecv(from0, n, chorusFloat32, 0, comm, stream);
        void* a = chorus::test::fake_capture_end(stream);
        if (rc != chorusSuccess) return fail_with(r, "graph A's capture", chorusGetLastError(comm));
        chorus::test::fake_capture_begin(stream);
        if (r == 1) rc = chorusRecv(from0, n, chorusFloat32, 0, comm, stream);
        if (r == 2) rc = chorusRecv(from1, n, chorusFloat32, 1, comm, stream);
        void* b = chorus::test::fake_capture_end(stream);
        if (rc != chorusSuccess) return fail_with(r, "graph B's capture", chorusGetLastError(comm));
        const chorus::kernels::cuda::IpcBackend& gpu = chorus::kernels::cuda::ipc();
        std::vector<std::vector<float>> got0(kReplays, std::vector<float>(n)), got1 = got0;
        for (int k = 0; k < kReplays; ++k) {
          if (!replay(a, stream, in, n, r, k) || chorus::test::fake_graph_launch(b, stream) != 0)
            return fail_with(r, "a replay", "failed");
          if (gpu.to_host_async(got0[k].data(), from0, n * 4, stream) != 0 ||
              gpu.to_host_async(got1[k].data(), from1, n * 4, stream) != 0)
            return fail_with(r, "reading back", "failed");
        }
        if (int e = chorus::test::fake_stream_sync(stream); e != 0)
          return fail_with(r, "the stream", gpu.error_string(e));
        for (int k = 0; k < kReplays && r != 0; ++k)
          for (size_t j = 0; j < n; ++j)
            if (got0[k][j] != value(0, j, k) || (r == 2 && got1[k][j] != value(1, j, k)))
              return fail_with(
                  r, fmt::format("replay {}", k),
                  fmt::format("element {}: from rank 0 {} (want {}), from rank 1 {} "
                              "(want {})",
                              j, got0[k][j], value(0, j, k), got1[k][j], value(1, j, k)));
        chorus::test::fake_graph_free(a);
        chorus::test::fake_graph_free(b);
        chorusCommDestroy(comm);
        return 0;
      },
      opts("10"));
  check_all(res);
  for (int r = 0; r < 3; ++r) {
    CHECK(res[r].seconds < 9);  // no capture waited for a timeout
    // Each rank made two pair communicators, said at CHORUS_DEBUG=INFO.
    CHECK(contains(res[r].output, fmt::format("rank {}: the communicator of replays with rank {}",
                                              r, (r + 1) % 3)));
    CHECK(contains(res[r].output, fmt::format("rank {}: the communicator of replays with rank {}",
                                              r, (r + 2) % 3)));
  }
}

namespace {

// One rank of the failure tests: its communicator, an async stream, 64 floats of device memory.
struct Rank {
  int r;
  chorusComm_t comm;
  void* stream;
  float* buf;
  chorusResult_t all_reduce() {
    return chorusAllReduce(buf, buf, 64, chorusFloat32, chorusSum, comm, stream);
  }
  // One call that works, its stream synchronised: the ranks are in step.
  bool in_step() {
    return all_reduce() == chorusSuccess && chorus::test::fake_stream_sync(stream) == 0;
  }
  // The stream ends (within `limit` s of `since`), the communicator has an error, and the next
  // call names it, with every one of `words`; then destroy. 0, or a failure said.
  int ends_named(std::chrono::steady_clock::time_point since, double limit,
                 std::initializer_list<const char*> words) {
    if (int e = chorus::test::fake_stream_sync(stream); e != 0 || seconds_since(since) > limit)
      return fail_with(r, "the stream",
                       fmt::format("error {} after {:.1f} s", e, seconds_since(since)));
    if (async_error(comm) == chorusSuccess) return fail_with(r, "the communicator", "no error");
    const chorusResult_t next = all_reduce();
    const std::string why = chorusGetLastError(comm);
    for (const char* w : words)
      if (next == chorusSuccess || !contains(why, w)) return fail_with(r, "the next call", why);
    chorusCommDestroy(comm);
    return 0;
  }
  // A graph of an all-reduce (with `with_all_reduce`) and a ring exchange in a group (buf to the
  // right, from the left into 64 floats of its own); nullptr when the capture failed.
  void* capture_ring(bool with_all_reduce) {
    float* got = dev(64);
    chorus::test::fake_capture_begin(stream);
    chorusResult_t rc = with_all_reduce ? all_reduce() : chorusSuccess;
    if (rc == chorusSuccess) {
      chorusGroupStart();
      chorusSend(buf, 64, chorusFloat32, (r + 1) % 3, comm, stream);
      chorusRecv(got, 64, chorusFloat32, (r + 2) % 3, comm, stream);
      rc = chorusGroupEnd();
    }
    void* graph = chorus::test::fake_capture_end(stream);
    if (rc == chorusSuccess) return graph;
    fail_with(r, "the capture", chorusGetLastError(comm));
    return nullptr;
  }
  // In step, then a graph of an all-reduce and a ring exchange (capture_ring) captured and
  // replayed once to its end; nullptr when any of it failed (said).
  void* ring_replayed_once() {
    if (!in_step()) {
      fail_with(r, "the eager call", chorusGetLastError(comm));
      return nullptr;
    }
    void* graph = capture_ring(true);
    if (graph == nullptr) return nullptr;
    if (chorus::test::fake_graph_launch(graph, stream) != 0 ||
        chorus::test::fake_stream_sync(stream) != 0) {
      fail_with(r, "the first replay", "failed");
      return nullptr;
    }
    return graph;
  }
  // `n` replays of `graph` from now on; they end named as a rank 2 that died (ends_named), within
  // `limit` s, destroy included. The graph is destroyed after the communicator, or, with
  // `free_early`, as soon as its stream ends.
  int replays_end_named(void* graph, int n, double limit, bool free_early = false) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i)
      if (chorus::test::fake_graph_launch(graph, stream) != 0)
        return fail_with(r, "a replay", "failed");
    if (free_early) {
      if (int e = chorus::test::fake_stream_sync(stream); e != 0)
        return fail_with(r, "the stream", fmt::format("error {}", e));
      chorus::test::fake_graph_free(graph);
      graph = nullptr;
    }
    const int e = ends_named(start, limit, {"rank 2"});
    if (graph != nullptr) chorus::test::fake_graph_free(graph);
    if (e == 0 && seconds_since(start) > limit) return fail_with(r, "destroy", "it waited");
    return e;
  }
};

std::optional<Rank> setup(int r) {
  chorusComm_t comm = init(r);
  if (!comm) return std::nullopt;
  return Rank{r, comm, chorus::test::fake_async_stream(),
              static_cast<float*>(chorus::test::fake_device_alloc(64 * 4))};
}

// Rank 2 killed right after capturing a ring exchange (after an all-reduce, with
// `with_all_reduce`): each survivor replays it `n` times, and the replays end named
// (Rank::replays_end_named, the graph destroyed as soon as its stream ends with `free_early`).
std::vector<chorus::test::RankResult> killed_after_capture(bool with_all_reduce, int n,
                                                           bool free_early, const RunOptions& o) {
  // Rank 2 dies once both survivors' captures have returned (a pipe): each side of a pair's
  // exchange may end before the other's, and a death in between fails the other's capture
  // instead (1 run in 10 before).
  int captured[2];
  REQUIRE(pipe(captured) == 0);
  auto res = run_ranks(
      3,
      [=](int r) {
        std::optional<Rank> k = setup(r);
        if (!k) return 1;
        if (!k->in_step()) return fail_with(r, "the eager call", chorusGetLastError(k->comm));
        void* graph = k->capture_ring(with_all_reduce);
        if (graph == nullptr) return 1;
        if (r != 2) (void)!write(captured[1], "c", 1);
        if (r == 2) {
          char two[2];
          for (size_t got = 0; got < sizeof two;) {
            pollfd p{captured[0], POLLIN, 0};
            if (poll(&p, 1, 10000) != 1) break;
            const ssize_t n = read(captured[0], two + got, sizeof two - got);
            if (n <= 0) break;
            got += size_t(n);
          }
          raise(SIGKILL);
        }
        return k->replays_end_named(graph, n, 15, free_early);
      },
      o);
  close(captured[0]);
  close(captured[1]);
  return res;
}

// setup(r) and a first replay of a ring exchange (Rank::ring_replayed_once); then rank 2 dies
// 300 ms later (the survivors' next replays are queued, or their first host part waits for it,
// by then). The graph; nullptr when any of it failed.
void* replayed_once_then_rank2_dies(std::optional<Rank>& k, int r) {
  k = setup(r);
  if (!k) return nullptr;
  void* graph = k->ring_replayed_once();
  if (graph != nullptr && r == 2) {
    usleep(300 * 1000);
    raise(SIGKILL);
  }
  return graph;
}

// Rank 2 killed with the survivors' next 10 replays queued: they end named
// (Rank::replays_end_named).
std::vector<chorus::test::RankResult> killed_while_queued(const RunOptions& o) {
  return run_ranks(
      3,
      [](int r) {
        std::optional<Rank> k;
        void* graph = replayed_once_then_rank2_dies(k, r);
        if (graph == nullptr) return 1;
        return k->replays_end_named(graph, 10, 15);
      },
      o);
}

}  // namespace

TEST_CASE(
    "staged device calls, one hardware queue: the host part's store ends each wait, with the "
    "process's streams sharing one queue as under CUDA_DEVICE_MAX_CONNECTIONS=1 (a stream write "
    "would queue behind it)",
    "[device]") {
  auto res = run_ranks(
      3,
      [](int r) {
        std::optional<Rank> k = setup(r);
        if (!k) return 1;
        chorus::test::fake_one_queue(k->stream);
        for (size_t j = 0; j < 64; ++j) k->buf[j] = value(r, j, 0);
        for (int i = 0; i < 3; ++i)  // in place: each call sums the last one's results
          if (k->all_reduce() != chorusSuccess)
            return fail_with(r, "call " + std::to_string(i), chorusGetLastError(k->comm));
        if (int e = chorus::test::fake_stream_sync(k->stream); e != 0)
          return fail_with(r, "the stream", chorus::kernels::cuda::ipc().error_string(e));
        for (size_t j = 0; j < 64; ++j) {
          const float want = 9 * (value(0, j, 0) + value(1, j, 0) + value(2, j, 0));
          if (k->buf[j] != want)
            return fail_with(r, "results", fmt::format("[{}] = {}, want {}", j, k->buf[j], want));
        }
        chorus::test::fake_one_queue(nullptr);
        chorusCommDestroy(k->comm);
        return 0;
      },
      opts());
  check_all(res);
}

TEST_CASE("staged device calls: a peer killed; the stream's earlier work that never ends",
          "[device]") {
  SECTION(
      "rank 2 killed while the survivors' host parts wait for it: their calls returned, "
      "their streams end, the error names it") {
    auto res = run_ranks(
        3,
        [](int r) {
          std::optional<Rank> k = setup(r);
          if (!k) return 1;
          // One call that works, so that the ranks are in step; then rank 2 dies.
          if (!k->in_step()) return fail_with(r, "the first call", chorusGetLastError(k->comm));
          if (r == 2) {  // after the survivors' calls (each takes milliseconds)
            usleep(300 * 1000);
            raise(SIGKILL);
          }
          const auto start = std::chrono::steady_clock::now();
          if (k->all_reduce() != chorusSuccess)
            return fail_with(r, "the call", chorusGetLastError(k->comm));
          if (seconds_since(start) > 1.0) return fail_with(r, "the call", "it waited");
          return k->ends_named(start, 10, {"rank 2"});
        },
        opts());
    check_ranks(res, {0, 1});
  }
  SECTION(
      "rank 1's recvbuff is host memory beside a device sendbuff: refused before anything is "
      "enqueued, naming the buffer, and every rank learns it at once") {
    auto res = run_ranks(
        3,
        [](int r) {
          std::optional<Rank> k = setup(r);
          if (!k) return 1;
          if (!k->in_step()) return fail_with(r, "the first call", chorusGetLastError(k->comm));
          const auto start = std::chrono::steady_clock::now();
          std::vector<float> host(64);
          const chorusResult_t rc = chorusAllReduce(k->buf, r == 1 ? host.data() : k->buf, 64,
                                                    chorusFloat32, chorusSum, k->comm, k->stream);
          const std::string why = chorusGetLastError(k->comm);
          if (r == 1 && (rc != chorusInvalidArgument || !contains(why, "recvbuff") ||
                         !contains(why, "is host memory") ||
                         !contains(why, "must be memory of the current device")))
            return fail_with(r, "the call", why);
          return k->ends_named(start, 10, {"recvbuff", "host memory"});
        },
        opts());
    check_all(res);
  }
  SECTION(
      "CHORUS_TEST_DEVICE_DIE=1 (tests/gpu/run.sh's device_kill_staged): rank 1 dies in its "
      "second call's host part; the survivors' streams end, the error names it") {
    RunOptions o = opts();
    o.env["CHORUS_TEST_DEVICE_DIE"] = "1";
    auto res = run_ranks(
        3,
        [](int r) {
          std::optional<Rank> k = setup(r);
          if (!k) return 1;
          const auto start = std::chrono::steady_clock::now();
          for (int i = 0; i < 2; ++i)
            if (k->all_reduce() != chorusSuccess)
              return fail_with(r, "call " + std::to_string(i), chorusGetLastError(k->comm));
          return k->ends_named(start, 10, {"rank 1"});
        },
        o);
    check_ranks(res, {0, 2});
    CHECK(res[1].exit_code != 0);
  }
  SECTION(
      "rank 1's stream being captured into a CUDA graph, the others' not: the capture's "
      "exchange meets their host collectives as a mismatch; the communicator fails, named on "
      "every rank") {
    auto res = run_ranks(
        3,
        [](int r) {
          std::optional<Rank> k = setup(r);
          if (!k) return 1;
          if (r == 1) chorus::test::fake_capturing(k->stream, true);
          const auto start = std::chrono::steady_clock::now();
          const chorusResult_t rc = k->all_reduce();
          const std::string why = chorusGetLastError(k->comm);
          if (r == 1 &&
              (rc != chorusInvalidUsage || !contains(why, "every rank must capture the call")))
            return fail_with(r, "the call", why);
          // The others' calls return once enqueued, or fail at once where the news came first.
          if (r != 1 && rc != chorusSuccess && !contains(why, "all_gather"))
            return fail_with(r, "the call", why);
          return k->ends_named(start, 30, {"rank 1", "all_gather"});
        },
        opts());
    check_all(res);
  }
  SECTION(
      "rank 2 killed while the survivors' replays of a captured all-reduce and ring exchange are "
      "queued -- their streams end, the error names it") {
    check_ranks(killed_while_queued(opts()), {0, 1});
  }
  SECTION(
      "rank 2 killed during the survivors' replays; rank 0 hears of the death 800 ms after rank "
      "1's abort of the replays' communicator (CHORUS_TEST_DEATH_NEWS_LATE_MS) -- rank 0's error "
      "still names the death, not the abort") {
    RunOptions o = opts();
    o.env["CHORUS_TEST_DEATH_NEWS_LATE_MS"] = "800";
    check_ranks(killed_while_queued(o), {0, 1});
  }
  SECTION(
      "rank 2 killed while a survivor's host part of a replay waits for it, and that host part is "
      "slow to leave (CHORUS_TEST_HOST_PART_LINGER_MS), then writes its page-locked memory -- the "
      "streams go on only once it has left (TSan -- no copy beside its late write)") {
    RunOptions o = opts();
    o.env["CHORUS_TEST_HOST_PART_LINGER_MS"] = "1000";
    auto res = run_ranks(
        3,
        [](int r) {
          std::optional<Rank> k;
          void* graph = replayed_once_then_rank2_dies(k, r);
          if (graph == nullptr) return 1;
          const auto start = std::chrono::steady_clock::now();
          for (int i = 0; i < 4; ++i)
            if (chorus::test::fake_graph_launch(graph, k->stream) != 0)
              return fail_with(r, "a replay", "failed");
          if (int e = chorus::test::fake_stream_sync(k->stream); e != 0)
            return fail_with(r, "the stream", fmt::format("error {}", e));
          // The failure came 0.3 s in; its host part left 1 s after that.
          if (const double s = seconds_since(start); s < 1.0)
            return fail_with(r, "the stream",
                             fmt::format("it went on {:.2f} s after the replays began, before "
                                         "the failed host part had left",
                                         s));
          const int e = k->ends_named(start, 15, {"rank 2"});
          chorus::test::fake_graph_free(graph);
          return e;
        },
        o);
    check_ranks(res, {0, 1});
  }
  SECTION(
      "rank 2 killed right after capturing a ring exchange (its pair communicators perhaps not "
      "made yet) -- the survivors' replays end, named, and destroy does not wait for a making") {
    check_ranks(killed_after_capture(false, 5, false, opts()), {0, 1});
  }
  SECTION(
      "rank 2 killed with the survivors' replays queued, each graph destroyed as soon as its "
      "stream ends, while the replays' thread (CHORUS_TEST_REPLAY_LAG_MS) still holds replays of "
      "it -- nothing it holds is freed under it (ASan)") {
    RunOptions o = opts();
    o.env["CHORUS_TEST_REPLAY_LAG_MS"] = "100";
    check_ranks(killed_after_capture(true, 10, true, o), {0, 1});
  }
  SECTION(
      "ranks 0 and 2 capture a send and a receive of different counts: named on both, and the "
      "communicator fails") {
    auto res = run_ranks(
        3,
        [](int r) {
          std::optional<Rank> k = setup(r);
          if (!k) return 1;
          if (r == 1) return k->ends_named(std::chrono::steady_clock::now(), 30, {"disagree"});
          const auto start = std::chrono::steady_clock::now();
          chorus::test::fake_capture_begin(k->stream);
          const chorusResult_t rc =
              r == 0 ? chorusSend(k->buf, 64, chorusFloat32, 2, k->comm, k->stream)
                     : chorusRecv(k->buf, 32, chorusFloat32, 0, k->comm, k->stream);
          chorus::test::fake_graph_free(chorus::test::fake_capture_end(k->stream));
          const std::string why = chorusGetLastError(k->comm);
          // Each rank's own words, or (where the peer's failure came first) the peer's.
          const bool own =
              contains(why,
                       "rank 0 captures 1 send(s) of 256 bytes to rank 2, which captures 1 "
                       "receive(s) of 128 bytes from it") ||
              contains(why,
                       "rank 2 captures 1 receive(s) of 128 bytes from rank 0, which "
                       "captures 1 send(s) of 256 bytes to it");
          if (rc != chorusInvalidUsage || !own) return fail_with(r, "the capture", why);
          return k->ends_named(start, 30, {"disagree"});
        },
        opts());
    check_all(res);
  }
  SECTION(
      "rank 0 captures a send, rank 2 receives it eagerly: the capture's exchange meets the "
      "receive as a mismatch, named on both, and the communicator fails") {
    auto res = run_ranks(
        3,
        [](int r) {
          std::optional<Rank> k = setup(r);
          if (!k) return 1;
          // Every rank's init done (rank 1 waits for the news only).
          if (!k->in_step()) return fail_with(r, "the eager call", chorusGetLastError(k->comm));
          const auto start = std::chrono::steady_clock::now();
          if (r == 1) return k->ends_named(start, 30, {"send #1 to rank 2", "recv #1 from rank 0"});
          if (r == 0) chorus::test::fake_capture_begin(k->stream);
          const chorusResult_t rc =
              r == 0 ? chorusSend(k->buf, 64, chorusFloat32, 2, k->comm, k->stream)
                     : chorusRecv(k->buf, 64, chorusFloat32, 0, k->comm, k->stream);
          if (r == 0) chorus::test::fake_graph_free(chorus::test::fake_capture_end(k->stream));
          const std::string why = chorusGetLastError(k->comm);
          if (r == 0 && (rc != chorusInvalidUsage ||
                         !contains(why, "both ranks of each pair must capture their sends")))
            return fail_with(r, "the capture", why);
          return k->ends_named(start, 30, {"send #1 to rank 2", "recv #1 from rank 0"});
        },
        opts());
    check_all(res);
  }
  SECTION(
      "every rank captures, rank 2 a call of another count: named on every rank, and the "
      "communicator fails") {
    auto res = run_ranks(
        3,
        [](int r) {
          std::optional<Rank> k = setup(r);
          if (!k) return 1;
          if (!k->in_step()) return fail_with(r, "the eager call", chorusGetLastError(k->comm));
          const auto start = std::chrono::steady_clock::now();
          chorus::test::fake_capture_begin(k->stream);
          const chorusResult_t rc = chorusAllReduce(k->buf, k->buf, r == 2 ? 32 : 64, chorusFloat32,
                                                    chorusSum, k->comm, k->stream);
          chorus::test::fake_graph_free(chorus::test::fake_capture_end(k->stream));
          const std::string why = chorusGetLastError(k->comm);
          if (rc != chorusInvalidUsage ||
              !contains(why, "ranks disagree on a call captured into a CUDA graph") ||
              !contains(why, "count 32"))
            return fail_with(r, "the capture", why);
          return k->ends_named(start, 30, {"ranks disagree"});
        },
        opts());
    check_all(res);
  }
  SECTION(
      "rank 2's capture of a receive fails after the pair agreed (page-locked memory refused) -- "
      "named on every rank, and rank 0, whose pair communicator is still waiting for rank 2's "
      "side, destroys at once") {
    // Rank 2 fails only once rank 0's capture has returned (a pipe): its news could otherwise
    // reach rank 0 before rank 0's side of the pair's exchange had ended, and fail that capture
    // instead (1 run in 20 before).
    int returned[2];
    REQUIRE(pipe(returned) == 0);
    auto res = run_ranks(
        3,
        [&](int r) {
          std::optional<Rank> k = setup(r);
          if (!k) return 1;
          if (!k->in_step()) return fail_with(r, "the eager call", chorusGetLastError(k->comm));
          const auto start = std::chrono::steady_clock::now();
          if (r == 1) return k->ends_named(start, 30, {"page-locked memory"});
          if (r == 2) {
            chorus::test::fake_pinned_alloc_fails(true);
            chorus::test::fake_before_pinned_failure([&] {
              pollfd p{returned[0], POLLIN, 0};
              (void)poll(&p, 1, 10000);
            });
          }
          chorus::test::fake_capture_begin(k->stream);
          const chorusResult_t rc =
              r == 0 ? chorusSend(k->buf, 64, chorusFloat32, 2, k->comm, k->stream)
                     : chorusRecv(k->buf, 64, chorusFloat32, 0, k->comm, k->stream);
          if (r == 0) (void)!write(returned[1], "r", 1);
          chorus::test::fake_graph_free(chorus::test::fake_capture_end(k->stream));
          chorus::test::fake_pinned_alloc_fails(false);
          const std::string why = chorusGetLastError(k->comm);
          if (r == 2 &&
              (rc != chorusSystemError || !contains(why, "allocating page-locked memory failed")))
            return fail_with(r, "the capture", why);
          if (r == 0 && rc != chorusSuccess) return fail_with(r, "the capture", why);
          // Within 10 s: destroy stops the pair communicator's making (30 s timeout).
          return k->ends_named(start, 10, {"rank 2", "page-locked memory"});
        },
        opts());
    close(returned[0]);
    close(returned[1]);
    check_all(res);
    for (int r = 0; r < 3; ++r) CHECK(res[r].seconds < 20);
  }
  SECTION("rank 1's stream never gets to the call: named after the timeout, on every rank") {
    auto res = run_ranks(
        3,
        [](int r) {
          std::optional<Rank> k = setup(r);
          if (!k) return 1;
          if (r == 1) chorus::test::fake_marks_stuck(true);
          // The others call 300 ms later, so that rank 1's own timeout comes first: at the same
          // moment, a peer's report of rank 1 could catch it between its wait and its failure.
          if (r != 1) usleep(300 * 1000);
          const auto start = std::chrono::steady_clock::now();
          if (k->all_reduce() != chorusSuccess)
            return fail_with(r, "the call", chorusGetLastError(k->comm));
          if (async_error(k->comm) == chorusSuccess)
            return fail_with(r, "the communicator", "no error");
          chorus::test::fake_marks_stuck(false);
          // Rank 1's own words ("...: the work enqueued on its stream before the call has not
          // finished after 2 s"), or, where a peer's timeout came first, its report of rank 1
          // ("rank 1: in all_reduce #1 (...) for 2.0 s, waiting for the work enqueued on its
          // stream before the call").
          return k->ends_named(start, 30,
                               {"rank 1", "the work enqueued on its stream before the call"});
        },
        opts("2"));
    check_all(res);
  }
}
