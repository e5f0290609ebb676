// conv2d and max_pool2d: forward and backward side by side.
#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

#include "ddp/ops/kernel_table.h"
#include "ddp/ops/ops.h"
#include "ddp/ops/thread_pool.h"
#include "ddp/tensor/autograd.h"

namespace chorus {
namespace {

// Batch split for intra-op threads: part p of `parts` covers images [first(p), first(p + 1)).
// On a GPU one part: its kernels take the whole batch.
struct BatchSplit {
  int n, parts;
  BatchSplit(int batch, Device d)
      : n(batch), parts(d.is_cpu() ? std::max(1, std::min(intra_op_threads(), batch)) : 1) {}
  int first(int p) const { return static_cast<int>(static_cast<long>(n) * p / parts); }
  Conv2dShape sub(const Conv2dShape& s, int p) const {
    Conv2dShape c = s;
    c.n = first(p + 1) - first(p);
    return c;
  }
  size_t workspace(const Conv2dShape& s) const {
    const Conv2dShape c = sub(s, 0);  // part 0 is never larger than the others by more than 1
    Conv2dShape big = c;
    big.n = c.n + 1;
    return kernels::cpu::conv2d_workspace_floats(big, kernels::cpu::conv2d_default_chunk(big));
  }
};

// Saved: x and w (backward recomputes im2col chunk by chunk). dy (N,OC,OH,OW) ->
// dx (N,C,H,W), dw (OC,C,KH,KW), db (OC).
class Conv2dNode final : public Node {
 public:
  Conv2dNode(const Conv2dShape& s, Tensor x, Tensor w)
      : s_(s), x_(std::move(x)), w_(std::move(w)) {}
  const char* name() const override { return "conv2d"; }
  void backward(const Tensor& dy, std::span<Tensor> grads) override {
    Tensor dx = edge(0).defined() ? Tensor::empty(x_.shape(), dy.device()) : Tensor();
    Tensor dw = Tensor::empty(w_.shape(), dy.device());
    Tensor db = edge(2).defined() ? Tensor::empty(Shape{s_.oc}, dy.device()) : Tensor();
    const KernelTable& kt = kernel_table_for(dy.device());
    const BatchSplit split(s_.n, dy.device());
    const size_t ws_each = split.workspace(s_);
    const long wn = w_.numel();
    // part 0 writes dw/db directly; the others into their own slices, summed after in part order
    Tensor ws = Tensor::empty(Shape{static_cast<int64_t>((ws_each + wn + s_.oc) * split.parts)},
                              dy.device());
    const long in_image = static_cast<long>(s_.c) * s_.h * s_.w,
               out_image = static_cast<long>(s_.oc) * s_.oh() * s_.ow();
    parallel_parts(split.parts, [&](int p) {
      const Conv2dShape c = split.sub(s_, p);
      float* mine = ws.data() + p * (ws_each + wn + s_.oc);
      float* pdw = p == 0 ? dw.data() : mine + ws_each;
      float* pdb = !db.defined() ? nullptr : p == 0 ? db.data() : mine + ws_each + wn;
      const long f = split.first(p);
      kt.conv2d_backward(c, x_.data() + f * in_image, w_.data(), dy.data() + f * out_image,
                         dx.defined() ? dx.data() + f * in_image : nullptr, pdw, pdb, mine,
                         kernels::cpu::conv2d_default_chunk(c));
    });
    for (int p = 1; p < split.parts; ++p) {
      const float* mine = ws.data() + p * (ws_each + wn + s_.oc);
      kt.add(wn, dw.data(), mine + ws_each, dw.data());
      if (db.defined()) kt.add(s_.oc, db.data(), mine + ws_each + wn, db.data());
    }
    grads[0] = dx;
    if (edge(1).defined()) grads[1] = dw;
    grads[2] = db;
  }

 private:
  Conv2dShape s_;
  Tensor x_, w_;
};

// Saved: x, y, and for 2x2/stride 2 each window's argmax (one byte per output, kept in a float
// buffer of a quarter the size). dy (N,C,OH,OW) -> dx (N,C,H,W).
class MaxPool2dNode final : public Node {
 public:
  MaxPool2dNode(const PoolShape& s, Tensor x, Tensor y, Tensor argmax)
      : s_(s), x_(std::move(x)), y_(std::move(y)), argmax_(std::move(argmax)) {}
  const char* name() const override { return "max_pool2d"; }
  void backward(const Tensor& dy, std::span<Tensor> grads) override {
    Tensor dx = Tensor::empty(x_.shape(), dy.device());
    const auto* idx =
        argmax_.defined() ? reinterpret_cast<const uint8_t*>(argmax_.data()) : nullptr;
    kernel_table_for(dy.device())
        .max_pool2d_backward(s_, x_.data(), y_.data(), idx, dy.data(), dx.data());
    grads[0] = dx;
  }

