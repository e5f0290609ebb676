// Link: a connection to one peer, the only way collectives/ talks to other ranks.
//
// A link is two FIFO byte streams, one each way. post_send/post_recv queue a byte range and
// return a ticket; progress() moves whatever bytes it can without blocking; a request is done
// once its ticket is below the completed count. Message boundaries are the caller's business
// (every operation starts with a header that says what follows), so the two sides may split
// the stream differently: a sender's 1 MiB may be received as 64 B + (1 MiB - 64 B).
// Threading: one thread (the communicator's progress thread) drives a link.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <utility>

#include "common/status.h"

namespace chorus::transport {

enum class LinkKind { kShm, kTcp };

class Link {
 public:
  virtual ~Link() = default;

  uint64_t post_send(const void* buf, size_t n);
  uint64_t post_recv(void* buf, size_t n);
  bool send_done(uint64_t ticket) const { return ticket < sends_completed_; }
  bool recv_done(uint64_t ticket) const { return ticket < recvs_completed_; }
  bool busy() const { return !sends_.empty() || !recvs_.empty(); }

  // Moves bytes without blocking; true when any byte moved. Errors name the peer.
  virtual Result<bool> progress() = 0;
  // Cheap liveness check used while sleeping (shm: is the peer process still there?).
  virtual Status check_alive() { return Status::ok(); }
  virtual LinkKind kind() const = 0;

  // Zero-copy access to the link's own staging slots (shm), so a step can reduce straight out
  // of a received slot and into an outgoing one. Only valid while no posted request of that
  // direction is pending. recv_peek: the next received bytes, contiguous (empty when none yet);
  // send_reserve: writable space in the next free outgoing slot (empty when the ring is full).
  virtual bool direct() const { return false; }
  virtual std::pair<const char*, size_t> recv_peek() { return {nullptr, 0}; }
  virtual void recv_consume(size_t) {}
  virtual std::pair<char*, size_t> send_reserve() { return {nullptr, 0}; }
  virtual void send_commit(size_t) {}
  const std::string& peer_name() const { return peer_name_; }
  int peer() const { return peer_; }

 protected:
  struct Request {
    char* buf;
    size_t n;
    size_t done;
  };
  Link(int peer, std::string peer_name) : peer_(peer), peer_name_(std::move(peer_name)) {}
  void complete_send() { sends_.pop_front(); ++sends_completed_; }
  void complete_recv() { recvs_.pop_front(); ++recvs_completed_; }

  std::deque<Request> sends_;
  std::deque<Request> recvs_;
  uint64_t sends_posted_ = 0, sends_completed_ = 0;
  uint64_t recvs_posted_ = 0, recvs_completed_ = 0;
  int peer_;
  std::string peer_name_;
};

inline uint64_t Link::post_send(const void* buf, size_t n) {
  sends_.push_back({static_cast<char*>(const_cast<void*>(buf)), n, 0});
  return sends_posted_++;
}

inline uint64_t Link::post_recv(void* buf, size_t n) {
  recvs_.push_back({static_cast<char*>(buf), n, 0});
  return recvs_posted_++;
}

}  // namespace chorus::transport
