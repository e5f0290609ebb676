// Module bookkeeping and the layers.
#include "ddp/nn/modules.h"

#include <fmt/format.h>

#include <cmath>
#include <stdexcept>

#include "ddp/ops/ops.h"

namespace chorus {
namespace {

// kaiming_uniform_(a=sqrt(5)) gives bound = gain * sqrt(3 / fan_in) with gain = sqrt(2 / (1 + 5)),
// i.e. 1 / sqrt(fan_in); PyTorch's bias bound is 1 / sqrt(fan_in) too.
Tensor uniform_param(const Shape& shape, int64_t fan_in, Generator& gen) {
  const float bound = 1.0f / std::sqrt(static_cast<float>(fan_in));
  Tensor t = Tensor::empty(shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.data()[i] = gen.uniform(-bound, bound);
  t.set_requires_grad(true);
  return t;
}

}  // namespace

Tensor& Module::register_parameter(std::string name, Tensor t) {
  params_.emplace_back(std::move(name), std::move(t));
  return params_.back().second;
}

void Module::collect(const std::string& prefix, std::vector<NamedTensor>& out) const {
  for (const auto& [name, t] : params_) out.emplace_back(prefix + name, t);
  for (const auto& [name, child] : children_) child->collect(prefix + name + ".", out);
}

std::vector<NamedTensor> Module::named_parameters() const {
  std::vector<NamedTensor> out;
  collect("", out);
  return out;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [name, t] : named_parameters()) out.push_back(t);
  return out;
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [name, child] : children_) child->train(on);
}

void Module::to(Device d) {
  for (auto& [name, t] : named_parameters()) t.move_to(d);
}

StateDict Module::state_dict() const {
  StateDict out;
  for (auto& [name, t] : named_parameters()) out.emplace_back(name, t.clone());
  return out;
}

void Module::load_state_dict(const StateDict& state) {
  auto params = named_parameters();
  std::map<std::string, const Tensor*> given;
  for (const auto& [name, t] : state) given[name] = &t;
  for (const auto& [name, p] : params) {
    auto it = given.find(name);
    if (it == given.end())
      throw std::invalid_argument(
          fmt::format("load_state_dict: expected parameter '{}', got none", name));
    check_shape(("load_state_dict: parameter '" + name + "'").c_str(), p.shape(),
                it->second->shape());
  }
  if (given.size() != params.size()) {
    for (const auto& [name, t] : state) {
      bool known = false;
      for (const auto& [pname, p] : params) known = known || pname == name;
      if (!known)
        throw std::invalid_argument(
            fmt::format("load_state_dict: expected {} known parameters, got unexpected '{}'",
                        params.size(), name));
    }
  }
  for (auto& [name, p] : params) p.copy_from(*given[name]);
}

Conv2d::Conv2d(int in_channels, int out_channels, int kernel, Generator& gen, int stride,
               int padding)
    : stride_(stride), padding_(padding) {
  const int64_t fan_in = static_cast<int64_t>(in_channels) * kernel * kernel;
  weight = register_parameter(
      "weight", uniform_param(Shape{out_channels, in_channels, kernel, kernel}, fan_in, gen));
  bias = register_parameter("bias", uniform_param(Shape{out_channels}, fan_in, gen));
}

Tensor Conv2d::forward(const Tensor& x) {
  return conv2d(x, weight, bias, stride_, padding_);
}

Linear::Linear(int in_features, int out_features, Generator& gen) {
  weight = register_parameter("weight",
                              uniform_param(Shape{out_features, in_features}, in_features, gen));
  bias = register_parameter("bias", uniform_param(Shape{out_features}, in_features, gen));
}

Tensor Linear::forward(const Tensor& x) {
  return linear(x, weight, bias);
}
Tensor MaxPool2d::forward(const Tensor& x) {
  return max_pool2d(x, kernel_, stride_);
}
Tensor ReLU::forward(const Tensor& x) {
  return relu(x);
}
Tensor Flatten::forward(const Tensor& x) {
  return flatten(x, 1);
}

Sequential& Sequential::add(std::shared_ptr<Module> m) {
  register_module(std::to_string(layers_.size()), m);
  layers_.push_back(std::move(m));
  return *this;
}

Tensor Sequential::forward(const Tensor& x) {
  Tensor h = x;
  for (auto& m : layers_) h = m->forward(h);
  return h;
}

Net::Net(int in_channels, int side, uint64_t seed) {
  Generator gen(seed);
  const int f = ((side - 4) / 2 - 4) / 2;
  conv1 = register_module("conv1", std::make_shared<Conv2d>(in_channels, 6, 5, gen));
  pool = register_module("pool", std::make_shared<MaxPool2d>(2, 2));
  conv2 = register_module("conv2", std::make_shared<Conv2d>(6, 16, 5, gen));
  fc1 = register_module("fc1", std::make_shared<Linear>(16 * f * f, 120, gen));
  fc2 = register_module("fc2", std::make_shared<Linear>(120, 84, gen));
  fc3 = register_module("fc3", std::make_shared<Linear>(84, 10, gen));
}

Tensor Net::forward(const Tensor& x) {
  // The tutorial writes pool(relu(conv(x))). relu and max pooling commute exactly -- the same
  // values, and the same gradients: the window's first maximum is the same element, and where it
  // is <= 0 both orders give it gradient 0 -- so relu runs on the pooled tensor, 4x smaller.
  Tensor h = relu(pool->forward(conv1->forward(x)));
  h = relu(pool->forward(conv2->forward(h)));
  h = flatten(h, 1);
  h = relu(fc1->forward(h));
  h = relu(fc2->forward(h));
  return fc3->forward(h);
}

int64_t count_parameters(const Module& m) {
  int64_t n = 0;
  for (auto& [name, t] : m.named_parameters()) n += t.numel();
  return n;
}

}  // namespace chorus
