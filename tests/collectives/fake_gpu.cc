#include "fake_gpu.h"

#include <fmt/format.h>

#include <fcntl.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "kernels/cpu/reduce.h"
#include "kernels/cuda/ipc.h"
#include "kernels/cuda/memory.h"
#include "transport/shm/shared_mem.h"

namespace chorus::test {
namespace {

namespace kc = kernels::cuda;
constexpr int kTimedOut = 702;  // cudaErrorLaunchTimeout
constexpr int kNoGraph = 901;   // cudaErrorStreamCaptureInvalidated: no graph being captured
static_assert(sizeof(transport::SharedRef) <= sizeof(kc::IpcHandle::bytes));

kc::PointerInfo classify(const void* p) {
  if (p != nullptr && transport::find_shared(p, 1)) return {kc::MemSpace::kDevice, 0};
  return {};
}

// fake_unmapped_alloc's blocks: start -> bytes.
struct Unmapped {
  std::mutex mu;
  std::map<const char*, size_t> blocks;
};
Unmapped& unmapped() {
  static Unmapped* u = new Unmapped;
  return *u;
}
bool is_unmapped(const void* p) {
  Unmapped& u = unmapped();
  std::lock_guard<std::mutex> lock(u.mu);
  auto it = u.blocks.upper_bound(static_cast<const char*>(p));
  if (it == u.blocks.begin()) return false;
  --it;
  return static_cast<const char*>(p) < it->first + it->second;
}

// fake_vmm_alloc's blocks (their starts), the retains of each allocation (by its SharedRef id),
// where each identity's allocation starts, and the descriptors exported.
struct Vmm {
  std::mutex mu;
  std::map<const void*, bool> blocks;
  std::map<uint64_t, int> retains;
  std::map<uint64_t, const char*> base_of;
  int exported = 0;
};
Vmm& vmm() {
  static Vmm* v = new Vmm;
  return *v;
}

int vmm_identify(const void* p, size_t bytes, kc::VmmAllocation* out) {
  std::optional<transport::SharedRef> ref = transport::find_shared(p, bytes == 0 ? 1 : bytes);
  if (!ref) return kc::kNotFdExportable;
  const char* base = static_cast<const char*>(p) - ref->offset;
  Vmm& v = vmm();
  std::lock_guard<std::mutex> lock(v.mu);
  if (!v.blocks.count(base)) return kc::kNotFdExportable;
  ++v.retains[ref->id];
  v.base_of[ref->id] = base;
  *out = kc::VmmAllocation{ref->id, uint64_t(reinterpret_cast<uintptr_t>(base)), ref->size};
  return 0;
}

int vmm_release(uint64_t identity) {
  Vmm& v = vmm();
  std::lock_guard<std::mutex> lock(v.mu);
  auto it = v.retains.find(identity);
  if (it == v.retains.end() || it->second == 0) return 1;
  --it->second;
  return 0;
}

int vmm_export_fd(uint64_t identity, int* fd) {
  *fd = -1;
  Vmm& v = vmm();
  std::lock_guard<std::mutex> lock(v.mu);
  if (!v.retains.count(identity) || v.retains[identity] == 0) return 1;  // not retained
  std::optional<transport::SharedRef> ref = transport::find_shared(v.base_of[identity], 1);
  if (!ref || ref->id != identity) return 1;
  *fd = fcntl(ref->fd, F_DUPFD_CLOEXEC, 0);
  if (*fd < 0) return 2;
  ++v.exported;
  return 0;
}

std::atomic<int> g_vmm_mapped{0};
// IPC closes and VMM unmaps made while a capture was under way (fake_closes_in_capture).
std::atomic<int> g_closes_in_capture{0};
void count_if_capturing();  // below, beside the captures

int vmm_map(int fd, uint64_t size, void** out) {
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return 2;
  *out = p;
  ++g_vmm_mapped;
  return 0;
}

int vmm_unmap(void* p, uint64_t size) {
  count_if_capturing();
  if (munmap(p, size) != 0) return 1;
  --g_vmm_mapped;
  return 0;
}

int export_buffer(const void* p, kc::IpcHandle* out) {
  std::optional<transport::SharedRef> ref = transport::find_shared(p, 1);
  if (!ref) return 1;  // cudaErrorInvalidValue
  if (is_unmapped(p)) return kc::kNotLegacyIpc;
  *out = {};
  out->offset = ref->offset;
  out->base = uint64_t(reinterpret_cast<uintptr_t>(p)) - ref->offset;
  out->size = ref->size;
  ref->offset = 0;
  std::memcpy(out->bytes, &*ref, sizeof *ref);
  return 0;
}

// An allocation's identity: its SharedRef id, which no other allocation of the process has.
int buffer_id(const void* p, uint64_t* id) {
  *id = 0;
  std::optional<transport::SharedRef> ref = transport::find_shared(p, 1);
  if (!ref) return kc::kNotAllocated;
  *id = ref->id;
  return 0;
}

// The allocations open here (each held once by map_shared, as CUDA IPC opens each once), by
// (pid, id), with the file each is (st_dev, st_ino of the owner's descriptor); and how many
// close released.
std::mutex g_open_mu;
std::map<std::pair<int32_t, uint64_t>, std::pair<dev_t, ino_t>>* g_open =
    new std::map<std::pair<int32_t, uint64_t>, std::pair<dev_t, ino_t>>;
std::atomic<int> g_closes{0};

// The file behind the owner's descriptor of `ref` ({0, 0}: none, the owner freed it or ended).
std::pair<dev_t, ino_t> owner_file(const transport::SharedRef& ref) {
  struct stat st {};
  const std::string path = "/proc/" + std::to_string(ref.pid) + "/fd/" + std::to_string(ref.fd);
  if (stat(path.c_str(), &st) != 0) return {0, 0};
  return {st.st_dev, st.st_ino};
}

int open(const kc::IpcHandle& h, void** out) {
  transport::SharedRef ref;
  std::memcpy(&ref, h.bytes, sizeof ref);
  // CUDA refuses a process's own handles ("invalid device context"): ranks that are threads of
  // one process must not come here.
  if (ref.pid == getpid()) return 201;
  // Held until close (as CUDA IPC's mappings are, kernels/cuda/ipc.h); after it, unmapped once
  // the owner has freed the memory (at a later new mapping, transport/shm/shared_mem.h).
  std::lock_guard<std::mutex> lock(g_open_mu);
  const bool first = !g_open->count({ref.pid, ref.id});
  Result<char*> base = transport::map_shared(ref, 1);
  if (!base.is_ok()) return 1;
  if (first)
    g_open->emplace(std::make_pair(ref.pid, ref.id), owner_file(ref));
  else
    transport::release_shared(ref);  // one hold an allocation
  *out = *base + h.offset;
  return 0;
}

// Closes h's allocation. On a GPU that unmaps it here at once, while the emulation's mapping
// would stay as long as its owner holds it: closing one the owner still holds -- which chorus
// does only by mistake, queued work of this process may still use the mapping -- ends the process
// here, naming it.
void close_handle(const kc::IpcHandle& h) {
  transport::SharedRef ref;
  std::memcpy(&ref, h.bytes, sizeof ref);
  std::lock_guard<std::mutex> lock(g_open_mu);
  auto it = g_open->find({ref.pid, ref.id});
  if (it == g_open->end()) return;
  if (owner_file(ref) == it->second) {
    std::fprintf(stderr,
                 "fake_gpu: an allocation of pid %d that its owner still holds was closed; on a "
                 "GPU the work that uses the mapping would fault\n",
                 int(ref.pid));
    std::abort();
  }
  g_open->erase(it);
  transport::release_shared(ref);
  ++g_closes;
  count_if_capturing();
}

int flags_alloc(size_t bytes, void** out) {
  *out = fake_device_alloc(bytes);
  return *out ? 0 : 2;  // cudaErrorMemoryAllocation
}

std::atomic<int> g_flags_frees{0};

void flags_free(void* p) {
  if (p == nullptr) return;
  fake_device_free(p);
  ++g_flags_frees;
}

// Host words: this process's memory (a stream of this process waits on them).
int host_words_alloc(size_t bytes, void** out) {
  *out = std::calloc(1, bytes);
  return *out ? 0 : 2;  // cudaErrorMemoryAllocation
}

// Host memory registered (host_register): the ranges, in this process; while g_register_fails,
// refused as CUDA refuses memory it cannot map at the same address.
std::mutex g_registered_mu;
std::vector<std::pair<const char*, size_t>>* g_registered =
    new std::vector<std::pair<const char*, size_t>>;
std::atomic<bool> g_register_fails{false};

int host_register(void* p, size_t bytes) {
  if (g_register_fails.load()) return kc::kNotLegacyIpc;
  std::lock_guard<std::mutex> lock(g_registered_mu);
  for (const auto& [at, n] : *g_registered)
    if (at == p) return 0;  // registered already (one mapping reached twice)
  g_registered->push_back({static_cast<const char*>(p), bytes});
  return 0;
}

void host_unregister(void* p) {
  std::lock_guard<std::mutex> lock(g_registered_mu);
  std::erase_if(*g_registered, [p](const auto& r) { return r.first == p; });
}

std::atomic<int> g_flags_releases{0};
std::atomic<void*> g_one_queue{nullptr};  // fake_one_queue's stream
int on_stream(void* stream, std::function<int()> op);

// A stream write: at once, or, with one hardware queue (fake_one_queue), behind that queue's work.
int flags_release(int, void* flags, const uint32_t* values, size_t count) {
  ++g_flags_releases;
  std::vector<uint32_t> v(values, values + count);
  auto write = [flags, v] {
    for (size_t i = 0; i < v.size(); ++i)
      __atomic_store_n(static_cast<uint32_t*>(flags) + i, v[i], __ATOMIC_RELEASE);
    return 0;
  };
  if (void* queue = g_one_queue.load()) return on_stream(queue, write);
  return write();
}

std::atomic<void*> g_last_stream{nullptr};

// fake_async_stream's streams: each runs its operations in order on a thread of its own.
struct AsyncStream {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::function<int()>> ops;
  bool running = false, stop = false;
  int first_error = 0;
  std::thread worker;
};
std::mutex g_async_mu;
std::set<void*>* g_async = new std::set<void*>;

AsyncStream* async_of(void* stream) {
  std::lock_guard<std::mutex> lock(g_async_mu);
  return g_async->count(stream) ? static_cast<AsyncStream*>(stream) : nullptr;
}

void async_loop(AsyncStream* a) {
  std::unique_lock<std::mutex> lock(a->mu);
  while (true) {
    a->cv.wait(lock, [&] { return a->stop || !a->ops.empty(); });
    if (a->ops.empty()) return;
    std::function<int()> op = std::move(a->ops.front());
    a->ops.pop_front();
    a->running = true;
    lock.unlock();
    const int rc = op();
    lock.lock();
    if (rc != 0 && a->first_error == 0) a->first_error = rc;
    a->running = false;
    a->cv.notify_all();
  }
}

// fake_capture_begin's streams and what each has captured so far; fake_capturing's streams.
// A captured graph: its operations, and the destructors of its user objects (graph_destructor),
// run when it is freed.
struct Graph {
  std::vector<std::function<int()>> ops;
  std::vector<std::pair<void (*)(void*), void*>> destructors;
  Graph() = default;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  ~Graph() {
    for (auto& [fn, arg] : destructors) fn(arg);
  }
};
std::mutex g_capture_mu;
std::map<void*, Graph*>* g_captures = new std::map<void*, Graph*>;
std::set<void*>* g_capturing = new std::set<void*>;

// While captured: recorded (0); on an async stream: queued (0); on any other: done now (its
// result).
int on_stream(void* stream, std::function<int()> op) {
  g_last_stream.store(stream);
  {
    std::lock_guard<std::mutex> lock(g_capture_mu);
    if (auto it = g_captures->find(stream); it != g_captures->end()) {
      it->second->ops.push_back(std::move(op));
      return 0;
    }
  }
  AsyncStream* a = async_of(stream);
  if (a == nullptr) return op();
  std::lock_guard<std::mutex> lock(a->mu);
  a->ops.push_back(std::move(op));
  a->cv.notify_all();
  return 0;
}

int sync_stream(void* stream) {
  AsyncStream* a = async_of(stream);
  if (a == nullptr) return 0;
  std::unique_lock<std::mutex> lock(a->mu);
  a->cv.wait(lock, [&] { return a->ops.empty() && !a->running; });
  return a->first_error;
}

// pinned_alloc's blocks (start -> bytes): a copy from them reads when it runs.
std::mutex g_pinned_mu;
std::map<const char*, size_t>* g_pinned = new std::map<const char*, size_t>;

bool is_pinned(const void* p) {
  std::lock_guard<std::mutex> lock(g_pinned_mu);
  auto it = g_pinned->upper_bound(static_cast<const char*>(p));
  if (it == g_pinned->begin()) return false;
  --it;
  return static_cast<const char*>(p) < it->first + it->second;
}

std::atomic<bool> g_pinned_fails{false};
std::function<void()>* g_before_pinned_failure = new std::function<void()>;  // under g_pinned_mu

int pinned_alloc(size_t bytes, void** out) {
  *out = nullptr;
  if (g_pinned_fails.load()) {
    std::function<void()> before;
    {
      std::lock_guard<std::mutex> lock(g_pinned_mu);
      before.swap(*g_before_pinned_failure);  // once
    }
    if (before) before();
    return 2;
  }
  *out = std::calloc(1, bytes == 0 ? 1 : bytes);
  if (*out == nullptr) return 2;
  std::lock_guard<std::mutex> lock(g_pinned_mu);
  (*g_pinned)[static_cast<const char*>(*out)] = bytes == 0 ? 1 : bytes;
  return 0;
}

std::atomic<int> g_frees_in_capture{0};

void count_if_capturing() {
  std::lock_guard<std::mutex> lock(g_capture_mu);
  if (!g_captures->empty()) ++g_closes_in_capture;
}
std::atomic<int> g_pinned_frees{0};

void pinned_free(void* p) {
  if (p == nullptr) return;
  ++g_pinned_frees;
  {
    std::lock_guard<std::mutex> lock(g_capture_mu);
    if (!g_captures->empty()) ++g_frees_in_capture;
  }
  {
    std::lock_guard<std::mutex> lock(g_pinned_mu);
    g_pinned->erase(static_cast<const char*>(p));
  }
  std::free(p);
}

int write_u32(void* stream, void* word, uint32_t v) {
  return on_stream(stream, [word, v] {
    __atomic_store_n(static_cast<uint32_t*>(word), v, __ATOMIC_RELEASE);
    return 0;
  });
}

std::atomic<int> g_wait_delay_ms{0};

int wait_u32_geq(void* stream, const void* word, uint32_t v) {
  return on_stream(stream, [word, v] {
    if (int ms = g_wait_delay_ms.load()) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    // CU_STREAM_WAIT_VALUE_GEQ's comparison: cyclic, (int32_t)(*word - v) >= 0.
    while (static_cast<int32_t>(
               __atomic_load_n(static_cast<const uint32_t*>(word), __ATOMIC_ACQUIRE) - v) < 0) {
      if (std::chrono::steady_clock::now() > end) return kTimedOut;
      sched_yield();
    }
    return 0;
  });
}

// The one mark there is (every stream operation is done when enqueued), the stream its latest
// record was made on, and what was asked of marks (fake_mark_log).
char g_mark;
std::atomic<void*> g_mark_stream{nullptr};
std::mutex g_mark_mu;
std::vector<std::string>* g_mark_log = new std::vector<std::string>;

std::string stream_name(void* s) {
  return fmt::format("{}", s);
}

// Marks recorded on async streams: reached when their stream gets there. Records are numbered:
// as cudaStreamWaitEvent, a wait is for the latest record when it is enqueued, not for one
// recorded after it (which a single flag, reset by that later record, would make it wait for).
struct AsyncMark {
  std::atomic<uint64_t> recorded{0};  // records enqueued
  std::atomic<uint64_t> reached{0};   // the latest record its stream got past
};
std::set<void*>* g_async_marks = new std::set<void*>;  // under g_mark_mu
std::atomic<bool> g_marks_stuck{false};                // fake_marks_stuck

AsyncMark* async_mark(void* mark) {
  std::lock_guard<std::mutex> lock(g_mark_mu);
  return g_async_marks->count(mark) ? static_cast<AsyncMark*>(mark) : nullptr;
}

std::atomic<int> g_fail_marks{0};

int mark_record(void* stream, void** mark) {
  if (g_fail_marks.load() > 0 && g_fail_marks.fetch_sub(1) > 0) return 999;  // cudaErrorUnknown
  g_mark_stream.store(stream);
  if (async_of(stream) != nullptr) {
    AsyncMark* m = async_mark(*mark);
    if (m == nullptr) {
      m = new AsyncMark;
      std::lock_guard<std::mutex> lock(g_mark_mu);
      g_async_marks->insert(m);
    }
    *mark = m;
    const uint64_t n = ++m->recorded;
    return on_stream(stream, [m, n] {
      m->reached.store(n);
      return 0;
    });
  }
  if (AsyncMark* m = async_mark(*mark)) {
    m->reached.store(++m->recorded);
  } else {
    *mark = &g_mark;
  }
  std::lock_guard<std::mutex> lock(g_mark_mu);
  g_mark_log->push_back("record on " + stream_name(stream));
  return 0;
}

int mark_wait(void* stream, void* mark) {
  if (AsyncMark* m = async_mark(mark))
    return on_stream(stream, [m, n = m->recorded.load()] {
      const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      while (m->reached.load() < n)
        if (std::chrono::steady_clock::now() > end) return kTimedOut;
      return 0;
    });
  if (mark != nullptr && mark != &g_mark) return 400;  // cudaErrorInvalidResourceHandle
  std::lock_guard<std::mutex> lock(g_mark_mu);
  g_mark_log->push_back("wait on " + stream_name(stream) + " for " +
                        (mark ? "the record on " + stream_name(g_mark_stream.load()) : "none"));
  return 0;
}

int mark_done(int device, void* mark) {
  if (mark == nullptr) return 400;
  if (device != 0) return 101;  // cudaErrorInvalidDevice: the emulated GPU is device 0
  if (g_marks_stuck.load()) return kc::kStampNotReady;
  AsyncMark* m = async_mark(mark);
  if (m == nullptr) return mark == &g_mark ? 0 : 400;
  return m->reached.load() >= m->recorded.load() ? 0 : kc::kStampNotReady;
}

void mark_free(void* mark) {
  if (AsyncMark* m = async_mark(mark)) {
    {
      std::lock_guard<std::mutex> lock(g_mark_mu);
      g_async_marks->erase(m);
    }
    delete m;
  }
}

// A time stamp is the host's clock when it is enqueued: the work before it is done by then.
int stamp_record(void* stream, void** stamp) {
  g_last_stream.store(stream);
  if (*stamp == nullptr) *stamp = new std::chrono::steady_clock::time_point;
  *static_cast<std::chrono::steady_clock::time_point*>(*stamp) = std::chrono::steady_clock::now();
  return 0;
}

int stamp_ms(void* from, void* to, float* ms) {
  using Point = std::chrono::steady_clock::time_point;
  *ms = std::chrono::duration<float, std::milli>(*static_cast<Point*>(to) -
                                                 *static_cast<Point*>(from))
            .count();
  return 0;
}

void stamp_free(void* stamp) {
  delete static_cast<std::chrono::steady_clock::time_point*>(stamp);
}

int fold(kernels::DType t, kernels::RedOp op, const void* const* in, int w, void* const* out,
         int nout, size_t n, int avg_n, void* stream) {
  if (w < 1 || nout < 1) return 1;
  std::vector<const void*> ins(in, in + w);
  std::vector<void*> outs(out, out + nout);
  return on_stream(stream, [=] {
    kernels::reduce_fold(t, op, ins.data(), w, outs[0], n, avg_n);
    for (int o = 1; o < nout; ++o) std::memmove(outs[o], outs[0], n * kernels::dtype_size(t));
    return 0;
  });
}

int to_host_async(void* dst, const void* src, size_t bytes, void* stream) {
  if (bytes == 0) return 0;
  return on_stream(stream, [=] {
    std::memcpy(dst, src, bytes);
    return 0;
  });
}

// copy_to_device: from pinned memory, read when the copy runs; from any other, now.
int to_device(void* dst, const void* src, size_t bytes, void* stream) {
  if (bytes == 0) return 0;
  if (async_of(stream) == nullptr || is_pinned(src))
    return on_stream(stream, [=] {
      std::memcpy(dst, src, bytes);
      return 0;
    });
  auto staged = std::make_shared<std::vector<char>>(static_cast<const char*>(src),
                                                    static_cast<const char*>(src) + bytes);
  return on_stream(stream, [=] {
    std::memcpy(dst, staged->data(), bytes);
    return 0;
  });
}

int capturing(void* stream, int* out) {
  std::lock_guard<std::mutex> lock(g_capture_mu);
  *out = g_capturing->count(stream) || g_captures->count(stream) ? 1 : 0;
  return 0;
}

int host_func(void* stream, void (*fn)(void*), void* arg) {
  return on_stream(stream, [fn, arg] {
    fn(arg);
    return 0;
  });
}

// Only a real capture (fake_capture_begin) has a graph to hold it.
int graph_destructor(void* stream, void (*fn)(void*), void* arg) {
  std::lock_guard<std::mutex> lock(g_capture_mu);
  auto it = g_captures->find(stream);
  if (it == g_captures->end()) return kNoGraph;
  it->second->destructors.push_back({fn, arg});
  return 0;
}

int current_device() {
  return 0;
}

std::string error_string(int rc) {
  if (rc == kTimedOut) return "the emulated stream's wait timed out (30 s)";
  if (rc == kNoGraph) return "the emulated stream has no graph being captured";
  return "emulated CUDA error " + std::to_string(rc);
}

const kc::IpcBackend kFake{.export_buffer = export_buffer,
                           .open = open,
                           .close = close_handle,
                           .buffer_id = buffer_id,
                           .flags_alloc = flags_alloc,
                           .flags_free = flags_free,
                           .host_words_alloc = host_words_alloc,
                           .host_register = host_register,
                           .host_unregister = host_unregister,
                           .flags_release = flags_release,
                           .write_u32 = write_u32,
                           .wait_u32_geq = wait_u32_geq,
                           .mark_record = mark_record,
                           .mark_wait = mark_wait,
                           .stamp_record = stamp_record,
                           .stamp_ms = stamp_ms,
                           .stamp_free = stamp_free,
                           .fold = fold,
                           .to_device = to_device,
                           .pinned_alloc = pinned_alloc,
                           .pinned_free = pinned_free,
                           .to_host_async = to_host_async,
                           .capturing = capturing,
                           .graph_destructor = graph_destructor,
                           .host_func = host_func,
                           .mark_done = mark_done,
                           .mark_free = mark_free,
                           .current_device = current_device,
                           .error_string = error_string,
                           .vmm_identify = vmm_identify,
                           .vmm_release = vmm_release,
                           .vmm_export_fd = vmm_export_fd,
                           .vmm_map = vmm_map,
                           .vmm_unmap = vmm_unmap};

}  // namespace

void install_fake_gpu() {
  kc::set_ipc_backend_for_test(&kFake);
  kc::set_pointer_classifier_for_test(classify);
}

void* fake_device_alloc(size_t bytes) {
  return fake_device_alloc_at(nullptr, bytes);
}

void* fake_device_alloc_at(void* at, size_t bytes) {
  Result<void*> p = transport::shared_alloc(bytes == 0 ? 1 : bytes, at);
  if (!p.is_ok()) {
    std::fprintf(stderr, "fake_device_alloc: %s\n", p.status().message().c_str());
    return nullptr;
  }
  return *p;
}

void fake_device_free(void* p) {
  {
    Unmapped& u = unmapped();
    std::lock_guard<std::mutex> lock(u.mu);
    u.blocks.erase(static_cast<const char*>(p));
  }
  {
    Vmm& v = vmm();
    std::lock_guard<std::mutex> lock(v.mu);
    v.blocks.erase(p);
  }
  (void)transport::shared_free(p);
}

std::vector<std::string> fake_mark_log() {
  std::lock_guard<std::mutex> lock(g_mark_mu);
  return *g_mark_log;
}

void* fake_last_stream() {
  return g_last_stream.load();
}

void* fake_unmapped_alloc(size_t bytes) {
  void* p = fake_device_alloc(bytes);
  if (p != nullptr) {
    Unmapped& u = unmapped();
    std::lock_guard<std::mutex> lock(u.mu);
    u.blocks[static_cast<const char*>(p)] = bytes == 0 ? 1 : bytes;
  }
  return p;
}

}  // namespace chorus::test

