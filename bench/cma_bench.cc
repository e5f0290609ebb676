// cma-bench: is a one-copy path over cross-memory attach worth building (issue 14 item 7)?
// Times process_vm_readv from a sibling process's buffer against memcpy of the same bytes, in
// the chunk sizes a one-copy all-reduce would use, and prints GB/s per (size, chunk), medians
// of 5 runs. Exits 77 where the kernel refuses cross-memory attach (ptrace rules).
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <vector>

namespace {

double seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Reads n bytes of `remote` in `chunk` pieces into a chunk-sized buffer (as a reduction
// would, keeping it in cache), iters times; GB/s or -1 on error.
double cma(pid_t pid, const char* remote, size_t n, size_t chunk, std::vector<char>& tmp,
           int iters) {
  double t0 = seconds();
  for (int i = 0; i < iters; ++i)
    for (size_t off = 0; off < n; off += chunk) {
      size_t k = std::min(chunk, n - off);
      iovec l{tmp.data(), k}, r{const_cast<char*>(remote) + off, k};
      if (process_vm_readv(pid, &l, 1, &r, 1, 0) != static_cast<ssize_t>(k)) return -1;
    }
  return n * double(iters) / (seconds() - t0) / 1e9;
}

double copy(const char* src, size_t n, size_t chunk, std::vector<char>& tmp, int iters) {
  double t0 = seconds();
  for (int i = 0; i < iters; ++i)
    for (size_t off = 0; off < n; off += chunk) {
      size_t k = std::min(chunk, n - off);
      std::memcpy(tmp.data(), src + off, k);
      asm volatile("" ::"r"(tmp.data()) : "memory");
    }
  return n * double(iters) / (seconds() - t0) / 1e9;
}

}  // namespace

int main() {
  const size_t max = size_t{128} << 20;
  std::vector<char> src(max, 1);
  pid_t child = fork();
  if (child == 0) {  // the peer: holds its copy of src (copy-on-write, never written) and waits
    pause();
    _exit(0);
  }
  std::printf("%10s %10s %12s %12s %8s\n", "bytes", "chunk", "cma GB/s", "memcpy GB/s", "ratio");
  int rc = 0;
  for (size_t n : {size_t{1} << 20, size_t{16} << 20, size_t{128} << 20})
    for (size_t chunk : {size_t{64} << 10, size_t{1} << 20}) {
      std::vector<char> tmp(chunk);
      const int iters = static_cast<int>(std::max<size_t>(2, (size_t{512} << 20) / n));
      std::vector<double> a, b;
      for (int run = 0; run < 5; ++run) {
        a.push_back(cma(child, src.data(), n, chunk, tmp, iters));
        b.push_back(copy(src.data(), n, chunk, tmp, iters));
      }
      if (a[0] < 0) {
        std::printf("skipped: process_vm_readv refused (%s): no cross-memory attach here\n",
                    std::strerror(errno));
        rc = 77;
        break;
      }
      std::sort(a.begin(), a.end());
      std::sort(b.begin(), b.end());
      std::printf("%10zu %10zu %12.2f %12.2f %8.2f\n", n, chunk, a[2], b[2], a[2] / b[2]);
    }
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  return rc;
}
