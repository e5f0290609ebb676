// gpu-platform: the measurements ../shared/notes/gpu-collectives.md asks for before the CUDA IPC
// link is designed, in one run on one GPU (two processes share device 0):
//   1. local copy traffic rate B (read + write bytes per second): copy engine (cudaMemcpyAsync
//      device to device) and an SM copy kernel, 256 MiB and 1 GiB;
//   2. the reduction kernel (kernels/cuda, f32 sum of two inputs) against that rate;
//   3. cross-process hand-off: a stream write-value into a flag in the other process's memory
//      (mapped through a legacy IPC handle), then a stream wait-value on the own flag,
//      ping-pong; per round trip, and whether the write into peer memory works at all (if not,
//      a 4-byte cudaMemcpyAsync is tried instead, as NCCL does).
// Prints human lines and "RESULT key=value" lines; exits 77 with the reason without a GPU.
#include <cuda.h>
#include <cuda_runtime.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "kernels/cuda/reduce.h"

namespace {

#define CHECK(x)                                                                           \
  do {                                                                                     \
    cudaError_t e_ = (x);                                                                  \
    if (e_ != cudaSuccess) {                                                               \
      std::printf("FAIL %s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                        \
    }                                                                                      \
  } while (0)

using WaitValue32 = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned);
using WriteValue32 = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned);

template <class Fn>
Fn entry(const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
  if (cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &found) !=
          cudaSuccess ||
      found != cudaDriverEntryPointSuccess)
    return nullptr;
  return reinterpret_cast<Fn>(fn);
}

__global__ void copy_kernel(const uint4* __restrict__ in, uint4* __restrict__ out, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x)
    out[i] = in[i];
}

// Median-free simple timing: `iters` runs after 2 warm-ups, events around the whole loop.
template <class F>
double time_ms(cudaStream_t s, int iters, F&& run) {
  for (int i = 0; i < 2; ++i) run();
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  CHECK(cudaEventRecord(a, s));
  for (int i = 0; i < iters; ++i) run();
  CHECK(cudaEventRecord(b, s));
  CHECK(cudaEventSynchronize(b));
  float ms = 0;
  CHECK(cudaEventElapsedTime(&ms, a, b));
  CHECK(cudaEventDestroy(a));
  CHECK(cudaEventDestroy(b));
  return double(ms) / iters;
}

void bandwidth() {
  cudaStream_t s;
  CHECK(cudaStreamCreate(&s));
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  for (size_t mib : {size_t(256), size_t(1024)}) {
    size_t bytes = mib << 20;
    void *a, *b, *c;
    CHECK(cudaMalloc(&a, bytes));
    CHECK(cudaMalloc(&b, bytes));
    CHECK(cudaMalloc(&c, bytes));
    CHECK(cudaMemsetAsync(a, 1, bytes, s));
    CHECK(cudaMemsetAsync(b, 2, bytes, s));
    double ce =
        time_ms(s, 10, [&] { CHECK(cudaMemcpyAsync(c, a, bytes, cudaMemcpyDeviceToDevice, s)); });
    double sm = time_ms(s, 10, [&] {
      copy_kernel<<<sms * 4, 512, 0, s>>>(static_cast<const uint4*>(a), static_cast<uint4*>(c),
                                          bytes / 16);
      CHECK(cudaGetLastError());
    });
    const void* in[2] = {a, b};
    size_t count = bytes / 4;
    double red = time_ms(s, 10, [&] {
      int rc = chorus::kernels::cuda::reduce_fold(
          chorus::kernels::DType::kF32, chorus::kernels::RedOp::kSum, in, 2, c, count, 0, s);
      if (rc) {
        std::printf("FAIL reduce_fold: cudaError %d\n", rc);
        std::exit(1);
      }
    });
    // Traffic: a copy reads and writes `bytes`; the reduction reads two inputs and writes one.
    double ce_gbs = 2.0 * bytes / ce / 1e6, sm_gbs = 2.0 * bytes / sm / 1e6;
    double red_gbs = 3.0 * bytes / red / 1e6;
    double best = ce_gbs > sm_gbs ? ce_gbs : sm_gbs;
    std::printf(
        "%4zu MiB: copy engine %.3f ms (%.0f GB/s traffic), SM copy %.3f ms (%.0f GB/s), "
        "reduce f32 sum of 2 %.3f ms (%.0f GB/s, %.0f%% of the best copy)\n",
        mib, ce, ce_gbs, sm, sm_gbs, red, red_gbs, 100.0 * red_gbs / best);
    std::printf(
        "RESULT copy_engine_gbs_%zuMiB=%.1f\nRESULT sm_copy_gbs_%zuMiB=%.1f\n"
        "RESULT reduce2_gbs_%zuMiB=%.1f\nRESULT reduce2_efficiency_%zuMiB=%.3f\n",
        mib, ce_gbs, mib, sm_gbs, mib, red_gbs, mib, red_gbs / best);
    CHECK(cudaFree(a));
    CHECK(cudaFree(b));
    CHECK(cudaFree(c));
  }
  CHECK(cudaStreamDestroy(s));
}

bool send_all(int fd, const void* p, size_t n) {
  return write(fd, p, n) == ssize_t(n);
}
bool recv_all(int fd, void* p, size_t n) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = read(fd, static_cast<char*>(p) + got, n - got);
    if (r <= 0) return false;
    got += size_t(r);
  }
  return true;
}

