// The calls chorus makes on a user's thread while one of its streams may be being captured into
// a CUDA graph: allocations (cudaMalloc, cudaHostAlloc), IPC exports and opens, VMM maps, new
// streams and events. Under cudaStreamCaptureModeGlobal -- PyTorch's default, and the mode of
// any capture on another thread -- CUDA counts them "potentially unsafe": they fail and
// invalidate the capture. None of them touches a stream being captured, so each runs with this
// thread's mode relaxed for its duration, as NCCL's and PyTorch's allocations do under capture
// (c10's CUDAStreamCaptureModeGuard). Frees are not covered: they synchronise, and the callers
// never free while a capture is under way. Closes of peers' memory (IPC closes, VMM unmaps) may
// synchronise too: on the calling thread they wait for its next call not captured
// (devcall::take_news); relaxed, they do not fail for another thread's capture. For the .cu
// files of kernels/cuda only.
#pragma once

#include <cuda_runtime.h>

namespace chorus::kernels::cuda {

class RelaxedCapture {
 public:
  RelaxedCapture() { (void)cudaThreadExchangeStreamCaptureMode(&mode_); }
  ~RelaxedCapture() { (void)cudaThreadExchangeStreamCaptureMode(&mode_); }
  RelaxedCapture(const RelaxedCapture&) = delete;
  RelaxedCapture& operator=(const RelaxedCapture&) = delete;

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;  // the thread's, while alive
};

}  // namespace chorus::kernels::cuda
