// Differentiable ops on Tensors. Each records one autograd Node when grad mode is on and an input
// requires grad; forward and backward of each op sit side by side in ddp/ops/{conv,dense,loss}.cc.
// Shapes follow PyTorch: images are (N, C, H, W), matrices (rows, cols). Mismatched shapes throw
// std::invalid_argument naming the op, the expected and the actual shape.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "ddp/tensor/tensor.h"

namespace chorus {

enum class Reduction { kMean, kSum };

// conv.cc
// x (N,C,H,W), w (OC,C,KH,KW), b (OC) or undefined -> (N,OC,OH,OW)
Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& b, int stride = 1, int padding = 0);
// x (N,C,H,W) -> (N,C,OH,OW), no padding, floor mode
Tensor max_pool2d(const Tensor& x, int kernel, int stride);

// dense.cc
Tensor relu(const Tensor& x);
// x (N,in), w (out,in), b (out) or undefined -> (N,out) = x w^T + b
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b);
Tensor reshape(const Tensor& x, const Shape& shape);  // same storage, same numel
Tensor flatten(const Tensor& x, int start_dim = 1);   // (N, ...) -> (N, prod(...))
// x copied to device d, differentiably (the gradient is copied back): the seam of a model split
// across devices (model parallel). x itself when it is there already.
Tensor to_device(const Tensor& x, Device d);
Tensor add(const Tensor& a, const Tensor& b);  // same shapes
Tensor mul(const Tensor& a, const Tensor& b);  // same shapes, elementwise
Tensor sum(const Tensor& x);                   // -> (1)
Tensor mean(const Tensor& x);                  // -> (1)

// loss.cc
Tensor log_softmax(const Tensor& x);  // x (N,K), over dim 1
// logp (N,K), labels N values in [0,K) -> (1)
Tensor nll_loss(const Tensor& logp, std::span<const int32_t> labels,
                Reduction reduction = Reduction::kMean);
Tensor cross_entropy(const Tensor& logits, std::span<const int32_t> labels,
                     Reduction reduction = Reduction::kMean);

// Class labels kept in a device's memory: a captured step's static input (ddp/train/
// step_graph.h), filled with set() before each replay. On the cpu, host memory. Copies share
// the values.
class Labels {
 public:
  Labels() = default;
  Labels(int64_t n, Device device);
  // n values in [0, classes), copied to the device; throws std::invalid_argument naming the
  // first one outside (as nll_loss does) or a count that differs.
  void set(std::span<const int32_t> values, int classes);
  const int32_t* data() const;
  int64_t size() const { return n_; }
  Device device() const { return values_.device(); }
  int classes() const { return classes_; }  // as the last set() checked them (0 before)

 private:
  Tensor values_;  // n floats' bytes, holding int32 values
  int64_t n_ = 0;
  int classes_ = 0;
};
Tensor nll_loss(const Tensor& logp, const Labels& labels, Reduction reduction = Reduction::kMean);
Tensor cross_entropy(const Tensor& logits, const Labels& labels,
                     Reduction reduction = Reduction::kMean);
std::vector<int32_t> argmax(const Tensor& x);  // x (N,K) -> N indices, first maximum wins

}  // namespace chorus
