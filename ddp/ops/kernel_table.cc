// The CPU kernel table.
#include "ddp/ops/kernel_table.h"

#include <fmt/format.h>

#include <stdexcept>

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

#include "ddp/ops/thread_pool.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/softmax.h"

namespace chorus {
namespace {

namespace k = kernels::cpu;

const KernelTable kCpuKernels = {
    k::gemm,
    k::conv2d_forward,
    k::conv2d_backward,
    k::max_pool2d_forward,
    k::max_pool2d_backward,
    k::relu_forward,
    k::relu_backward,
    k::add,
    k::mul,
    k::scale,
    k::fill,
    k::sum,
    k::add_row_bias,
    k::sum_rows,
    k::log_softmax_forward,
    k::log_softmax_backward,
    k::nll_forward,
    k::nll_backward,
    k::argmax_rows,
};

}  // namespace

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
  throw std::invalid_argument(
      fmt::format("dispatch: expected device cpu, got {} (no kernels for it are built yet; "
                  "move the tensors with .to(Device::cpu()))",
                  device.str()));
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
