// [cuda] The device reduction kernels (kernels/cuda/reduce.h) on a GPU: the cases of
// fold_cases.h (every type x op x input count x length x alignment, in place too) against the
// scalar reference, reduce_copy's second output, scale_avg, and arguments refused. Skips (exit
// 77) with the reason where no device is visible.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#include "../kernels/fold_cases.h"
#include "check_cuda.h"
#include "kernels/cuda/reduce.h"

using namespace chorus::kernels;

namespace {

// One case on the device: each input copied to its own allocation at the case's offset.
int run_on_device(const test::FoldCase& c, const std::vector<const void*>& in, void* out) {
  size_t bytes = c.count * dtype_size(c.t);
  std::vector<void*> dev(size_t(c.w) + 2, nullptr);
  std::vector<const void*> din(size_t(c.w));
  for (int k = 0; k < c.w; k++) {
    CHECK_CUDA(cudaMalloc(&dev[size_t(k)], c.in_offset[size_t(k)] + bytes + 16));
    din[size_t(k)] = static_cast<char*>(dev[size_t(k)]) + c.in_offset[size_t(k)];
    CHECK_CUDA(cudaMemcpy(const_cast<void*>(din[size_t(k)]), in[size_t(k)], bytes,
                          cudaMemcpyHostToDevice));
  }
  void* dout = const_cast<void*>(din[0]);
  if (!c.in_place) {
    CHECK_CUDA(cudaMalloc(&dev[size_t(c.w)], c.out_offset + bytes + 16));
    dout = static_cast<char*>(dev[size_t(c.w)]) + c.out_offset;
    CHECK_CUDA(cudaMemcpy(dout, out, bytes + 16, cudaMemcpyHostToDevice));  // guard bytes too
  } else {
    CHECK_CUDA(cudaMemcpy(static_cast<char*>(dout) + bytes, static_cast<char*>(out) + bytes, 16,
                          cudaMemcpyHostToDevice));
  }
  cudaStream_t s;
  CHECK_CUDA(cudaStreamCreate(&s));
  int rc;
  if (c.w == 2 && c.op != RedOp::kAvg && !c.in_place) {  // reduce_copy, with a second output
    CHECK_CUDA(cudaMalloc(&dev[size_t(c.w) + 1], bytes + 1));
    rc = cuda::reduce_copy(c.t, c.op, din[0], din[1], dout, dev[size_t(c.w) + 1], c.count, s);
  } else {
    rc = cuda::reduce_fold(c.t, c.op, din.data(), c.w, dout, c.count, c.avg_n, s);
  }
  if (rc) std::printf("launch: cudaError %d\n", rc);
  CHECK_CUDA(cudaStreamSynchronize(s));
  CHECK_CUDA(cudaMemcpy(out, dout, bytes + 16, cudaMemcpyDeviceToHost));
  if (dev[size_t(c.w) + 1]) {
    std::vector<uint8_t> second(bytes + 1);
    CHECK_CUDA(cudaMemcpy(second.data(), dev[size_t(c.w) + 1], bytes, cudaMemcpyDeviceToHost));
    if (std::memcmp(second.data(), out, bytes) != 0) rc = 1;
  }
  CHECK_CUDA(cudaStreamDestroy(s));
  for (void* p : dev)
    if (p) CHECK_CUDA(cudaFree(p));
  return rc;
}

int check_scale_avg() {
  int failed = 0;
  for (DType t : test::kAllTypes) {
    size_t n = 1031, bytes = n * dtype_size(t);
    std::vector<uint8_t> v = test::random_bytes(t, n, 99), want = v, got(bytes + 1);
    ref::scale_avg(t, want.data(), n, 3);
    void* d;
    CHECK_CUDA(cudaMalloc(&d, bytes));
    CHECK_CUDA(cudaMemcpy(d, v.data(), bytes, cudaMemcpyHostToDevice));
    if (cuda::scale_avg(t, d, n, 3, nullptr) != 0) failed++;
    CHECK_CUDA(cudaMemcpy(got.data(), d, bytes, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaFree(d));
    if (test::first_mismatch(t, got.data(), want.data(), n) >= 0) {
      std::printf("FAIL scale_avg %s\n", dtype_name(t));
      failed++;
    }
  }
  return failed;
}

}  // namespace

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("skip: [cuda] no CUDA device visible (cudaGetDeviceCount: %d devices)\n", devices);
    return 77;
  }
  // CHORUS_CUDA_TEST_QUICK=1 (the compute-sanitizer runs of tests/gpu/run.sh): fewer lengths.
  const bool quick = std::getenv("CHORUS_CUDA_TEST_QUICK") != nullptr;
  int failed = quick ? test::run_fold_cases(run_on_device, {0, 1, 17, 1031}, {1, 2, 3})
                     : test::run_fold_cases(run_on_device, {0, 1, 7, 16, 17, 1031, (1u << 20) + 7},
                                            {1, 2, 3, 8});
  failed += check_scale_avg();
  const void* none[1] = {nullptr};
  if (cuda::reduce_fold(DType::kF32, RedOp::kSum, none, 0, nullptr, 1, 0, nullptr) !=
      int(cudaErrorInvalidValue)) {
    std::printf("FAIL: w = 0 was not refused\n");
    failed++;
  }
  std::printf("%s on %d device(s)\n", failed ? "FAILED" : "ok", devices);
  return failed ? 1 : 0;
}
