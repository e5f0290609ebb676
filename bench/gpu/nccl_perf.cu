// nccl-perf: NCCL's all-reduce on the same GPU buffers and sizes as chorus-perf --device cuda, for
// the NCCL column of issue 19's bar. NCCL is loaded here with dlopen (NCCL_LIB, or libnccl.so.2
// on the loader's path; the GPU machine has the nvidia-nccl-cu13 wheel) -- only in this
// benchmark: chorus itself never links or loads it. chorus bootstraps the ranks (the unique id is
// broadcast with chorusBroadcast).
//
//   chorus-run -n 2 build/bench/nccl-perf [-b 8] [-e 256M] [-f 8] [-n 10]
//
// Prints nccl-tests' columns plus the efficiency against the local copy traffic rate measured in
// the same run (as chorus-perf --device cuda), and RESULT lines. Where NCCL refuses (two ranks on
// one GPU before NCCL 2.30's NCCL_MULTI_RANK_GPU_ENABLE), it says so and reports a single empty
// kernel launch instead, the floor any 8-byte all-reduce pays. Exits 77 without NCCL or a GPU.
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include <chorus/chorus.h>

namespace {

struct NcclId {
  char internal[128];
};
using NcclComm = void*;
using GetUniqueId = int (*)(NcclId*);
using CommInitRank = int (*)(NcclComm*, int, NcclId, int);
using AllReduce = int (*)(const void*, void*, size_t, int, int, NcclComm, cudaStream_t);
using CommDestroy = int (*)(NcclComm);
using ErrorString = const char* (*)(int);
constexpr int kNcclFloat32 = 7, kNcclSum = 0;

size_t parse_size(const char* s) {
  char* end = nullptr;
  double v = std::strtod(s, &end);
  switch (end && *end ? *end : ' ') {
    case 'K':
      v *= 1024;
      break;
    case 'M':
      v *= 1024 * 1024;
      break;
    case 'G':
      v *= 1024.0 * 1024 * 1024;
      break;
  }
  return size_t(v);
}

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

__global__ void empty_kernel() {}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IONBF, 0);  // chorus-run stops the others when one exits
  size_t lo = 8, hi = size_t(256) << 20;
  int factor = 8, iters = 10;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "-b")) lo = parse_size(argv[i + 1]);
    if (!std::strcmp(argv[i], "-e")) hi = parse_size(argv[i + 1]);
    if (!std::strcmp(argv[i], "-f")) factor = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "-n")) iters = std::atoi(argv[i + 1]);
  }
  chorusComm_t comm;
  if (chorusCommInitFromEnv(&comm) != chorusSuccess) {
    std::fprintf(stderr, "nccl-perf: %s\n", chorusGetLastError(nullptr));
    return 2;
  }
  int rank = 0, size = 1;
  chorusCommUserRank(comm, &rank);
  chorusCommCount(comm, &size);
  int devices = 0;
  // Every rank decides the same: skip unless all have a GPU and NCCL.
  const char* lib = std::getenv("NCCL_LIB");
  void* h = dlopen(lib ? lib : "libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
  const std::string why = h ? std::string() : std::string(dlerror());
  int ok = cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0 && h != nullptr;
  chorusAllReduce(&ok, &ok, 1, chorusInt32, chorusMin, comm, nullptr);
  if (!ok) {
    if (rank == 0)
      std::printf("skip: %s\n", devices == 0   ? "no CUDA device"
                                : !why.empty() ? why.c_str()
                                               : "NCCL or a GPU missing on another rank");
    chorusCommDestroy(comm);
    return 77;
  }
  auto get_id = reinterpret_cast<GetUniqueId>(dlsym(h, "ncclGetUniqueId"));
  auto init = reinterpret_cast<CommInitRank>(dlsym(h, "ncclCommInitRank"));
  auto all_reduce = reinterpret_cast<AllReduce>(dlsym(h, "ncclAllReduce"));
  auto destroy = reinterpret_cast<CommDestroy>(dlsym(h, "ncclCommDestroy"));
  auto err = reinterpret_cast<ErrorString>(dlsym(h, "ncclGetErrorString"));
  const char* local = std::getenv("LOCAL_RANK");
  cudaSetDevice((local ? std::atoi(local) : rank) % devices);
  cudaStream_t stream;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  NcclId id{};
  if (rank == 0) get_id(&id);
  chorusBroadcast(&id, &id, sizeof id, chorusUint8, 0, comm, nullptr);
  NcclComm nc = nullptr;
  int rc = init(&nc, size, id, rank);
  int all_ok = rc == 0;
  chorusAllReduce(&all_ok, &all_ok, 1, chorusInt32, chorusMin, comm, nullptr);
  if (!all_ok) {  // NCCL refuses (two ranks on one GPU): the floor of a launch instead
    if (rank == 0)
      std::printf("NCCL refused %d ranks here: %s\n", size, rc ? err(rc) : "on another rank");
    empty_kernel<<<1, 1, 0, stream>>>();
    cudaStreamSynchronize(stream);
    const double t0 = now();
    for (int i = 0; i < 1000; ++i) empty_kernel<<<1, 1, 0, stream>>>();
    cudaStreamSynchronize(stream);
    const double us = (now() - t0) / 1000 * 1e6;
    if (rank == 0)
      std::printf("one empty kernel launch: %.2f us\nRESULT nccl_refused_launch_us=%.2f\n", us, us);
    chorusCommDestroy(comm);
    return 0;
  }
  char *a, *b;
  cudaMalloc(&a, hi);
  cudaMalloc(&b, hi);
  cudaMemset(a, 0, hi);
  cudaEvent_t e0, e1;  // the local copy's traffic rate, as chorus-perf --device cuda
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  cudaMemcpyAsync(b, a, hi, cudaMemcpyDeviceToDevice, stream);
  cudaEventRecord(e0, stream);
  for (int i = 0; i < 10; ++i) cudaMemcpyAsync(b, a, hi, cudaMemcpyDeviceToDevice, stream);
  cudaEventRecord(e1, stream);
  cudaEventSynchronize(e1);
  float ms = 0;
  cudaEventElapsedTime(&ms, e0, e1);
  const double copy_gbs = 2.0 * double(hi) * 10 / (ms * 1e-3) / 1e9;
  if (rank == 0)
    std::printf(
        "# NCCL all-reduce, %d ranks; local copy traffic %.0f GB/s\n"
        "# %12s %10s %10s %10s %6s\n",
        size, copy_gbs, "size_B", "time_us", "algbw_GBs", "busbw_GBs", "eff");
  for (size_t bytes = lo; bytes <= hi; bytes *= size_t(factor)) {
    const size_t count = bytes / 4;
    for (int i = 0; i < 3; ++i) all_reduce(a, b, count, kNcclFloat32, kNcclSum, nc, stream);
    cudaStreamSynchronize(stream);
    chorusBarrier(comm, nullptr);
    const double t0 = now();
    for (int i = 0; i < iters; ++i) all_reduce(a, b, count, kNcclFloat32, kNcclSum, nc, stream);
    cudaStreamSynchronize(stream);
    double s = (now() - t0) / iters;
    chorusAllReduce(&s, &s, 1, chorusFloat64, chorusMax, comm, nullptr);
    const double algbw = bytes / s / 1e9, busbw = algbw * 2.0 * (size - 1) / size;
    const double eff = 2.0 * size * bytes / s / 1e9 / copy_gbs;
    if (rank == 0)
      std::printf("  %12zu %10.1f %10.2f %10.2f %6.3f\nRESULT nccl_allreduce_p%d_%zuB_busbw=%.2f\n",
                  bytes, s * 1e6, algbw, busbw, eff, size, bytes, busbw);
    if (bytes > hi / size_t(factor)) break;
  }
  destroy(nc);
  cudaFree(a);
  cudaFree(b);
  chorusCommDestroy(comm);
  return 0;
}
