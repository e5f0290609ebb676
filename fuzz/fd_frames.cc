// Fuzz target: a message on the fd-passing socket (transport/fd_pass.h), as a hostile process
// of this user could send it: the first input byte says how many descriptors to attach (up to
// 19, past the limit of 16), the rest is the stream. recv_fds must fail cleanly or return
// exactly what the header says, and close every descriptor it does not return.
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <vector>

#include "transport/fd_pass.h"

using namespace chorus::transport;

namespace {
size_t open_fds() {
  size_t n = 0;
  for (auto& e : std::filesystem::directory_iterator("/proc/self/fd")) (void)e, ++n;
  return n;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const size_t before = open_fds();
  const int attach = data[0] % 20;
  const size_t len = std::min<size_t>(size - 1, 256);
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return 0;
  std::vector<int> fds;
  for (int i = 0; i < attach; ++i) fds.push_back(open("/dev/null", O_RDONLY | O_CLOEXEC));
  if (len > 0) (void)send_with_fds(sv[0], data + 1, len, fds, chorus::Deadline::after_seconds(1));
  close(sv[0]);  // the reader sees the end instead of waiting
  for (int fd : fds) close(fd);
  fcntl(sv[1], F_SETFL, O_NONBLOCK);
  {
    auto r = recv_fds(sv[1], chorus::Deadline::after_seconds(1.0));
    if (r.is_ok() && r->fds.size() > static_cast<size_t>(kMaxPassedFds)) __builtin_trap();
  }
  close(sv[1]);
  if (open_fds() != before) __builtin_trap();  // a descriptor leaked
  return 0;
}
