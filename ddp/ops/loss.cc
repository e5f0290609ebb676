// log_softmax, nll_loss, cross_entropy, argmax: forward and backward side by side.
#include <fmt/format.h>

#include <cstring>
#include <stdexcept>

#include "ddp/ops/kernel_table.h"
#include "ddp/ops/ops.h"
#include "ddp/tensor/autograd.h"
#include "ddp/tensor/device_cache.h"

namespace chorus {
namespace {

// Saved: y = log_softmax(x) (N,K). dx = dy - exp(y) * rowsum(dy).
class LogSoftmaxNode final : public Node {
 public:
  explicit LogSoftmaxNode(Tensor y) : y_(std::move(y)) {}
  const char* name() const override { return "log_softmax"; }
  void backward(const Tensor& dy, std::span<Tensor> grads) override {
    Tensor dx = Tensor::empty(dy.shape(), dy.device());
    kernel_table_for(dy.device())
        .log_softmax_backward(static_cast<int>(dy.dim(0)), static_cast<int>(dy.dim(1)), y_.data(),
                              dy.data(), dx.data());
    grads[0] = dx;
  }

 private:
  Tensor y_;
};

// Saved: the labels (host values, or Labels on the device), shape (N,K).
// dlogp[r, label r] = -dloss (sum) or -dloss / N (mean).
class NllNode final : public Node {
 public:
  NllNode(std::span<const int32_t> labels, const Shape& in, float scale)
      : host_(labels.begin(), labels.end()), in_(in), scale_(scale) {}
  NllNode(Labels labels, const Shape& in, float scale)
      : device_(std::move(labels)), in_(in), scale_(scale) {}
  const char* name() const override { return "nll_loss"; }
  void backward(const Tensor& dy, std::span<Tensor> grads) override {
    Tensor dx = Tensor::empty(in_, dy.device());
    const bool on_device = device_.size() > 0;
    kernel_table_for(dy.device())
        .nll_backward(static_cast<int>(in_[0]), static_cast<int>(in_[1]),
                      on_device ? device_.data() : host_.data(), on_device, dy.data(), scale_,
                      dx.data());  // dy read where it lies: no host wait
    grads[0] = dx;
  }

 private:
  std::vector<int32_t> host_;
  Labels device_;
  Shape in_;
  float scale_;
};

void check_labels(std::span<const int32_t> labels, int64_t n, int k) {
  if (static_cast<int64_t>(labels.size()) != n)
    throw std::invalid_argument(
        fmt::format("nll_loss: expected {} labels, got {}", n, labels.size()));
  for (size_t i = 0; i < labels.size(); ++i)
    if (labels[i] < 0 || labels[i] >= k)
      throw std::invalid_argument(
          fmt::format("nll_loss: expected labels in [0, {}), got {} at {}", k, labels[i], i));
}

void check_matrix(const char* op, const Tensor& x) {
  if (x.ndim() != 2)
    throw std::invalid_argument(
        fmt::format("{}: expected a 2-d input (N, K), got {}", op, x.shape().str()));
}

}  // namespace

Tensor log_softmax(const Tensor& x) {
  check_matrix("log_softmax", x);
  Tensor y = Tensor::empty(x.shape(), x.device());
  kernel_table_for(x.device())
      .log_softmax_forward(static_cast<int>(x.dim(0)), static_cast<int>(x.dim(1)), x.data(),
                           y.data());
  if (any_requires_grad({&x})) {
    auto node = std::make_shared<LogSoftmaxNode>(y.detach());
    node->set_inputs({&x});
    record(y, std::move(node));
  }
  return y;
}

namespace {

// The loss of labels already checked: host values, or Labels on logp's device (on_device).
template <typename L>
Tensor nll_checked(const Tensor& logp, const L& labels, const int32_t* data, bool on_device,
                   Reduction reduction) {
  const int n = static_cast<int>(logp.dim(0)), k = static_cast<int>(logp.dim(1));
  const float scale = reduction == Reduction::kMean ? 1.0f / static_cast<float>(n) : 1.0f;
  Tensor y = Tensor::empty(Shape{1}, logp.device());
  kernel_table_for(logp.device())
      .nll_forward(n, k, logp.data(), data, on_device,
                   reduction == Reduction::kMean ? static_cast<float>(n) : 1.0f, y.data());
  if (any_requires_grad({&logp})) {
    auto node = std::make_shared<NllNode>(labels, logp.shape(), scale);
    node->set_inputs({&logp});
    record(y, std::move(node));
  }
  return y;
}

}  // namespace

Tensor nll_loss(const Tensor& logp, std::span<const int32_t> labels, Reduction reduction) {
  check_matrix("nll_loss", logp);
  check_labels(labels, logp.dim(0), static_cast<int>(logp.dim(1)));
  return nll_checked(logp, labels, labels.data(), false, reduction);
}

Tensor nll_loss(const Tensor& logp, const Labels& labels, Reduction reduction) {
  check_matrix("nll_loss", logp);
  const int64_t n = logp.dim(0), k = logp.dim(1);
  if (labels.size() != n)
    throw std::invalid_argument(
        fmt::format("nll_loss: expected {} labels, got {}", n, labels.size()));
  if (labels.classes() != k)
    throw std::invalid_argument(
        fmt::format("nll_loss: the labels were checked against {} classes, the input has {}",
                    labels.classes(), k));
  if (labels.device() != logp.device())
    throw std::invalid_argument(fmt::format("nll_loss: input is on {} but labels are on {}",
                                            logp.device().str(), labels.device().str()));
  return nll_checked(logp, labels, labels.data(), true, reduction);
}

Tensor cross_entropy(const Tensor& logits, std::span<const int32_t> labels, Reduction reduction) {
  return nll_loss(log_softmax(logits), labels, reduction);
}

Tensor cross_entropy(const Tensor& logits, const Labels& labels, Reduction reduction) {
  return nll_loss(log_softmax(logits), labels, reduction);
}

Labels::Labels(int64_t n, Device device)
    : values_(Tensor::empty(Shape{n > 0 ? n : 1}, device)), n_(n) {
  static_assert(sizeof(int32_t) == sizeof(float), "labels live in a float tensor's bytes");
  if (n <= 0) throw std::invalid_argument(fmt::format("Labels: expected n > 0, got {}", n));
}

void Labels::set(std::span<const int32_t> values, int classes) {
  check_labels(values, n_, classes);
  if (values_.device().is_cpu())
    std::memcpy(values_.data(), values.data(), values.size_bytes());
  else
    cuda_backend().copy(values_.data(), values_.device(), values.data(), Device::cpu(),
                        values.size_bytes());
  classes_ = classes;
}

const int32_t* Labels::data() const {
  return reinterpret_cast<const int32_t*>(values_.data());
}

std::vector<int32_t> argmax(const Tensor& x) {
  check_matrix("argmax", x);
  std::vector<int32_t> out(static_cast<size_t>(x.dim(0)));
  kernel_table_for(x.device())
      .argmax_rows(static_cast<int>(x.dim(0)), static_cast<int>(x.dim(1)), x.data(), out.data());
  return out;
}

}  // namespace chorus
