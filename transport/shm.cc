// Shared-memory segments, rings and doorbells.
#include "transport/shm.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

namespace chorus::transport {
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

namespace {

constexpr uint64_t kSegMagic = 0x63686f7275732d31ull;  // "chorus-1"

struct SegHeader {
  uint64_t magic;
  uint64_t size;
  uint64_t slot_bytes;
  int32_t nslots;
  int32_t nrings;
  int32_t pid;
  int32_t pad;
  alignas(64) Doorbell doorbell;
};

// The consumer's counter; the producer reads it only when its cached copy says the ring is full.
struct alignas(64) RingCtl {
  alignas(64) std::atomic<uint64_t> tail;  // slots released by the consumer
};

size_t slot_stride(size_t slot_bytes) { return (sizeof(SlotHeader) + slot_bytes + 63) & ~size_t{63}; }
size_t ring_bytes(size_t slot_bytes, int nslots) { return sizeof(RingCtl) + nslots * slot_stride(slot_bytes); }

RingCtl* ctl(char* ring) { return reinterpret_cast<RingCtl*>(ring); }
SlotHeader* slot(char* ring, size_t slot_bytes, uint64_t i, int nslots) {
  return reinterpret_cast<SlotHeader*>(ring + sizeof(RingCtl) + (i % nslots) * slot_stride(slot_bytes));
}
char* slot_data(SlotHeader* s) { return reinterpret_cast<char*>(s) + sizeof(SlotHeader); }

}  // namespace

ShmSegment::~ShmSegment() {
  if (base_) munmap(base_, size_);
  if (owner_) shm_unlink(name_.c_str());
}

void ShmSegment::unlink() {
  if (owner_) shm_unlink(name_.c_str());
  owner_ = false;
}

Result<std::unique_ptr<ShmSegment>> ShmSegment::create(const std::string& name, int nrings, const ShmConfig& cfg) {
  if (cfg.slot_bytes >= kMaxSlotBytes)
    return make_error(Code::kInvalidArgument, "shm: slots of {} bytes exceed the {} byte limit (CHORUS_SHM_SLOT_BYTES)",
                      cfg.slot_bytes, kMaxSlotBytes - 1);
  size_t size = sizeof(SegHeader) + nrings * ring_bytes(cfg.slot_bytes, cfg.nslots);
  struct statvfs vfs{};
  if (statvfs("/dev/shm", &vfs) == 0 && size > vfs.f_bavail * static_cast<double>(vfs.f_frsize))
    return make_error(Code::kSystemError,
                      "shm: /dev/shm is too small: need {:.1f} MiB for {} peer rings of {} x {} KiB slots, {:.1f} MiB free; "
                      "enlarge /dev/shm (docker: --shm-size), lower CHORUS_SHM_SLOT_BYTES/CHORUS_SHM_SLOTS, or use CHORUS_TRANSPORT=tcp",
                      size / double(1 << 20), nrings, cfg.nslots, cfg.slot_bytes >> 10,
                      vfs.f_bavail * static_cast<double>(vfs.f_frsize) / (1 << 20));
  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) return make_error(Code::kSystemError, "shm: cannot create /dev/shm{}: {}", name, strerror(errno));
  std::unique_ptr<ShmSegment> seg(new ShmSegment());
  seg->name_ = name;
  seg->owner_ = true;
  int rc = ftruncate(fd, static_cast<off_t>(size));
  if (rc == 0) rc = posix_fallocate(fd, 0, static_cast<off_t>(size));
  else rc = errno;
  if (rc != 0) {
    close(fd);
    struct statvfs vfs{};
    statvfs("/dev/shm", &vfs);
    double free_mib = vfs.f_bavail * static_cast<double>(vfs.f_frsize) / (1 << 20);
    return make_error(Code::kSystemError,
                      "shm: /dev/shm is too small: need {:.1f} MiB for {} peer rings of {} x {} KiB slots, {:.1f} MiB free "
                      "({}); enlarge /dev/shm (docker: --shm-size), lower CHORUS_SHM_SLOT_BYTES/CHORUS_SHM_SLOTS, "
                      "or use CHORUS_TRANSPORT=tcp",
                      size / double(1 << 20), nrings, cfg.nslots, cfg.slot_bytes >> 10, free_mib, strerror(rc));
  }
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return make_error(Code::kSystemError, "shm: mmap of {} bytes failed: {}", size, strerror(errno));
  seg->base_ = p;
  seg->size_ = size;
  auto* h = new (p) SegHeader();
  h->size = size;
  h->slot_bytes = cfg.slot_bytes;
  h->nslots = cfg.nslots;
  h->nrings = nrings;
  h->pid = getpid();
  for (int r = 0; r < nrings; ++r) {
    new (seg->ring(r)) RingCtl();
    for (int k = 0; k < cfg.nslots; ++k) new (slot(seg->ring(r), cfg.slot_bytes, k, cfg.nslots)) SlotHeader{{0}};
  }
  std::atomic_thread_fence(std::memory_order_release);
  h->magic = kSegMagic;
  return seg;
}

