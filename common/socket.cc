// TCP socket helpers.
#include "common/socket.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>

#include "common/env.h"

namespace chorus {

void Fd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

std::string SockAddr::to_string() const {
  if (host.find(':') != std::string::npos) return fmt::format("[{}]:{}", host, port);
  return fmt::format("{}:{}", host, port);
}

namespace {

std::string errno_str(int e) {
  return strerror(e);
}

std::string addr_string(const sockaddr* sa) {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (sa->sa_family == AF_INET)
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, buf, sizeof buf);
  else if (sa->sa_family == AF_INET6)
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr, buf, sizeof buf);
  return buf;
}

int addr_port(const sockaddr* sa) {
  if (sa->sa_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(sa)->sin_port);
  return ntohs(reinterpret_cast<const sockaddr_in6*>(sa)->sin6_port);
}

Result<sockaddr_storage> resolve(const std::string& host, int port, socklen_t* len) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  std::string port_s = std::to_string(port);
  int rc = getaddrinfo(host.c_str(), port_s.c_str(), &hints, &res);
  if (rc != 0 || res == nullptr)
    return make_error(Code::kInvalidArgument, "cannot resolve host '{}': {}", host,
                      gai_strerror(rc));
  sockaddr_storage ss{};
  memcpy(&ss, res->ai_addr, res->ai_addrlen);
  *len = res->ai_addrlen;
  freeaddrinfo(res);
  return ss;
}

}  // namespace

Result<std::string> interface_address(const std::string& ifname) {
  ifaddrs* ifa = nullptr;
  if (getifaddrs(&ifa) != 0)
    return make_error(Code::kSystemError, "getifaddrs: {}", errno_str(errno));
  std::string v4, v6, names;
  for (ifaddrs* p = ifa; p; p = p->ifa_next) {
    if (!p->ifa_addr) continue;
    if (names.find(p->ifa_name) == std::string::npos)
      names += std::string(names.empty() ? "" : ", ") + p->ifa_name;
    if (ifname != p->ifa_name) continue;
    if (p->ifa_addr->sa_family == AF_INET && v4.empty()) v4 = addr_string(p->ifa_addr);
    if (p->ifa_addr->sa_family == AF_INET6 && v6.empty()) v6 = addr_string(p->ifa_addr);
  }
  freeifaddrs(ifa);
  if (!v4.empty()) return v4;
  if (!v6.empty()) return v6;
  return make_error(Code::kInvalidArgument, "no interface named '{}' with an address (have: {})",
                    ifname, names);
}

Result<std::string> local_address(const std::vector<std::string>& preferred) {
  if (auto name = env_get("CHORUS_SOCKET_IFNAME")) {
    auto r = interface_address(*name);
    if (!r.is_ok()) return r.status().wrap("CHORUS_SOCKET_IFNAME");
    return r;
  }
  ifaddrs* ifa = nullptr;
  if (getifaddrs(&ifa) != 0)
    return make_error(Code::kSystemError, "getifaddrs: {}", errno_str(errno));
  auto usable = [](const ifaddrs* p) {
    return p->ifa_addr && p->ifa_addr->sa_family == AF_INET && !(p->ifa_flags & IFF_LOOPBACK) &&
           (p->ifa_flags & IFF_UP);
  };
  std::string best;
  for (const std::string& want : preferred)
    for (ifaddrs* p = ifa; p && best.empty(); p = p->ifa_next)
      if (usable(p) && want == p->ifa_name) best = addr_string(p->ifa_addr);
  for (ifaddrs* p = ifa; p && best.empty(); p = p->ifa_next)
    if (usable(p)) best = addr_string(p->ifa_addr);
  if (best.empty()) best = "127.0.0.1";
  freeifaddrs(ifa);
  return best;
}

Result<std::string> resolve_host(const std::string& host) {
  socklen_t len = 0;
  CHORUS_ASSIGN_OR_RETURN(sockaddr_storage ss, resolve(host, 0, &len));
  return addr_string(reinterpret_cast<sockaddr*>(&ss));
}

bool is_loopback_address(const std::string& numeric) {
  in_addr a4{};
  if (inet_pton(AF_INET, numeric.c_str(), &a4) == 1) return (ntohl(a4.s_addr) >> 24) == 127;
  in6_addr a6{};
  if (inet_pton(AF_INET6, numeric.c_str(), &a6) == 1) return IN6_IS_ADDR_LOOPBACK(&a6);
  return false;
}

bool is_local_address(const std::string& numeric) {
  if (is_loopback_address(numeric)) return true;
  ifaddrs* ifa = nullptr;
  if (getifaddrs(&ifa) != 0) return false;
  bool found = false;
  for (ifaddrs* p = ifa; p && !found; p = p->ifa_next)
    if (p->ifa_addr && (p->ifa_addr->sa_family == AF_INET || p->ifa_addr->sa_family == AF_INET6))
      found = addr_string(p->ifa_addr) == numeric;
  freeifaddrs(ifa);
  return found;
}

