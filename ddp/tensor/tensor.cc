// Tensor and Shape.
#include "ddp/tensor/tensor.h"

#include "ddp/tensor/device_cache.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "ddp/tensor/autograd.h"

namespace chorus {

namespace {

// "(a, b, c)" for dims not yet in a Shape.
std::string dims_str(const int64_t* dims, size_t n) {
  std::string s = "(";
  for (size_t i = 0; i < n; ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + ")";
}

// Every dimension >= 0, and the product of the non-zero ones at most Shape::kMaxNumel, so that
// no sub-shape's element count (nor its size in bytes) overflows.
void check_dims(const int64_t* dims, size_t n) {
  if (n > static_cast<size_t>(Shape::kMaxDims))
    throw std::invalid_argument(fmt::format("shape {}: expected at most {} dims, got {}",
                                            dims_str(dims, n), Shape::kMaxDims, n));
  int64_t product = 1;
  for (size_t i = 0; i < n; ++i) {
    if (dims[i] < 0)
      throw std::invalid_argument(fmt::format("shape {}: dimension {} is {}, expected >= 0",
                                              dims_str(dims, n), i, dims[i]));
    if (dims[i] == 0) continue;
    if (product > Shape::kMaxNumel / dims[i])
      throw std::invalid_argument(
          fmt::format("shape {}: more than {} elements (the most a tensor may hold)",
                      dims_str(dims, n), Shape::kMaxNumel));
    product *= dims[i];
  }
}

}  // namespace

Shape::Shape(std::initializer_list<int64_t> dims) {
  check_dims(dims.begin(), dims.size());
  for (int64_t d : dims) dims_[static_cast<size_t>(ndim_++)] = d;
}

Shape Shape::of(const std::vector<int64_t>& dims) {
  check_dims(dims.data(), dims.size());
  Shape s;
  for (int64_t d : dims) s.dims_[static_cast<size_t>(s.ndim_++)] = d;
  return s;
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim_; ++i) n *= dims_[static_cast<size_t>(i)];
  return n;
}

std::string Shape::str() const {
  std::string s = "(";
  for (int i = 0; i < ndim_; ++i)
    s += (i ? ", " : "") + std::to_string(dims_[static_cast<size_t>(i)]);
  return s + ")";
}

bool Shape::operator==(const Shape& o) const {
  return ndim_ == o.ndim_ && std::equal(dims_.begin(), dims_.begin() + ndim_, o.dims_.begin());
}

void check_shape(const char* what, const Shape& expected, const Shape& got) {
  if (!(expected == got))
    throw std::invalid_argument(
        fmt::format("{}: expected shape {}, got {}", what, expected.str(), got.str()));
}

// ---- Tensor -------------------------------------------------------------------------------

namespace {

// Bytes between any two devices: memmove on the cpu, the device backend otherwise.
void copy_bytes(void* dst, Device dst_dev, const void* src, Device src_dev, size_t bytes) {
  if (bytes == 0) return;
  if (dst_dev.is_cpu() && src_dev.is_cpu())
    std::memmove(dst, src, bytes);
  else
    cuda_backend().copy(dst, dst_dev, src, src_dev, bytes);
}

}  // namespace

Tensor Tensor::empty(const Shape& shape, Device device) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::make_shared<Storage>(static_cast<size_t>(shape.numel()), device);
  impl->shape = shape;
  return Tensor(std::move(impl));
}

Tensor Tensor::zeros(const Shape& shape, Device device) {
  return full(shape, 0.0f, device);
}

Tensor Tensor::full(const Shape& shape, float value, Device device) {
  Tensor t = empty(shape, device);
  t.fill(value);
  return t;
}

Tensor Tensor::from(const Shape& shape, const std::vector<float>& values) {
  if (static_cast<int64_t>(values.size()) != shape.numel())
    throw std::invalid_argument(
        fmt::format("tensor from values: expected {} values for shape {}, got {}", shape.numel(),
                    shape.str(), values.size()));
  Tensor t = empty(shape);
  std::copy(values.begin(), values.end(), t.data());
  return t;
}

