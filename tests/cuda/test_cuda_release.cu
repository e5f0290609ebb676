// [cuda] flags_release (kernels/cuda/ipc.h) while the rank's own thread is blocked in the driver
// behind the very wait it ends. A survivor of a kill -9 is often there: its loss's cudaMemcpy
// waits on the legacy default stream, which waits for the all-reduce's stream, which waits on a
// flag word the dead rank never wrote; the watch thread names the death and releases the flags.
// On an H100 (2026-11-27, test_elastic_device) the release created its stream at that moment,
// and stream creation waited for a driver lock the blocked cudaMemcpy held: both hung for good.
// Here one thread blocks in cudaMemcpy behind a stream wait, and another asks whether an event
// recorded before the wait is reached (as the staged path's progress thread does) and releases
// the flag: all must return within 10 s. Then the calls chorus makes on its own threads while
// the caller may capture a stream in global mode (PyTorch's default): an event query and a free
// of page-locked memory on another thread must neither fail nor invalidate that capture
// (kernels/cuda/capture_mode.h). Last, the CUDA IPC path's host words: a wait through one mapping
// of a memfd ended by a stream write through another, and by a host store with a blocked
// cudaMemcpy behind it (collectives/device_words.h). tests/gpu/run.sh also runs it with
// CUDA_DEVICE_MAX_CONNECTIONS=1 (one hardware queue for every stream). Skips (exit 77) with the
// reason where no device is visible.
#include <cuda_runtime.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <future>
#include <thread>
#include <utility>

#include "check_cuda.h"
#include "kernels/cuda/ipc.h"
#include "kernels/cuda/memory.h"

namespace kc = chorus::kernels::cuda;

namespace {

// A hang cannot be unwound: say so and leave (the blocked threads with the process).
[[noreturn]] void hung(const char* what) {
  std::printf("FAIL: %s\n", what);
  std::fflush(stdout);
  _exit(1);
}

template <class Pred>
bool within(std::chrono::seconds limit, Pred done) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

// A blocking cudaMemcpy on a thread of its own, on the legacy default stream, which waits for
// stream s, which waits until `flag` >= v: start() enqueues the wait and starts the copy, and
// checks that the copy is held there (0; 1, said); finish() waits up to 10 s for it once the wait
// was released (`hang`: what it says if not), and joins it.
struct BlockedCopy {
  std::atomic<bool> copied{false};
  std::atomic<int> copy_rc{0};
  std::thread thread;

