// Shared-memory link: one single-producer/single-consumer ring of slots per directed pair.
//
// A sender copies into the next free slot of its ring in the receiver's segment (segment.h)
// and publishes it by writing the slot's sequence number (release); the receiver polls that
// slot, reads, then frees it by advancing `tail` (release), which the sender rereads only when
// the ring looks full. No locks on the data path. Whoever changes a ring rings the other
// side's doorbell, the wake-up source of every shm link of a channel (ShmWake).
// The link offers its slots directly (DirectSlots), so steps reduce in place.
#pragma once

#include <memory>
#include <string>

#include "common/process.h"
#include "transport/link.h"
#include "transport/shm/segment.h"
#include "transport/transport.h"

namespace chorus::transport {

// My segment, owned for the channel, and its doorbell as the shm links' wake-up source.
class ShmWake : public WakeSource {
 public:
  explicit ShmWake(std::unique_ptr<ShmSegment> own) : own_(std::move(own)), db_(own_->doorbell()) {}
  ShmSegment* segment() { return own_.get(); }
  bool has_doorbell() const override { return true; }
  uint32_t arm() override {
    db_->sleepers.fetch_add(1, std::memory_order_seq_cst);
    return db_->seq.load(std::memory_order_seq_cst);
  }
  bool rung_since(uint32_t seen) const override {
    return db_->seq.load(std::memory_order_seq_cst) != seen;
  }
  void wait(uint32_t seen, int ms) override { doorbell_wait(db_, seen, ms); }
  void disarm() override { db_->sleepers.fetch_sub(1, std::memory_order_seq_cst); }
  void ring() override { doorbell_ring(db_); }

 private:
  std::unique_ptr<ShmSegment> own_;
  Doorbell* db_;
};

class ShmLink final : public Link, public DirectSlots {
 public:
  // in_ring: the ring in my segment this peer writes; out_ring: the ring in its segment I write.
  ShmLink(int peer, std::string peer_name, ShmWake* mine, int in_ring,
          std::shared_ptr<ShmSegment> theirs, int out_ring, int peer_pid);
  Result<bool> progress() override;
  Status check_alive() override;
  void signal_revoke() override;
  DirectSlots* direct() override { return this; }
  size_t slot_capacity() const override { return theirs_->slot_bytes(); }
  std::pair<const char*, size_t> recv_peek() override;
  void recv_consume(size_t n) override;
  std::pair<char*, size_t> send_reserve() override;
  void send_commit(size_t n) override;

 private:
  bool progress_send();
  bool progress_recv();
  bool out_full();
  void publish(SlotHeader* s, size_t len);
  SlotHeader* in_slot(size_t* len);
  void release_in_slot();
  std::shared_ptr<ShmSegment> theirs_;
  char* in_;
  char* out_;
  size_t slot_bytes_;
  int nslots_;
  PeerProcess peer_;             // the peer rank's process
  size_t in_offset_ = 0;         // bytes already consumed from the current inbound slot
  uint64_t in_tail_ = 0;         // next inbound message number (mirrors the shared tail)
  uint64_t out_head_ = 0;        // next outbound message number (only this side writes it)
  uint64_t out_tail_cache_ = 0;  // the consumer's tail as last read
  size_t out_slot_bytes_ = 0;
  int out_nslots_ = 0;
};

// The registry's factory (connect.cc): reads CHORUS_SHM_SLOT_BYTES and CHORUS_SHM_SLOTS.
Result<std::unique_ptr<Transport>> make_shm_transport();
// The /dev/shm name of a rank's segment.
std::string shm_segment_name(int pid, const std::string& prefix, int rank);

}  // namespace chorus::transport
