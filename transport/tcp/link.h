// TCP link: several non-blocking sockets per peer, the byte stream striped across them.
//
// The stream is cut into stripes of `stripe` bytes; stripe k travels on socket k % nsocks, so
// a large transfer keeps every socket busy while a small message uses one. Each socket moves
// its own stripes independently; a request is complete when every stripe under it has moved.
// The sockets of every tcp link of a channel are the wake-up source TcpWake, polled.
//
// One more socket per pair carries no stream: the control socket. A rank that revokes the
// communicator writes one byte to it (signal_revoke), which the peer reads in check_alive, so
// the news needs no bootstrap store. (In-band it cannot go: the stream may stop mid-message; and
// TCP's urgent byte is dropped once the peer's ordinary reads pass its mark.)
#pragma once

#include <vector>

#include "common/socket.h"
#include "transport/link.h"
#include "transport/transport.h"

namespace chorus::transport {

// The sockets of a channel's tcp links, for the channel's Waiter to poll.
class TcpWake : public WakeSource {
 public:
  std::vector<int> poll_fds() const override { return fds_; }
  void add(int fd) { fds_.push_back(fd); }

 private:
  std::vector<int> fds_;
};

class TcpLink final : public Link {
 public:
  // `control`: the pair's control socket (may be invalid: no store-free revoke then).
  TcpLink(int peer, std::string peer_name, std::vector<Fd> socks, size_t stripe, TcpWake* wake,
          Fd control = Fd());
  Result<bool> progress() override;
  Status check_alive() override;
  void signal_revoke() override;

 private:
  struct Stream {
    std::deque<Request>* queue;
    uint64_t queue_start = 0;   // stream offset of queue->front()'s first byte
    uint64_t posted_end = 0;    // stream offset just past the last posted byte
    std::vector<uint64_t> pos;  // per socket: next stream byte it owns and has not moved
  };
  Result<bool> progress_stream(Stream& st, bool sending);
  void account(Stream& st, bool sending);
  std::vector<Fd> socks_;
  Fd control_;
  bool control_closed_ = false;  // the peer closed it (exit or destroy): nothing more comes
  bool revoked_ = false;
  size_t stripe_;
  Stream send_;
  Stream recv_;
  uint64_t seen_send_posted_ = 0, seen_recv_posted_ = 0;
};

// The registry's factory (connect.cc): reads CHORUS_NSOCKS and CHORUS_SOCKET_STRIPE_BYTES.
Result<std::unique_ptr<Transport>> make_tcp_transport();

}  // namespace chorus::transport