  int start(cudaStream_t s, const uint32_t* flag, uint32_t v, int* word, const char* what) {
    if (int rc = kc::stream_wait_u32_geq(s, flag, v); rc) {
      std::printf("FAIL: stream_wait_u32_geq on %s: %s\n", what, kc::ipc_error_string(rc).c_str());
      return 1;
    }
    cudaEvent_t after_wait = nullptr;
    CHECK_CUDA(cudaEventCreateWithFlags(&after_wait, cudaEventDisableTiming));
    CHECK_CUDA(cudaEventRecord(after_wait, s));
    CHECK_CUDA(cudaStreamWaitEvent(nullptr, after_wait, 0));
    thread = std::thread([this, word] {
      int host = -1;
      copy_rc = int(cudaMemcpy(&host, word, sizeof host, cudaMemcpyDeviceToHost));
      copied = true;
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    if (copied) {
      std::printf("FAIL: the copy did not wait for %s (the stream wait held nothing)\n", what);
      thread.join();
      return 1;
    }
    return 0;
  }
  int finish(const char* hang) {
    if (!within(std::chrono::seconds(10), [&] { return copied.load(); })) hung(hang);
    thread.join();
    CHECK_CUDA(cudaError_t(copy_rc.load()));
    return 0;
  }
};

// A global-mode capture on this thread while another thread queries an event (recorded before
// the capture) and frees page-locked memory, as chorus's threads do: both calls succeed and the
// capture ends with a graph. 0, or 1 with the failure said.
int capture_beside() {
  cudaStream_t c = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&c, cudaStreamNonBlocking));
  cudaEvent_t e = nullptr;
  CHECK_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  CHECK_CUDA(cudaEventRecord(e, c));
  CHECK_CUDA(cudaStreamSynchronize(c));
  void* pinned = nullptr;
  if (int rc = kc::pinned_alloc(4096, &pinned); rc) {
    std::printf("FAIL: pinned_alloc: %s\n", kc::ipc_error_string(rc).c_str());
    return 1;
  }
  int* word = nullptr;
  CHECK_CUDA(cudaMalloc(&word, sizeof(int)));
  CHECK_CUDA(cudaStreamBeginCapture(c, cudaStreamCaptureModeGlobal));
  CHECK_CUDA(cudaMemsetAsync(word, 0, sizeof(int), c));
  auto other = std::async(std::launch::async, [&] {
    const int rc = kc::event_query_on(0, e);
    kc::pinned_free(pinned);
    return std::make_pair(rc, int(cudaGetLastError()));
  });
  const auto [query_rc, left] = other.get();
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(c, &graph);
  if (query_rc != 0 || left != 0 || end != cudaSuccess || graph == nullptr) {
    std::printf(
        "FAIL: beside a global-mode capture, another thread's event query gave %d (%s), a free "
        "of page-locked memory left error %d; the capture ended with %s\n",
        query_rc, kc::ipc_error_string(query_rc).c_str(), left, cudaGetErrorString(end));
    return 1;
  }
  CHECK_CUDA(cudaGraphDestroy(graph));
  std::printf(
      "ok: an event query and a page-locked free on another thread beside a global-mode "
      "capture: both succeeded, the capture ended with its graph\n");
  return 0;
}

// The CUDA IPC path's host words (collectives/device_words.h): a memfd mapped twice -- the
// owner's mapping and a peer's, as two processes map it -- each registered (host_register). A
// stream write into one mapping ends a stream's wait on the other; then a wait with a blocking
// cudaMemcpy behind it, ended by a host store into the other mapping: no stream write at all,
// so no hardware queue (CUDA_DEVICE_MAX_CONNECTIONS=1 in run.sh's second run) can hold it back.
int host_words_release() {
  const size_t bytes = 2 << 20;
  const int fd = memfd_create("chorus-test-words", MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, bytes) != 0) {
    std::printf("FAIL: memfd: %s\n", std::strerror(errno));
    return 1;
  }
  void* maps[2];
  for (void*& m : maps) {
    m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (m == MAP_FAILED) {
      std::printf("FAIL: mmap: %s\n", std::strerror(errno));
      return 1;
    }
    // A piece, as the arena gives one: not the mapping's first page.
    if (int rc = kc::host_register(static_cast<char*>(m) + 36864, 36864); rc) {
      std::printf("FAIL: host_register: %s\n", kc::ipc_error_string(rc).c_str());
      return 1;
    }
  }
  auto* mine = reinterpret_cast<uint32_t*>(static_cast<char*>(maps[0]) + 36864);
  auto* peers = reinterpret_cast<uint32_t*>(static_cast<char*>(maps[1]) + 36864);
  cudaStream_t s = nullptr, t = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CHECK_CUDA(cudaStreamCreateWithFlags(&t, cudaStreamNonBlocking));
  // 1. A peer's signal: stream t writes 1 through its mapping; s waits for it through the other.
  if (int rc = kc::stream_wait_u32_geq(s, mine + 5, 1); rc) {
    std::printf("FAIL: stream_wait_u32_geq on host words: %s\n", kc::ipc_error_string(rc).c_str());
    return 1;
  }
  if (int rc = kc::stream_write_u32(t, peers + 5, 1); rc) {
    std::printf("FAIL: stream_write_u32 on host words: %s\n", kc::ipc_error_string(rc).c_str());
    return 1;
  }
  auto synced = std::async(std::launch::async, [&] { return int(cudaStreamSynchronize(s)); });
  if (synced.wait_for(std::chrono::seconds(10)) != std::future_status::ready)
    hung("a stream write into host words did not end a wait on another mapping of them");
  CHECK_CUDA(cudaError_t(synced.get()));
  if (__atomic_load_n(mine + 5, __ATOMIC_ACQUIRE) != 1) {
    std::printf("FAIL: the host does not see the stream's write into host words\n");
    return 1;
  }
  // 2. The release: a wait with a blocking copy behind it, ended by a host store.
  int* word = nullptr;
  CHECK_CUDA(cudaMalloc(&word, sizeof(int)));
  CHECK_CUDA(cudaDeviceSynchronize());
  BlockedCopy blocked;
  if (int rc = blocked.start(s, mine + 6, 1u << 30, word, "the host word"); rc) return rc;
  __atomic_store_n(peers + 6, 1u << 30, __ATOMIC_RELEASE);  // the release: a host store
  if (int rc = blocked.finish(
          "a host store into host words did not end the wait a blocked cudaMemcpy sat behind");
      rc)
    return rc;
  std::printf(
      "ok: host words in a memfd mapped twice: a stream write through one mapping ended a wait "
      "on the other, and a host store ended a wait a blocked cudaMemcpy sat behind\n");
  return 0;
}

}  // namespace

