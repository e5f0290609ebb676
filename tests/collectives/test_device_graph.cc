// Device collectives, sends and receives captured into CUDA graphs (collectives/device_graph.h) on
// an emulated GPU whose streams record what they are given while captured and replay it
// (fake_gpu.h): every replay right, with the ranks out of step (a rank's stream held back before
// some replays) and eager calls between replays; a peer killed while replays are queued (the
// survivors' streams end); memory that needs the bounce buffer refused under capture.
#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>
#include <catch2/catch.hpp>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "chorus/chorus.h"
#include "device_test.h"
#include "fake_gpu.h"
#include "harness.h"
#include "kernels/cpu/reduce.h"
#include "kernels/cuda/ipc.h"

using chorus::test::check_all;
using chorus::test::check_ranks;
using chorus::test::contains;
using chorus::test::fail_with;
using chorus::test::run_ranks;
using chorus::test::RunOptions;
namespace kc = chorus::kernels::cuda;
const auto init = chorus::test::device_init;

namespace {

RunOptions opts(bool one_gpu) {
  RunOptions o;
  o.env = {{"CHORUS_TIMEOUT", "30"}};
  if (one_gpu)
    o.env.insert({{"CHORUS_TEST_GPU_UUID", "GPU-fake-0"}, {"CHORUS_ALLOW_SHARED_GPU", "1"}});
  o.limit_seconds = 120;
  return o;
}

float value(int q, size_t j, int k) {
  return float((q * 37 + int(j) * 3 + k * 11) % 64) - 20.0f;
}

// A copy of n floats on the stream (a kernel of the emulation).
int copy_on(void* stream, const float* from, float* to, size_t n) {
  const void* in[] = {from};
  void* out[] = {to};
  return kc::ipc().fold(chorus::kernels::DType::kF32, chorus::kernels::RedOp::kSum, in, 1, out, 1,
                        n, 0, stream);
}

float* dev(size_t n) {
  return static_cast<float*>(chorus::test::fake_device_alloc(n * 4));
}

// Before replay k: its input on the stream (value(r, j, k)); rank 1's stream held back 40 ms
// before every third replay, so that the ranks are out of step.
bool feed(int r, int k, float* in, size_t n, void* stream) {
  std::vector<float> input(n);
  for (size_t j = 0; j < n; ++j) input[j] = value(r, j, k);
  if (kc::ipc().to_device(in, input.data(), n * 4, stream) != 0) return false;  // copied now
  if (r == 1 && k % 3 == 0) chorus::test::fake_stream_delay(stream, 40);
  return true;
}

struct Config {
  int p;
  bool one_gpu;
};

// `body(c, rank)` on each rank, for 3 ranks with a GPU each, and 2 and 3 sharing one.
template <typename Body>
void on_configs(Body body) {
  for (Config c : {Config{3, false}, Config{3, true}, Config{2, true}}) {
    INFO(c.p << " ranks, " << (c.one_gpu ? "one GPU" : "a GPU each"));
    check_all(run_ranks(
        c.p, [&](int r) { return body(c, r); }, opts(c.one_gpu)));
  }
}

}  // namespace

