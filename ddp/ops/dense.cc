// relu, linear, reshape/flatten, add, mul, sum, mean: forward and backward side by side.
#include <fmt/format.h>

#include <stdexcept>

#include "ddp/ops/kernel_table.h"
#include "ddp/ops/ops.h"
#include "ddp/tensor/autograd.h"

namespace chorus {
namespace {

// Saved: y. dx = dy * (y > 0).
class ReluNode final : public Node {
 public:
  explicit ReluNode(Tensor y) : y_(std::move(y)) {}
  const char* name() const override { return "relu"; }
  void backward(const Tensor& dy, std::span<Tensor> grads) override {
    Tensor dx = Tensor::empty(dy.shape(), dy.device());
    kernel_table_for(dy.device()).relu_backward(dy.numel(), y_.data(), dy.data(), dx.data());
    grads[0] = dx;
  }

 private:
  Tensor y_;
};

// Saved: x (N,in), w (out,in). dy (N,out) -> dx = dy w (N,in), dw = dy^T x (out,in), db = sum_N dy.
class LinearNode final : public Node {
 public:
  LinearNode(Tensor x, Tensor w) : x_(std::move(x)), w_(std::move(w)) {}
  const char* name() const override { return "linear"; }
  void backward(const Tensor& dy, std::span<Tensor> grads) override {
    const KernelTable& kt = kernel_table_for(dy.device());
    const int n = static_cast<int>(x_.dim(0)), in = static_cast<int>(x_.dim(1)),
              out = static_cast<int>(w_.dim(0));
    if (edge(0).defined()) {
      Tensor dx = Tensor::empty(x_.shape(), dy.device());
      kt.gemm(Trans::kNo, Trans::kNo, n, in, out, 1.0f, dy.data(), out, w_.data(), in, 0.0f,
              dx.data(), in);
      grads[0] = dx;
    }
    if (edge(1).defined()) {
      Tensor dw = Tensor::empty(w_.shape(), dy.device());
      kt.gemm(Trans::kYes, Trans::kNo, out, in, n, 1.0f, dy.data(), out, x_.data(), in, 0.0f,
              dw.data(), in);
      grads[1] = dw;
    }
    if (edge(2).defined()) {
      Tensor db = Tensor::empty(Shape{out}, dy.device());
      kt.sum_rows(n, out, dy.data(), db.data());
      grads[2] = db;
    }
  }

 private:
  Tensor x_, w_;
};

// The gradient is dy seen with the input's shape.
class ReshapeNode final : public Node {
 public:
  explicit ReshapeNode(const Shape& in) : in_(in) {}
  const char* name() const override { return "reshape"; }
  void backward(const Tensor& dy, std::span<Tensor> grads) override {
    grads[0] = Tensor::alias(dy, 0, in_);
  }

 private:
  Shape in_;
};

// The gradient goes back to the input's device.
class ToDeviceNode final : public Node {
 public:
  explicit ToDeviceNode(Device from) : from_(from) {}
  const char* name() const override { return "to_device"; }
  void backward(const Tensor& dy, std::span<Tensor> grads) override { grads[0] = dy.to(from_); }

 private:
  Device from_;
};

class AddNode final : public Node {
 public:
  const char* name() const override { return "add"; }
  void backward(const Tensor& dy, std::span<Tensor> grads) override {
    grads[0] = dy;
    grads[1] = dy;
  }
};

// Saved: a, b. da = dy * b, db = dy * a.
class MulNode final : public Node {
 public:
  MulNode(Tensor a, Tensor b) : a_(std::move(a)), b_(std::move(b)) {}
  const char* name() const override { return "mul"; }
  void backward(const Tensor& dy, std::span<Tensor> grads) override {
    const KernelTable& kt = kernel_table_for(dy.device());
    if (edge(0).defined()) {
      grads[0] = Tensor::empty(dy.shape(), dy.device());
      kt.mul(dy.numel(), dy.data(), b_.data(), grads[0].data());
    }
    if (edge(1).defined()) {
      grads[1] = Tensor::empty(dy.shape(), dy.device());
      kt.mul(dy.numel(), dy.data(), a_.data(), grads[1].data());
    }
  }

 private:
  Tensor a_, b_;
};

// sum (scale 1) and mean (scale 1/numel): dx = dy * scale everywhere.
class SumNode final : public Node {
 public:
  SumNode(const Shape& in, float scale) : in_(in), scale_(scale) {}
  const char* name() const override { return "sum"; }
  void backward(const Tensor& dy, std::span<Tensor> grads) override {
    grads[0] = Tensor::full(in_, dy.item() * scale_, dy.device());
  }

