// A send/recv above 2^31 bytes on each link: sizes must never pass through an int.
#include <catch2/catch.hpp>

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "chorus/chorus.hpp"
#include "harness.h"

namespace {

// A buffer of n bytes in huge pages where the kernel gives them (THP "madvise" or "always"),
// never filled: the kernel's first touch of 2 GiB in 4 KiB pages was most of this test's time
// (on this project's 2-core virtual machines, 1 GiB took 2.9-3.6 s in 4 KiB faults when quiet and
// 7.5 s beside other tests; 1.7-2.5 s in 2 MiB ones).
// It ends where an inaccessible page begins, so a write or read past its last byte faults in
// every build (the sanitizers do not watch mmap'd memory).
struct Buffer {
  size_t n;
  size_t mapped = 0;
  void* base = nullptr;
  unsigned char* p = nullptr;
  explicit Buffer(size_t bytes) : n(bytes) {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    const size_t span = (n + page - 1) / page * page;
    void* m =
        mmap(nullptr, span + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return;
    base = m;
    mapped = span + page;
    madvise(m, span, MADV_HUGEPAGE);  // advice only: without it the test is slower, not wrong
    if (mprotect(static_cast<char*>(m) + span, page, PROT_NONE) != 0) return;
    p = static_cast<unsigned char*>(m) + (span - n);
  }
  ~Buffer() {
    if (base) munmap(base, mapped);
  }
  unsigned char& operator[](size_t i) { return p[i]; }
};

}  // namespace

TEST_CASE("send/recv above 2^31 bytes", "[p2p][large]") {
  auto transport = GENERATE(std::string("shm"), std::string("tcp"));
  chorus::test::RunOptions opt;
  opt.env["CHORUS_TRANSPORT"] = transport;
  opt.limit_seconds = 120;
  auto res = chorus::test::run_ranks(
      2,
      [](int rank) {
        auto comm = chorus::Communicator::from_env();
        const size_t n = (size_t{1} << 31) + 4099;
        Buffer buf(n);
        if (!buf.p) {
          std::fprintf(stderr, "rank %d: cannot map %zu bytes: %s\n", rank, n, strerror(errno));
          return 1;
        }
        if (rank == 0) {
          for (size_t i = 0; i < n; i += 4096) buf[i] = static_cast<unsigned char>(i >> 12);
          buf[n - 1] = 0x5a;
          comm.send(buf.p, n, chorusUint8, 1);
        } else {
          comm.recv(buf.p, n, chorusUint8, 0);
          for (size_t i = 0; i < n; i += 4096)
            if (buf[i] != static_cast<unsigned char>(i >> 12)) {
              std::fprintf(stderr, "byte %zu wrong\n", i);
              return 1;
            }
          if (buf[n - 1] != 0x5a) {
            std::fprintf(stderr, "last byte wrong\n");
            return 1;
          }
        }
        return 0;
      },
      opt);
  for (auto& r : res) {
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
  }
}
