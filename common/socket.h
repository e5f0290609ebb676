// Small TCP socket helpers with deadlines: listen, connect, exact send/recv, interface lookup.
// All sockets are non-blocking underneath; the *_all functions poll until done or the deadline.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/status.h"

namespace chorus {

// An owned file descriptor, closed on destruction.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept {
    reset(o.release());
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    int f = fd_;
    fd_ = -1;
    return f;
  }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

struct SockAddr {
  std::string host;  // numeric address, IPv4 or IPv6
  int port = 0;
  std::string to_string() const;
};

// Resolves the address other hosts should use to reach us: CHORUS_SOCKET_IFNAME's address when
// set (error if no such interface), else the address of the first of `preferred` that is up
// with an IPv4 address (the NIC closest to the rank's GPU), else the first non-loopback IPv4
// address, else 127.0.0.1.
Result<std::string> local_address(const std::vector<std::string>& preferred = {});
// Address of a named interface ("eth0", "lo"); IPv4 first, then IPv6.
Result<std::string> interface_address(const std::string& ifname);

// The numeric address a host name resolves to first ("localhost" -> "127.0.0.1").
Result<std::string> resolve_host(const std::string& host);
// Loopback (127.0.0.0/8, ::1), and addresses of this host's interfaces (loopback included).
bool is_loopback_address(const std::string& numeric);
bool is_local_address(const std::string& numeric);

// Listens on host:port (port 0 = any free port); returns the fd and the bound address.
Result<Fd> tcp_listen(const std::string& host, int port, SockAddr* bound);
// Connects, retrying refused connections until the deadline (the peer may not listen yet).
Result<Fd> tcp_connect(const SockAddr& to, Deadline deadline);
// One connection attempt, no retry; on failure *error_number is connect's errno (ECONNREFUSED:
// nothing listens there; ETIMEDOUT: no answer by the deadline, then the code is kTimeout).
Result<Fd> tcp_connect_once(const SockAddr& to, Deadline deadline, int* error_number);
// Accepts one connection, waiting until the deadline; sets TCP_NODELAY and O_NONBLOCK.
Result<Fd> tcp_accept(int listen_fd, Deadline deadline, SockAddr* peer);
// Accepts one waiting connection without waiting; on failure *error_number is accept's errno
// (EAGAIN: nobody is waiting; EMFILE/ENFILE: out of descriptors).
Result<Fd> tcp_accept_now(int listen_fd, SockAddr* peer, int* error_number);

Status set_nonblocking(int fd);
Status set_nodelay(int fd);

// Sends/receives exactly n bytes or fails: peer closed (with the count so far), error, deadline.
// `what` names the peer in messages, e.g. "rank 3 (10.0.0.4:29500)".
Status send_all(int fd, const void* buf, size_t n, Deadline deadline, const std::string& what);
Status recv_all(int fd, void* buf, size_t n, Deadline deadline, const std::string& what);

// Non-blocking partial I/O: bytes moved (0 if it would block), or an error (peer closed included).
Result<size_t> send_some(int fd, const void* buf, size_t n, const std::string& what);
Result<size_t> recv_some(int fd, void* buf, size_t n, const std::string& what);

// Waits until fd is readable (events=POLLIN) or writable (POLLOUT), at most ms milliseconds.
Result<bool> poll_fd(int fd, short events, int ms);
// Waits until fd is readable (or has an error to report), checking `stop` every 100 ms; false
// once stop is set.
bool wait_readable_unless(int fd, const std::atomic<bool>& stop);

}  // namespace chorus
