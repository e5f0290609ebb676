// shm-pipe: how fast bytes cross between two processes through shared memory on this machine,
// the ceiling of any all-reduce of ordinary (malloc) buffers over shm (issue 14). Two
// processes on different cores, a ring of 4 slots of 128 KiB (chorus's shm defaults), each slot
// filled with memcpy from a private buffer and emptied with memcpy into another, as the slot
// rings do, one way (A -> B, the other direction idle). A two-rank all-reduce of ordinary
// buffers moves N bytes each way through such rings (busbw = N / time), so its busbw can be no
// more than this figure. Against memcpy of the same pieces inside one process. GB/s, medians of
// 5 runs.
//   shm-pipe [BYTES...]   (default 1 MiB, 16 MiB, 128 MiB)
#include <sched.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

constexpr size_t kSlot = 128 << 10;
constexpr int kSlots = 4;
constexpr int kRuns = 5;

double seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct alignas(64) Counter {
  std::atomic<uint64_t> v{0};
  char pad[64 - sizeof(std::atomic<uint64_t>)];
};

// One direction: head counts slots filled, tail slots emptied; data follows the control page.
struct Ring {
  Counter head, tail;
  char* data = nullptr;
};

struct Shared {
  Counter go;  // runs started by the parent; the child follows
  Counter done;
  Ring ring;  // parent -> child
};

// Moves `total` bytes through `ring`: out of src (the sender) or into dst (the receiver).
void pump(Ring& ring, bool sender, const char* src, char* dst, size_t total) {
  const uint64_t n = (total + kSlot - 1) / kSlot;
  uint64_t k = sender ? ring.head.v.load() : ring.tail.v.load();
  size_t off = 0;
  for (const uint64_t end = k + n; k < end; off += kSlot) {
    const size_t len = std::min(kSlot, total - off);
    char* slot = ring.data + (k % kSlots) * kSlot;
    if (sender) {
      while (k - ring.tail.v.load(std::memory_order_acquire) >= kSlots) {
      }
      std::memcpy(slot, src + off, len);
      ring.head.v.store(++k, std::memory_order_release);
    } else {
      while (ring.head.v.load(std::memory_order_acquire) <= k) {
      }
      std::memcpy(dst + off, slot, len);
      ring.tail.v.store(++k, std::memory_order_release);
    }
  }
}

void pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu % std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)), &set);
  sched_setaffinity(0, sizeof set, &set);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<size_t> sizes;
  for (int i = 1; i < argc; ++i) sizes.push_back(std::strtoull(argv[i], nullptr, 10));
  if (sizes.empty()) sizes = {1 << 20, 16 << 20, 128 << 20};
  const size_t max = *std::max_element(sizes.begin(), sizes.end());
  const size_t ring_bytes = kSlot * kSlots;
  char* mem = static_cast<char*>(
      mmap(nullptr, ring_bytes + 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  if (mem == MAP_FAILED) return std::perror("mmap"), 1;
  Shared* sh = new (mem) Shared();
  sh->ring.data = mem + 4096;
  std::memset(sh->ring.data, 1, ring_bytes);
  std::vector<char> src(max, 2), dst(max, 3);
  // kRuns runs per size; the child receives what the parent sends.
  pid_t child = fork();
  if (child == 0) {
    pin(1);
    uint64_t seen = 0;
    for (size_t n : sizes)
      for (int r = 0; r < kRuns; ++r) {
        while (sh->go.v.load(std::memory_order_acquire) == seen) {
        }
        ++seen;
        pump(sh->ring, false, nullptr, dst.data(), n);
        sh->done.v.store(seen, std::memory_order_release);
      }
    _exit(0);
  }
  pin(0);
  std::printf("%12s %12s %12s\n", "bytes", "shm GB/s", "memcpy GB/s");
  uint64_t runs = 0;
  for (size_t n : sizes) {
    std::vector<double> pipe, copy;
    for (int r = 0; r < kRuns; ++r) {
      double t0 = seconds();
      sh->go.v.store(++runs, std::memory_order_release);
      pump(sh->ring, true, src.data(), nullptr, n);
      while (sh->done.v.load(std::memory_order_acquire) != runs) {
      }
      pipe.push_back(seconds() - t0);
    }
    for (int r = 0; r < kRuns; ++r) {
      double t0 = seconds();
      for (size_t off = 0; off < n; off += kSlot)
        std::memcpy(dst.data() + off, src.data() + off, std::min(kSlot, n - off));
      copy.push_back(seconds() - t0);
    }
    std::printf("%12zu %12.2f %12.2f\n", n, n / median(pipe) / 1e9, n / median(copy) / 1e9);
  }
  waitpid(child, nullptr, 0);
  return 0;
}
