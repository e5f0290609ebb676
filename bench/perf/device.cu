#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "perf/device.h"

namespace perf::device {
namespace {

cudaStream_t g_stream = nullptr;
int g_device = 0;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorName(e) + ": " +
                             cudaGetErrorString(e));
}

}  // namespace

std::string unavailable() {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) return std::string("no CUDA device (") + cudaGetErrorString(e) + ")";
  return n > 0 ? std::string() : std::string("no CUDA device");
}

void init(int local_rank) {
  int n = 1;
  check(cudaGetDeviceCount(&n), "cudaGetDeviceCount");
  g_device = n > 0 ? local_rank % n : 0;
  check(cudaSetDevice(g_device), "cudaSetDevice");
  check(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking), "cudaStreamCreate");
}

void* alloc(size_t bytes) {
  void* p = nullptr;
  check(cudaMalloc(&p, bytes), "cudaMalloc");
  check(cudaMemset(p, 0, bytes), "cudaMemset");
  return p;
}

void release(void* p) {
  cudaFree(p);
}

void to_device(void* dst, const void* src, size_t bytes) {
  check(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy to the device");
}

void to_host(void* dst, const void* src, size_t bytes) {
  check(cudaStreamSynchronize(g_stream), "cudaStreamSynchronize");
  check(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy to the host");
}

void* stream() {
  return g_stream;
}

void sync() {
  check(cudaStreamSynchronize(g_stream), "cudaStreamSynchronize");
}

double copy_traffic_gbs(size_t bytes) {
  void* a = alloc(bytes);
  void* b = alloc(bytes);
  cudaEvent_t t0, t1;
  check(cudaEventCreate(&t0), "cudaEventCreate");
  check(cudaEventCreate(&t1), "cudaEventCreate");
  const int iters = 10;
  check(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, g_stream), "cudaMemcpyAsync");
  check(cudaEventRecord(t0, g_stream), "cudaEventRecord");
  for (int i = 0; i < iters; ++i)
    check(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, g_stream), "cudaMemcpyAsync");
  check(cudaEventRecord(t1, g_stream), "cudaEventRecord");
  check(cudaEventSynchronize(t1), "cudaEventSynchronize");
  float ms = 0;
  check(cudaEventElapsedTime(&ms, t0, t1), "cudaEventElapsedTime");
  cudaEventDestroy(t0);
  cudaEventDestroy(t1);
  release(a);
  release(b);
  return ms > 0 ? 2.0 * double(bytes) * iters / (ms * 1e-3) / 1e9 : 0;
}

std::string name() {
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, g_device) != cudaSuccess)
    return "cuda:" + std::to_string(g_device);
  return "cuda:" + std::to_string(g_device) + " (" + p.name + ")";
}

}  // namespace perf::device
