// The one dispatch point from tensor ops to kernels: a table of kernel entry points per Device,
// filled from kernels/cpu and, for cuda:N, from kernels/cuda/nn.h (on device pointers; host
// values -- labels, argmax's output, sum's result -- stay on the host).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>

#include "ddp/tensor/tensor.h"
#include "kernels/cpu/conv2d.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/pool.h"
#include "kernels/cpu/sgd.h"

namespace chorus {

using kernels::cpu::Conv2dShape;
using kernels::cpu::PoolShape;
using kernels::cpu::Trans;

struct KernelTable {
  void (*gemm)(Trans, Trans, int m, int n, int k, float alpha, const float* a, int lda,
               const float* b, int ldb, float beta, float* c, int ldc);
  void (*conv2d_forward)(const Conv2dShape&, const float* x, const float* w, const float* b,
                         float* y, float* workspace, int chunk);
  void (*conv2d_backward)(const Conv2dShape&, const float* x, const float* w, const float* dy,
                          float* dx, float* dw, float* db, float* workspace, int chunk);
  void (*max_pool2d_forward)(const PoolShape&, const float* x, float* y, uint8_t* argmax);
  void (*max_pool2d_backward)(const PoolShape&, const float* x, const float* y,
                              const uint8_t* argmax, const float* dy, float* dx);
  void (*relu_forward)(long n, const float* x, float* y);
  void (*relu_backward)(long n, const float* y, const float* dy, float* dx);
  void (*add)(long n, const float* a, const float* b, float* y);
  void (*mul)(long n, const float* a, const float* b, float* y);
  void (*scale)(long n, float alpha, const float* x, float* y);
  void (*div_scalar)(long n, const float* x, float d, float* y);  // y = x / d (not x * (1/d))
  void (*fill)(long n, float value, float* y);
  float (*sum)(long n, const float* x);
  void (*add_row_bias)(int rows, int cols, const float* bias, float* y);
  void (*sum_rows)(int rows, int cols, const float* dy, float* dbias);
  void (*log_softmax_forward)(int rows, int cols, const float* x, float* y);
  void (*log_softmax_backward)(int rows, int cols, const float* y, const float* dy, float* dx);
  // The loss and its gradient stay on the device (no host wait inside a step): y[0] = the sum
  // of -logp[r, labels[r]] (in double, row order) rounded to float, / divisor; the backward reads
  // dy[0]: dlogp[r, labels[r]] = -(dy[0] * scale), 0 elsewhere. labels: host memory, or the
  // device's when on_device (Labels in ops.h: a captured step's static input).
  void (*nll_forward)(int rows, int cols, const float* logp, const int32_t* labels, bool on_device,
                      float divisor, float* y);
  void (*nll_backward)(int rows, int cols, const int32_t* labels, bool on_device, const float* dy,
                       float scale, float* dlogp);
  void (*argmax_rows)(int rows, int cols, const float* x, int32_t* out);  // out: host memory
  void (*sgd_update)(const kernels::cpu::SgdStep&, long n, float* w, const float* grad, float* buf,
                     bool first);
};

// Throws std::invalid_argument naming the device when no kernels exist for it (a build without
// CUDA, no such device), or repeating the message of a bad CHORUS_CPU_ISA. For cuda:N, makes N
// the calling thread's current device.
const KernelTable& kernel_table_for(Device device);
// Empty where kernels for `device` can run; otherwise why not (no CUDA build, no device).
std::string kernels_unavailable(Device device);
// Tests: the table cuda:N dispatches to (nullptr: CUDA's again). With an emulated GPU whose
// memory the CPU reads (tests/ddp/test_device_ddp.cc), the CPU table serves.
void set_cuda_kernel_table_for_test(const KernelTable* table);

// TF32 for the GEMMs of cuda:N (linear and convolution layers; PyTorch's allow_tf32): off unless
// CHORUS_ALLOW_TF32=1 (read at the first call of either; a value other than 0 or 1 throws
// std::invalid_argument naming it, there and at every cuda dispatch until it is fixed) or
// set_allow_tf32(true). Off, every product stays float and the GPU matches the CPU within 1e-5;
// on, the tensor cores multiply operands rounded to 10 mantissa bits (relative error about 1e-3).
// The CPU kernels never use it.
bool allow_tf32();
void set_allow_tf32(bool allow);
void reset_allow_tf32_for_test();  // CHORUS_ALLOW_TF32 read again at the next allow_tf32()

// Ops with several tensor inputs call this first: throws std::invalid_argument when the defined
// ones are not all on one device, naming the op, two of the tensors and their devices.
void check_same_device(const char* op,
                       std::initializer_list<std::pair<const char*, const Tensor*>> tensors);

// Intra-op threads for the CPU kernels: conv2d forward/backward split the batch across this many
// threads (ddp/ops/thread_pool.h); everything else runs on the caller. Results depend on the thread
// count only through the order dw/db partial sums are added (fixed for a given count).
void set_cpu_threads(int threads);

// Flush denormal floats to zero on the calling thread (x86 FTZ/DAZ), like
// torch.set_flush_denormal(True). Momentum buffers of weights whose gradient stays zero decay
// into the denormal range, where every multiply takes a ~100-cycle microcode assist.
// Returns false where the CPU has no such mode.
bool set_flush_denormal(bool on);

}  // namespace chorus
