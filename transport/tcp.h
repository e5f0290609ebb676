// TCP link: several non-blocking sockets per peer, the byte stream striped across them.
//
// The stream is cut into stripes of `stripe` bytes; stripe k travels on socket k % nsocks, so
// a large transfer keeps every socket busy while a small message uses one. Each socket moves
// its own stripes independently; a request is complete when every stripe under it has moved.
#pragma once

#include <vector>

#include "common/socket.h"
#include "transport/link.h"

namespace chorus::transport {

class TcpLink : public Link {
 public:
  TcpLink(int peer, std::string peer_name, std::vector<Fd> socks, size_t stripe);
  Result<bool> progress() override;
  LinkKind kind() const override { return LinkKind::kTcp; }
  std::vector<int> fds() const;

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
  size_t stripe_;
  Stream send_;
  Stream recv_;
  uint64_t seen_send_posted_ = 0, seen_recv_posted_ = 0;
};

}  // namespace chorus::transport
