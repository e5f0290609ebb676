// The CPU kernel table.
#include "ddp/backend.h"

#include <fmt/format.h>

#include <stdexcept>

#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/softmax.h"

namespace chorus {
namespace {

namespace k = kernels::cpu;

const Backend kCpuBackend = {
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

const Backend& backend_for(Device device) {
  if (device == Device::kCpu) return kCpuBackend;
  throw std::invalid_argument(fmt::format("dispatch: expected device cpu, got {} (no kernels built)",
                                          device_name(device)));
}

void set_cpu_threads(int threads) { k::gemm_set_threads(threads < 1 ? 1 : threads); }

}  // namespace chorus
