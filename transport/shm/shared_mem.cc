// chorusMemAlloc's buffers (shared_mem.h): one memfd per allocation, and the peers' allocations
// mapped here, each once.
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
#include <utility>

namespace chorus::transport {
namespace {

struct Own {
  size_t size;
  int fd;
  uint64_t id;
};

struct Registry {
  std::mutex mu;
  std::map<uintptr_t, Own> own;                          // by address
  std::map<std::pair<int32_t, uint64_t>, char*> mapped;  // peers' allocations, by (pid, id)
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

}  // namespace

Result<void*> shared_alloc(size_t bytes) {
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
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
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
    it = r.mapped.emplace(key, static_cast<char*>(p)).first;
  }
  return it->second + ref.offset;
}

}  // namespace chorus::transport