Result<std::unique_ptr<ShmSegment>> ShmSegment::open(const std::string& name) {
  int fd = shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) return make_error(Code::kSystemError, "shm: cannot open /dev/shm{}: {}", name, strerror(errno));
  struct stat st{};
  fstat(fd, &st);
  if (st.st_size < static_cast<off_t>(sizeof(SegHeader))) {
    close(fd);
    return make_error(Code::kSystemError, "shm: /dev/shm{} is only {} bytes", name, st.st_size);
  }
  void* p = mmap(nullptr, st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return make_error(Code::kSystemError, "shm: mmap of /dev/shm{} failed: {}", name, strerror(errno));
  std::unique_ptr<ShmSegment> seg(new ShmSegment());
  seg->name_ = name;
  seg->base_ = p;
  seg->size_ = st.st_size;
  auto* h = static_cast<SegHeader*>(p);
  if (h->magic != kSegMagic || h->size != static_cast<uint64_t>(st.st_size))
    return make_error(Code::kSystemError, "shm: /dev/shm{} is not a chorus segment (magic {:#x})", name, h->magic);
  return seg;
}

Doorbell* ShmSegment::doorbell() { return &static_cast<SegHeader*>(base_)->doorbell; }
int ShmSegment::owner_pid() const { return static_cast<SegHeader*>(base_)->pid; }
size_t ShmSegment::slot_bytes() const { return static_cast<SegHeader*>(base_)->slot_bytes; }
int ShmSegment::nslots() const { return static_cast<SegHeader*>(base_)->nslots; }
char* ShmSegment::ring(int index) {
  return static_cast<char*>(base_) + sizeof(SegHeader) + index * ring_bytes(slot_bytes(), nslots());
}

void doorbell_wait(Doorbell* db, uint32_t seen, int ms) {
  struct timespec ts{ms / 1000, (ms % 1000) * 1000000L};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&db->seq), FUTEX_WAIT, seen, &ts, nullptr, 0);
}

// StoreLoad barrier between the publish and the sleepers check. On x86 a locked no-op on the
// stack does it for fewer cycles than mfence (and it is what compilers emit for seq_cst stores).
inline void store_load_barrier() {
#if defined(__x86_64__)
  asm volatile("lock orl $0, (%%rsp)" ::: "memory", "cc");
#else
  std::atomic_thread_fence(std::memory_order_seq_cst);
#endif
}

void doorbell_ring(Doorbell* db) {
  store_load_barrier();  // the publish before the sleepers check
  if (db->sleepers.load(std::memory_order_relaxed) == 0) return;
  db->seq.fetch_add(1, std::memory_order_seq_cst);
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&db->seq), FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
}

ShmLink::ShmLink(int peer, std::string peer_name, ShmSegment* mine, int in_ring,
                 std::shared_ptr<ShmSegment> theirs, int out_ring, int peer_pid)
    : Link(peer, std::move(peer_name)), mine_(mine), theirs_(std::move(theirs)), peer_pid_(peer_pid) {
  in_ = mine_->ring(in_ring);
  out_ = theirs_->ring(out_ring);
  slot_bytes_ = mine_->slot_bytes();
  nslots_ = mine_->nslots();
  out_slot_bytes_ = theirs_->slot_bytes();
  out_nslots_ = theirs_->nslots();
}

bool ShmLink::out_full() {
  if (out_head_ - out_tail_cache_ < static_cast<uint64_t>(out_nslots_)) return false;
  out_tail_cache_ = ctl(out_)->tail.load(std::memory_order_acquire);
  return out_head_ - out_tail_cache_ >= static_cast<uint64_t>(out_nslots_);
}

void ShmLink::publish(SlotHeader* s, size_t len) {
  ++out_head_;
  s->word.store((static_cast<uint64_t>(len) << kSeqBits) | (out_head_ & kSeqMask), std::memory_order_release);
}

// Fills free slots with queued bytes; several small requests may share one slot.
bool ShmLink::progress_send() {
  bool moved = false;
  while (!sends_.empty() && !out_full()) {
    SlotHeader* s = slot(out_, out_slot_bytes_, out_head_, out_nslots_);
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
  SlotHeader* s = slot(in_, slot_bytes_, in_tail_, nslots_);
  uint64_t w = s->word.load(std::memory_order_acquire);
  if ((w & kSeqMask) != ((in_tail_ + 1) & kSeqMask)) return nullptr;
  *len = static_cast<size_t>(w >> kSeqBits);
  return s;
}

void ShmLink::release_in_slot() {
  in_offset_ = 0;
  ctl(in_)->tail.store(++in_tail_, std::memory_order_release);
}

// Copies published bytes into posted receives; frees each slot once it is fully consumed.
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
    }
    if (in_offset_ < len) break;
    release_in_slot();
    moved = true;
  }
  // Zero-byte receives complete without data.
  while (!recvs_.empty() && recvs_.front().n == 0) complete_recv();
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
  SlotHeader* s = slot(in_, slot_bytes_, in_tail_, nslots_);
  in_offset_ += n;
  if (in_offset_ < (s->word.load(std::memory_order_relaxed) >> kSeqBits)) return;
  release_in_slot();
  doorbell_ring(theirs_->doorbell());
}

std::pair<char*, size_t> ShmLink::send_reserve() {
  if (!sends_.empty() || out_full()) return {nullptr, 0};  // posted sends go first
  return {slot_data(slot(out_, out_slot_bytes_, out_head_, out_nslots_)), out_slot_bytes_};
}

void ShmLink::send_commit(size_t n) {
  publish(slot(out_, out_slot_bytes_, out_head_, out_nslots_), n);
  doorbell_ring(theirs_->doorbell());
}

Status ShmLink::check_alive() {
  if (kill(peer_pid_, 0) != 0 && errno == ESRCH)
    return make_error(Code::kRemoteError, "{} died (process {} is gone)", peer_name(), peer_pid_);
  return Status::ok();
}

}  // namespace chorus::transport
