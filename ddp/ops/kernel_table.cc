// The CPU kernel table.
#include "ddp/ops/kernel_table.h"

#include <fmt/format.h>

#include <atomic>
#include <stdexcept>

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

#include "common/env.h"
#include "ddp/ops/thread_pool.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/softmax.h"
#include "kernels/cuda/nn.h"

namespace chorus {
namespace {

namespace k = kernels::cpu;

// nll's forward and backward with the loss and its gradient where the tensors are (here, host).
// (On the cpu, the device's memory is the host's: on_device changes nothing.)
void nll_forward_cpu(int rows, int cols, const float* logp, const int32_t* labels, bool,
                     float divisor, float* y) {
  *y = k::nll_forward(rows, cols, logp, labels) / divisor;
}
void nll_backward_cpu(int rows, int cols, const int32_t* labels, bool, const float* dy, float scale,
                      float* dlogp) {
  k::nll_backward(rows, cols, labels, *dy * scale, dlogp);
}

// The DDP reducer's division of each gradient by the world size (as PyTorch's: a true division).
void div_scalar_cpu(long n, const float* x, float d, float* y) {
  for (long i = 0; i < n; ++i) y[i] = x[i] / d;
}

const KernelTable kCpuKernels = {
    .gemm = k::gemm,
    .conv2d_forward = k::conv2d_forward,
    .conv2d_backward = k::conv2d_backward,
    .max_pool2d_forward = k::max_pool2d_forward,
    .max_pool2d_backward = k::max_pool2d_backward,
    .relu_forward = k::relu_forward,
    .relu_backward = k::relu_backward,
    .add = k::add,
    .mul = k::mul,
    .scale = k::scale,
    .div_scalar = div_scalar_cpu,
    .fill = k::fill,
    .sum = k::sum,
    .add_row_bias = k::add_row_bias,
    .sum_rows = k::sum_rows,
    .log_softmax_forward = k::log_softmax_forward,
    .log_softmax_backward = k::log_softmax_backward,
    .nll_forward = nll_forward_cpu,
    .nll_backward = nll_backward_cpu,
    .argmax_rows = k::argmax_rows,
    .sgd_update = k::sgd_update,
};

namespace cu = kernels::cuda::nn;
const KernelTable kCudaKernels = {
    .gemm = cu::gemm,
    .conv2d_forward = cu::conv2d_forward,
    .conv2d_backward = cu::conv2d_backward,
    .max_pool2d_forward = cu::max_pool2d_forward,
    .max_pool2d_backward = cu::max_pool2d_backward,
    .relu_forward = cu::relu_forward,
    .relu_backward = cu::relu_backward,
    .add = cu::add,
    .mul = cu::mul,
    .scale = cu::scale,
    .div_scalar = cu::div_scalar,
    .fill = cu::fill,
    .sum = cu::sum,
    .add_row_bias = cu::add_row_bias,
    .sum_rows = cu::sum_rows,
    .log_softmax_forward = cu::log_softmax_forward,
    .log_softmax_backward = cu::log_softmax_backward,
    .nll_forward = cu::nll_forward,
    .nll_backward = cu::nll_backward,
    .argmax_rows = cu::argmax_rows,
    .sgd_update = cu::sgd_update,
};

std::atomic<const KernelTable*> g_test_cuda_table{nullptr};
std::atomic<int> g_allow_tf32{-1};  // -1: CHORUS_ALLOW_TF32 not read yet

}  // namespace

bool allow_tf32() {
  int v = g_allow_tf32.load();
  if (v >= 0) return v == 1;
  Result<int64_t> env = env_int_in("CHORUS_ALLOW_TF32", 0, 0, 1);
  if (!env.is_ok()) throw std::invalid_argument(env.status().message());
  g_allow_tf32.compare_exchange_strong(v, static_cast<int>(*env));  // a set_allow_tf32 wins
  return g_allow_tf32.load() == 1;
}

void set_allow_tf32(bool allow) {
  g_allow_tf32.store(allow ? 1 : 0);
}

void reset_allow_tf32_for_test() {
  g_allow_tf32.store(-1);
}

void set_cuda_kernel_table_for_test(const KernelTable* table) {
  g_test_cuda_table.store(table);
}

const KernelTable& kernel_table_for(Device device) {
  if (device.is_cpu()) {
    // A bad CHORUS_CPU_ISA (kernels/cpu/isa.h) is an exception here, not an abort in a kernel.
    static const bool isa_ok = [] {
      if (Status s = kernels::init_isa(); !s.is_ok()) throw std::invalid_argument(s.message());
      return true;
    }();
    (void)isa_ok;
    return kCpuKernels;
  }
  const bool tf32 = allow_tf32();
  if (const KernelTable* t = g_test_cuda_table.load()) return *t;
  if (const std::string why = kernels_unavailable(device); !why.empty())
    throw std::invalid_argument(
        fmt::format("dispatch: no kernels for {}: {} (move the tensors with .to(Device::cpu()))",
                    device.str(), why));
  cu::set_device(device.index);
  cu::set_allow_tf32(tf32);
  return kCudaKernels;
}

std::string kernels_unavailable(Device device) {
  if (device.is_cpu() || g_test_cuda_table.load()) return {};
  static const std::string why = cu::unavailable();  // probed once
  return why;
}

void check_same_device(const char* op,
                       std::initializer_list<std::pair<const char*, const Tensor*>> tensors) {
  const std::pair<const char*, const Tensor*>* first = nullptr;
  for (const auto& t : tensors) {
    if (!t.second->defined()) continue;
    if (!first) {
      first = &t;
      continue;
    }
    if (t.second->device() != first->second->device())
      throw std::invalid_argument(fmt::format(
          "{}: {} is on {} but {} is on {}: every input must be on one device (move one with "
          ".to())",
          op, first->first, first->second->device().str(), t.first, t.second->device().str()));
  }
}

void set_cpu_threads(int threads) {
  // Our pool splits conv layers over the batch; OpenBLAS stays on one thread so the two never
  // oversubscribe the cores (a GEMM may run inside a pool part).
  set_intra_op_threads(threads);
  k::gemm_set_threads(1);
}

bool set_flush_denormal(bool on) {
#if defined(__x86_64__) || defined(__i386__)
  constexpr unsigned kFtzDaz = 0x8040;  // flush-to-zero (bit 15) | denormals-are-zero (bit 6)
  const unsigned csr = _mm_getcsr();
  _mm_setcsr(on ? (csr | kFtzDaz) : (csr & ~kFtzDaz));
  return true;
#else
  return !on;
#endif
}

}  // namespace chorus