TEST_CASE(
    "device collectives captured into a CUDA graph: every replay right, ranks out of step, "
    "eager calls between",
    "[device][graph]") {
  on_configs([](Config c, int r) {
    chorusComm_t comm = init(r);
    if (!comm) return 1;
    int capturable = -1;
    if (chorusCommCapturable(comm, &capturable) != chorusSuccess || capturable != 1)
      return fail_with(r, "chorusCommCapturable", fmt::format("{}, want 1", capturable));
    if (chorusCommCapturable(comm, nullptr) != chorusInvalidArgument ||
        !contains(chorusGetLastError(comm), "chorusCommCapturable: capturable is NULL"))
      return fail_with(r, "chorusCommCapturable(NULL)", chorusGetLastError(comm));
    const int p = c.p;
    constexpr size_t n = 257;
    constexpr int kReplays = 12;
    void* stream = chorus::test::fake_async_stream();
    float *in = dev(n), *sum = dev(n), *bc = dev(n), *ag = dev(p * n), *rs = dev(n);
    float* eager = dev(n);
    std::vector<float*> sums, bcs, rss, eagers;
    for (int k = 0; k < kReplays; ++k) {
      sums.push_back(dev(n));
      bcs.push_back(dev(n));
      rss.push_back(dev(n));
      eagers.push_back(dev(n));
    }
    // The capture: nothing runs, and the calls' host exchange happens once, here.
    chorus::test::fake_capture_begin(stream);
    chorusResult_t rc = chorusAllReduce(in, sum, n, chorusFloat32, chorusSum, comm, stream);
    if (rc == chorusSuccess) rc = chorusBroadcast(in, bc, n, chorusFloat32, p - 1, comm, stream);
    if (rc == chorusSuccess) rc = chorusAllGather(in, ag, n, chorusFloat32, comm, stream);
    if (rc == chorusSuccess)
      rc = chorusReduceScatter(ag, rs, n, chorusFloat32, chorusSum, comm, stream);
    void* graph = chorus::test::fake_capture_end(stream);
    if (rc != chorusSuccess) return fail_with(r, "the capture", chorusGetLastError(comm));
    if (chorus::test::fake_graph_ops(graph) == 0 || sum[0] != 0.0f)
      return fail_with(r, "the capture", "nothing captured, or it ran");
    // The replays, with no host synchronisation: a new input before each (on the stream),
    // the results copied out after it; rank 1's stream held back before every third
    // replay; an eager all-reduce after every fourth.
    for (int k = 0; k < kReplays; ++k) {
      if (!feed(r, k, in, n, stream)) return fail_with(r, "the input", "failed");
      if (chorus::test::fake_graph_launch(graph, stream) != 0)
        return fail_with(r, "a replay", "failed");
      if (copy_on(stream, sum, sums[k], n) != 0 || copy_on(stream, bc, bcs[k], n) != 0 ||
          copy_on(stream, rs, rss[k], n) != 0)
        return fail_with(r, "copying out", "failed");
      if (k % 4 == 3) {
        if (copy_on(stream, in, eager, n) != 0 ||
            chorusAllReduce(eager, eagers[k], n, chorusFloat32, chorusMax, comm, stream) !=
                chorusSuccess)
          return fail_with(r, "an eager call", chorusGetLastError(comm));
      }
    }
    if (int e = chorus::test::fake_stream_sync(stream); e != 0)
      return fail_with(r, "the stream", kc::ipc().error_string(e));
    for (int k = 0; k < kReplays; ++k)
      for (size_t j = 0; j < n; ++j) {
        float want_sum = 0, want_max = value(0, j, k);
        for (int q = 0; q < p; ++q) want_sum += value(q, j, k);
        for (int q = 1; q < p; ++q) want_max = std::max(want_max, value(q, j, k));
        const float want_rs = float(p) * value(r, j, k);
        if (sums[k][j] != want_sum || bcs[k][j] != value(p - 1, j, k) || rss[k][j] != want_rs ||
            (k % 4 == 3 && eagers[k][j] != want_max))
          return fail_with(r, fmt::format("replay {}", k),
                           fmt::format("element {}: sum {} broadcast {} reduce-scatter {} "
                                       "eager {}, want {} {} {} {}",
                                       j, sums[k][j], bcs[k][j], rss[k][j], eagers[k][j], want_sum,
                                       value(p - 1, j, k), want_rs, want_max));
      }
    chorus::test::fake_graph_free(graph);
    chorusCommDestroy(comm);
    return 0;
  });
}

// A captured barrier's words are reset after each wait (device_graph.h), and a reset must never
// wipe a peer's next signal. With signals and waits alone ("ready"), it could: rank 1's waits are
// held back 20 ms, so rank 0, released by rank 1's signal, replays again and signals into a word
// rank 1 has not reset yet -- the reset then wipes it, and rank 1's next wait never ends. The
// captured barrier therefore also meets on "done", as the other collectives do.
TEST_CASE("a captured barrier replayed back to back, one rank's waits held back",
          "[device][graph]") {
  on_configs([](Config, int r) {
    chorusComm_t comm = init(r);
    if (!comm) return 1;
    void* stream = chorus::test::fake_async_stream();
    chorus::test::fake_capture_begin(stream);
    const chorusResult_t rc = chorusBarrier(comm, stream);
    void* graph = chorus::test::fake_capture_end(stream);
    if (rc != chorusSuccess) return fail_with(r, "the capture", chorusGetLastError(comm));
    if (r == 1) chorus::test::fake_wait_delay(20);
    constexpr int kReplays = 8;
    for (int k = 0; k < kReplays; ++k)
      if (chorus::test::fake_graph_launch(graph, stream) != 0)
        return fail_with(r, "a replay", "failed");
    if (int e = chorus::test::fake_stream_sync(stream); e != 0)
      return fail_with(r, fmt::format("the stream ({} replays)", kReplays),
                       kc::ipc().error_string(e));
    chorus::test::fake_wait_delay(0);
    chorus::test::fake_graph_free(graph);
    chorusCommDestroy(comm);
    return 0;
  });
}

