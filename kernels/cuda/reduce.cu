// CUDA reduction kernels: one template kernel per (type, op) around fold_thread (fold.cuh), which
// holds the element loop so that the CPU tests run the same lines.
#include "kernels/cuda/reduce.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "kernels/cuda/capture_mode.h"
#include "kernels/cuda/fold.cuh"

namespace chorus::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr size_t kMaxBlocks = 2048;

template <class S, RedOp Op>
__global__ void __launch_bounds__(kThreads) fold_kernel(FoldArgs a) {
  size_t nthreads = size_t(gridDim.x) * blockDim.x;
  fold_thread<S, Op>(a, size_t(blockIdx.x) * blockDim.x + threadIdx.x, nthreads);
}

template <class S>
int launch(RedOp op, const FoldArgs& a, cudaStream_t stream) {
  // Enough threads that each has about kUnroll vectors to move, capped (grid-stride past it).
  size_t vecs = (a.count * sizeof(S) + 15) / 16;
  size_t want = (vecs + size_t(kThreads) * kUnroll - 1) / (size_t(kThreads) * kUnroll);
  unsigned blocks = unsigned(std::clamp<size_t>(want, 1, kMaxBlocks));
  // The launch's own error only: an earlier call's left on this thread (one whose failure was
  // handled, as a refused IPC export) would be reported as this launch's. Sticky errors come
  // back anyway.
  (void)cudaGetLastError();
  switch (op) {
    case RedOp::kSum:
    case RedOp::kAvg:
      fold_kernel<S, RedOp::kSum><<<blocks, kThreads, 0, stream>>>(a);
      break;
    case RedOp::kProd:
      fold_kernel<S, RedOp::kProd><<<blocks, kThreads, 0, stream>>>(a);
      break;
    case RedOp::kMin:
      fold_kernel<S, RedOp::kMin><<<blocks, kThreads, 0, stream>>>(a);
      break;
    case RedOp::kMax:
      fold_kernel<S, RedOp::kMax><<<blocks, kThreads, 0, stream>>>(a);
      break;
  }
  return int(cudaGetLastError());
}

// Every fold kernel loaded into the current device's context at the first launch there. CUDA
// 12.2 on loads a kernel at its first launch by default (CUDA_MODULE_LOADING=LAZY), which may
// wait for the context's work: a first launch of another type or op at a peer's death, with this
// rank's streams waiting on words the peer will never write, would wait with the rest. NCCL loads
// its kernels at init for the same reason. Devices past 63 load lazily.
std::atomic<uint64_t> g_loaded{0};  // by device

void load_all() {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return;
  const uint64_t bit = uint64_t(1) << dev;
  if ((g_loaded.load(std::memory_order_acquire) & bit) != 0) return;
  const RelaxedCapture relaxed;  // capture_mode.h: the first launch may be a captured call's
  for (int t = 0; t < kNumDTypes; ++t)
    elem::with_storage_type(DType(t), [](auto tag) {
      using S = decltype(tag);
      cudaFuncAttributes attr;
      for (const void* k : {reinterpret_cast<const void*>(&fold_kernel<S, RedOp::kSum>),
                            reinterpret_cast<const void*>(&fold_kernel<S, RedOp::kProd>),
                            reinterpret_cast<const void*>(&fold_kernel<S, RedOp::kMin>),
                            reinterpret_cast<const void*>(&fold_kernel<S, RedOp::kMax>)})
        (void)cudaFuncGetAttributes(&attr, k);
    });
  (void)cudaGetLastError();                           // (a failure here shows at the launch)
  g_loaded.fetch_or(bit, std::memory_order_acq_rel);  // two threads may both load: harmless
}

int run(DType t, RedOp op, const FoldArgs& a, void* stream) {
  load_all();
  if (unsigned(op) >= unsigned(kNumRedOps) || unsigned(t) >= unsigned(kNumDTypes) || a.w < 1 ||
      a.w > kMaxFoldInputs || a.nout < 1 || a.nout > kMaxFoldOutputs || a.avg_n < 0)
    return int(cudaErrorInvalidValue);
  if (a.count == 0) return 0;
  int rc = 0;
  elem::with_storage_type(
      t, [&](auto tag) { rc = launch<decltype(tag)>(op, a, static_cast<cudaStream_t>(stream)); });
  return rc;
}

}  // namespace

int reduce_fold(DType t, RedOp op, const void* const* in, int w, void* out, size_t count, int avg_n,
                void* stream) {
  return reduce_fold_to(t, op, in, w, &out, 1, count, avg_n, stream);
}

int reduce_fold_to(DType t, RedOp op, const void* const* in, int w, void* const* out, int nout,
                   size_t count, int avg_n, void* stream) {
  FoldArgs a;
  if (w < 1 || w > kMaxFoldInputs || nout < 1 || nout > kMaxFoldOutputs)
    return int(cudaErrorInvalidValue);
  for (int k = 0; k < w; k++) a.in[k] = in[k];
  for (int o = 0; o < nout; o++) a.out[o] = out[o];
  a.w = w;
  a.nout = nout;
  a.count = count;
  a.avg_n = avg_n;
  return run(t, op, a, stream);
}

int reduce_copy(DType t, RedOp op, const void* a, const void* b, void* out, void* out2,
                size_t count, void* stream) {
  FoldArgs f;
  f.in[0] = a;
  f.in[1] = b;
  f.w = 2;
  f.out[0] = out;
  f.out[1] = out2;
  f.nout = out2 ? 2 : 1;
  f.count = count;
  return run(t, op, f, stream);
}

int scale_avg(DType t, void* buf, size_t count, int nranks, void* stream) {
  if (nranks < 1) return int(cudaErrorInvalidValue);
  if (nranks == 1) return 0;
  FoldArgs f;
  f.in[0] = buf;
  f.w = 1;
  f.out[0] = buf;
  f.nout = 1;
  f.count = count;
  f.avg_n = nranks;
  return run(t, RedOp::kSum, f, stream);
}

}  // namespace chorus::kernels::cuda
