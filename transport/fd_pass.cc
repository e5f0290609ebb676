// Descriptor passing over abstract Unix sockets (fd_pass.h).
#include "transport/fd_pass.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>

#include "common/log.h"

namespace chorus::transport {

namespace {

Result<socklen_t> abstract_addr(const std::string& name, sockaddr_un* a) {
  const bool printable =
      std::all_of(name.begin(), name.end(), [](char c) { return c > ' ' && c < 127 && c != '/'; });
  if (name.empty() || name.size() > 100 || !printable)
    return make_error(Code::kInvalidArgument,
                      "fd socket name '{}': want 1..100 printable characters without '/'", name);
  std::memset(a, 0, sizeof *a);
  a->sun_family = AF_UNIX;
  const std::string path = "chorus-fd-" + name;  // after a leading NUL: the abstract namespace
  std::memcpy(a->sun_path + 1, path.data(), path.size());
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + path.size());
}

int ms_left(const Deadline& d) {
  return static_cast<int>(std::clamp(d.remaining() * 1000.0, 0.0, 100.0));
}

}  // namespace

Result<FdHeader> parse_fd_header(const void* p, size_t n, int attached) {
  if (n != sizeof(FdHeader))
    return make_error(Code::kRemoteError, "fd message header of {} bytes, want {}", n,
                      sizeof(FdHeader));
  FdHeader h;
  std::memcpy(&h, p, sizeof h);
  if (h.magic != kFdMagic)
    return make_error(Code::kRemoteError, "not a chorus fd message (magic {:#x})", h.magic);
  if (h.count > static_cast<uint32_t>(kMaxPassedFds))
    return make_error(Code::kRemoteError, "fd message says {} descriptors, at most {}", h.count,
                      kMaxPassedFds);
  if (static_cast<int>(h.count) != attached)
    return make_error(Code::kRemoteError, "fd message says {} descriptors but {} came with it",
                      h.count, attached);
  return h;
}

Result<Fd> fd_listen(const std::string& name) {
  sockaddr_un a;
  CHORUS_ASSIGN_OR_RETURN(socklen_t len, abstract_addr(name, &a));
  Fd s(socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!s.valid()) return make_error(Code::kSystemError, "fd socket: {}", std::strerror(errno));
  if (bind(s.get(), reinterpret_cast<sockaddr*>(&a), len) != 0)
    return make_error(errno == EADDRINUSE ? Code::kInvalidUsage : Code::kSystemError,
                      "fd socket '{}': bind: {}", name, std::strerror(errno));
  if (listen(s.get(), 16) != 0)
    return make_error(Code::kSystemError, "fd socket '{}': listen: {}", name, std::strerror(errno));
  return s;
}

Result<Fd> fd_accept(int listen_fd, int expect_pid, Deadline deadline) {
  while (true) {
    Fd c(accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (c.valid()) {
      ucred cred{};
      socklen_t n = sizeof cred;
      if (getsockopt(c.get(), SOL_SOCKET, SO_PEERCRED, &cred, &n) != 0)
        return make_error(Code::kSystemError, "fd socket: SO_PEERCRED: {}", std::strerror(errno));
      if (cred.uid == geteuid() && cred.pid == expect_pid) return c;
      log_warn("fd socket: refused a connection from pid {} (uid {}); waiting for pid {}", cred.pid,
               cred.uid, expect_pid);
      continue;  // c closes
    }
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED)
      return make_error(Code::kSystemError, "fd socket: accept: {}", std::strerror(errno));
    if (deadline.expired())
      return make_error(Code::kTimeout, "no connection from pid {} to the fd socket", expect_pid);
    if (auto w = poll_fd(listen_fd, POLLIN, ms_left(deadline)); !w.is_ok()) return w.status();
  }
}