int main() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::printf("skip: no CUDA device visible\n");
    return 77;
  }
  CHECK_CUDA(cudaSetDevice(0));
  constexpr size_t kWords = 16;
  void* flags = nullptr;
  if (int rc = kc::flags_alloc(kWords * sizeof(uint32_t), &flags); rc) {
    std::printf("FAIL: flags_alloc: %s\n", kc::ipc_error_string(rc).c_str());
    return 1;
  }
  int* word = nullptr;
  CHECK_CUDA(cudaMalloc(&word, sizeof(int)));
  CHECK_CUDA(cudaMemset(word, 0, sizeof(int)));
  CHECK_CUDA(cudaDeviceSynchronize());

  // The rank's side: its stream waits for flag word 3 to reach 1; the legacy default stream
  // waits for that stream; a blocking copy on it to the host.
  cudaStream_t s = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t before_wait = nullptr;  // recorded before the wait: reached at once
  CHECK_CUDA(cudaEventCreateWithFlags(&before_wait, cudaEventDisableTiming));
  CHECK_CUDA(cudaEventRecord(before_wait, s));
  CHECK_CUDA(cudaStreamSynchronize(s));  // (the wait comes after: nothing holds it yet)
  BlockedCopy blocked;
  if (int rc = blocked.start(s, static_cast<uint32_t*>(flags) + 3, 1, word, "the flag"); rc)
    return rc;

  // The watch thread's side (the progress thread's query first): release every word (word 3 to
  // 1 among them).
  auto released = std::async(std::launch::async, [&] {
    if (int rc = kc::event_query_on(0, before_wait); rc) return rc;
    uint32_t values[kWords];
    for (uint32_t& v : values) v = 1;
    return kc::flags_release(0, flags, values, kWords);
  });
  if (released.wait_for(std::chrono::seconds(10)) != std::future_status::ready)
    hung(
        "flags_release did not return within 10 s while another thread waited in cudaMemcpy "
        "behind the wait it ends");
  if (int rc = released.get(); rc) {
    std::printf("FAIL: flags_release: %s\n", kc::ipc_error_string(rc).c_str());
    hung("the blocked copy cannot end");
  }
  if (int rc = blocked.finish("the blocked cudaMemcpy did not return within 10 s of the release");
      rc)
    return rc;

  // A device where no flags_alloc ran has no release stream: refused, not made there.
  uint32_t one = 1;
  if (int rc = kc::flags_release(n, flags, &one, 1); rc != kc::kReleaseUnprepared) {
    std::printf("FAIL: flags_release on device %d (no flags_alloc): rc %d, expected %d\n", n, rc,
                kc::kReleaseUnprepared);
    return 1;
  }
  std::printf("ok: flags_release ended a wait that a blocked cudaMemcpy sat behind\n");
  if (int rc = capture_beside(); rc) return rc;
  return host_words_release();
}
