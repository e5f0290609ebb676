// Shared-memory link: one single-producer/single-consumer ring of slots per directed pair.
//
// Each rank owns one POSIX shm segment: a doorbell, then one inbound ring per same-host peer.
// A sender copies into the next free slot of its ring in the receiver's segment and publishes
// it by writing the slot's sequence number (release); the receiver polls that slot, reads, then
// frees it by advancing `tail` (release), which the sender rereads only when the ring looks full. No locks on the data path. Whoever changes a ring rings the other side's doorbell:
// a 32-bit futex word that a rank with nothing to do sleeps on after a short spin.
// See docs in collectives/engine.h for the spin-then-sleep policy.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "transport/link.h"

namespace chorus::transport {

struct alignas(64) Doorbell {
  std::atomic<uint32_t> seq{0};
  std::atomic<uint32_t> sleepers{0};
};

struct ShmConfig {
  size_t slot_bytes = 256 << 10;
  int nslots = 8;
};

// One mapped segment (own or a peer's). The owner creates it; peers open it by name.
class ShmSegment {
 public:
  ~ShmSegment();
  // Creates "/dev/shm/<name>" with `nrings` inbound rings; fails clearly when /dev/shm is small.
  static Result<std::unique_ptr<ShmSegment>> create(const std::string& name, int nrings, const ShmConfig& cfg);
  static Result<std::unique_ptr<ShmSegment>> open(const std::string& name);
  void unlink();  // removes the name; the mapping stays valid for everyone who has it
  Doorbell* doorbell();
  int owner_pid() const;
  char* ring(int index);  // start of inbound ring `index`
  size_t slot_bytes() const;
  int nslots() const;
  const std::string& name() const { return name_; }

 private:
  ShmSegment() = default;
  std::string name_;
  void* base_ = nullptr;
  size_t size_ = 0;
  bool owner_ = false;
};

// The sleeping side: announce (sleepers++), read seq, re-check for work, then
// doorbell_wait(seen) -- it returns at once if anyone rang since seq was read.
void doorbell_wait(Doorbell* db, uint32_t seen, int ms);
// The waking side, after publishing a change: rings only when the owner may be asleep, so the
// data path touches no shared counter while both sides are spinning.
void doorbell_ring(Doorbell* db);

struct SlotHeader;

class ShmLink : public Link {
 public:
  // out_ring: my inbound ring inside the peer's segment; in_ring: the peer's ring in mine.
  ShmLink(int peer, std::string peer_name, ShmSegment* mine, int in_ring, std::shared_ptr<ShmSegment> theirs,
          int out_ring, int peer_pid);
  Result<bool> progress() override;
  Status check_alive() override;
  LinkKind kind() const override { return LinkKind::kShm; }
  bool direct() const override { return true; }
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
  ShmSegment* mine_;
  std::shared_ptr<ShmSegment> theirs_;
  char* in_;
  char* out_;
  size_t slot_bytes_;
  int nslots_;
  int peer_pid_;
  size_t in_offset_ = 0;  // bytes already consumed from the current inbound slot
  uint64_t in_tail_ = 0;  // next inbound message number (mirrors the shared tail)
  uint64_t out_head_ = 0;        // next outbound message number (only this side writes it)
  uint64_t out_tail_cache_ = 0;  // the consumer's tail as last read
  size_t out_slot_bytes_ = 0;
  int out_nslots_ = 0;
};

}  // namespace chorus::transport
