// Tensor: a contiguous f32 n-d array over shared storage, with the autograd fields
// (requires_grad, grad, grad_fn) and the per-parameter gradient-ready hook.
//
// A Tensor is a cheap handle (one shared_ptr) to a TensorImpl; copies alias. Several tensors may
// view one Storage at different offsets (alias()), which is how DDP makes a parameter's grad a
// slice of a flat bucket. Threading: a Tensor is not synchronised; one thread mutates it at a time.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "ddp/tensor/storage.h"

namespace chorus {

// Up to six dimensions, stored inline (no heap). Every Shape is valid: construction throws
// std::invalid_argument, naming the dims, for a negative dimension or for more than kMaxNumel
// elements (counting the non-zero dimensions, so no sub-shape overflows either).
class Shape {
 public:
  static constexpr int kMaxDims = 6;
  // The most elements a tensor may hold: their size in bytes fits in int64 for any element
  // type of up to 8 bytes.
  static constexpr int64_t kMaxNumel = INT64_MAX / 8;
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);
  static Shape of(const std::vector<int64_t>& dims);

  int ndim() const { return ndim_; }
  int64_t operator[](int i) const { return dims_[static_cast<size_t>(i)]; }
  int64_t numel() const;
  std::vector<int64_t> vec() const { return {dims_.begin(), dims_.begin() + ndim_}; }
  std::string str() const;  // "(64, 1, 28, 28)"
  bool operator==(const Shape& o) const;

 private:
  std::array<int64_t, kMaxDims> dims_{};
  int ndim_ = 0;
};

class Node;
struct TensorImpl;
class Tensor;
using GradReadyHook = std::function<void(Tensor& param)>;

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // Uninitialised / zero / constant / copied-in tensors on a fresh storage.
  static Tensor empty(const Shape& shape, Device device = Device::cpu());
  static Tensor zeros(const Shape& shape, Device device = Device::cpu());
  static Tensor full(const Shape& shape, float value, Device device = Device::cpu());
  static Tensor from(const Shape& shape, const std::vector<float>& values);
  // A view of base's storage starting `offset` floats past base's own start; throws when the
  // view would run past the storage.
  static Tensor alias(const Tensor& base, int64_t offset, const Shape& shape);

  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const;
  int64_t dim(int i) const { return shape()[i]; }
  int ndim() const { return shape().ndim(); }
  int64_t numel() const { return shape().numel(); }
  Device device() const;
  float* data() const;
  float item() const;  // the value of a one-element tensor
  std::vector<float> to_vector() const;
  const std::shared_ptr<Storage>& storage() const;
  int64_t offset() const;

  // ---- autograd ----
  bool requires_grad() const;
  Tensor& set_requires_grad(bool on);  // only on leaves
  bool is_leaf() const;
  const Tensor& grad() const;  // undefined until a backward reached this leaf
  // Replace the gradient buffer, e.g. by a view into a DDP bucket. Shape must match.
  void set_grad(const Tensor& g);
  const std::shared_ptr<Node>& grad_fn() const;
  // Called once per backward, after this leaf's gradient for that backward is final, in the
  // order gradients become final. Runs on the thread that called backward().
  void register_grad_ready_hook(GradReadyHook hook);
  // Reverse-mode sweep from this scalar (grad 1) through the tape.
  void backward() const;

  // ---- no autograd ----
  Tensor detach() const;  // same storage, no grad_fn, requires_grad false
  Tensor clone() const;   // new storage, same values, detached
  // This tensor on device d: itself when it is there already, else a detached copy (no autograd
  // edge across devices yet).
  Tensor to(Device d) const;
  // Moves this tensor's values to device d in place: every handle of it then sees the new
  // storage (how Module::to moves parameters). The gradient is dropped. Not for a view that
  // shares its storage with other tensors.
  void move_to(Device d) const;
  // Same numel required; writes the data, not the handle; src may be on another device.
  void copy_from(const Tensor& src) const;
  void fill(float value) const;

  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }

 private:
  std::shared_ptr<TensorImpl> impl_;
};

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  int64_t offset = 0;
  Shape shape;
  bool requires_grad = false;
  Tensor grad;
  std::shared_ptr<Node> grad_fn;
  std::vector<GradReadyHook> grad_ready_hooks;
  int pending_edges = 0;  // autograd engine bookkeeping during one backward
};

// Throws std::invalid_argument "<what>: expected shape (a, b), got (c, d)" when they differ.
void check_shape(const char* what, const Shape& expected, const Shape& got);

}  // namespace chorus