Result<Fd> fd_connect(const std::string& name, Deadline deadline) {
  sockaddr_un a;
  CHORUS_ASSIGN_OR_RETURN(socklen_t len, abstract_addr(name, &a));
  while (true) {
    Fd s(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!s.valid()) return make_error(Code::kSystemError, "fd socket: {}", std::strerror(errno));
    if (connect(s.get(), reinterpret_cast<sockaddr*>(&a), len) == 0) {
      CHORUS_TRY(set_nonblocking(s.get()));
      return s;
    }
    if (errno != ECONNREFUSED && errno != ENOENT && errno != EAGAIN && errno != EINTR)
      return make_error(Code::kSystemError, "fd socket '{}': connect: {}", name,
                        std::strerror(errno));
    if (deadline.expired())
      return make_error(Code::kTimeout, "fd socket '{}': nobody listens", name);
    usleep(5000);
  }
}

Status send_with_fds(int sock, const void* data, size_t n, std::span<const int> fds,
                     Deadline deadline) {
  constexpr size_t kMax = 64;
  if (fds.size() > kMax || n == 0)
    return make_error(Code::kInvalidArgument,
                      "{} bytes with {} descriptors: want 1.. bytes, at most {}", n, fds.size(),
                      kMax);
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMax)] = {};
  iovec iov{const_cast<void*>(data), n};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  if (!fds.empty()) {
    m.msg_control = control;
    m.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  while (true) {
    ssize_t sent = sendmsg(sock, &m, MSG_NOSIGNAL);
    if (sent > 0) {  // the descriptors went with the first byte; the rest is plain data
      if (static_cast<size_t>(sent) == n) return Status::ok();
      return send_all(sock, static_cast<const char*>(data) + sent, n - sent, deadline,
                      "the fd socket's peer");
    }
    if (sent < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
      return make_error(Code::kSystemError, "fd socket: sendmsg: {}", std::strerror(errno));
    if (deadline.expired()) return make_error(Code::kTimeout, "fd socket: the peer reads nothing");
    if (auto w = poll_fd(sock, POLLOUT, ms_left(deadline)); !w.is_ok()) return w.status();
  }
}

Status send_fds(int sock, uint64_t tag, std::span<const int> fds, Deadline deadline) {
  if (fds.size() > static_cast<size_t>(kMaxPassedFds))
    return make_error(Code::kInvalidArgument, "{} descriptors in one message, at most {}",
                      fds.size(), kMaxPassedFds);
  const FdHeader h{kFdMagic, static_cast<uint32_t>(fds.size()), tag};
  return send_with_fds(sock, &h, sizeof h, fds, deadline);
}

Result<PassedFds> recv_fds(int sock, Deadline deadline) {
  PassedFds out;
  char buf[sizeof(FdHeader)];
  size_t got = 0;
  while (got < sizeof buf) {
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxPassedFds)];
    iovec iov{buf + got, sizeof buf - got};
    msghdr m{};
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = control;
    m.msg_controllen = sizeof control;
    ssize_t r = recvmsg(sock, &m, MSG_CMSG_CLOEXEC);
    if (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
      return make_error(Code::kSystemError, "fd socket: recvmsg: {}", std::strerror(errno));
    if (r > 0) {
      // Every descriptor that arrived is owned (and so closed on any error) before any check.
      for (cmsghdr* c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
        const size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < n; ++i) {
          int fd;
          std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
          out.fds.emplace_back(fd);
        }
      }
      if (m.msg_flags & MSG_CTRUNC)
        return make_error(Code::kRemoteError, "fd message with more than {} descriptors",
                          kMaxPassedFds);
      got += static_cast<size_t>(r);
      continue;
    }
    if (r == 0)
      return make_error(Code::kRemoteError, "fd socket: the peer closed after {} of {} bytes", got,
                        sizeof buf);
    if (deadline.expired()) return make_error(Code::kTimeout, "fd socket: no message");
    if (auto w = poll_fd(sock, POLLIN, ms_left(deadline)); !w.is_ok()) return w.status();
  }
  CHORUS_ASSIGN_OR_RETURN(FdHeader h,
                          parse_fd_header(buf, sizeof buf, static_cast<int>(out.fds.size())));
  out.tag = h.tag;
  return out;
}

}  // namespace chorus::transport
