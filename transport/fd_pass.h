// Passing file descriptors between processes of one host: SCM_RIGHTS over a Unix stream socket.
// For the CUDA IPC link (shared/notes/gpu-collectives.md): cuMem (VMM) allocations export only
// as POSIX file descriptors, and descriptors only travel this way (no ptrace rights needed,
// unlike pidfd_getfd).
//
// The socket has an abstract name ("\0chorus-fd-" + name): nothing is left in the file system,
// and it is visible only inside this network namespace, which is part of the host identity
// (topology.h), so ranks that see each other as one host can always reach it. Anyone in the
// namespace may connect, so the listener checks the peer's credentials (SO_PEERCRED): this
// user, and the pid of the rank it expects; others are closed and the wait goes on.
//
// A message is a 16-byte header (magic, count, tag) with `count` descriptors attached to it.
// Received descriptors are close-on-exec; any that arrive with a bad message are closed.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/socket.h"
#include "common/status.h"

namespace chorus::transport {

constexpr int kMaxPassedFds = 16;
constexpr uint32_t kFdMagic = 0x66647331;  // "fds1"

struct FdHeader {
  uint32_t magic;
  uint32_t count;  // descriptors attached
  uint64_t tag;    // what they are: the caller's meaning
};
static_assert(sizeof(FdHeader) == 16, "FdHeader is a fixed wire format");

struct PassedFds {
  uint64_t tag = 0;
  std::vector<Fd> fds;
};

// name: 1..100 printable characters without '/'.
Result<Fd> fd_listen(const std::string& name);
// One connection from process expect_pid of this user, within the deadline.
Result<Fd> fd_accept(int listen_fd, int expect_pid, Deadline deadline);
// Retries until the listener exists or the deadline passes.
Result<Fd> fd_connect(const std::string& name, Deadline deadline);

Status send_fds(int sock, uint64_t tag, std::span<const int> fds, Deadline deadline);
// n bytes with up to 64 descriptors attached to the first of them: send_fds's carrier, and how
// the tests and the fuzzer send messages that are not well formed.
Status send_with_fds(int sock, const void* data, size_t n, std::span<const int> fds,
                     Deadline deadline);
Result<PassedFds> recv_fds(int sock, Deadline deadline);

// The header's check, apart for the fuzzer: `attached` descriptors came with it.
Result<FdHeader> parse_fd_header(const void* p, size_t n, int attached);

}  // namespace chorus::transport