// Rank r's mapping of its peers' buffer x is to be closed (their owners freed it) while a call
// is captured: closing may synchronise, which CUDA forbids while a capture is under way, so the
// closes wait for the next call not captured. An eager all-reduce on x, x freed, then `capture`
// (given x's old address and a buffer y) between fake_capture_begin and _end, then an eager call:
// 0 closes during the capture, 0 before the eager call, the 2 peers' x after it. With
// `destroy_next`, the communicator is destroyed instead of the eager call: the destroy closes
// them (no later call of its would).
int closes_after_capture(int r, bool destroy_next,
                         const std::function<chorusResult_t(float* x, float* y, size_t n,
                                                            chorusComm_t, void*)>& capture) {
  chorusComm_t comm = init(r);
  if (!comm) return 1;
  constexpr size_t n = 64;
  void* stream = chorus::test::fake_async_stream();
  float *x = dev(n), *y = dev(n);
  if (chorusAllReduce(x, x, n, chorusFloat32, chorusSum, comm, stream) != chorusSuccess ||
      chorus::test::fake_stream_sync(stream) != 0)
    return fail_with(r, "the eager call", chorusGetLastError(comm));
  chorus::test::fake_device_free(x);  // the peers map it still
  chorus::test::fake_capture_begin(stream);
  const chorusResult_t rc = capture(x, y, n, comm, stream);
  void* graph = chorus::test::fake_capture_end(stream);
  if (rc != chorusSuccess) return fail_with(r, "the capture", chorusGetLastError(comm));
  const int in_capture = chorus::test::fake_closes_in_capture();
  const int held = chorus::test::fake_ipc_closes();
  if (chorus::test::fake_stream_sync(stream) != 0) return fail_with(r, "the stream", "failed");
  chorus::test::fake_graph_free(graph);
  const char* next = destroy_next ? "the destroy" : "the eager call";
  if (destroy_next) {
    // A host call first: no rank ends (its buffers gone) before every rank has mapped them.
    int one = 1;
    if (chorusAllReduce(&one, &one, 1, chorusInt32, chorusSum, comm, nullptr) != chorusSuccess)
      return fail_with(r, "the host call", chorusGetLastError(comm));
    if (chorusCommDestroy(comm) != chorusSuccess) return fail_with(r, next, "failed");
  } else if (chorusAllReduce(y, y, n, chorusFloat32, chorusSum, comm, stream) != chorusSuccess ||
             chorus::test::fake_stream_sync(stream) != 0) {
    return fail_with(r, next, chorusGetLastError(comm));
  }
  const int closes = chorus::test::fake_ipc_closes();
  if (in_capture != 0 || held != 0 || closes != 2)
    return fail_with(r, "the closes",
                     fmt::format("{} during the capture, {} before {}, {} after it; want 0, 0, 2",
                                 in_capture, held, next, closes));
  if (!destroy_next) chorusCommDestroy(comm);
  return 0;
}

// The peer's news that it freed x (device_freed.h) comes with the captured calls.
TEST_CASE("freed memory's news in a captured call: closed at the next call or the destroy",
          "[device][graph]") {
  for (bool destroy_next : {false, true})
    check_all(run_ranks(
        3,
        [destroy_next](int r) {
          return closes_after_capture(
              r, destroy_next, [](float*, float* y, size_t n, chorusComm_t comm, void* stream) {
                chorusResult_t rc = chorusSuccess;
                for (int k = 0; k < 3 && rc == chorusSuccess; ++k)
                  rc = chorusAllReduce(y, y, n, chorusFloat32, chorusSum, comm, stream);
                return rc;
              });
        },
        opts(false)));
}

// The captured call's buffer lies where x lay (cudaMalloc often places it so): the peers find x
// overlapped (device_freed.h's close_overlapped).
TEST_CASE(
    "a captured call's buffer where a freed one lay: the old closed at the next call or "
    "the destroy",
    "[device][graph]") {
  for (bool destroy_next : {false, true})
    check_all(run_ranks(
        3,
        [destroy_next](int r) {
          return closes_after_capture(
              r, destroy_next, [r](float* x, float*, size_t n, chorusComm_t comm, void* stream) {
                auto* again = static_cast<float*>(chorus::test::fake_device_alloc_at(x, n * 4));
                if (again != x) {
                  fail_with(r, "the allocation", "not where the freed one lay");
                  return chorusInternalError;
                }
                return chorusAllReduce(again, again, n, chorusFloat32, chorusSum, comm, stream);
              });
        },
        opts(false)));
}

