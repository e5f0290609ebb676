// nn: Module (named parameters, children, train/eval, state_dict) and the layers of the tutorial
// CNN, initialised like PyTorch (kaiming-uniform a=sqrt(5) weights, U(-1/sqrt(fan_in), +) biases).
//
// Parameter names are dotted paths in registration order ("conv1.weight", "fc3.bias"), fixed by
// the module itself: a wrapper (DDP) must forward state_dict()/named_parameters() to the module it
// wraps so the names stay the same whether or not the model is wrapped.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ddp/tensor/random.h"
#include "ddp/tensor/tensor.h"

namespace chorus {

using NamedTensor = std::pair<std::string, Tensor>;
// Ordered by registration, as PyTorch's OrderedDict.
using StateDict = std::vector<NamedTensor>;

class Module {
 public:
  virtual ~Module() = default;
  virtual Tensor forward(const Tensor& x) = 0;
  Tensor operator()(const Tensor& x) { return forward(x); }

  // Every parameter of this module and its children, depth first in registration order.
  std::vector<NamedTensor> named_parameters() const;
  std::vector<Tensor> parameters() const;
  const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& children() const {
    return children_;
  }

  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }

  // Moves every parameter to device d, in place (optimizers holding them see the move). Their
  // gradients are dropped.
  void to(Device d);

  // Detached copies of every parameter, by name.
  StateDict state_dict() const;
  // Copies values in. Throws naming the parameter on a missing or unexpected name or a shape
  // mismatch; nothing is changed unless every entry matches.
  void load_state_dict(const StateDict& state);

 protected:
  Tensor& register_parameter(std::string name, Tensor t);
  template <typename M>
  std::shared_ptr<M> register_module(std::string name, std::shared_ptr<M> m) {
    children_.emplace_back(std::move(name), m);
    return m;
  }

 private:
  void collect(const std::string& prefix, std::vector<NamedTensor>& out) const;
  std::vector<NamedTensor> params_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
};

class Conv2d : public Module {
 public:
  Conv2d(int in_channels, int out_channels, int kernel, Generator& gen, int stride = 1,
         int padding = 0);
  Tensor forward(const Tensor& x) override;
  Tensor weight, bias;

 private:
  int stride_, padding_;
};

class Linear : public Module {
 public:
  Linear(int in_features, int out_features, Generator& gen);
  Tensor forward(const Tensor& x) override;
  Tensor weight, bias;
};

class MaxPool2d : public Module {
 public:
  MaxPool2d(int kernel, int stride) : kernel_(kernel), stride_(stride) {}
  Tensor forward(const Tensor& x) override;

 private:
  int kernel_, stride_;
};

class ReLU : public Module {
 public:
  Tensor forward(const Tensor& x) override;
};

class Flatten : public Module {
 public:
  Tensor forward(const Tensor& x) override;
};

// Children named "0", "1", ... as in PyTorch.
class Sequential : public Module {
 public:
  Sequential& add(std::shared_ptr<Module> m);
  Tensor forward(const Tensor& x) override;

 private:
  std::vector<std::shared_ptr<Module>> layers_;
};

// The PyTorch CIFAR-10 tutorial CNN: conv(5x5, 6) -> relu -> pool 2 -> conv(5x5, 16) -> relu ->
// pool 2 -> flatten -> 120 -> relu -> 84 -> relu -> 10. in_channels 3, side 32: the exact tutorial
// net (fc1 400 -> 120); in_channels 1, side 28: the Fashion-MNIST variant (fc1 256 -> 120).
class Net : public Module {
 public:
  Net(int in_channels, int side, uint64_t seed);
  Tensor forward(const Tensor& x) override;
  std::shared_ptr<Conv2d> conv1, conv2;
  std::shared_ptr<MaxPool2d> pool;
  std::shared_ptr<Linear> fc1, fc2, fc3;
};

int64_t count_parameters(const Module& m);

}  // namespace chorus