// One side of the ping-pong (side 0 starts). Returns 0 on success.
int pingpong(int side, int fd, int rounds) {
  CHECK(cudaSetDevice(0));
  WaitValue32 wait = entry<WaitValue32>("cuStreamWaitValue32");
  WriteValue32 write_value = entry<WriteValue32>("cuStreamWriteValue32");
  if (!wait || !write_value) {
    std::printf("side %d: the driver has no stream memory operations\n", side);
    return 1;
  }
  uint32_t* mine;
  CHECK(cudaMalloc(&mine, 64));
  CHECK(cudaMemset(mine, 0, 64));
  cudaIpcMemHandle_t h, theirs_h;
  CHECK(cudaIpcGetMemHandle(&h, mine));
  if (!send_all(fd, &h, sizeof h) || !recv_all(fd, &theirs_h, sizeof theirs_h)) return 1;
  void* theirs = nullptr;
  CHECK(cudaIpcOpenMemHandle(&theirs, theirs_h, cudaIpcMemLazyEnablePeerAccess));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  uint32_t* values;  // 1..rounds, the sources of the 4-byte copies
  CHECK(cudaMalloc(&values, sizeof(uint32_t) * (rounds + 1)));
  {
    uint32_t* host = new uint32_t[rounds + 1];
    for (int i = 0; i <= rounds; ++i) host[i] = uint32_t(i);
    CHECK(cudaMemcpy(values, host, sizeof(uint32_t) * (rounds + 1), cudaMemcpyHostToDevice));
    delete[] host;
  }
  // 1: 4-byte copy (NCCL's way) first, then 0: write-value into peer memory, which may fail.
  for (int mode : {1, 0}) {
    char go = 0;
    if (!send_all(fd, &go, 1) || !recv_all(fd, &go, 1)) return 1;  // both ready
    auto t0 = std::chrono::steady_clock::now();
    CUresult bad = CUDA_SUCCESS;
    for (int i = 1; i <= rounds && bad == CUDA_SUCCESS; ++i) {
      uint32_t v = uint32_t(i);
      auto signal = [&] {
        if (mode == 0) return write_value(CUstream(s), CUdeviceptr(theirs), v, 0);
        // The copy's source holds i: the flag then holds i.
        return cudaMemcpyAsync(theirs, values + i, 4, cudaMemcpyDeviceToDevice, s) == cudaSuccess
                   ? CUDA_SUCCESS
                   : CUDA_ERROR_UNKNOWN;
      };
      uint32_t want = v;
      if (side == 0) {
        bad = signal();
        if (bad == CUDA_SUCCESS)
          bad = wait(CUstream(s), CUdeviceptr(mine), want, CU_STREAM_WAIT_VALUE_GEQ);
      } else {
        bad = wait(CUstream(s), CUdeviceptr(mine), want, CU_STREAM_WAIT_VALUE_GEQ);
        if (bad == CUDA_SUCCESS) bad = signal();
      }
    }
    // Wait for the stream with a deadline: a wait whose signal never comes never ends.
    cudaError_t synced = cudaErrorNotReady;
    auto limit = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (bad == CUDA_SUCCESS && (synced = cudaStreamQuery(s)) == cudaErrorNotReady &&
           std::chrono::steady_clock::now() < limit)
      usleep(100);
    double us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    const char* how = mode == 0 ? "stream write-value into peer memory" : "4-byte async copy";
    const char* key = mode == 0 ? "write_value" : "copy";
    char ok = bad == CUDA_SUCCESS && synced == cudaSuccess, peer_ok = 0;
    if (!send_all(fd, &ok, 1) || !recv_all(fd, &peer_ok, 1)) return 1;
    if (!ok || !peer_ok) {
      if (side == 0)
        std::printf(
            "hand-off by %s: fails (CUresult %d, stream: %s; peer %s)\n"
            "RESULT handoff_%s_works=0\n",
            how, int(bad), cudaGetErrorString(synced), peer_ok ? "ok" : "failed", key);
      return 1;  // a stream may still hold a wait that never ends: the process ends it
    }
    if (side == 0)
      std::printf(
          "hand-off by %s then stream wait: %.2f us per round trip (%d rounds)\n"
          "RESULT handoff_%s_us=%.2f\n",
          how, us / rounds, rounds, key, us / rounds);
    CHECK(cudaMemset(mine, 0, 64));
    CHECK(cudaDeviceSynchronize());
  }
  CHECK(cudaIpcCloseMemHandle(theirs));
  CHECK(cudaFree(mine));
  CHECK(cudaFree(values));
  return 0;
}

}  // namespace

int main() {
  // Fork before CUDA starts in this process (a CUDA context does not survive fork).
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) return 1;
  pid_t child = fork();
  if (child == 0) {
    close(sv[0]);
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) _exit(77);
    _exit(pingpong(1, sv[1], 2000));
  }
  close(sv[1]);
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("skip: no CUDA device visible (cudaGetDeviceCount: %d devices)\n", devices);
    close(sv[0]);
    waitpid(child, nullptr, 0);
    return 77;
  }
  cudaDeviceProp p{};
  CHECK(cudaGetDeviceProperties(&p, 0));
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  std::printf("device 0: %s, sm_%d%d, %d SMs, %.1f GiB; driver %d, runtime %d\n", p.name, p.major,
              p.minor, p.multiProcessorCount, double(p.totalGlobalMem) / (1u << 30), driver,
              runtime);
  int rc = pingpong(0, sv[0], 2000);
  int status = 0;
  waitpid(child, &status, 0);
  bandwidth();
  bool child_ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  std::printf("%s\n", rc == 0 && child_ok ? "ok" : "FAILED (hand-off)");
  return rc == 0 && child_ok ? 0 : 1;
}
