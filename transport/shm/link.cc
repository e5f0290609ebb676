// Shared-memory link: the rings' producer and consumer sides (see link.h).
#include "transport/shm/link.h"

#include <algorithm>
#include <cstring>

namespace chorus::transport {

ShmLink::ShmLink(int peer, std::string peer_name, ShmWake* mine, int in_ring,
                 std::shared_ptr<ShmSegment> theirs, int out_ring, int peer_pid)
    : Link(peer, std::move(peer_name), mine), theirs_(std::move(theirs)), peer_(peer_pid) {
  in_ = mine->segment()->ring(in_ring);
  out_ = theirs_->ring(out_ring);
  slot_bytes_ = mine->segment()->slot_bytes();
  nslots_ = mine->segment()->nslots();
  out_slot_bytes_ = theirs_->slot_bytes();
  out_nslots_ = theirs_->nslots();
}

bool ShmLink::out_full() {
  if (out_head_ - out_tail_cache_ < static_cast<uint64_t>(out_nslots_)) return false;
  out_tail_cache_ = ring_ctl(out_)->tail.load(std::memory_order_acquire);
  return out_head_ - out_tail_cache_ >= static_cast<uint64_t>(out_nslots_);
}

void ShmLink::publish(SlotHeader* s, size_t len) {
  ++out_head_;
  s->word.store((static_cast<uint64_t>(len) << kSeqBits) | (out_head_ & kSeqMask),
                std::memory_order_release);
}

// Fills free slots with queued bytes; several small requests may share one slot.
bool ShmLink::progress_send() {
  bool moved = false;
  while (!sends_.empty() && !out_full()) {
    SlotHeader* s = ring_slot(out_, out_slot_bytes_, out_head_, out_nslots_);
    char* dst = slot_data(s);
    size_t used = 0;
    while (!sends_.empty() && used < out_slot_bytes_) {
      Request& r = sends_.front();
      size_t n = std::min(r.n - r.done, out_slot_bytes_ - used);
      if (n) std::memcpy(dst + used, r.buf + r.done, n);  // a 0-byte send may have no buffer
      used += n;
      r.done += n;
      if (r.done == r.n) complete_send();
    }
    publish(s, used);
    moved = true;
  }
  return moved;
}

// The current inbound slot, or nullptr when message number in_tail_ has not arrived;
// *len is its length.
SlotHeader* ShmLink::in_slot(size_t* len) {
  SlotHeader* s = ring_slot(in_, slot_bytes_, in_tail_, nslots_);
  uint64_t w = s->word.load(std::memory_order_acquire);
  if ((w & kSeqMask) != ((in_tail_ + 1) & kSeqMask)) return nullptr;
  *len = static_cast<size_t>(w >> kSeqBits);
  return s;
}

void ShmLink::release_in_slot() {
  in_offset_ = 0;
  ring_ctl(in_)->tail.store(++in_tail_, std::memory_order_release);
}

// Copies published bytes into posted receives; frees each slot once it is fully consumed.
// Moved: any byte copied or receive completed, a slot freed or not (a message's header taken
// from a slot that also holds its data is movement: the caller posts the data's receive next,
// and must look again before it sleeps -- it slept through the data, 100 ms at a time).
bool ShmLink::progress_recv() {
  bool moved = false;
  while (!recvs_.empty()) {
    size_t len = 0;
    SlotHeader* s = in_slot(&len);
    if (!s) break;
    const char* src = slot_data(s);
    while (!recvs_.empty() && in_offset_ < len) {
      Request& r = recvs_.front();
      size_t n = std::min(r.n - r.done, len - in_offset_);
      if (n) std::memcpy(r.buf + r.done, src + in_offset_, n);  // ... and a 0-byte recv too
      in_offset_ += n;
      r.done += n;
      if (r.done == r.n) complete_recv();
      moved = true;
    }
    if (in_offset_ < len) break;
    release_in_slot();
    moved = true;
  }
  // Zero-byte receives complete without data.
  while (!recvs_.empty() && recvs_.front().n == 0) {
    complete_recv();
    moved = true;
  }
  return moved;
}

Result<bool> ShmLink::progress() {
  while (!sends_.empty() && sends_.front().n == 0) complete_send();
  bool sent = progress_send();
  bool received = progress_recv();
  if (sent || received) doorbell_ring(theirs_->doorbell());
  return sent || received;
}

std::pair<const char*, size_t> ShmLink::recv_peek() {
  if (!recvs_.empty()) return {nullptr, 0};  // posted receives come first in the stream
  size_t len = 0;
  SlotHeader* s = in_slot(&len);
  if (!s) return {nullptr, 0};
  return {slot_data(s) + in_offset_, len - in_offset_};
}

void ShmLink::recv_consume(size_t n) {
  SlotHeader* s = ring_slot(in_, slot_bytes_, in_tail_, nslots_);
  in_offset_ += n;
  if (in_offset_ < (s->word.load(std::memory_order_relaxed) >> kSeqBits)) return;
  release_in_slot();
  doorbell_ring(theirs_->doorbell());
}

std::pair<char*, size_t> ShmLink::send_reserve() {
  if (!sends_.empty() || out_full()) return {nullptr, 0};  // posted sends go first
  return {slot_data(ring_slot(out_, out_slot_bytes_, out_head_, out_nslots_)), out_slot_bytes_};
}

void ShmLink::send_commit(size_t n) {
  publish(ring_slot(out_, out_slot_bytes_, out_head_, out_nslots_), n);
  doorbell_ring(theirs_->doorbell());
}

Status ShmLink::check_alive() {
  if (ring_ctl(in_)->revoked.load(std::memory_order_acquire))
    return make_error(Code::kRevoked, "rank {} revoked the communicator (news over the link to {})",
                      peer(), peer_name());
  if (peer_.gone())
    return make_error(Code::kRemoteError, "{} died (process {} is gone)", peer_name(), peer_.pid());
  return Status::ok();
}

void ShmLink::signal_revoke() {
  ring_ctl(out_)->revoked.store(1, std::memory_order_release);
  doorbell_wake(theirs_->doorbell());  // wakes the peer even if it is not yet announced asleep
}

}  // namespace chorus::transport
