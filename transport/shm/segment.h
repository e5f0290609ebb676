// Shared-memory segments and doorbells: the memory the shm links' rings live in.
//
// Each rank owns one POSIX shm segment: a doorbell, then one inbound ring per same-host peer.
// The doorbell is a 32-bit futex word that a rank with nothing to do sleeps on after a short
// spin; whoever changes a ring the owner reads rings it (see link.h for the rings).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"

namespace chorus::transport {

struct alignas(64) Doorbell {
  std::atomic<uint32_t> seq{0};
  std::atomic<uint32_t> sleepers{0};
};

// Defaults: 4 slots of 128 KiB per directed pair. A smaller ring stays in cache with the
// buffers: against 8 x 256 KiB, 1.2-1.8x at 1-64 MiB out of place on 2-4 ranks, no change
// at 8 B-32 KiB (bench/RESULTS.md, "Ring or direct, measured; smaller shm rings").
struct ShmConfig {
  size_t slot_bytes = 128 << 10;
  int nslots = 4;
};

// A slot starts with one 64-bit word: the message number (low 38 bits, compared modulo 2^38)
// and the length (high 26 bits). It shares a cache line with the start of the data, so a
// consumer polls the slot itself and a small message (a 48-byte operation header and 8 bytes
// of data) is one cache-line transfer.
struct SlotHeader {
  std::atomic<uint64_t> word;
};
constexpr int kSeqBits = 38;
constexpr uint64_t kSeqMask = (uint64_t{1} << kSeqBits) - 1;
constexpr size_t kMaxSlotBytes = size_t{1} << (64 - kSeqBits);

// The consumer's counter; the producer reads it only when its cached copy says the ring is full.
struct alignas(64) RingCtl {
  alignas(64) std::atomic<uint64_t> tail;  // slots released by the consumer
  std::atomic<uint32_t> revoked;           // set by the producer: it revoked the communicator
};

// Ring layout: a RingCtl, then nslots slots of a SlotHeader and slot_bytes of data each.
inline size_t slot_stride(size_t slot_bytes) {
  return (sizeof(SlotHeader) + slot_bytes + 63) & ~size_t{63};
}
inline size_t ring_bytes(size_t slot_bytes, int nslots) {
  return sizeof(RingCtl) + nslots * slot_stride(slot_bytes);
}
inline RingCtl* ring_ctl(char* ring) {
  return reinterpret_cast<RingCtl*>(ring);
}
inline SlotHeader* ring_slot(char* ring, size_t slot_bytes, uint64_t i, int nslots) {
  return reinterpret_cast<SlotHeader*>(ring + sizeof(RingCtl) +
                                       (i % nslots) * slot_stride(slot_bytes));
}
inline char* slot_data(SlotHeader* s) {
  return reinterpret_cast<char*>(s) + sizeof(SlotHeader);
}

// One mapped segment (own or a peer's). The owner creates it; peers open it by name.
class ShmSegment {
 public:
  ~ShmSegment();
  // Creates "/dev/shm/<name>" with `nrings` inbound rings; fails clearly when /dev/shm is small.
  static Result<std::unique_ptr<ShmSegment>> create(const std::string& name, int nrings,
                                                    const ShmConfig& cfg);
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
void doorbell_wake(Doorbell* db);  // the slow half of doorbell_ring: bump seq, futex wake

// StoreLoad barrier between the publish and the sleepers check. On x86 a locked no-op on the
// stack does it for fewer cycles than mfence (and it is what compilers emit for seq_cst stores).
inline void store_load_barrier() {
#if defined(__x86_64__)
  asm volatile("lock orl $0, (%%rsp)" ::: "memory", "cc");
#else
  std::atomic_thread_fence(std::memory_order_seq_cst);
#endif
}

// The waking side, after publishing a change: rings only when the owner may be asleep, so the
// data path touches no shared counter while both sides are spinning.
inline void doorbell_ring(Doorbell* db) {
  store_load_barrier();  // the publish before the sleepers check
  if (db->sleepers.load(std::memory_order_relaxed) == 0) return;
  doorbell_wake(db);
}

}  // namespace chorus::transport