namespace chorus::test {

void* fake_vmm_alloc(size_t bytes) {
  void* p = fake_unmapped_alloc(bytes);
  if (p != nullptr) {
    Vmm& v = vmm();
    std::lock_guard<std::mutex> lock(v.mu);
    v.blocks[p] = true;
  }
  return p;
}

int fake_vmm_retained() {
  Vmm& v = vmm();
  std::lock_guard<std::mutex> lock(v.mu);
  int n = 0;
  for (const auto& [id, count] : v.retains) n += count;
  return n;
}

int fake_vmm_exported() {
  Vmm& v = vmm();
  std::lock_guard<std::mutex> lock(v.mu);
  return v.exported;
}

void* fake_async_stream() {
  auto* a = new AsyncStream;
  a->worker = std::thread(async_loop, a);
  std::lock_guard<std::mutex> lock(g_async_mu);
  g_async->insert(a);
  return a;
}

int fake_stream_sync(void* stream) {
  return sync_stream(stream);
}

void fake_capture_begin(void* stream) {
  std::lock_guard<std::mutex> lock(g_capture_mu);
  g_captures->emplace(stream, new Graph);
}

void* fake_capture_end(void* stream) {
  std::lock_guard<std::mutex> lock(g_capture_mu);
  auto it = g_captures->find(stream);
  if (it == g_captures->end()) return nullptr;
  Graph* g = it->second;
  g_captures->erase(it);
  return g;
}

int fake_graph_launch(void* graph, void* stream) {
  for (const std::function<int()>& op : static_cast<Graph*>(graph)->ops)
    if (int rc = on_stream(stream, op); rc != 0) return rc;
  return 0;
}

int fake_graph_ops(void* graph) {
  return static_cast<int>(static_cast<Graph*>(graph)->ops.size());
}

void fake_graph_free(void* graph) {
  delete static_cast<Graph*>(graph);
}

void fake_graph_free_later(void* graph, int ms) {
  std::thread([graph, ms] {
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    delete static_cast<Graph*>(graph);
  }).detach();
}

void fake_stream_delay(void* stream, int ms) {
  (void)on_stream(stream, [ms] {
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    return 0;
  });
}

void fake_fail_marks(int n) {
  g_fail_marks.store(n);
}

void fake_wait_delay(int ms) {
  g_wait_delay_ms.store(ms);
}

void fake_capturing(void* stream, bool on) {
  std::lock_guard<std::mutex> lock(g_capture_mu);
  if (on) {
    g_capturing->insert(stream);
  } else {
    g_capturing->erase(stream);
  }
}

void fake_marks_stuck(bool stuck) {
  g_marks_stuck.store(stuck);
}

int fake_closes_in_capture() {
  return g_closes_in_capture.load();
}

int fake_frees_in_capture() {
  return g_frees_in_capture.load();
}

void fake_pinned_alloc_fails(bool on) {
  g_pinned_fails.store(on);
}

void fake_before_pinned_failure(std::function<void()> fn) {
  std::lock_guard<std::mutex> lock(g_pinned_mu);
  *g_before_pinned_failure = std::move(fn);
}

int fake_pinned_live() {
  std::lock_guard<std::mutex> lock(g_pinned_mu);
  return static_cast<int>(g_pinned->size());
}

int fake_pinned_frees() {
  return g_pinned_frees.load();
}

int fake_vmm_mapped() {
  return g_vmm_mapped.load();
}

int fake_flags_frees() {
  return g_flags_frees.load();
}

int fake_ipc_closes() {
  return g_closes.load();
}

int fake_host_registered() {
  std::lock_guard<std::mutex> lock(g_registered_mu);
  return int(g_registered->size());
}

void fake_host_register_fails(bool on) {
  g_register_fails.store(on);
}

int fake_flags_releases() {
  return g_flags_releases.load();
}

void fake_one_queue(void* stream) {
  g_one_queue.store(stream);
}

}  // namespace chorus::test