Status set_nonblocking(int fd) {
  int flags = fcntl(fd, F_GETFL, 0);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0)
    return make_error(Code::kSystemError, "fcntl(O_NONBLOCK): {}", errno_str(errno));
  return Status::ok();
}

Status set_nodelay(int fd) {
  int one = 1;
  if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) < 0)
    return make_error(Code::kSystemError, "setsockopt(TCP_NODELAY): {}", errno_str(errno));
  return Status::ok();
}

Result<Fd> tcp_listen(const std::string& host, int port, SockAddr* bound) {
  socklen_t len = 0;
  CHORUS_ASSIGN_OR_RETURN(sockaddr_storage ss, resolve(host, port, &len));
  Fd fd(socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return make_error(Code::kSystemError, "socket: {}", errno_str(errno));
  int one = 1;
  setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(fd.get(), reinterpret_cast<sockaddr*>(&ss), len) != 0)
    return make_error(Code::kSystemError, "bind {}:{}: {}", host, port, errno_str(errno));
  if (listen(fd.get(), 1024) != 0)
    return make_error(Code::kSystemError, "listen: {}", errno_str(errno));
  CHORUS_TRY(set_nonblocking(fd.get()));
  if (bound) {
    sockaddr_storage got{};
    socklen_t glen = sizeof got;
    getsockname(fd.get(), reinterpret_cast<sockaddr*>(&got), &glen);
    bound->host = addr_string(reinterpret_cast<sockaddr*>(&got));
    bound->port = addr_port(reinterpret_cast<sockaddr*>(&got));
  }
  return fd;
}

namespace {

// One attempt: the connected socket, or an invalid Fd with errno set (ETIMEDOUT: no answer by
// the deadline); an error only when no socket could be made.
Result<Fd> connect_attempt(const sockaddr_storage& ss, socklen_t len, Deadline deadline) {
  Fd fd(socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return make_error(Code::kSystemError, "socket: {}", errno_str(errno));
  CHORUS_TRY(set_nonblocking(fd.get()));
  int rc = connect(fd.get(), reinterpret_cast<const sockaddr*>(&ss), len);
  if (rc != 0 && errno == EINPROGRESS) {
    auto w = poll_fd(fd.get(), POLLOUT, deadline.slice_ms(1000));
    CHORUS_TRY(w);
    int err = 0;
    socklen_t el = sizeof err;
    getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &el);
    rc = (*w && err == 0) ? 0 : -1;
    errno = *w ? err : ETIMEDOUT;
  }
  if (rc != 0) return Fd();
  CHORUS_TRY(set_nodelay(fd.get()));
  return fd;
}

}  // namespace

Result<Fd> tcp_connect(const SockAddr& to, Deadline deadline) {
  socklen_t len = 0;
  CHORUS_ASSIGN_OR_RETURN(sockaddr_storage ss, resolve(to.host, to.port, &len));
  int last_errno = 0;
  double backoff_ms = 1;
  while (true) {
    CHORUS_ASSIGN_OR_RETURN(Fd fd, connect_attempt(ss, len, deadline));
    if (fd.valid()) return fd;
    last_errno = errno;
    if (last_errno != ECONNREFUSED && last_errno != ETIMEDOUT && last_errno != ECONNRESET &&
        last_errno != EHOSTUNREACH && last_errno != ENETUNREACH && last_errno != EAGAIN)
      return make_error(Code::kSystemError, "connect to {}: {}", to.to_string(),
                        errno_str(last_errno));
    if (deadline.expired())
      return make_error(Code::kTimeout, "connect to {}: {} after {:.0f} s", to.to_string(),
                        errno_str(last_errno), deadline.total());
    usleep(static_cast<useconds_t>(std::min(backoff_ms, deadline.remaining() * 1000) * 1000));
    backoff_ms = std::min(backoff_ms * 2, 100.0);
  }
}

Result<Fd> tcp_connect_once(const SockAddr& to, Deadline deadline, int* error_number) {
  socklen_t len = 0;
  CHORUS_ASSIGN_OR_RETURN(sockaddr_storage ss, resolve(to.host, to.port, &len));
  *error_number = 0;
  while (true) {
    CHORUS_ASSIGN_OR_RETURN(Fd fd, connect_attempt(ss, len, deadline));
    if (fd.valid()) return fd;
    *error_number = errno;
    // Still no answer with time left (the poll waits in slices): wait on.
    if (*error_number != ETIMEDOUT || deadline.expired())
      return make_error(*error_number == ETIMEDOUT ? Code::kTimeout : Code::kSystemError,
                        "connect to {}: {}", to.to_string(), errno_str(*error_number));
  }
}

