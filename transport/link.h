// Link: a connection to one peer, the only way collectives/ talks to other ranks -- the
// contract every transport backend (transport/<name>/) fulfils.
//
// Buffers are MemRefs: a pointer, a length and the memory space the bytes live in (the host
// or a device), so a backend that moves device memory (a CUDA IPC copy, an RDMA write) takes
// the same calls as one that moves host bytes.
//
// A link is two FIFO byte streams, one each way. post_send/post_recv queue a buffer and
// return a ticket; progress() moves whatever it can without blocking; a request is complete
// once its ticket is below the completed count (send_done/recv_done). Completion is the
// backend's to declare and may come later than the call that started the copy: a DMA, an
// RDMA write or a cudaMemcpyAsync completes when a later progress() sees it finished. Until
// then the buffer belongs to the link. Message boundaries are the caller's business (every
// operation starts with a header that says what follows), so the two sides may split the
// stream differently: a sender's 1 MiB may be received as 64 B + (1 MiB - 64 B).
//
// Capabilities beyond the streams are asked for, never assumed from the backend's name:
//   direct()       zero-copy access to the link's own staging slots (DirectSlots), or null;
//   wake_source()  where a thread with nothing to do sleeps until this link may progress.
// Threading: one thread (the channel's progress thread) drives a link.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

namespace chorus::transport {

// Where bytes live: the host, or device `space` (>= 0, the device's ordinal).
constexpr int32_t kHostSpace = -1;

struct MemRef {
  char* ptr = nullptr;
  size_t bytes = 0;
  int32_t space = kHostSpace;
  static MemRef host(const void* p, size_t n) {
    return {static_cast<char*>(const_cast<void*>(p)), n, kHostSpace};
  }
};

// A backend's wake-up: the channel's Waiter (transport/waiter.h) sleeps on it when nothing
// moves. A source offers descriptors to poll (tcp: its sockets, edge-triggered for in, out
// and hang-up) and/or a doorbell (shm: a futex word its peers ring after every change).
// Doorbell protocol, for the one thread that sleeps: arm() (announce a sleeper) -> look for
// work once more -> rung_since(seen) -> wait(seen, ms) -> disarm(). ring() wakes a sleeper.
class WakeSource {
 public:
  virtual ~WakeSource() = default;
  virtual std::vector<int> poll_fds() const { return {}; }
  virtual bool has_doorbell() const { return false; }
  virtual uint32_t arm() { return 0; }  // returns the doorbell's count as seen now
  virtual bool rung_since(uint32_t) const { return false; }
  virtual void wait(uint32_t /*seen*/, int /*ms*/) {}
  virtual void disarm() {}
  virtual void ring() {}
};

// Zero-copy access to a link's staging slots, so a step can reduce straight out of a received
// slot and into an outgoing one. Only valid while no posted request of that direction is
// pending (posted bytes come first in the stream). recv_peek: the next received bytes,
// contiguous (empty when none yet); send_reserve: writable space in the next free outgoing
// slot (empty when the ring is full). Bytes written into a reserved slot must be complete
// (the executor finished) before send_commit publishes them.
class DirectSlots {
 public:
  virtual size_t slot_capacity() const = 0;  // bytes one outgoing slot holds
  virtual std::pair<const char*, size_t> recv_peek() = 0;
  virtual void recv_consume(size_t n) = 0;
  virtual std::pair<char*, size_t> send_reserve() = 0;
  virtual void send_commit(size_t n) = 0;

 protected:
  ~DirectSlots() = default;
};

class Link {
 public:
  virtual ~Link() = default;

  uint64_t post_send(MemRef m);
  uint64_t post_recv(MemRef m);
  uint64_t post_send(const void* buf, size_t n) { return post_send(MemRef::host(buf, n)); }
  uint64_t post_recv(void* buf, size_t n) { return post_recv(MemRef::host(buf, n)); }
  bool send_done(uint64_t ticket) const { return ticket < sends_completed_; }
  bool recv_done(uint64_t ticket) const { return ticket < recvs_completed_; }
  bool busy() const { return !sends_.empty() || !recvs_.empty(); }
  bool sends_pending() const { return !sends_.empty(); }

  // Moves bytes without blocking; true when any byte moved. Errors name the peer.
  virtual Result<bool> progress() = 0;
  // Cheap liveness check used while sleeping (shm: is the peer process still there?). Also
  // where a peer's revocation arrives: Code::kRevoked once the peer called signal_revoke().
  virtual Status check_alive() { return Status::ok(); }
  // Tells the peer, outside the byte streams and without the bootstrap store, that this rank
  // revoked the communicator (shm: a flag word in the ring we write; ib: a zero-byte write whose
  // immediate says so; tcp: a byte on the pair's control socket). Called while no operation
  // runs on the link.
  virtual void signal_revoke() {}
  // The memory spaces this link moves (host only for shm and tcp).
  virtual bool accepts(int32_t space) const { return space == kHostSpace; }
  virtual DirectSlots* direct() { return nullptr; }
  WakeSource* wake_source() const { return wake_; }
  const std::string& peer_name() const { return peer_name_; }
  int peer() const { return peer_; }

 protected:
  struct Request {
    char* buf;
    size_t n;
    size_t done;
    int32_t space;
  };
  Link(int peer, std::string peer_name, WakeSource* wake)
      : wake_(wake), peer_(peer), peer_name_(std::move(peer_name)) {}
  void complete_send() {
    sends_.pop_front();
    ++sends_completed_;
  }
  void complete_recv() {
    recvs_.pop_front();
    ++recvs_completed_;
  }

  std::deque<Request> sends_;
  std::deque<Request> recvs_;
  uint64_t sends_posted_ = 0, sends_completed_ = 0;
  uint64_t recvs_posted_ = 0, recvs_completed_ = 0;

 private:
  WakeSource* wake_;
  int peer_;
  std::string peer_name_;
};

inline uint64_t Link::post_send(MemRef m) {
  CHORUS_ASSERT(m.space == kHostSpace || accepts(m.space));
  sends_.push_back({m.ptr, m.bytes, 0, m.space});
  return sends_posted_++;
}

inline uint64_t Link::post_recv(MemRef m) {
  CHORUS_ASSERT(m.space == kHostSpace || accepts(m.space));
  recvs_.push_back({m.ptr, m.bytes, 0, m.space});
  return recvs_posted_++;
}

}  // namespace chorus::transport
