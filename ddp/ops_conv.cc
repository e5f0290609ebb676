// conv2d and max_pool2d: forward and backward side by side.
#include <fmt/format.h>

#include <stdexcept>

#include "ddp/autograd.h"
#include "ddp/backend.h"
#include "ddp/ops.h"

namespace chorus {
namespace {

// Saved: col = im2col(x) (K, N*OH*OW) and w. Gradients: dx (N,C,H,W), dw (OC,C,KH,KW), db (OC).
class Conv2dNode final : public Node {
 public:
  Conv2dNode(const Conv2dShape& s, Tensor col, Tensor w) : s_(s), col_(std::move(col)), w_(std::move(w)) {}
  const char* name() const override { return "conv2d"; }
  void backward(const Tensor& dy, std::span<Tensor> grads) override {
    const Backend& be = backend_for(dy.device());
    Tensor dx = edge(0).defined() ? Tensor::empty(Shape{s_.n, s_.c, s_.h, s_.w}, dy.device()) : Tensor();
    Tensor dw = Tensor::empty(w_.shape(), dy.device());
    Tensor db = edge(2).defined() ? Tensor::empty(Shape{s_.oc}, dy.device()) : Tensor();
    Tensor scratch = Tensor::empty(Shape{static_cast<int64_t>(s_.scratch_floats())}, dy.device());
    // dcol reuses col's buffer: col is dead once dw is computed.
    be.conv2d_backward(s_, col_.data(), w_.data(), dy.data(), dx.defined() ? dx.data() : nullptr, dw.data(),
                       db.defined() ? db.data() : nullptr, scratch.data(), col_.data());
    grads[0] = dx;
    if (edge(1).defined()) grads[1] = dw;
    grads[2] = db;
    col_ = Tensor();
  }

 private:
  Conv2dShape s_;
  Tensor col_, w_;
};

// Saved: x and y (the backward finds each window's first maximum again). dx (N,C,H,W).
class MaxPool2dNode final : public Node {
 public:
  MaxPool2dNode(const PoolShape& s, Tensor x, Tensor y) : s_(s), x_(std::move(x)), y_(std::move(y)) {}
  const char* name() const override { return "max_pool2d"; }
  void backward(const Tensor& dy, std::span<Tensor> grads) override {
    Tensor dx = Tensor::empty(x_.shape(), dy.device());
    backend_for(dy.device()).max_pool2d_backward(s_, x_.data(), y_.data(), dy.data(), dx.data());
    grads[0] = dx;
  }

 private:
  PoolShape s_;
  Tensor x_, y_;
};

}  // namespace

Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& b, int stride, int padding) {
  if (x.ndim() != 4 || w.ndim() != 4)
    throw std::invalid_argument(fmt::format("conv2d: expected 4-d input and weight, got {} and {}",
                                            x.shape().str(), w.shape().str()));
  if (x.dim(1) != w.dim(1))
    throw std::invalid_argument(fmt::format("conv2d: expected input with {} channels (weight {}), got {}",
                                            w.dim(1), w.shape().str(), x.shape().str()));
  if (b.defined()) check_shape("conv2d bias", Shape{w.dim(0)}, b.shape());
  if (stride < 1 || padding < 0)
    throw std::invalid_argument(fmt::format("conv2d: expected stride >= 1 and padding >= 0, got {} and {}",
                                            stride, padding));
  Conv2dShape s;
  s.n = static_cast<int>(x.dim(0)), s.c = static_cast<int>(x.dim(1));
  s.h = static_cast<int>(x.dim(2)), s.w = static_cast<int>(x.dim(3));
  s.oc = static_cast<int>(w.dim(0)), s.kh = static_cast<int>(w.dim(2)), s.kw = static_cast<int>(w.dim(3));
  s.stride = stride, s.pad = padding;
  if (s.h + 2 * padding < s.kh || s.w + 2 * padding < s.kw)
    throw std::invalid_argument(fmt::format("conv2d: expected input at least {}x{} after padding, got {}",
                                            s.kh, s.kw, x.shape().str()));
  const Backend& be = backend_for(x.device());
  Tensor y = Tensor::empty(Shape{s.n, s.oc, s.oh(), s.ow()}, x.device());
  Tensor col = Tensor::empty(Shape{static_cast<int64_t>(s.col_floats())}, x.device());
  Tensor scratch = Tensor::empty(Shape{static_cast<int64_t>(s.scratch_floats())}, x.device());
  be.conv2d_forward(s, x.data(), w.data(), b.defined() ? b.data() : nullptr, y.data(), col.data(), scratch.data());
  if (any_requires_grad({&x, &w, &b})) {
    auto node = std::make_shared<Conv2dNode>(s, col, w.detach());
    node->set_inputs({&x, &w, &b});
    record(y, std::move(node));
  }
  return y;
}

Tensor max_pool2d(const Tensor& x, int kernel, int stride) {
  if (x.ndim() != 4)
    throw std::invalid_argument(fmt::format("max_pool2d: expected a 4-d input, got {}", x.shape().str()));
  if (kernel < 1 || stride < 1 || x.dim(2) < kernel || x.dim(3) < kernel)
    throw std::invalid_argument(fmt::format("max_pool2d: expected kernel {} to fit input {}, got stride {}",
                                            kernel, x.shape().str(), stride));
  PoolShape s;
  s.planes = static_cast<int>(x.dim(0) * x.dim(1));
  s.h = static_cast<int>(x.dim(2)), s.w = static_cast<int>(x.dim(3));
  s.kernel = kernel, s.stride = stride;
  Tensor y = Tensor::empty(Shape{x.dim(0), x.dim(1), s.oh(), s.ow()}, x.device());
  backend_for(x.device()).max_pool2d_forward(s, x.data(), y.data());
  if (any_requires_grad({&x})) {
    auto node = std::make_shared<MaxPool2dNode>(s, x.detach(), y.detach());
    node->set_inputs({&x});
    record(y, std::move(node));
  }
  return y;
}

}  // namespace chorus
