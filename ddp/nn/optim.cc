// SGD step, written in the order of PyTorch's _single_tensor_sgd so the f32 rounding matches.
#include "ddp/nn/optim.h"

#include "ddp/ops/kernel_table.h"

#include <fmt/format.h>

#include <stdexcept>

namespace chorus {

Sgd::Sgd(std::vector<Tensor> params, SgdOptions options)
    : params_(std::move(params)), buffers_(params_.size()), options_(options) {
  if (options_.lr < 0.0f)
    throw std::invalid_argument(fmt::format("sgd: expected lr >= 0, got {}", options_.lr));
  if (options_.nesterov && (options_.momentum <= 0.0f || options_.dampening != 0.0f))
    throw std::invalid_argument(fmt::format(
        "sgd: nesterov expects momentum > 0 and dampening 0, got momentum {} and dampening {}",
        options_.momentum, options_.dampening));
}

void Sgd::step() {
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor& p = params_[i];
    if (!p.grad().defined()) continue;
    const bool first = options_.momentum != 0.0f && !buffers_[i].defined();
    if (first) buffers_[i] = Tensor::empty(p.shape(), p.device());
    float* buf = options_.momentum != 0.0f ? buffers_[i].data() : nullptr;
    kernel_table_for(p.device())
        .sgd_update(options_, static_cast<long>(p.numel()), p.data(), p.grad().data(), buf, first);
  }
}

void Sgd::zero_grad(bool set_to_none) {
  for (Tensor& p : params_) {
    if (!p.grad().defined()) continue;
    if (set_to_none)
      p.set_grad(Tensor());
    else
      p.grad().fill(0.0f);
  }
}

}  // namespace chorus
