// nn (names, init, state_dict) and SGD against hand-computed sequences.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "ddp/nn/modules.h"
#include "ddp/nn/optim.h"
#include "ddp/ops/ops.h"

using namespace chorus;

namespace {

// Runs `steps` SGD steps on a one-element parameter p0 = 1 whose gradient is always 1.
std::vector<float> run_sgd(SgdOptions o, int steps) {
  Tensor p = Tensor::from(Shape{1}, {1.0f}).set_requires_grad(true);
  Sgd opt({p}, o);
  std::vector<float> out;
  for (int i = 0; i < steps; ++i) {
    opt.zero_grad();
    sum(p).backward();  // grad 1
    opt.step();
    out.push_back(p.item());
  }
  return out;
}

void check_seq(const std::vector<float>& got, const std::vector<double>& expected) {
  REQUIRE(got.size() == expected.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("step " << i + 1);
    CHECK(got[i] == Approx(expected[i]).epsilon(1e-6));
  }
}

}  // namespace

TEST_CASE("sgd: hand-computed momentum, nesterov, dampening, weight decay", "[optim]") {
  // plain: p -= 0.1
  check_seq(run_sgd({.lr = 0.1f}, 2), {0.9, 0.8});
  // momentum 0.9: buf 1, 1.9, 2.71 -> p 0.9, 0.71, 0.439
  check_seq(run_sgd({.lr = 0.1f, .momentum = 0.9f}, 3), {0.9, 0.71, 0.439});
  // nesterov: buf 1, 1.9, 2.71; d = 1 + 0.9 buf = 1.9, 2.71, 3.439 -> p 0.81, 0.539, 0.1951
  check_seq(run_sgd({.lr = 0.1f, .momentum = 0.9f, .nesterov = true}, 3), {0.81, 0.539, 0.1951});
  // dampening 0.5: first buf = g (undampened) = 1; then 0.9 + 0.5 = 1.4 -> p 0.9, 0.76
  check_seq(run_sgd({.lr = 0.1f, .momentum = 0.9f, .dampening = 0.5f}, 2), {0.9, 0.76});
  // weight decay 0.5: d = 1 + 0.5 p: 1.5 -> p 0.85; 1.425 -> p 0.7075
  check_seq(run_sgd({.lr = 0.1f, .weight_decay = 0.5f}, 2), {0.85, 0.7075});
  // all together: wd 0.5, momentum 0.9, nesterov
  //   step 1: d = 1.5, buf 1.5, d = 1.5 + 1.35 = 2.85, p = 1 - 0.285 = 0.715
  //   step 2: d = 1 + 0.3575 = 1.3575, buf = 1.35 + 1.3575 = 2.7075, d = 1.3575 + 2.43675
  //   = 3.79425,
  //           p = 0.715 - 0.379425 = 0.335575
  check_seq(run_sgd({.lr = 0.1f, .momentum = 0.9f, .weight_decay = 0.5f, .nesterov = true}, 2),
            {0.715, 0.335575});
  CHECK_THROWS_WITH(
      Sgd({}, {.lr = 0.1f, .nesterov = true}),
      "sgd: nesterov expects momentum > 0 and dampening 0, got momentum 0 and dampening 0");
}

TEST_CASE("sgd: zero_grad keeps grad buffers (views stay views), or drops them", "[optim]") {
  Tensor p = Tensor::from(Shape{2}, {1, 2}).set_requires_grad(true);
  Tensor bucket = Tensor::full(Shape{2}, 5.0f);
  p.set_grad(Tensor::alias(bucket, 0, Shape{2}));
  Sgd opt({p}, {.lr = 0.1f});
  opt.zero_grad();
  CHECK(bucket.to_vector() == std::vector<float>{0, 0});
  CHECK(p.grad().storage() == bucket.storage());
  opt.zero_grad(true);
  CHECK_FALSE(p.grad().defined());
}

