// SGD with PyTorch's exact update rule (torch.optim.SGD, 1.13):
//   g = grad + weight_decay * p
//   buf = g (first step) | momentum * buf + (1 - dampening) * g
//   g = g + momentum * buf (nesterov) | buf
//   p = p - lr * g
#pragma once

#include <vector>

#include "ddp/ops/kernel_table.h"  // kernels/cpu/sgd.h
#include "ddp/tensor/tensor.h"

namespace chorus {

// lr, momentum, dampening, weight_decay, nesterov (PyTorch's defaults but lr): the step the
// kernels make (kernels/cpu/sgd.h, and the CUDA one).
using SgdOptions = kernels::cpu::SgdStep;

class Sgd {
 public:
  // Throws on nesterov without momentum or with dampening (as PyTorch does) and on negative lr.
  Sgd(std::vector<Tensor> params, SgdOptions options);
  // Applies one update to every parameter that has a gradient; runs without recording autograd.
  void step();
  // Zeroes gradients in place (keeps their buffers, so views into DDP buckets survive), or drops
  // them when set_to_none.
  void zero_grad(bool set_to_none = false);

  const SgdOptions& options() const { return options_; }
  void set_lr(float lr) { options_.lr = lr; }
  // The momentum buffers, one per parameter (undefined before the first step): for checkpoints.
  std::vector<Tensor>& momentum_buffers() { return buffers_; }

 private:
  std::vector<Tensor> params_;
  std::vector<Tensor> buffers_;
  SgdOptions options_;
};

}  // namespace chorus
