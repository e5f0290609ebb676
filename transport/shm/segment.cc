// Shared-memory segments and doorbells (see segment.h).
#include "transport/shm/segment.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace chorus::transport {
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

}  // namespace

ShmSegment::~ShmSegment() {
  if (base_) munmap(base_, size_);
  if (owner_) shm_unlink(name_.c_str());
}

void ShmSegment::unlink() {
  if (owner_) shm_unlink(name_.c_str());
  owner_ = false;
}

Result<std::unique_ptr<ShmSegment>> ShmSegment::create(const std::string& name, int nrings,
                                                       const ShmConfig& cfg) {
  if (cfg.slot_bytes >= kMaxSlotBytes)
    return make_error(Code::kInvalidArgument,
                      "shm: slots of {} bytes exceed the {} byte limit (CHORUS_SHM_SLOT_BYTES)",
                      cfg.slot_bytes, kMaxSlotBytes - 1);
  size_t size = sizeof(SegHeader) + nrings * ring_bytes(cfg.slot_bytes, cfg.nslots);
  struct statvfs vfs {};
  if (statvfs("/dev/shm", &vfs) == 0 && size > vfs.f_bavail * static_cast<double>(vfs.f_frsize))
    return make_error(Code::kSystemError,
                      "shm: /dev/shm is too small: need {:.1f} MiB for {} peer rings of {} x {} "
                      "KiB slots, {:.1f} MiB free; "
                      "enlarge /dev/shm (docker: --shm-size), lower "
                      "CHORUS_SHM_SLOT_BYTES/CHORUS_SHM_SLOTS, or use CHORUS_TRANSPORT=tcp",
                      size / double(1 << 20), nrings, cfg.nslots, cfg.slot_bytes >> 10,
                      vfs.f_bavail * static_cast<double>(vfs.f_frsize) / (1 << 20));
  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0)
    return make_error(Code::kSystemError, "shm: cannot create /dev/shm{}: {}", name,
                      strerror(errno));
  std::unique_ptr<ShmSegment> seg(new ShmSegment());
  seg->name_ = name;
  seg->owner_ = true;
  int rc = ftruncate(fd, static_cast<off_t>(size));
  if (rc == 0)
    rc = posix_fallocate(fd, 0, static_cast<off_t>(size));
  else
    rc = errno;
  if (rc != 0) {
    close(fd);
    struct statvfs vfs {};
    statvfs("/dev/shm", &vfs);
    double free_mib = vfs.f_bavail * static_cast<double>(vfs.f_frsize) / (1 << 20);
    return make_error(Code::kSystemError,
                      "shm: /dev/shm is too small: need {:.1f} MiB for {} peer rings of {} x {} "
                      "KiB slots, {:.1f} MiB free "
                      "({}); enlarge /dev/shm (docker: --shm-size), lower "
                      "CHORUS_SHM_SLOT_BYTES/CHORUS_SHM_SLOTS, "
                      "or use CHORUS_TRANSPORT=tcp",
                      size / double(1 << 20), nrings, cfg.nslots, cfg.slot_bytes >> 10, free_mib,
                      strerror(rc));
  }
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED)
    return make_error(Code::kSystemError, "shm: mmap of {} bytes failed: {}", size,
                      strerror(errno));
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
    for (int k = 0; k < cfg.nslots; ++k)
      new (ring_slot(seg->ring(r), cfg.slot_bytes, k, cfg.nslots)) SlotHeader{{0}};
  }
  std::atomic_thread_fence(std::memory_order_release);
  h->magic = kSegMagic;
  return seg;
}

Result<std::unique_ptr<ShmSegment>> ShmSegment::open(const std::string& name) {
  int fd = shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0)
    return make_error(Code::kSystemError, "shm: cannot open /dev/shm{}: {}", name, strerror(errno));
  struct stat st {};
  fstat(fd, &st);
  if (st.st_size < static_cast<off_t>(sizeof(SegHeader))) {
    close(fd);
    return make_error(Code::kSystemError, "shm: /dev/shm{} is only {} bytes", name, st.st_size);
  }
  void* p = mmap(nullptr, st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED)
    return make_error(Code::kSystemError, "shm: mmap of /dev/shm{} failed: {}", name,
                      strerror(errno));
  std::unique_ptr<ShmSegment> seg(new ShmSegment());
  seg->name_ = name;
  seg->base_ = p;
  seg->size_ = st.st_size;
  auto* h = static_cast<SegHeader*>(p);
  if (h->magic != kSegMagic || h->size != static_cast<uint64_t>(st.st_size))
    return make_error(Code::kSystemError, "shm: /dev/shm{} is not a chorus segment (magic {:#x})",
                      name, h->magic);
  return seg;
}

Doorbell* ShmSegment::doorbell() {
  return &static_cast<SegHeader*>(base_)->doorbell;
}
int ShmSegment::owner_pid() const {
  return static_cast<SegHeader*>(base_)->pid;
}
size_t ShmSegment::slot_bytes() const {
  return static_cast<SegHeader*>(base_)->slot_bytes;
}
int ShmSegment::nslots() const {
  return static_cast<SegHeader*>(base_)->nslots;
}
char* ShmSegment::ring(int index) {
  return static_cast<char*>(base_) + sizeof(SegHeader) + index * ring_bytes(slot_bytes(), nslots());
}

void doorbell_wait(Doorbell* db, uint32_t seen, int ms) {
  struct timespec ts {
    ms / 1000, (ms % 1000) * 1000000L
  };
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&db->seq), FUTEX_WAIT, seen, &ts, nullptr, 0);
}

void doorbell_wake(Doorbell* db) {
  db->seq.fetch_add(1, std::memory_order_seq_cst);
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&db->seq), FUTEX_WAKE, INT32_MAX, nullptr, nullptr,
          0);
}

}  // namespace chorus::transport