 private:
  Shape in_;
  float scale_;
};

Tensor reduce_all(const Tensor& x, float scale) {
  Tensor y = Tensor::empty(Shape{1}, x.device());
  const KernelTable& kt = kernel_table_for(x.device());
  kt.fill(1, kt.sum(x.numel(), x.data()) * scale, y.data());  // y may be device memory
  if (any_requires_grad({&x})) {
    auto node = std::make_shared<SumNode>(x.shape(), scale);
    node->set_inputs({&x});
    record(y, std::move(node));
  }
  return y;
}

}  // namespace

Tensor relu(const Tensor& x) {
  Tensor y = Tensor::empty(x.shape(), x.device());
  kernel_table_for(x.device()).relu_forward(x.numel(), x.data(), y.data());
  if (any_requires_grad({&x})) {
    auto node = std::make_shared<ReluNode>(y.detach());
    node->set_inputs({&x});
    record(y, std::move(node));
  }
  return y;
}

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b) {
  check_same_device("linear", {{"input", &x}, {"weight", &w}, {"bias", &b}});
  if (x.ndim() != 2 || w.ndim() != 2 || x.dim(1) != w.dim(1))
    throw std::invalid_argument(fmt::format("linear: expected input (N, {}) for weight {}, got {}",
                                            w.ndim() == 2 ? w.dim(1) : -1, w.shape().str(),
                                            x.shape().str()));
  if (b.defined()) check_shape("linear bias", Shape{w.dim(0)}, b.shape());
  const KernelTable& kt = kernel_table_for(x.device());
  const int n = static_cast<int>(x.dim(0)), in = static_cast<int>(x.dim(1)),
            out = static_cast<int>(w.dim(0));
  Tensor y = Tensor::empty(Shape{n, out}, x.device());
  // y (N,out) = x (N,in) w^T (in,out) + b
  kt.gemm(Trans::kNo, Trans::kYes, n, out, in, 1.0f, x.data(), in, w.data(), in, 0.0f, y.data(),
          out);
  if (b.defined()) kt.add_row_bias(n, out, b.data(), y.data());
  if (any_requires_grad({&x, &w, &b})) {
    auto node = std::make_shared<LinearNode>(x.detach(), w.detach());
    node->set_inputs({&x, &w, &b});
    record(y, std::move(node));
  }
  return y;
}

Tensor reshape(const Tensor& x, const Shape& shape) {
  if (shape.numel() != x.numel())
    throw std::invalid_argument(
        fmt::format("reshape: expected a shape of {} elements like {}, got {}", x.numel(),
                    x.shape().str(), shape.str()));
  Tensor y = Tensor::alias(x, 0, shape);
  if (any_requires_grad({&x})) {
    auto node = std::make_shared<ReshapeNode>(x.shape());
    node->set_inputs({&x});
    record(y, std::move(node));
  }
  return y;
}

Tensor to_device(const Tensor& x, Device d) {
  if (d == x.device()) return x;
  Tensor y = x.to(d);
  if (any_requires_grad({&x})) {
    auto node = std::make_shared<ToDeviceNode>(x.device());
    node->set_inputs({&x});
    record(y, std::move(node));
  }
  return y;
}

Tensor flatten(const Tensor& x, int start_dim) {
  if (start_dim < 0 || start_dim >= x.ndim())
    throw std::invalid_argument(
        fmt::format("flatten: expected start_dim in [0, {}), got {}", x.ndim(), start_dim));
  std::vector<int64_t> dims;
  int64_t tail = 1;
  for (int i = 0; i < x.ndim(); ++i) {
    if (i < start_dim)
      dims.push_back(x.dim(i));
    else
      tail *= x.dim(i);
  }
  dims.push_back(tail);
  return reshape(x, Shape::of(dims));
}

Tensor add(const Tensor& a, const Tensor& b) {
  check_same_device("add", {{"a", &a}, {"b", &b}});
  check_shape("add", a.shape(), b.shape());
  Tensor y = Tensor::empty(a.shape(), a.device());
  kernel_table_for(a.device()).add(a.numel(), a.data(), b.data(), y.data());
  if (any_requires_grad({&a, &b})) {
    auto node = std::make_shared<AddNode>();
    node->set_inputs({&a, &b});
    record(y, std::move(node));
  }
  return y;
}

Tensor mul(const Tensor& a, const Tensor& b) {
  check_same_device("mul", {{"a", &a}, {"b", &b}});
  check_shape("mul", a.shape(), b.shape());
  Tensor y = Tensor::empty(a.shape(), a.device());
  kernel_table_for(a.device()).mul(a.numel(), a.data(), b.data(), y.data());
  if (any_requires_grad({&a, &b})) {
    auto node = std::make_shared<MulNode>(a.detach(), b.detach());
    node->set_inputs({&a, &b});
    record(y, std::move(node));
  }
  return y;
}

Tensor sum(const Tensor& x) {
  return reduce_all(x, 1.0f);
}
Tensor mean(const Tensor& x) {
  return reduce_all(x, 1.0f / static_cast<float>(x.numel()));
}

}  // namespace chorus