// Sends and receives captured (device_graph.h: a pair's slots): a group that sends to the right
// and receives from the left (on 2 ranks, both ways between the pair), then a lone send from rank
// 0 to rank 1 that rank 2 takes no part in; replayed out of step, eager sends between replays.
TEST_CASE(
    "device sends and receives captured into a CUDA graph: every replay right, ranks out of "
    "step, eager sends between",
    "[device][graph]") {
  on_configs([](Config c, int r) {
    chorusComm_t comm = init(r);
    if (!comm) return 1;
    const int p = c.p, right = (r + 1) % p, left = (r + p - 1) % p;
    constexpr size_t n = 263;
    constexpr int kReplays = 12;
    void* stream = chorus::test::fake_async_stream();
    float *in = dev(n), *got = dev(n), *lone = dev(n);
    std::vector<float*> gots, lones, eagers;
    for (int k = 0; k < kReplays; ++k) {
      gots.push_back(dev(n));
      lones.push_back(dev(n));
      eagers.push_back(dev(n));
    }
    chorus::test::fake_capture_begin(stream);
    chorusGroupStart();
    chorusSend(in, n, chorusFloat32, right, comm, stream);
    chorusRecv(got, n, chorusFloat32, left, comm, stream);
    chorusResult_t rc = chorusGroupEnd();
    if (rc == chorusSuccess && r == 0) rc = chorusSend(in, n, chorusFloat32, 1, comm, stream);
    if (rc == chorusSuccess && r == 1) rc = chorusRecv(lone, n, chorusFloat32, 0, comm, stream);
    void* graph = chorus::test::fake_capture_end(stream);
    if (rc != chorusSuccess) return fail_with(r, "the capture", chorusGetLastError(comm));
    if (chorus::test::fake_graph_ops(graph) == 0)
      return fail_with(r, "the capture", "nothing captured");
    for (int k = 0; k < kReplays; ++k) {
      if (!feed(r, k, in, n, stream)) return fail_with(r, "the input", "failed");
      if (r == 0 && k % 5 == 1) chorus::test::fake_stream_delay(stream, 30);
      if (chorus::test::fake_graph_launch(graph, stream) != 0)
        return fail_with(r, "a replay", "failed");
      if (copy_on(stream, got, gots[k], n) != 0 ||
          (r == 1 && copy_on(stream, lone, lones[k], n) != 0))
        return fail_with(r, "copying out", "failed");
      if (k % 4 == 3) {  // an eager exchange the other way round, between replays
        chorusGroupStart();
        chorusSend(in, n, chorusFloat32, left, comm, stream);
        chorusRecv(eagers[k], n, chorusFloat32, right, comm, stream);
        if (chorusGroupEnd() != chorusSuccess)
          return fail_with(r, "an eager exchange", chorusGetLastError(comm));
      }
    }
    if (int e = chorus::test::fake_stream_sync(stream); e != 0)
      return fail_with(r, "the stream", kc::ipc().error_string(e));
    for (int k = 0; k < kReplays; ++k)
      for (size_t j = 0; j < n; ++j) {
        const bool bad_lone = r == 1 && lones[k][j] != value(0, j, k);
        const bool bad_eager = k % 4 == 3 && eagers[k][j] != value(right, j, k);
        if (gots[k][j] != value(left, j, k) || bad_lone || bad_eager)
          return fail_with(r, fmt::format("replay {}", k),
                           fmt::format("element {}: from the left {} (want {}), lone {} "
                                       "(want {}), eager {} (want {})",
                                       j, gots[k][j], value(left, j, k), lones[k][j],
                                       value(0, j, k), eagers[k][j], value(right, j, k)));
      }
    chorus::test::fake_graph_free(graph);
    chorusCommDestroy(comm);
    return 0;
  });
}

