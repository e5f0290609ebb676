// One parameter's SGD step (momentum, dampening, weight decay, Nesterov), written in the order
// of PyTorch's _single_tensor_sgd so the f32 rounding matches; the CUDA kernel
// (kernels/cuda/nn.h) rounds the same way.
#pragma once

namespace chorus::kernels::cpu {

struct SgdStep {
  float lr = 0.01f;
  float momentum = 0.0f;
  float dampening = 0.0f;
  float weight_decay = 0.0f;
  bool nesterov = false;
};

// w -= lr * d, d the decayed gradient through the momentum buffer `buf` (null without momentum;
// `first`: the buffer starts as d). w, grad and buf never overlap.
void sgd_update(const SgdStep& o, long n, float* w, const float* grad, float* buf, bool first);

}  // namespace chorus::kernels::cpu