TEST_CASE("net: parameter names, counts, and PyTorch's init bounds", "[nn]") {
  Net fm(1, 28, 0), cifar(3, 32, 0);
  CHECK(count_parameters(fm) == 44426);
  CHECK(count_parameters(cifar) == 62006);
  std::vector<std::string> names;
  for (auto& [n, p] : fm.named_parameters()) names.push_back(n);
  CHECK(names == std::vector<std::string>{"conv1.weight", "conv1.bias", "conv2.weight",
                                          "conv2.bias", "fc1.weight", "fc1.bias", "fc2.weight",
                                          "fc2.bias", "fc3.weight", "fc3.bias"});
  // kaiming_uniform(a=sqrt(5)) and the bias: U(-1/sqrt(fan_in), 1/sqrt(fan_in))
  auto check_bound = [](const Tensor& t, double fan_in) {
    const double bound = 1.0 / std::sqrt(fan_in);
    float lo = 1e9f, hi = -1e9f;
    for (float v : t.to_vector()) lo = std::min(lo, v), hi = std::max(hi, v);
    CHECK(lo >= -bound);
    CHECK(hi <= bound);
    if (t.numel() > 100) CHECK(hi - lo > 1.8 * bound);  // fills the range
  };
  check_bound(fm.conv1->weight, 25), check_bound(fm.conv1->bias, 25);
  check_bound(fm.conv2->weight, 150), check_bound(fm.fc1->weight, 256),
      check_bound(fm.fc3->bias, 84);
  Net same(1, 28, 0), other(1, 28, 1);
  CHECK(same.fc1->weight.to_vector() == fm.fc1->weight.to_vector());
  CHECK(other.fc1->weight.to_vector() != fm.fc1->weight.to_vector());
}

TEST_CASE("state_dict round trip, including through a wrapper", "[nn]") {
  Net a(1, 28, 0), b(1, 28, 1);
  Tensor x = Tensor::full(Shape{2, 1, 28, 28}, 0.25f);
  StateDict sd = a.state_dict();
  a.fc1->weight.data()[0] += 1.0f;  // state_dict is a copy
  CHECK(sd[4].second.data()[0] != a.fc1->weight.data()[0]);
  a.load_state_dict(sd);
  b.load_state_dict(sd);
  CHECK(a.forward(x).to_vector() == b.forward(x).to_vector());
  // names do not change when the model sits inside a container: the container holds its own
  // prefix ("0."), and the model's own state_dict keeps the bare names.
  auto inner = std::make_shared<Net>(1, 28, 2);
  Sequential wrapped;
  wrapped.add(inner);
  CHECK(wrapped.named_parameters()[0].first == "0.conv1.weight");
  inner->load_state_dict(sd);
  CHECK(inner->state_dict()[0].first == "conv1.weight");
  CHECK(inner->forward(x).to_vector() == b.forward(x).to_vector());

  StateDict bad = sd;
  bad[0].second = Tensor::zeros(Shape{6, 1, 3, 3});
  CHECK_THROWS_WITH(
      b.load_state_dict(bad),
      "load_state_dict: parameter 'conv1.weight': expected shape (6, 1, 5, 5), got (6, 1, 3, 3)");
  StateDict missing(sd.begin() + 1, sd.end());
  CHECK_THROWS_WITH(b.load_state_dict(missing),
                    "load_state_dict: expected parameter 'conv1.weight', got none");
  StateDict extra = sd;
  extra.emplace_back("fc4.weight", Tensor::zeros(Shape{1}));
  CHECK_THROWS_WITH(b.load_state_dict(extra),
                    "load_state_dict: expected 10 known parameters, got unexpected 'fc4.weight'");
}

TEST_CASE("train/eval propagates to children", "[nn]") {
  Net n(1, 28, 0);
  n.eval();
  CHECK_FALSE(n.fc1->is_training());
  n.train();
  CHECK(n.conv2->is_training());
}
