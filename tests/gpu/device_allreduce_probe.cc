// [cuda] chorusAllReduce (and the other device collectives, send/recv in groups and the barrier
// with a stream) on device buffers between processes sharing device 0 (CUDA IPC; run by
// tests/gpu/run.sh where a GPU is lent):
//   device_allreduce_probe CHORUS_RUN [NRANKS...]   runs the workers on 2 and 3 ranks (or the
//                                                   counts given) with CHORUS_ALLOW_SHARED_GPU=1
//   device_allreduce_probe --die-worker             one rank of 3 with CHORUS_TEST_DEVICE_DIE=1:
//                                                   rank 1 dies mid-call; the others name it
//   CHORUS_PROBE_STAGED=1 (either form)             each rank on a host of its own: the staged
//                                                   path instead of CUDA IPC
//   device_allreduce_probe --worker                 one rank: every type x op x count x in/out of
//                                                   place x offset against a host reference;
//                                                   the other calls on cudaMalloc,
//                                                   cudaMallocAsync and VMM memory (VMM that
//                                                   exports as a file descriptor mapped by the
//                                                   peers through it, the rest through the
//                                                   bounce buffer; calls alternating between
//                                                   streams too);
//                                                   stream order without host synchronisation;
//                                                   buffers freed and allocated again, and
//                                                   freed with nothing where they lay, and
//                                                   communicators destroyed (the GPU's memory
//                                                   comes back);
//                                                   calls captured into a CUDA graph, replayed
//                                                   (a barrier 2000 times back to back);
//                                                   errors named on every rank; bandwidth.
// Exits 77 with the reason where no GPU is visible.
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <chorus/chorus.h>