 private:
  PoolShape s_;
  Tensor x_, y_, argmax_;
};

}  // namespace

Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& b, int stride, int padding) {
  check_same_device("conv2d", {{"input", &x}, {"weight", &w}, {"bias", &b}});
  if (x.ndim() != 4 || w.ndim() != 4)
    throw std::invalid_argument(fmt::format("conv2d: expected 4-d input and weight, got {} and {}",
                                            x.shape().str(), w.shape().str()));
  if (x.dim(1) != w.dim(1))
    throw std::invalid_argument(
        fmt::format("conv2d: expected input with {} channels (weight {}), got {}", w.dim(1),
                    w.shape().str(), x.shape().str()));
  if (b.defined()) check_shape("conv2d bias", Shape{w.dim(0)}, b.shape());
  if (stride < 1 || padding < 0)
    throw std::invalid_argument(fmt::format(
        "conv2d: expected stride >= 1 and padding >= 0, got {} and {}", stride, padding));
  Conv2dShape s;
  s.n = static_cast<int>(x.dim(0)), s.c = static_cast<int>(x.dim(1));
  s.h = static_cast<int>(x.dim(2)), s.w = static_cast<int>(x.dim(3));
  s.oc = static_cast<int>(w.dim(0)), s.kh = static_cast<int>(w.dim(2)),
  s.kw = static_cast<int>(w.dim(3));
  s.stride = stride, s.pad = padding;
  if (s.h + 2 * padding < s.kh || s.w + 2 * padding < s.kw)
    throw std::invalid_argument(
        fmt::format("conv2d: expected input at least {}x{} after padding, got {}", s.kh, s.kw,
                    x.shape().str()));
  const KernelTable& kt = kernel_table_for(x.device());
  Tensor y = Tensor::empty(Shape{s.n, s.oc, s.oh(), s.ow()}, x.device());
  const BatchSplit split(s.n, x.device());
  const size_t ws_each = split.workspace(s);
  Tensor ws = Tensor::empty(Shape{static_cast<int64_t>(ws_each * split.parts)}, x.device());
  const long in_image = static_cast<long>(s.c) * s.h * s.w,
             out_image = static_cast<long>(s.oc) * s.oh() * s.ow();
  parallel_parts(split.parts, [&](int p) {
    const Conv2dShape c = split.sub(s, p);
    const long f = split.first(p);
    kt.conv2d_forward(c, x.data() + f * in_image, w.data(), b.defined() ? b.data() : nullptr,
                      y.data() + f * out_image, ws.data() + p * ws_each,
                      kernels::cpu::conv2d_default_chunk(c));
  });
  if (any_requires_grad({&x, &w, &b})) {
    auto node = std::make_shared<Conv2dNode>(s, x.detach(), w.detach());
    node->set_inputs({&x, &w, &b});
    record(y, std::move(node));
  }
  return y;
}

Tensor max_pool2d(const Tensor& x, int kernel, int stride) {
  if (x.ndim() != 4)
    throw std::invalid_argument(
        fmt::format("max_pool2d: expected a 4-d input, got {}", x.shape().str()));
  if (kernel < 1 || stride < 1 || x.dim(2) < kernel || x.dim(3) < kernel)
    throw std::invalid_argument(
        fmt::format("max_pool2d: expected kernel {} to fit input {}, got stride {}", kernel,
                    x.shape().str(), stride));
  PoolShape s;
  s.planes = static_cast<int>(x.dim(0) * x.dim(1));
  s.h = static_cast<int>(x.dim(2)), s.w = static_cast<int>(x.dim(3));
  s.kernel = kernel, s.stride = stride;
  Tensor y = Tensor::empty(Shape{x.dim(0), x.dim(1), s.oh(), s.ow()}, x.device());
  const bool grad = any_requires_grad({&x});
  Tensor argmax;
  if (grad && kernels::cpu::max_pool2d_uses_argmax(s))
    argmax = Tensor::empty(Shape{(y.numel() + 3) / 4}, x.device());
  kernel_table_for(x.device())
      .max_pool2d_forward(s, x.data(), y.data(),
                          argmax.defined() ? reinterpret_cast<uint8_t*>(argmax.data()) : nullptr);
  if (grad) {
    auto node = std::make_shared<MaxPool2dNode>(s, x.detach(), y.detach(), argmax);
    node->set_inputs({&x});
    record(y, std::move(node));
  }
  return y;
}

}  // namespace chorus