// A captured call's slot (device_graph.h "GraphSlots") comes back when CUDA destroys its graph
// (the emulation: fake_graph_free): more captures than slots over a communicator's life; and
// while graphs hold every slot, a capture is refused naming why, also when each rank has slots
// free but no slot is free on both.
TEST_CASE("slots of captured calls come back when their graph is destroyed", "[device][graph]") {
  auto res = run_ranks(
      2,
      [](int r) {
        chorusComm_t comm = init(r);
        if (!comm) return 1;
        constexpr size_t n = 33;
        void* stream = chorus::test::fake_async_stream();
        float *in = dev(n), *sum = dev(n), *got = dev(n);
        // One graph: an all-reduce, and an exchange both ways. Its replay's results checked.
        auto capture = [&](bool with_pair) -> void* {
          chorus::test::fake_capture_begin(stream);
          chorusResult_t rc = chorusAllReduce(in, sum, n, chorusFloat32, chorusSum, comm, stream);
          if (rc == chorusSuccess && with_pair) {
            chorusGroupStart();
            chorusSend(in, n, chorusFloat32, 1 - r, comm, stream);
            chorusRecv(got, n, chorusFloat32, 1 - r, comm, stream);
            rc = chorusGroupEnd();
          }
          void* graph = chorus::test::fake_capture_end(stream);
          if (rc == chorusSuccess) return graph;
          chorus::test::fake_graph_free(graph);
          return nullptr;
        };
        auto replay_right = [&](void* graph, int k, bool with_pair) {
          for (size_t j = 0; j < n; ++j) in[j] = value(r, j, k);
          if (chorus::test::fake_graph_launch(graph, stream) != 0 ||
              chorus::test::fake_stream_sync(stream) != 0)
            return false;
          for (size_t j = 0; j < n; ++j)
            if (sum[j] != value(0, j, k) + value(1, j, k) ||
                (with_pair && got[j] != value(1 - r, j, k)))
              return false;
          return true;
        };
        for (int k = 0; k < 70; ++k) {  // each graph destroyed after its replay
          void* graph = capture(true);
          if (graph == nullptr)
            return fail_with(r, fmt::format("capture {}", k), chorusGetLastError(comm));
          if (!replay_right(graph, k, true))
            return fail_with(r, fmt::format("capture {}", k), "a wrong replay");
          chorus::test::fake_graph_free(graph);
        }
        std::vector<void*> held;  // 64 graphs that live: every collective slot taken
        for (int k = 0; k < 64; ++k) {
          held.push_back(capture(false));
          if (held.back() == nullptr)
            return fail_with(r, fmt::format("held capture {}", k), chorusGetLastError(comm));
        }
        if (capture(false) != nullptr ||
            !contains(chorusGetLastError(comm),
                      "64 captured device collectives of this communicator are held by CUDA "
                      "graphs that live still"))
          return fail_with(r, "the 65th held capture", chorusGetLastError(comm));
        // Each rank destroys another graph: each has a slot free, but none is free on both.
        chorus::test::fake_graph_free(held[r == 0 ? 5 : 7]);
        if (capture(false) != nullptr ||
            !contains(chorusGetLastError(comm),
                      "no slot for a captured device collective is free on every rank at once"))
          return fail_with(r, "a capture with no common slot", chorusGetLastError(comm));
        chorus::test::fake_graph_free(held[r == 0 ? 7 : 5]);
        held[5] = held[7] = nullptr;
        void* again = capture(false);  // slot 5 now
        if (again == nullptr)
          return fail_with(r, "a capture in a freed slot", chorusGetLastError(comm));
        if (!replay_right(again, 100, false) || !replay_right(held[6], 101, false) ||
            !replay_right(again, 102, false))
          return fail_with(r, "replays of a reused slot beside the held ones", "wrong");
        // Every slot taken again; then a graph destroyed whose destructor CUDA runs a moment later:
        // the capture right after it waits for the slot instead of being refused.
        held[7] = capture(false);
        if (held[7] == nullptr)
          return fail_with(r, "a capture in slot 7", chorusGetLastError(comm));
        chorus::test::fake_graph_free_later(again, 50);
        again = capture(false);
        if (again == nullptr)
          return fail_with(r, "a capture 50 ms before a destroyed graph's destructor ran",
                           chorusGetLastError(comm));
        if (!replay_right(again, 103, false))
          return fail_with(r, "a replay in the slot given back late", "wrong");
        chorus::test::fake_graph_free(again);
        for (size_t i = 0; i < held.size(); ++i)
          if (held[i] && i != 6) chorus::test::fake_graph_free(held[i]);
        // One graph outlives the communicator: destroy warns that its replays would wait.
        chorusCommDestroy(comm);
        chorus::test::fake_graph_free(held[6]);
        return 0;
      },
      opts(false));
  check_all(res);
  for (int r = 0; r < 2; ++r)
    CHECK(contains(res[r].output,
                   fmt::format("chorusCommDestroy on rank {}: 1 captured call(s) of this "
                               "communicator are still held by CUDA graphs not destroyed",
                               r)));
}

