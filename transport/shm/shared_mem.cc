// chorusMemAlloc's buffers (shared_mem.h): one memfd per allocation, and the peers' allocations
// mapped here, each once, until its owner frees it.
#include "transport/shm/shared_mem.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <utility>

namespace chorus::transport {
namespace {

struct Own {
  size_t size;
  int fd;
  uint64_t id;
};

// A peer's allocation mapped here: the file it is (to tell whether its owner still holds it) and
// the holds on it (map_shared's, not yet released).
struct Peer {
  char* base;
  uint64_t size;
  int32_t fd;  // the owner's descriptor
  dev_t dev;
  ino_t ino;
  int holds;
};

struct Registry {
  std::mutex mu;
  std::map<uintptr_t, Own> own;                         // by address
  std::map<std::pair<int32_t, uint64_t>, Peer> mapped;  // peers' allocations, by (pid, id)
  uint64_t next_id = 0;
};

// Never destroyed: a buffer may be freed from a static destructor.
Registry& registry() {
  static Registry* r = [] {
    auto* reg = new Registry;
    reg->next_id = std::random_device{}() | (uint64_t{std::random_device{}()} << 32);
    return reg;
  }();
  return *r;
}

// Whether pid's descriptor fd is still the file (dev, ino): false once the owner freed the
// allocation (the descriptor closed, or reused for another) or ended.
bool still_held(int32_t pid, int32_t fd, dev_t dev, ino_t ino) {
  const std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd);
  struct stat st {};
  return stat(path.c_str(), &st) == 0 && st.st_dev == dev && st.st_ino == ino;
}

// Unmaps the peers' allocations that nothing here holds and whose owners freed them: the mapping
// alone would keep their memory for the life of this process. Under r.mu.
void unmap_freed(Registry& r) {
  for (auto it = r.mapped.begin(); it != r.mapped.end();) {
    const Peer& m = it->second;
    if (m.holds > 0 || still_held(it->first.first, m.fd, m.dev, m.ino)) {
      ++it;
      continue;
    }
    munmap(m.base, m.size);
    it = r.mapped.erase(it);
  }
}

}  // namespace

Result<void*> shared_alloc(size_t bytes, void* hint) {
  if (bytes == 0) return make_error(Code::kInvalidArgument, "chorusMemAlloc: size is 0");
  const long page = sysconf(_SC_PAGESIZE);
  if (bytes > (SIZE_MAX >> 1))
    return make_error(Code::kInvalidArgument, "chorusMemAlloc: size {} is too large", bytes);
  const size_t size = (bytes + page - 1) / page * page;
  int fd = memfd_create("chorus-buffer", MFD_CLOEXEC);
  if (fd < 0)
    return make_error(Code::kSystemError, "chorusMemAlloc: memfd_create failed: {}",
                      std::strerror(errno));
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
    const int e = errno;
    close(fd);
    return make_error(Code::kSystemError, "chorusMemAlloc: {} bytes: ftruncate failed: {}", size,
                      std::strerror(e));
  }
  void* p = mmap(hint, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    const int e = errno;
    close(fd);
    return make_error(Code::kSystemError, "chorusMemAlloc: mmap of {} bytes failed: {}", size,
                      std::strerror(e));
  }
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.own[reinterpret_cast<uintptr_t>(p)] = Own{size, fd, r.next_id++};
  return p;
}

Status shared_free(void* p) {
  if (p == nullptr) return Status::ok();  // as free()
  Registry& r = registry();
  Own o;
  {
    std::lock_guard<std::mutex> lock(r.mu);
    auto it = r.own.find(reinterpret_cast<uintptr_t>(p));
    if (it == r.own.end())
      return make_error(Code::kInvalidArgument,
                        "chorusMemFree: {} was not returned by chorusMemAlloc (or is freed "
                        "already)",
                        p);
    o = it->second;
    r.own.erase(it);
  }
  munmap(p, o.size);
  close(o.fd);
  return Status::ok();
}

std::optional<SharedRef> find_shared(const void* p, size_t bytes) {
  Registry& r = registry();
  const auto a = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.own.upper_bound(a);
  if (it == r.own.begin()) return std::nullopt;
  --it;
  const uintptr_t base = it->first;
  const Own& o = it->second;
  if (a - base > o.size || bytes > o.size - (a - base)) return std::nullopt;
  return SharedRef{static_cast<int32_t>(getpid()), o.fd, o.id, o.size, a - base};
}

Result<char*> map_shared(const SharedRef& ref, size_t bytes, bool fail_for_test) {
  if (ref.size == 0 || ref.offset > ref.size || bytes > ref.size - ref.offset)
    return make_error(Code::kInvalidArgument,
                      "shared buffer of pid {}: {} bytes at offset {} lie outside its {} bytes",
                      ref.pid, bytes, ref.offset, ref.size);
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  const auto key = std::make_pair(ref.pid, ref.id);
  auto it = r.mapped.find(key);
  if (it == r.mapped.end()) {
    const std::string path = "/proc/" + std::to_string(ref.pid) + "/fd/" + std::to_string(ref.fd);
    if (fail_for_test)
      return make_error(Code::kSystemError, "opening {} failed: refused by the test hook", path);
    unmap_freed(r);  // a new allocation: perhaps in place of freed ones
    int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0)
      return make_error(Code::kSystemError, "opening {} (a buffer of pid {}) failed: {}", path,
                        ref.pid, std::strerror(errno));
    struct stat st {};
    if (fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) != ref.size) {
      close(fd);
      return make_error(Code::kSystemError, "{} is not pid {}'s buffer of {} bytes", path, ref.pid,
                        ref.size);
    }
    void* p = mmap(nullptr, ref.size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    close(fd);  // the mapping keeps the memory
    if (p == MAP_FAILED)
      return make_error(Code::kSystemError, "mapping {} bytes of pid {} failed: {}", ref.size,
                        ref.pid, std::strerror(errno));
    it = r.mapped
             .emplace(key, Peer{static_cast<char*>(p), ref.size, ref.fd, st.st_dev, st.st_ino, 0})
             .first;
  }
  ++it->second.holds;
  return it->second.base + ref.offset;
}

void release_shared(const SharedRef& ref) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.mapped.find(std::make_pair(ref.pid, ref.id));
  if (it != r.mapped.end() && it->second.holds > 0) --it->second.holds;
}

int shared_peer_mappings() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  return static_cast<int>(r.mapped.size());
}

}  // namespace chorus::transport