Tensor Tensor::alias(const Tensor& base, int64_t offset, const Shape& shape) {
  const int64_t start = base.offset() + offset;
  if (offset < 0 || start + shape.numel() > static_cast<int64_t>(base.storage()->size()))
    throw std::invalid_argument(
        fmt::format("alias: view of {} floats at offset {} needs storage of {}, got {}",
                    shape.numel(), start, start + shape.numel(), base.storage()->size()));
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = base.storage();
  impl->offset = start;
  impl->shape = shape;
  return Tensor(std::move(impl));
}

const Shape& Tensor::shape() const {
  return impl_->shape;
}
Device Tensor::device() const {
  return impl_->storage->device();
}
float* Tensor::data() const {
  return impl_->storage->data() + impl_->offset;
}
const std::shared_ptr<Storage>& Tensor::storage() const {
  return impl_->storage;
}
int64_t Tensor::offset() const {
  return impl_->offset;
}

float Tensor::item() const {
  if (numel() != 1)
    throw std::invalid_argument(fmt::format("item: expected 1 element, got {}", numel()));
  return to_vector()[0];
}

std::vector<float> Tensor::to_vector() const {
  if (device().is_cpu()) return {data(), data() + numel()};
  std::vector<float> v(static_cast<size_t>(numel()));
  copy_bytes(v.data(), Device::cpu(), data(), device(), v.size() * sizeof(float));
  return v;
}

void Tensor::move_to(Device d) const {
  if (d == device()) return;
  Tensor moved = to(d);
  impl_->storage = moved.storage();
  impl_->offset = 0;
  impl_->grad = Tensor();
}

Tensor Tensor::to(Device d) const {
  if (d == device()) return *this;
  Tensor t = empty(shape(), d);
  copy_bytes(t.data(), d, data(), device(), sizeof(float) * static_cast<size_t>(numel()));
  return t;
}

bool Tensor::requires_grad() const {
  return impl_->requires_grad;
}

Tensor& Tensor::set_requires_grad(bool on) {
  if (impl_->grad_fn)
    throw std::invalid_argument(
        "set_requires_grad: expected a leaf tensor, got the output of an op");
  impl_->requires_grad = on;
  return *this;
}

bool Tensor::is_leaf() const {
  return impl_->grad_fn == nullptr;
}
const Tensor& Tensor::grad() const {
  return impl_->grad;
}

void Tensor::set_grad(const Tensor& g) {
  if (g.defined()) check_shape("set_grad", shape(), g.shape());
  impl_->grad = g;
}

const std::shared_ptr<Node>& Tensor::grad_fn() const {
  return impl_->grad_fn;
}

void Tensor::register_grad_ready_hook(GradReadyHook hook) {
  if (!is_leaf())
    throw std::invalid_argument(
        "register_grad_ready_hook: expected a leaf tensor, got an op output");
  impl_->grad_ready_hooks.push_back(std::move(hook));
}

void Tensor::backward() const {
  run_backward(*this);
}

Tensor Tensor::detach() const {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = impl_->storage;
  impl->offset = impl_->offset;
  impl->shape = impl_->shape;
  return Tensor(std::move(impl));
}

Tensor Tensor::clone() const {
  Tensor t = empty(shape(), device());
  copy_bytes(t.data(), device(), data(), device(), sizeof(float) * static_cast<size_t>(numel()));
  return t;
}

void Tensor::copy_from(const Tensor& src) const {
  if (src.numel() != numel())
    throw std::invalid_argument(
        fmt::format("copy_from: expected {} elements, got {}", numel(), src.numel()));
  copy_bytes(data(), device(), src.data(), src.device(),
             sizeof(float) * static_cast<size_t>(numel()));
}

void Tensor::fill(float value) const {
  if (device().is_cpu()) {
    std::fill(data(), data() + numel(), value);
    return;
  }
  cuda_backend().fill(device(), static_cast<long>(numel()), value, data());
}

}  // namespace chorus