TEST_CASE(
    "captured device calls: a peer killed while replays are queued; bounce-buffer memory "
    "refused",
    "[device][graph]") {
  SECTION("rank 2 killed: the survivors' queued replays end, the error names it") {
    auto res = run_ranks(
        3,
        [](int r) {
          chorusComm_t comm = init(r);
          if (!comm) return 1;
          void* stream = chorus::test::fake_async_stream();
          float *buf = dev(64), *got = dev(64);
          // An all-reduce and a ring exchange (the pairs' words: rank 0 waits for rank 2's
          // send, rank 1 for its copy).
          chorus::test::fake_capture_begin(stream);
          chorusResult_t rc = chorusAllReduce(buf, buf, 64, chorusFloat32, chorusSum, comm, stream);
          if (rc == chorusSuccess) {
            chorusGroupStart();
            chorusSend(buf, 64, chorusFloat32, (r + 1) % 3, comm, stream);
            chorusRecv(got, 64, chorusFloat32, (r + 2) % 3, comm, stream);
            rc = chorusGroupEnd();
          }
          void* graph = chorus::test::fake_capture_end(stream);
          if (rc != chorusSuccess) return fail_with(r, "the capture", chorusGetLastError(comm));
          if (chorus::test::fake_graph_launch(graph, stream) != 0 ||
              chorus::test::fake_stream_sync(stream) != 0)
            return fail_with(r, "the first replay", "failed");
          if (r == 2) {
            usleep(200 * 1000);  // the survivors' replays are queued by then
            raise(SIGKILL);
          }
          const auto start = std::chrono::steady_clock::now();
          for (int k = 0; k < 10; ++k)
            if (chorus::test::fake_graph_launch(graph, stream) != 0)
              return fail_with(r, "a replay", "failed");
          const int e = chorus::test::fake_stream_sync(stream);
          const double took =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
          if (e != 0 || took > 10)
            return fail_with(r, "the stream", fmt::format("error {} after {:.1f} s", e, took));
          chorusResult_t async = chorusSuccess;
          chorusCommGetAsyncError(comm, &async);
          const chorusResult_t next =
              chorusAllReduce(buf, buf, 64, chorusFloat32, chorusSum, comm, stream);
          const std::string why = chorusGetLastError(comm);
          chorus::test::fake_graph_free(graph);
          if (async == chorusSuccess || next == chorusSuccess || !contains(why, "rank 2"))
            return fail_with(r, "the next call", why);
          chorusCommDestroy(comm);
          return 0;
        },
        opts(false));
    check_ranks(res, {0, 1});
  }
  SECTION(
      "rank 1's memory needs the bounce buffer: refused on every rank, the communicator goes "
      "on") {
    auto res = run_ranks(
        3,
        [](int r) {
          chorusComm_t comm = init(r);
          if (!comm) return 1;
          void* stream = chorus::test::fake_async_stream();
          auto* buf = static_cast<float*>(r == 1 ? chorus::test::fake_unmapped_alloc(64 * 4)
                                                 : chorus::test::fake_device_alloc(64 * 4));
          chorus::test::fake_capture_begin(stream);
          const chorusResult_t rc =
              chorusAllReduce(buf, buf, 64, chorusFloat32, chorusSum, comm, stream);
          chorus::test::fake_graph_free(chorus::test::fake_capture_end(stream));
          const std::string why = chorusGetLastError(comm);
          if (rc == chorusSuccess || !contains(why, "needs memory that CUDA IPC maps") ||
              (r != 1 && !contains(why, "rank 1:")))
            return fail_with(r, "the captured call", why);
          for (int j = 0; j < 64; ++j) buf[j] = 1.0f;
          if (chorusAllReduce(buf, buf, 64, chorusFloat32, chorusSum, comm, stream) !=
                  chorusSuccess ||
              chorus::test::fake_stream_sync(stream) != 0 || buf[63] != 3.0f)
            return fail_with(r, "the eager call after", chorusGetLastError(comm));
          chorusCommDestroy(comm);
          return 0;
        },
        opts(false));
    check_all(res);
  }
}