Result<Fd> tcp_accept(int listen_fd, Deadline deadline, SockAddr* peer) {
  while (true) {
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    int fd =
        accept4(listen_fd, reinterpret_cast<sockaddr*>(&ss), &len, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd >= 0) {
      Fd owned(fd);
      CHORUS_TRY(set_nodelay(fd));
      if (peer) {
        peer->host = addr_string(reinterpret_cast<sockaddr*>(&ss));
        peer->port = addr_port(reinterpret_cast<sockaddr*>(&ss));
      }
      return owned;
    }
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
      return make_error(Code::kSystemError, "accept: {}", errno_str(errno));
    if (deadline.expired())
      return make_error(Code::kTimeout, "accept: no connection within {:.0f} s", deadline.total());
    CHORUS_TRY(poll_fd(listen_fd, POLLIN, deadline.slice_ms(100)));
  }
}

Result<Fd> tcp_accept_now(int listen_fd, SockAddr* peer, int* error_number) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  int fd = accept4(listen_fd, reinterpret_cast<sockaddr*>(&ss), &len, SOCK_CLOEXEC | SOCK_NONBLOCK);
  *error_number = fd < 0 ? errno : 0;
  if (fd < 0) return make_error(Code::kSystemError, "accept: {}", errno_str(*error_number));
  Fd owned(fd);
  (void)set_nodelay(fd);
  if (peer) {
    peer->host = addr_string(reinterpret_cast<sockaddr*>(&ss));
    peer->port = addr_port(reinterpret_cast<sockaddr*>(&ss));
  }
  return owned;
}

Result<bool> poll_fd(int fd, short events, int ms) {
  pollfd p{fd, events, 0};
  int rc = poll(&p, 1, ms);
  if (rc < 0) {
    if (errno == EINTR) return false;
    return make_error(Code::kSystemError, "poll: {}", errno_str(errno));
  }
  return rc > 0;
}

bool wait_readable_unless(int fd, const std::atomic<bool>& stop) {
  while (!stop.load()) {
    auto r = poll_fd(fd, POLLIN, 100);
    if (!r.is_ok() || *r) return true;
  }
  return false;
}

Result<size_t> send_some(int fd, const void* buf, size_t n, const std::string& what) {
  if (n == 0) return size_t{0};
  ssize_t rc = ::send(fd, buf, std::min<size_t>(n, 1 << 30), MSG_NOSIGNAL);
  if (rc >= 0) return static_cast<size_t>(rc);
  if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return size_t{0};
  return make_error(Code::kRemoteError, "send to {} failed: {}", what, errno_str(errno));
}

Result<size_t> recv_some(int fd, void* buf, size_t n, const std::string& what) {
  if (n == 0) return size_t{0};
  ssize_t rc = ::recv(fd, buf, std::min<size_t>(n, 1 << 30), 0);
  if (rc > 0) return static_cast<size_t>(rc);
  if (rc == 0) return make_error(Code::kRemoteError, "connection closed by {}", what);
  if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return size_t{0};
  return make_error(Code::kRemoteError, "recv from {} failed: {}", what, errno_str(errno));
}

Status send_all(int fd, const void* buf, size_t n, Deadline deadline, const std::string& what) {
  size_t done = 0;
  while (done < n) {
    auto r = send_some(fd, static_cast<const char*>(buf) + done, n - done, what);
    if (!r.is_ok()) return r.status().wrap(fmt::format("after {} of {} bytes", done, n));
    done += *r;
    if (done == n) break;
    if (*r == 0) {
      if (deadline.expired())
        return make_error(Code::kTimeout, "send to {}: {} of {} bytes after {:.1f} s", what, done,
                          n, deadline.total());
      CHORUS_TRY(poll_fd(fd, POLLOUT, deadline.slice_ms(100)));
    }
  }
  return Status::ok();
}

Status recv_all(int fd, void* buf, size_t n, Deadline deadline, const std::string& what) {
  size_t done = 0;
  while (done < n) {
    auto r = recv_some(fd, static_cast<char*>(buf) + done, n - done, what);
    if (!r.is_ok())
      return Status(r.status().code(),
                    fmt::format("{} after {} of {} bytes", r.status().message(), done, n));
    done += *r;
    if (done == n) break;
    if (*r == 0) {
      if (deadline.expired())
        return make_error(Code::kTimeout, "recv from {}: {} of {} bytes after {:.1f} s", what, done,
                          n, deadline.total());
      CHORUS_TRY(poll_fd(fd, POLLIN, deadline.slice_ms(100)));
    }
  }
  return Status::ok();
}

}  // namespace chorus