namespace {

int g_rank = 0, g_size = 1, g_failed = 0;

#define CK(x)                                                                                     \
  do {                                                                                            \
    cudaError_t e_ = (x);                                                                         \
    if (e_ != cudaSuccess) {                                                                      \
      std::printf("[%d] %s:%d %s: %s\n", g_rank, __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(10);                                                                              \
    }                                                                                             \
  } while (0)

void fail(const std::string& what) {
  if (g_failed++ < 20) std::printf("[%d] FAIL %s\n", g_rank, what.c_str());
}

const int kTypes[] = {chorusInt8,   chorusUint8,   chorusInt32,   chorusUint32,  chorusInt64,
                      chorusUint64, chorusFloat16, chorusFloat32, chorusFloat64, chorusBfloat16};
const char* kTypeNames[] = {"i8", "u8", "i32", "u32", "i64", "u64", "f16", "f32", "f64", "bf16"};
const char* kOpNames[] = {"sum", "prod", "max", "min", "avg"};

size_t type_size(int t) {
  switch (t) {
    case chorusInt8:
    case chorusUint8:
      return 1;
    case chorusFloat16:
    case chorusBfloat16:
      return 2;
    case chorusInt32:
    case chorusUint32:
    case chorusFloat32:
      return 4;
  }
  return 8;
}

// Small integers (1, 2, 3) in any type, so that sum, prod, min and max are exact everywhere.
void put(int t, void* base, size_t i, int v) {
  static const uint16_t half[] = {0, 0x3C00, 0x4000, 0x4200}, bf[] = {0, 0x3F80, 0x4000, 0x4040};
  switch (t) {
    case chorusInt8:
      static_cast<int8_t*>(base)[i] = int8_t(v);
      break;
    case chorusUint8:
      static_cast<uint8_t*>(base)[i] = uint8_t(v);
      break;
    case chorusInt32:
      static_cast<int32_t*>(base)[i] = v;
      break;
    case chorusUint32:
      static_cast<uint32_t*>(base)[i] = uint32_t(v);
      break;
    case chorusInt64:
      static_cast<int64_t*>(base)[i] = v;
      break;
    case chorusUint64:
      static_cast<uint64_t*>(base)[i] = uint64_t(v);
      break;
    case chorusFloat16:
      static_cast<uint16_t*>(base)[i] = half[v];
      break;
    case chorusBfloat16:
      static_cast<uint16_t*>(base)[i] = bf[v];
      break;
    case chorusFloat32:
      static_cast<float*>(base)[i] = float(v);
      break;
    case chorusFloat64:
      static_cast<double*>(base)[i] = double(v);
      break;
  }
}

double half_to_double(uint16_t h) {
  int e = (h >> 10) & 31, m = h & 1023;
  double v = e == 0 ? std::ldexp(m, -24) : e == 31 ? INFINITY : std::ldexp(1024 + m, e - 25);
  return (h & 0x8000) ? -v : v;
}

double get(int t, const void* base, size_t i) {
  switch (t) {
    case chorusInt8:
      return static_cast<const int8_t*>(base)[i];
    case chorusUint8:
      return static_cast<const uint8_t*>(base)[i];
    case chorusInt32:
      return static_cast<const int32_t*>(base)[i];
    case chorusUint32:
      return static_cast<const uint32_t*>(base)[i];
    case chorusInt64:
      return double(static_cast<const int64_t*>(base)[i]);
    case chorusUint64:
      return double(static_cast<const uint64_t*>(base)[i]);
    case chorusFloat16:
      return half_to_double(static_cast<const uint16_t*>(base)[i]);
    case chorusBfloat16: {
      uint32_t bits = uint32_t(static_cast<const uint16_t*>(base)[i]) << 16;
      float f;
      std::memcpy(&f, &bits, 4);
      return f;
    }
    case chorusFloat32:
      return static_cast<const float*>(base)[i];
    case chorusFloat64:
      return static_cast<const double*>(base)[i];
  }
  return NAN;
}

int value(int rank, size_t i) {
  return 1 + int((size_t(rank) + i) % 3);
}

double expected(int op, int t, size_t i) {
  double sum = 0, prod = 1, mx = 0, mn = 1e9;
  for (int q = 0; q < g_size; ++q) {
    int v = value(q, i);
    sum += v;
    prod *= v;
    mx = v > mx ? v : mx;
    mn = v < mn ? v : mn;
  }
  switch (op) {
    case chorusSum:
      return sum;
    case chorusProd:
      return prod;
    case chorusMax:
      return mx;
    case chorusMin:
      return mn;
  }
  bool is_float =
      t == chorusFloat16 || t == chorusFloat32 || t == chorusFloat64 || t == chorusBfloat16;
  return is_float ? sum / g_size : std::trunc(sum / g_size);
}

bool close(int t, double got, double want) {
  double tol = t == chorusFloat16 || t == chorusBfloat16 ? 1e-2 : t == chorusFloat32 ? 1e-6 : 0;
  return std::fabs(got - want) <= tol * std::fmax(1.0, std::fabs(want));
}

// Every type x op x count x in/out of place x element offset, on `stream`.
int correctness(chorusComm_t comm, cudaStream_t stream) {
  // CHORUS_CUDA_TEST_QUICK=1 (under compute-sanitizer): the small counts only.
  const bool quick = std::getenv("CHORUS_CUDA_TEST_QUICK") != nullptr;
  const size_t counts[] = {1, 7, 1031, quick ? 1031 : (size_t(1) << 20) + 3};
  const size_t most = (size_t(1) << 20) + 8;
  char *send, *recv;
  CK(cudaMalloc(&send, most * 8));
  CK(cudaMalloc(&recv, most * 8));
  std::vector<char> host(most * 8), back(most * 8);
  int cases = 0;
  for (int ti = 0; ti < 10; ++ti)
    for (int op = 0; op < 5; ++op)
      for (size_t count : counts)
        for (int in_place = 0; in_place < 2; ++in_place)
          for (size_t offset : {size_t(0), size_t(1)}) {
            const int t = kTypes[ti];
            const size_t es = type_size(t);
            for (size_t i = 0; i < count; ++i) put(t, host.data(), i, value(g_rank, i));
            char* s = send + offset * es;
            char* r = in_place ? s : recv + offset * es;
            CK(cudaMemcpyAsync(s, host.data(), count * es, cudaMemcpyHostToDevice, stream));
            if (!in_place) CK(cudaMemsetAsync(r, 0xEE, count * es, stream));
            chorusResult_t rc =
                chorusAllReduce(s, r, count, chorusDataType_t(t), chorusRedOp_t(op), comm, stream);
            std::string name = std::string(kTypeNames[ti]) + " " + kOpNames[op] + " count " +
                               std::to_string(count) + (in_place ? " in place" : "") + " offset " +
                               std::to_string(offset);
            if (rc != chorusSuccess) {
              fail(name + ": " + chorusGetLastError(comm));
              return 1;
            }
            CK(cudaMemcpyAsync(back.data(), r, count * es, cudaMemcpyDeviceToHost, stream));
            CK(cudaStreamSynchronize(stream));
            size_t wrong = 0, first = 0;
            for (size_t i = 0; i < count; ++i)
              if (!close(t, get(t, back.data(), i), expected(op, t, i)) && wrong++ == 0) first = i;
            if (wrong)
              fail(name + ": " + std::to_string(wrong) + " wrong, first at " +
                   std::to_string(first) + ": got " + std::to_string(get(t, back.data(), first)) +
                   " want " + std::to_string(expected(op, t, first)));
            cases++;
          }
  CK(cudaFree(send));
  CK(cudaFree(recv));
  return cases;
}

// Device memory of each kind a caller may hand over: cudaMalloc (CUDA IPC maps it), stream-ordered
// (cudaMallocAsync, the default pool) and VMM (cuMem, as PyTorch's expandable segments), which
// CUDA IPC cannot map: VMM memory that exports as a file descriptor is mapped by the peers through
// it (collectives/device_vmm.h), the rest goes through the bounce buffer
// (collectives/device_bounce.h).
// kAsyncFdPool: stream-ordered memory of a pool made to export as a file descriptor, which says
// so of its pieces too, but a piece is no allocation of its own: the bounce buffer takes it.
enum class Mem { kMalloc, kAsync, kVmm, kVmmNoFd, kAsyncFdPool };
const char* mem_name(Mem m) {
  return m == Mem::kMalloc        ? "cudaMalloc"
         : m == Mem::kAsync       ? "cudaMallocAsync"
         : m == Mem::kVmm         ? "VMM (cuMem, exported by file descriptor)"
         : m == Mem::kAsyncFdPool ? "cudaMallocFromPoolAsync (a pool exported by descriptor)"
                                  : "VMM (cuMem, no shareable handle)";
}

template <class Fn>
Fn driver_fn(const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
  CK(cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &found));
  if (found != cudaDriverEntryPointSuccess || fn == nullptr) {
    std::printf("[%d] no driver entry point %s\n", g_rank, name);
    std::exit(10);
  }
  return reinterpret_cast<Fn>(fn);
}

#define CU(x)                                                                               \
  do {                                                                                      \
    CUresult r_ = (x);                                                                      \
    if (r_ != CUDA_SUCCESS) {                                                               \
      std::printf("[%d] %s:%d %s: CUresult %d\n", g_rank, __FILE__, __LINE__, #x, int(r_)); \
      std::exit(10);                                                                        \
    }                                                                                       \
  } while (0)

// cuMem memory on device 0 that exports as a POSIX file descriptor (fd), as PyTorch's expandable
// segments make it, or that exports as nothing; never unmapped (the probe's process ends soon).
void* vmm_alloc(size_t bytes, bool fd) {
  using Granularity =
      CUresult (*)(size_t*, const CUmemAllocationProp*, CUmemAllocationGranularity_flags);
  using Create = CUresult (*)(CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*,
                              unsigned long long);
  using Reserve = CUresult (*)(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long);
  using Map =
      CUresult (*)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
  using SetAccess = CUresult (*)(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t);
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  prop.requestedHandleTypes =
      fd ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : CU_MEM_HANDLE_TYPE_NONE;
  size_t gran = 0;
  CU(driver_fn<Granularity>("cuMemGetAllocationGranularity")(&gran, &prop,
                                                             CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  const size_t size = (bytes + gran - 1) / gran * gran;
  CUmemGenericAllocationHandle h = 0;
  CU(driver_fn<Create>("cuMemCreate")(&h, size, &prop, 0));
  CUdeviceptr ptr = 0;
  CU(driver_fn<Reserve>("cuMemAddressReserve")(&ptr, size, 0, 0, 0));
  CU(driver_fn<Map>("cuMemMap")(ptr, size, 0, h, 0));
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CU(driver_fn<SetAccess>("cuMemSetAccess")(ptr, size, &access, 1));
  return reinterpret_cast<void*>(ptr);
}

void* mem_alloc(Mem m, size_t bytes, cudaStream_t stream) {
  void* p = nullptr;
  if (m == Mem::kMalloc) CK(cudaMalloc(&p, bytes));
  if (m == Mem::kAsync) {
    CK(cudaMallocAsync(&p, bytes, stream));
    CK(cudaStreamSynchronize(stream));
  }
  if (m == Mem::kAsyncFdPool) {
    static cudaMemPool_t pool = [] {
      cudaMemPoolProps props{};
      props.allocType = cudaMemAllocationTypePinned;
      props.handleTypes = cudaMemHandleTypePosixFileDescriptor;
      props.location.type = cudaMemLocationTypeDevice;
      props.location.id = 0;
      cudaMemPool_t made = nullptr;
      CK(cudaMemPoolCreate(&made, &props));
      return made;
    }();
    CK(cudaMallocFromPoolAsync(&p, bytes, pool, stream));
    CK(cudaStreamSynchronize(stream));
  }
  if (m == Mem::kVmm || m == Mem::kVmmNoFd) p = vmm_alloc(bytes, m == Mem::kVmm);
  return p;
}

void mem_free(Mem m, void* p, cudaStream_t stream) {
  if (m == Mem::kMalloc) CK(cudaFree(p));
  if (m == Mem::kAsync || m == Mem::kAsyncFdPool) CK(cudaFreeAsync(p, stream));
}

// All-to-all-v on `send`/`recv` (2^20 + 3 words each at least): blocks of uneven size (rank q
// to rank d: n + (q + 2d) % 5 words, n = 1, 1031, 2^18), laid out in reverse order with gaps,
// apart and in place (the recv blocks over the send ones); every word of recv checked, the gaps
// as they were.
int alltoallv_cases(chorusComm_t comm, cudaStream_t stream, void* send_mem, void* recv_mem,
                    Mem mine) {
  const int p = g_size, r = g_rank;
  int cases = 0;
  for (size_t n : {size_t(1), size_t(1031), size_t(1) << 18})
    for (int in_place = 0; in_place < 2; ++in_place) {
      auto words = [&](int q, int d) { return n + size_t(q + 2 * d) % 5; };
      std::vector<size_t> sc(p), sd(p), rc(p), rd(p);
      size_t at = 0, end = 0;
      for (int d = p - 1; d >= 0; --d)
        at += 1 + d % 3, sc[d] = words(r, d), sd[d] = at, at += sc[d];
      end = at;
      at = in_place ? 1 : 2;
      for (int q = 0; q < p; ++q) rc[q] = words(q, r), rd[q] = at, at += rc[q] + 2;
      end = std::max(end, at);
      auto* s = static_cast<uint32_t*>(send_mem);
      auto* d = in_place ? s : static_cast<uint32_t*>(recv_mem);
      std::vector<uint32_t> host_s(end), host_d(end);
      for (size_t j = 0; j < end; ++j)
        host_s[j] = 0xabab0000u + uint32_t(j), host_d[j] = ~host_s[j];
      for (int q = 0; q < p; ++q)
        for (size_t j = 0; j < sc[q]; ++j) host_s[sd[q] + j] = uint32_t(r << 24 | q << 20 | j);
      std::vector<uint32_t> want = in_place ? host_s : host_d;
      for (int q = 0; q < p; ++q)
        for (size_t j = 0; j < rc[q]; ++j) want[rd[q] + j] = uint32_t(q << 24 | r << 20 | j);
      CK(cudaMemcpyAsync(s, host_s.data(), end * 4, cudaMemcpyHostToDevice, stream));
      if (!in_place) CK(cudaMemcpyAsync(d, host_d.data(), end * 4, cudaMemcpyHostToDevice, stream));
      const std::string name = "all-to-all-v n " + std::to_string(n) +
                               (in_place ? " in place" : "") + " on " + mem_name(mine);
      if (chorusAllToAllv(s, sc.data(), sd.data(), d, rc.data(), rd.data(), chorusUint32, comm,
                          stream) != chorusSuccess) {
        fail(name + ": " + chorusGetLastError(comm));
        return cases;
      }
      std::vector<uint32_t> back(end);
      CK(cudaMemcpyAsync(back.data(), d, end * 4, cudaMemcpyDeviceToHost, stream));
      CK(cudaStreamSynchronize(stream));
      size_t wrong = 0;
      for (size_t j = 0; j < end; ++j) wrong += back[j] != want[j];
      if (wrong) fail(name + ": " + std::to_string(wrong) + " words wrong");
      cases++;
    }
  return cases;
}

// The other device collectives (f32 sum of small integers: exact; gather, scatter and
// all-to-all too), send/recv in a group both
// ways around the ring, the barrier with a stream; in and out of place; against the host. On
// memory of kind `m` (rank 0: cudaMalloc memory whatever `m`, so that kinds meet in one call).
int other_collectives(chorusComm_t comm, cudaStream_t stream, Mem m = Mem::kMalloc) {
  const int p = g_size, r = g_rank;
  const size_t counts[] = {1, 1031, (size_t(1) << 20) + 3};
  const size_t most = ((size_t(1) << 20) + 3) * p;
  const Mem mine = r == 0 ? Mem::kMalloc : m;
  auto* send = static_cast<float*>(mem_alloc(mine, most * 4, stream));
  auto* recv = static_cast<float*>(mem_alloc(mine, most * 4, stream));
  std::vector<float> host(most), back(most), want(most);
  int cases = 0;
  auto in = [](int q, size_t i) { return float(value(q, i)); };
  for (size_t n : counts)
    for (int in_place = 0; in_place < 2; ++in_place)
      for (int which = 0; which < 8; ++which) {
        const int root = int(n % p);
        const bool send_blocks = which == 3 || which == 6 || which == 7,
                   recv_blocks = which == 2 || which == 5 || which == 7;
        const size_t send_n = send_blocks ? n * p : n, recv_n = recv_blocks ? n * p : n;
        float* s = send;
        float* d = in_place ? send : recv;
        if (in_place && (which == 2 || which == 5)) s = recv + r * n, d = recv;
        if (in_place && (which == 3 || which == 6)) d = send + r * n;
        for (size_t i = 0; i < send_n; ++i) host[i] = in(r, i);
        CK(cudaMemcpyAsync(s, host.data(), send_n * 4, cudaMemcpyHostToDevice, stream));
        chorusResult_t rc = chorusSuccess;
        const char* names[] = {"reduce",    "broadcast", "all-gather", "reduce-scatter",
                               "send/recv", "gather",    "scatter",    "all-to-all"};
        const int right = (r + 1) % p, left = (r + p - 1) % p;
        switch (which) {
          case 0:
            rc = chorusReduce(s, d, n, chorusFloat32, chorusSum, root, comm, stream);
            break;
          case 1:
            rc = chorusBroadcast(s, d, n, chorusFloat32, root, comm, stream);
            break;
          case 2:
            rc = chorusAllGather(s, d, n, chorusFloat32, comm, stream);
            break;
          case 3:
            rc = chorusReduceScatter(s, d, n, chorusFloat32, chorusSum, comm, stream);
            break;
          case 5:
            rc = chorusGather(s, d, n, chorusFloat32, root, comm, stream);
            break;
          case 6:
            rc = chorusScatter(s, d, n, chorusFloat32, root, comm, stream);
            break;
          case 7:  // in place: the input copied aside first (device_bounce.h)
            rc = chorusAllToAll(s, d, n, chorusFloat32, comm, stream);
            break;
          default:
            if (in_place) d = recv;  // send/recv: never one buffer
            chorusGroupStart();
            chorusSend(s, n, chorusFloat32, right, comm, stream);
            chorusRecv(d, n, chorusFloat32, left, comm, stream);
            rc = chorusGroupEnd();
            if (rc == chorusSuccess) rc = chorusBarrier(comm, stream);
            break;
        }
        const std::string name = std::string(names[which]) + " count " + std::to_string(n) +
                                 (in_place ? " in place" : "") + " on " + mem_name(mine);
        if (rc != chorusSuccess) {
          fail(name + ": " + chorusGetLastError(comm));
          break;
        }
        if ((which == 0 || which == 5) && r != root) continue;
        for (size_t i = 0; i < recv_n; ++i) {
          float w = 0;
          if (which == 0)
            for (int q = 0; q < p; ++q) w += in(q, i);
          if (which == 1) w = in(root, i);
          if (which == 2) w = in(int(i / n), i % n);
          if (which == 3)
            for (int q = 0; q < p; ++q) w += in(q, r * n + i);
          if (which == 4) w = in(left, i);
          if (which == 5) w = in(int(i / n), i % n);
          if (which == 6) w = in(root, r * n + i);
          if (which == 7) w = in(int(i / n), r * n + i % n);
          want[i] = w;
        }
        CK(cudaMemcpyAsync(back.data(), d, recv_n * 4, cudaMemcpyDeviceToHost, stream));
        CK(cudaStreamSynchronize(stream));
        size_t wrong = 0;
        for (size_t i = 0; i < recv_n; ++i) wrong += back[i] != want[i];
        if (wrong) fail(name + ": " + std::to_string(wrong) + " wrong");
        cases++;
      }
  cases += alltoallv_cases(comm, stream, send, recv, mine);
  mem_free(mine, send, stream);
  mem_free(mine, recv, stream);
  return cases;
}

// All-reduces on memory of kind `m`, alternating between two streams with no host
// synchronisation: through the bounce buffer, each call must wait for the last one on the other
// stream before it copies in. Each call has buffers of its own; one synchronisation at the end.
void alternating_streams(chorusComm_t comm, cudaStream_t stream, Mem m) {
  constexpr int kCalls = 8;
  const size_t count = size_t(4) << 20;
  cudaStream_t other;
  CK(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
  std::vector<float*> bufs;
  std::vector<float> host(count);
  for (int c = 0; c < kCalls; ++c) {
    cudaStream_t s = c % 2 ? other : stream;
    auto* b = static_cast<float*>(mem_alloc(m, count * 4, s));
    for (size_t i = 0; i < count; ++i) host[i] = float(value(g_rank, i + c));
    CK(cudaMemcpy(b, host.data(), count * 4, cudaMemcpyHostToDevice));
    bufs.push_back(b);
  }
  for (int c = 0; c < kCalls; ++c)
    if (chorusAllReduce(bufs[c], bufs[c], count, chorusFloat32, chorusSum, comm,
                        c % 2 ? other : stream) != chorusSuccess) {
      fail(std::string("alternating streams on ") + mem_name(m) + ": " + chorusGetLastError(comm));
      return;
    }
  CK(cudaDeviceSynchronize());
  for (int c = 0; c < kCalls; ++c) {
    CK(cudaMemcpy(host.data(), bufs[c], count * 4, cudaMemcpyDeviceToHost));
    size_t wrong = 0;
    for (size_t i = 0; i < count; ++i) {
      float w = 0;
      for (int q = 0; q < g_size; ++q) w += float(value(q, i + c));
      wrong += host[i] != w;
    }
    if (wrong)
      fail(std::string("alternating streams on ") + mem_name(m) + ", call " + std::to_string(c) +
           ": " + std::to_string(wrong) + " wrong");
    mem_free(m, bufs[c], stream);
  }
  CK(cudaStreamSynchronize(stream));
  CK(cudaStreamDestroy(other));
}

void sleep_ms(void* ms) {
  std::this_thread::sleep_for(std::chrono::milliseconds(reinterpret_cast<intptr_t>(ms)));
}

// A ring exchange (a group: send to the right, receive from the left), an all-reduce and a
// broadcast captured into a CUDA graph (global capture mode, as PyTorch's default; after an eager
// warm-up call, as PyTorch and NCCL ask) and replayed 20 times with no host synchronisation: a
// new input copied in before each replay, the results copied out after; rank 1's stream held
// back 20 ms before every third replay, so the ranks are out of step.
// Staged (a host per rank): the host parts run at each replay's host node (the ring exchange,
// captured first, on each pair's communicator of replays; the collectives on theirs).
void graph_replays(chorusComm_t comm, cudaStream_t stream, bool staged) {
  constexpr size_t n = 1 << 16;
  constexpr int kReplays = 20, kOut = 3;
  float *in, *sum, *bc, *rx, *host_in, *host_out;
  int capturable = -1;
  if (chorusCommCapturable(comm, &capturable) != chorusSuccess || capturable != (staged ? 0 : 1))
    return fail("graph: chorusCommCapturable gave " + std::to_string(capturable) + ", want " +
                (staged ? "0" : "1"));
  CK(cudaMalloc(&in, n * 4));
  CK(cudaMalloc(&sum, n * 4));
  CK(cudaMalloc(&bc, n * 4));
  CK(cudaMalloc(&rx, n * 4));
  CK(cudaMallocHost(&host_in, kReplays * n * 4));
  CK(cudaMallocHost(&host_out, kOut * kReplays * n * 4));
  const int right = (g_rank + 1) % g_size, left = (g_rank + g_size - 1) % g_size;
  for (int k = 0; k < kReplays; ++k)
    for (size_t i = 0; i < n; ++i) host_in[k * n + i] = float(value(g_rank, i + 7 * k));
  if (chorusAllReduce(in, sum, n, chorusFloat32, chorusSum, comm, stream) != chorusSuccess)
    return fail(std::string("graph: the warm-up call: ") + chorusGetLastError(comm));
  CK(cudaStreamSynchronize(stream));
  cudaGraph_t graph;
  CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  chorusGroupStart();
  chorusSend(in, n, chorusFloat32, right, comm, stream);
  chorusRecv(rx, n, chorusFloat32, left, comm, stream);
  chorusResult_t rc = chorusGroupEnd();
  if (rc == chorusSuccess) rc = chorusAllReduce(in, sum, n, chorusFloat32, chorusSum, comm, stream);
  if (rc == chorusSuccess) rc = chorusBroadcast(in, bc, n, chorusFloat32, 0, comm, stream);
  const std::string why = rc == chorusSuccess ? "" : chorusGetLastError(comm);
  CK(cudaStreamEndCapture(stream, &graph));
  if (rc != chorusSuccess) return fail("graph: the capture: " + why);
  cudaGraphExec_t exec;
  CK(cudaGraphInstantiate(&exec, graph, 0));
  for (int k = 0; k < kReplays; ++k) {
    CK(cudaMemcpyAsync(in, host_in + k * n, n * 4, cudaMemcpyHostToDevice, stream));
    if (g_rank == 1 && k % 3 == 0)
      CK(cudaLaunchHostFunc(stream, sleep_ms, reinterpret_cast<void*>(intptr_t(20))));
    CK(cudaGraphLaunch(exec, stream));
    CK(cudaMemcpyAsync(host_out + kOut * k * n, sum, n * 4, cudaMemcpyDeviceToHost, stream));
    CK(cudaMemcpyAsync(host_out + (kOut * k + 1) * n, bc, n * 4, cudaMemcpyDeviceToHost, stream));
    CK(cudaMemcpyAsync(host_out + (kOut * k + 2) * n, rx, n * 4, cudaMemcpyDeviceToHost, stream));
  }
  CK(cudaStreamSynchronize(stream));
  int wrong = 0;
  for (int k = 0; k < kReplays; ++k)
    for (size_t i = 0; i < n; ++i) {
      double want = 0;
      for (int q = 0; q < g_size; ++q) want += value(q, i + 7 * k);
      if (host_out[kOut * k * n + i] != float(want) ||
          host_out[(kOut * k + 1) * n + i] != float(value(0, i + 7 * k)) ||
          host_out[(kOut * k + 2) * n + i] != float(value(left, i + 7 * k)))
        if (wrong++ == 0)
          fail("graph: replay " + std::to_string(k) + " element " + std::to_string(i) + " wrong");
    }
  if (g_rank == 0 && wrong == 0)
    std::printf(
        "%d ranks%s: all-reduce + broadcast + ring send/recv captured in a CUDA graph, %d "
        "replays right\n",
        g_size, staged ? " (staged)" : "", kReplays);
  CK(cudaGraphExecDestroy(exec));
  CK(cudaGraphDestroy(graph));
  CK(cudaFree(in));
  CK(cudaFree(sum));
  CK(cudaFree(bc));
  CK(cudaFree(rx));
  CK(cudaFreeHost(host_in));
  CK(cudaFreeHost(host_out));
}

// A captured barrier replayed 2000 times back to back (device_graph.h: its words are reset after
// each wait; with "ready" alone a peer's next signal could land before the reset and be wiped,
// and a replay would wait for ever). The stream must end within 60 s.
void graph_barrier(chorusComm_t comm, cudaStream_t stream) {
  constexpr int kReplays = 2000;
  cudaGraph_t graph;
  CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  const chorusResult_t rc = chorusBarrier(comm, stream);
  const std::string why = rc == chorusSuccess ? "" : chorusGetLastError(comm);
  CK(cudaStreamEndCapture(stream, &graph));
  if (rc != chorusSuccess) return fail("captured barrier: the capture: " + why);
  cudaGraphExec_t exec;
  CK(cudaGraphInstantiate(&exec, graph, 0));
  const auto t0 = std::chrono::steady_clock::now();
  for (int k = 0; k < kReplays; ++k) CK(cudaGraphLaunch(exec, stream));
  cudaError_t q = cudaErrorNotReady;
  while ((q = cudaStreamQuery(stream)) == cudaErrorNotReady &&
         std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60))
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  if (q == cudaErrorNotReady) {
    std::printf("[%d] FAIL captured barrier: the stream still waits 60 s after %d replays\n",
                g_rank, kReplays);
    std::fflush(stdout);
    std::_Exit(1);  // a waiting stream would hang the exit too
  }
  CK(q);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (g_rank == 0)
    std::printf("%d ranks: a captured barrier replayed %d times back to back, %.1f us each\n",
                g_size, kReplays, s * 1e6 / kReplays);
  CK(cudaGraphExecDestroy(exec));
  CK(cudaGraphDestroy(graph));
}

// A communicator whose very first call is captured (global mode, no warm-up, as a user of
// NCCL may do): what it sets up at its first device call -- flag words, release stream, events,
// IPC handles, page-locked memory -- is made during the capture (kernels/cuda/capture_mode.h
// relaxes the thread's mode for those calls). Three replays, checked.
void graph_first_call(chorusComm_t parent, cudaStream_t stream) {
  constexpr size_t n = 4096;
  constexpr int kReplays = 3;
  chorusComm_t comm = nullptr;
  if (chorusCommSplit(parent, 0, g_rank, &comm) != chorusSuccess)
    return fail(std::string("first call captured: the split: ") + chorusGetLastError(parent));
  float *buf, *host;
  CK(cudaMalloc(&buf, n * 4));
  CK(cudaMallocHost(&host, kReplays * n * 4));
  cudaGraph_t graph;
  CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  const chorusResult_t rc = chorusAllReduce(buf, buf, n, chorusFloat32, chorusSum, comm, stream);
  const std::string why = rc == chorusSuccess ? "" : chorusGetLastError(comm);
  const cudaError_t end = cudaStreamEndCapture(stream, &graph);
  if (rc != chorusSuccess || end != cudaSuccess) {
    (void)cudaGetLastError();
    chorusCommDestroy(comm);
    return fail("first call captured: " + (rc != chorusSuccess ? why : cudaGetErrorString(end)));
  }
  cudaGraphExec_t exec;
  CK(cudaGraphInstantiate(&exec, graph, 0));
  for (int k = 0; k < kReplays; ++k) {
    for (size_t i = 0; i < n; ++i) host[k * n + i] = float(g_rank + k);
    CK(cudaMemcpyAsync(buf, host + k * n, n * 4, cudaMemcpyHostToDevice, stream));
    CK(cudaGraphLaunch(exec, stream));
    CK(cudaMemcpyAsync(host + k * n, buf, n * 4, cudaMemcpyDeviceToHost, stream));
  }
  CK(cudaStreamSynchronize(stream));
  for (int k = 0; k < kReplays; ++k) {
    const float want = float(g_size * (g_size - 1) / 2 + g_size * k);
    if (host[k * n] != want || host[k * n + n - 1] != want)
      fail("first call captured: replay " + std::to_string(k) + " wrong");
  }
  if (g_rank == 0 && !g_failed)
    std::printf("%d ranks: a communicator's first call captured (global mode), %d replays right\n",
                g_size, kReplays);
  CK(cudaGraphExecDestroy(exec));
  CK(cudaGraphDestroy(graph));
  chorusCommDestroy(comm);
  CK(cudaFree(buf));
  CK(cudaFreeHost(host));
}

// More captures than a communicator has slots (64), each graph destroyed after one replay: a
// slot comes back when CUDA runs the destructor of the user object its graph holds, which it
// may do a little later (on a thread of its own); a capture refused for want of a slot is tried
// again for up to 1 s, and the tries are counted.
void graph_slots_reused(chorusComm_t comm, cudaStream_t stream) {
  constexpr size_t n = 1024;
  constexpr int kGraphs = 100;
  float *buf, *host;
  CK(cudaMalloc(&buf, n * 4));
  CK(cudaMallocHost(&host, n * 4));
  int retries = 0;
  for (int k = 0; k < kGraphs && !g_failed; ++k) {
    cudaGraph_t graph = nullptr;
    chorusResult_t rc = chorusSuccess;
    std::string why;
    for (int attempt = 0; attempt < 100; ++attempt) {
      CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
      rc = chorusAllReduce(buf, buf, n, chorusFloat32, chorusSum, comm, stream);
      why = rc == chorusSuccess ? "" : chorusGetLastError(comm);
      CK(cudaStreamEndCapture(stream, &graph));
      const bool no_slot = why.find("no slot") != std::string::npos ||
                           why.find("held by CUDA graphs") != std::string::npos;
      if (rc == chorusSuccess || !no_slot) break;
      CK(cudaGraphDestroy(graph));
      ++retries;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (rc != chorusSuccess) return fail("graph slots: capture " + std::to_string(k) + ": " + why);
    cudaGraphExec_t exec;
    CK(cudaGraphInstantiate(&exec, graph, 0));
    for (size_t i = 0; i < n; ++i) host[i] = float(g_rank + k);
    CK(cudaMemcpyAsync(buf, host, n * 4, cudaMemcpyHostToDevice, stream));
    CK(cudaGraphLaunch(exec, stream));
    CK(cudaMemcpyAsync(host, buf, n * 4, cudaMemcpyDeviceToHost, stream));
    CK(cudaStreamSynchronize(stream));
    const float want = float(g_size * (g_size - 1) / 2 + g_size * k);
    if (host[0] != want || host[n - 1] != want)
      return fail("graph slots: replay of capture " + std::to_string(k) + " wrong");
    CK(cudaGraphExecDestroy(exec));
    CK(cudaGraphDestroy(graph));
  }
  if (g_rank == 0 && !g_failed)
    std::printf(
        "%d ranks: %d graphs captured and destroyed one after another (%d captures "
        "retried for a slot not yet given back)\n",
        g_size, kGraphs, retries);
  CK(cudaFree(buf));
  CK(cudaFreeHost(host));
}

// Stream order with no host synchronisation: a fill on the stream, the all-reduce, a read-back,
// one synchronisation at the end. On a stream of its own and on the legacy default stream.
void stream_order(chorusComm_t comm, cudaStream_t stream) {
  const size_t count = size_t(16) << 20;  // 64 MiB of f32: the fill is still running at the call
  float* buf;
  CK(cudaMalloc(&buf, count * 4));
  float *in, *out;  // pinned: the copies are truly asynchronous
  CK(cudaMallocHost(&in, count * 4));
  CK(cudaMallocHost(&out, count * 4));
  for (size_t i = 0; i < count; ++i) in[i] = float(g_rank + 1);
  for (cudaStream_t s : {stream, cudaStream_t(nullptr)}) {
    std::memset(out, 0, count * 4);
    CK(cudaMemcpyAsync(buf, in, count * 4, cudaMemcpyHostToDevice, s));
    if (chorusAllReduce(buf, buf, count, chorusFloat32, chorusSum, comm, s) != chorusSuccess) {
      fail(std::string("stream order: ") + chorusGetLastError(comm));
      break;
    }
    CK(cudaMemcpyAsync(out, buf, count * 4, cudaMemcpyDeviceToHost, s));
    CK(cudaStreamSynchronize(s));
    const float want = float(g_size * (g_size + 1) / 2);
    size_t wrong = 0;
    for (size_t i = 0; i < count; ++i) wrong += out[i] != want;
    if (wrong)
      fail("stream order (" + std::string(s ? "own stream" : "default stream") +
           "): " + std::to_string(wrong) + " wrong");
  }
  CK(cudaFreeHost(out));
  CK(cudaFreeHost(in));
  CK(cudaFree(buf));
}

// Buffers freed and allocated again around each call (cudaMalloc often gives the freed address
// back): each round's numbers right, so no peer reads through a mapping of the freed allocation;
// the peers close those (collectives/device_freed.h). Says how often the address came back.
void freed_and_allocated_again(chorusComm_t comm, cudaStream_t stream) {
  const size_t count = size_t(1) << 20;
  std::vector<float> host(count);
  void* last = nullptr;
  int again = 0;
  for (int round = 0; round < 6 && !g_failed; ++round) {
    float* buf;
    CK(cudaMalloc(&buf, count * 4));
    again += buf == last;
    for (size_t i = 0; i < count; ++i) host[i] = float(g_rank + round * 10 + int(i % 9));
    CK(cudaMemcpy(buf, host.data(), count * 4, cudaMemcpyHostToDevice));
    if (chorusAllReduce(buf, buf, count, chorusFloat32, chorusSum, comm, stream) != chorusSuccess)
      fail(std::string("freed and allocated again: ") + chorusGetLastError(comm));
    CK(cudaStreamSynchronize(stream));
    CK(cudaMemcpy(host.data(), buf, count * 4, cudaMemcpyDeviceToHost));
    size_t wrong = 0;
    for (size_t i = 0; i < count; ++i)
      wrong += host[i] != float(g_size * (round * 10 + int(i % 9)) + g_size * (g_size - 1) / 2);
    if (wrong)
      fail("freed and allocated again, round " + std::to_string(round) + ": " +
           std::to_string(wrong) + " wrong");
    last = buf;
    CK(cudaFree(buf));
  }
  if (g_rank == 0)
    std::printf("%d ranks: freed and allocated again: 6 rounds, the address came back %d times\n",
                g_size, again);
}

// How much of the GPU's memory the peers' mappings hold: the free memory at the start and at the
// end, read between two barriers on every rank, after a few small all-reduces whose records carry
// the owners' news of their frees (collectives/device_freed.h; a few allocations checked a call).
class HeldMemory {
 public:
  HeldMemory(chorusComm_t comm, cudaStream_t stream, const char* what)
      : comm_(comm), stream_(stream), what_(what) {
    CK(cudaMalloc(&small_, 1024 * 4));
    CK(cudaMemset(small_, 0, 1024 * 4));
    calls(1);
    free0_ = free_now();
  }
  ~HeldMemory() { CK(cudaFree(small_)); }
  // MiB held since the start; fails (naming what) past `limit_mib`.
  double held_mib(double limit_mib) {
    calls(4);
    const double held = (double(free0_) - double(free_now())) / double(1 << 20);
    if (held > limit_mib)
      fail(std::string(what_) + ": " + std::to_string(int(held)) + " MiB still held");
    return held;
  }

 private:
  void calls(int n) {
    for (int i = 0; i < n; ++i)
      if (chorusAllReduce(small_, small_, 1024, chorusFloat32, chorusSum, comm_, stream_) !=
          chorusSuccess)
        fail(std::string(what_) + ": " + chorusGetLastError(comm_));
    CK(cudaStreamSynchronize(stream_));
  }
  size_t free_now() {
    size_t free = 0, total = 0;
    chorusBarrier(comm_, nullptr);
    CK(cudaMemGetInfo(&free, &total));
    chorusBarrier(comm_, nullptr);
    return free;
  }
  chorusComm_t comm_;
  cudaStream_t stream_;
  const char* what_;
  float* small_ = nullptr;
  size_t free0_ = 0;
};

// Buffers freed with nothing allocated where they lay (each allocated before the last is freed):
// their owners find the frees (CU_POINTER_ATTRIBUTE_BUFFER_ID) and say so in their next calls'
// records, and the peers close their mappings (collectives/device_freed.h), so the GPU's memory
// comes back. Kept open, 4 buffers of 256 MiB per rank (16 MiB under CHORUS_CUDA_TEST_QUICK)
// would stay in use.
void freed_elsewhere(chorusComm_t comm, cudaStream_t stream) {
  const bool quick = std::getenv("CHORUS_CUDA_TEST_QUICK") != nullptr;
  const size_t count = size_t(quick ? 4 : 64) << 20;  // floats
  const double mib = double(count * 4) / double(1 << 20);
  const int rounds = 4;
  HeldMemory watch(comm, stream, "freed elsewhere");
  std::vector<float*> bufs(rounds);
  for (float*& b : bufs) CK(cudaMalloc(&b, count * 4));
  for (float* b : bufs) {
    CK(cudaMemsetAsync(b, 0, count * 4, stream));
    if (chorusAllReduce(b, b, count, chorusFloat32, chorusSum, comm, stream) != chorusSuccess)
      fail(std::string("freed elsewhere: ") + chorusGetLastError(comm));
    CK(cudaStreamSynchronize(stream));
    CK(cudaFree(b));
  }
  const double held_mib = watch.held_mib(mib);
  if (g_rank == 0)
    std::printf(
        "%d ranks: freed elsewhere: %.0f MiB of the GPU still held after each rank freed "
        "%d buffers of %.0f MiB (kept open by the peers: %.0f MiB)\n",
        g_size, held_mib, rounds, mib, g_size * rounds * mib);
}

// Communicators made and destroyed (splits), each with an all-reduce through its bounce buffer
// (cudaMallocAsync memory, which CUDA IPC cannot map): destroy frees the bounce buffers once the
// stream is past them (collectives/device_bounce.h), and the peers close their mappings when the
// owner's next records say so, so the GPU's memory comes back. Until the thirty-first session each
// communicator kept its bounce buffer for the process's life: 4 x 16 MiB (128 MiB without
// CHORUS_CUDA_TEST_QUICK) per rank, held in every peer too.
void destroyed_gives_back(chorusComm_t comm, cudaStream_t stream) {
  const bool quick = std::getenv("CHORUS_CUDA_TEST_QUICK") != nullptr;
  const size_t count = size_t(quick ? 4 : 32) << 20;  // floats
  const double mib = double(count * 4) / double(1 << 20);
  const int rounds = 4;
  HeldMemory watch(comm, stream, "destroyed communicators");
  for (int round = 0; round < rounds && !g_failed; ++round) {
    chorusComm_t child = nullptr;
    if (chorusCommSplit(comm, 0, g_rank, &child) != chorusSuccess) {
      fail(std::string("destroyed communicators: split: ") + chorusGetLastError(comm));
      break;
    }
    void* p = mem_alloc(Mem::kAsync, count * 4, stream);
    CK(cudaMemsetAsync(p, 0, count * 4, stream));
    if (chorusAllReduce(p, p, count, chorusFloat32, chorusSum, child, stream) != chorusSuccess)
      fail(std::string("destroyed communicators: ") + chorusGetLastError(child));
    mem_free(Mem::kAsync, p, stream);
    CK(cudaStreamSynchronize(stream));
    chorusCommDestroy(child);
  }
  const double held_mib = watch.held_mib(mib);
  if (g_rank == 0)
    std::printf(
        "%d ranks: destroyed communicators: %.0f MiB of the GPU still held after %d "
        "communicators, each with a bounce buffer of %.0f MiB per rank, were destroyed "
        "(kept: %.0f MiB)\n",
        g_size, held_mib, rounds, mib, g_size * rounds * mib);
}

// Errors: named on every rank, and the communicator still works afterwards.
void errors(chorusComm_t comm, cudaStream_t stream) {
  float* dev;
  CK(cudaMalloc(&dev, 64 * 4));
  std::vector<float> host_buf(64);
  // Rank 1 passes a host recvbuff: rank 1 names it, the others name rank 1.
  void* recv = g_rank == 1 ? static_cast<void*>(host_buf.data()) : static_cast<void*>(dev);
  chorusResult_t rc = chorusAllReduce(dev, recv, 64, chorusFloat32, chorusSum, comm, stream);
  std::string why = chorusGetLastError(comm);
  bool named = g_rank == 1 ? why.find("recvbuff") != std::string::npos &&
                                 why.find("host memory") != std::string::npos
                           : why.find("rank 1: recvbuff") != std::string::npos;
  if (rc == chorusSuccess || !named) fail("host recvbuff on rank 1 not named: " + why);
  // Counts that differ.
  rc = chorusAllReduce(dev, dev, 32 + g_rank, chorusFloat32, chorusSum, comm, stream);
  why = chorusGetLastError(comm);
  if (rc == chorusSuccess || why.find("ranks disagree") == std::string::npos)
    fail("different counts not named: " + why);
  // A call without a device path (every collective has one now; the point-to-point I-calls
  // do not) refuses device buffers by name.
  chorusRequest_t req = nullptr;
  rc = chorusIsend(dev, 16, chorusFloat32, (g_rank + 1) % g_size, 0, comm, &req);
  why = chorusGetLastError(comm);
  if (rc == chorusSuccess || why.find("device buffers are sent by chorusSend") == std::string::npos)
    fail("device chorusIsend not refused by name: " + why);
  // Still usable.
  if (chorusAllReduce(dev, dev, 64, chorusFloat32, chorusSum, comm, stream) != chorusSuccess)
    fail(std::string("all-reduce after the errors: ") + chorusGetLastError(comm));
  CK(cudaStreamSynchronize(stream));
  CK(cudaFree(dev));
}

// Staged (CHORUS_PROBE_STAGED=1): counts that differ are found by the host part after the calls
// returned; the streams end, the communicator fails within 5 s, and the next call says why.
void staged_errors(chorusComm_t comm, cudaStream_t stream) {
  float* dev;
  CK(cudaMalloc(&dev, 64 * 4));
  const auto t0 = std::chrono::steady_clock::now();
  chorusResult_t rc =
      chorusAllReduce(dev, dev, 32 + g_rank, chorusFloat32, chorusSum, comm, stream);
  std::string why = rc == chorusSuccess ? "" : chorusGetLastError(comm);
  CK(cudaStreamSynchronize(stream));
  chorusResult_t async = chorusSuccess;
  while (async == chorusSuccess &&
         std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5)) {
    chorusCommGetAsyncError(comm, &async);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (why.empty()) {
    rc = chorusAllReduce(dev, dev, 16, chorusFloat32, chorusSum, comm, stream);
    why = chorusGetLastError(comm);
  }
  if (async == chorusSuccess || rc == chorusSuccess || why.find("count 3") == std::string::npos)
    fail("staged: different counts not named after the call: " + why);
  else if (g_rank == 0)
    std::printf("staged: different counts named: %s\n", why.c_str());
  CK(cudaFree(dev));
}

// nccl-tests' columns, and the local copy's traffic rate measured in the same run.
void bandwidth(chorusComm_t comm, cudaStream_t stream) {
  const size_t most = size_t(256) << 20;
  char *a, *b;
  CK(cudaMalloc(&a, most));
  CK(cudaMalloc(&b, most));
  CK(cudaMemset(a, 0, most));
  cudaEvent_t t0, t1;
  CK(cudaEventCreate(&t0));
  CK(cudaEventCreate(&t1));
  CK(cudaMemcpyAsync(b, a, most, cudaMemcpyDeviceToDevice, stream));
  CK(cudaEventRecord(t0, stream));
  for (int i = 0; i < 10; ++i) CK(cudaMemcpyAsync(b, a, most, cudaMemcpyDeviceToDevice, stream));
  CK(cudaEventRecord(t1, stream));
  CK(cudaEventSynchronize(t1));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, t0, t1));
  const double copy_gbs = 2.0 * most * 10 / (ms * 1e-3) / 1e9;
  if (g_rank == 0)
    std::printf(
        "copy engine (alone on the GPU? shared with %d ranks' idle contexts): %.0f GB/s "
        "traffic\n# size_B  time_us  algbw_GBs  busbw_GBs  efficiency\n",
        g_size, copy_gbs);
  for (size_t bytes :
       {size_t(8), size_t(1) << 16, size_t(1) << 20, size_t(16) << 20, size_t(64) << 20, most}) {
    const int iters = bytes >= (size_t(64) << 20) ? 10 : 50;
    const size_t count = bytes / 4;
    for (int i = 0; i < 3; ++i)
      chorusAllReduce(a, b, count, chorusFloat32, chorusSum, comm, stream);
    CK(cudaStreamSynchronize(stream));
    auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i)
      if (chorusAllReduce(a, b, count, chorusFloat32, chorusSum, comm, stream) != chorusSuccess) {
        fail(std::string("bandwidth: ") + chorusGetLastError(comm));
        return;
      }
    CK(cudaStreamSynchronize(stream));
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / iters;
    const double algbw = bytes / s / 1e9, busbw = algbw * 2.0 * (g_size - 1) / g_size;
    const double eff = 2.0 * g_size * bytes / s / 1e9 / copy_gbs;
    if (g_rank == 0)
      std::printf("%10zu %10.1f %10.2f %10.2f %10.3f\nRESULT dev_allreduce_p%d_%zuB_busbw=%.2f\n",
                  bytes, s * 1e6, algbw, busbw, eff, g_size, bytes, busbw);
  }
  CK(cudaFree(a));
  CK(cudaFree(b));
}

// CHORUS_PROBE_STAGED=1: every rank on a host of its own (CHORUS_HOSTID), so that the device
// calls take the staged path (collectives/device_staged.cc: the host collective on the progress
// thread, the stream waiting for it on a flag word) on this one machine.
bool staged_probe() {
  const char* rank = std::getenv("RANK");
  if (std::getenv("CHORUS_PROBE_STAGED") == nullptr || rank == nullptr) return false;
  setenv("CHORUS_HOSTID", ("probe-host-" + std::string(rank)).c_str(), 1);
  return true;
}

// A rank killed during a device all-reduce (CHORUS_TEST_DEVICE_DIE=1: rank 1 dies after the
// exchange of its second call, before it signals): the survivors' streams must not wait for ever
// (their flag words are released) and their calls name rank 1, within 5 s.
int die_worker() {
  std::setvbuf(stdout, nullptr, _IONBF, 0);
  staged_probe();
  CK(cudaSetDevice(0));
  CK(cudaFree(nullptr));
  chorusComm_t comm;
  if (chorusCommInitFromEnv(&comm) != chorusSuccess) {
    std::printf("init failed: %s\n", chorusGetLastError(nullptr));
    return 2;
  }
  chorusCommUserRank(comm, &g_rank);
  cudaStream_t stream;
  CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  float* buf;
  CK(cudaMalloc(&buf, 1 << 20));
  if (chorusAllReduce(buf, buf, 1 << 18, chorusFloat32, chorusSum, comm, stream) != chorusSuccess) {
    std::printf("[%d] FAIL the first all-reduce: %s\n", g_rank, chorusGetLastError(comm));
    return 1;
  }
  CK(cudaStreamSynchronize(stream));
  const auto t0 = std::chrono::steady_clock::now();
  chorusResult_t rc = chorusAllReduce(buf, buf, 1 << 18, chorusFloat32, chorusSum, comm, stream);
  // The host may have returned before the death; the stream must end either way.
  cudaError_t q = cudaErrorNotReady;
  while ((q = cudaStreamQuery(stream)) == cudaErrorNotReady &&
         std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10))
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  if (q == cudaErrorNotReady) {
    std::printf("[%d] FAIL the stream still waits 10 s after the death\n", g_rank);
    std::_Exit(1);  // a waiting stream would hang the exit too
  }
  // The error: from the call itself, or from the next one.
  std::string why = rc == chorusSuccess ? "" : chorusGetLastError(comm);
  if (why.empty()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    rc = chorusAllReduce(buf, buf, 16, chorusFloat32, chorusSum, comm, stream);
    why = chorusGetLastError(comm);
  }
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("[%d] after %.2f s: %s\n", g_rank, took, why.c_str());
  std::this_thread::sleep_for(std::chrono::seconds(1));  // the other survivor hears of rank 1 first
  const bool named = rc != chorusSuccess && why.find("rank 1") != std::string::npos;
  std::printf("[%d] %s\n", g_rank, named && took < 5 ? "ok" : "FAILED");
  std::_Exit(named && took < 5 ? 0 : 1);
}

int worker() {
  std::setvbuf(stdout, nullptr, _IONBF, 0);
  const bool staged = staged_probe();
  CK(cudaSetDevice(0));
  CK(cudaFree(nullptr));
  chorusComm_t comm;
  if (chorusCommInitFromEnv(&comm) != chorusSuccess) {
    std::printf("init failed: %s\n", chorusGetLastError(nullptr));
    return 2;
  }
  chorusCommUserRank(comm, &g_rank);
  chorusCommCount(comm, &g_size);
  cudaStream_t stream;
  CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  auto t0 = std::chrono::steady_clock::now();
  int cases = correctness(comm, stream);
  double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (g_rank == 0) std::printf("%d ranks: %d cases in %.1f s\n", g_size, cases, took);
  if (!g_failed) cases = other_collectives(comm, stream);
  if (g_rank == 0) std::printf("%d ranks: %d cases of the other calls\n", g_size, cases);
  for (Mem m : {Mem::kAsync, Mem::kVmm, Mem::kVmmNoFd, Mem::kAsyncFdPool}) {
    if (!g_failed) cases = other_collectives(comm, stream, m);
    if (!g_failed) alternating_streams(comm, stream, m);
    if (g_rank == 0)
      std::printf("%d ranks: %d cases of the other calls, ranks > 0 on %s memory\n", g_size, cases,
                  mem_name(m));
  }
  if (!g_failed) stream_order(comm, stream);
  if (!g_failed) freed_and_allocated_again(comm, stream);
  if (!g_failed && !staged) freed_elsewhere(comm, stream);       // CUDA IPC maps them
  if (!g_failed && !staged) destroyed_gives_back(comm, stream);  // bounce buffers freed
  // Staged, a mismatch is found by the host part after the call returned (the communicator's
  // error): the checks of errors() are for the CUDA IPC path's exchange.
  if (!g_failed && !staged) errors(comm, stream);
  if (!g_failed && !staged && std::getenv("CHORUS_CUDA_TEST_QUICK") == nullptr)
    bandwidth(comm, stream);
  // The graphs after the bandwidth: whatever CUDA refuses under a global-mode capture (not yet
  // run on a GPU) costs no measurement.
  if (!g_failed) graph_replays(comm, stream, staged);
  if (!g_failed && !staged) graph_barrier(comm, stream);
  if (!g_failed) graph_slots_reused(comm, stream);
  if (!g_failed) graph_first_call(comm, stream);
  if (!g_failed && staged) staged_errors(comm, stream);  // the communicator fails: last
  chorusCommDestroy(comm);
  std::printf("[%d] %s\n", g_rank, g_failed ? "FAILED" : "ok");
  return g_failed ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && std::strcmp(argv[1], "--worker") == 0) return worker();
  if (argc == 2 && std::strcmp(argv[1], "--die-worker") == 0) return die_worker();
  if (argc < 2) {
    std::fprintf(stderr, "usage: device_allreduce_probe CHORUS_RUN [NRANKS...] | --worker\n");
    return 2;
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("skip: no CUDA device visible\n");
    return 77;
  }
  std::vector<int> sizes;
  for (int i = 2; i < argc; ++i) sizes.push_back(std::atoi(argv[i]));
  if (sizes.empty()) sizes = {2, 3};
  int failed = 0;
  for (int n : sizes) {
    std::string cmd = "CHORUS_ALLOW_SHARED_GPU=1 CHORUS_TIMEOUT=60 " + std::string(argv[1]) +
                      " -n " + std::to_string(n) + " " + argv[0] + " --worker";
    std::printf("== %s\n", cmd.c_str());
    std::fflush(stdout);
    if (std::system(cmd.c_str()) != 0) failed++;
  }
  std::printf("%s\n", failed ? "FAILED" : "ok");
  return failed ? 1 : 0;
}
