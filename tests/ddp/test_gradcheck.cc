// Finite-difference gradient check of every differentiable op, on random shapes including odd
// sizes and the conv stride/padding cases. Loss = sum(op(inputs) * R) for a fixed random R.
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <vector>

#include "ddp/ops/ops.h"
#include "ddp/tensor/autograd.h"
#include "ddp/tensor/random.h"

using namespace chorus;

namespace {

Tensor random_tensor(const Shape& s, uint64_t seed, bool grad = true) {
  Generator g(seed);
  Tensor t = Tensor::empty(s);
  for (int64_t i = 0; i < t.numel(); ++i) t.data()[i] = g.uniform(-1.0f, 1.0f);
  t.set_requires_grad(grad);
  return t;
}

// Values spread at least `gap` apart in random order and away from 0: no kinks within eps
// for relu and max pooling.
Tensor spread_tensor(const Shape& s, uint64_t seed, float gap) {
  Generator g(seed);
  const auto perm = g.permutation(s.numel());
  Tensor t = Tensor::empty(s);
  for (int64_t i = 0; i < t.numel(); ++i) {
    const float v =
        gap * static_cast<float>(perm[static_cast<size_t>(i)] - s.numel() / 2) + gap / 2;
    t.data()[i] = v;
  }
  t.set_requires_grad(true);
  return t;
}

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

// Compares backward() against central differences for every (or up to 40 sampled) element of
// every input.
void gradcheck(const char* name, const Fn& f, std::vector<Tensor> inputs, float eps = 1e-2f,
               double tol = 2e-2) {
  Tensor probe;
  {
    NoGradGuard ng;
    probe = f(inputs);
  }
  Tensor r = random_tensor(probe.shape(), 99, false);
  auto loss_of = [&](const std::vector<Tensor>& in) { return sum(mul(f(in), r)); };
  for (Tensor& t : inputs) t.set_grad(Tensor());
  loss_of(inputs).backward();
  Generator pick(7);
  for (size_t k = 0; k < inputs.size(); ++k) {
    Tensor& t = inputs[k];
    if (!t.requires_grad()) continue;
    REQUIRE(t.grad().defined());
    const int64_t n = t.numel();
    const int64_t checks = std::min<int64_t>(n, 40);
    for (int64_t c = 0; c < checks; ++c) {
      const int64_t i = n <= 40 ? c : static_cast<int64_t>(pick.below(static_cast<uint64_t>(n)));
      const float saved = t.data()[i];
      double plus, minus;
      {
        NoGradGuard ng;
        t.data()[i] = saved + eps;
        plus = loss_of(inputs).item();
        t.data()[i] = saved - eps;
        minus = loss_of(inputs).item();
        t.data()[i] = saved;
      }
      const double numeric = (plus - minus) / (2.0 * eps);
      const double analytic = t.grad().data()[i];
      INFO(name << ": input " << k << " element " << i << " numeric " << numeric << " analytic "
                << analytic);
      CHECK(std::fabs(numeric - analytic) <= tol * (1.0 + std::fabs(numeric)));
    }
  }
}

}  // namespace

TEST_CASE("gradcheck conv2d: odd sizes, stride and padding", "[gradcheck]") {
  struct Case {
    int64_t n, c, h, w, oc, kh, kw;
    int stride, pad;
  };
  const Case cases[] = {{2, 1, 7, 7, 3, 5, 5, 1, 0},
                        {1, 3, 6, 5, 2, 3, 3, 2, 1},
                        {2, 2, 5, 6, 3, 3, 2, 1, 2},
                        {1, 2, 9, 8, 4, 3, 3, 3, 1}};
  uint64_t seed = 1;
  for (const Case& t : cases) {
    Tensor x = random_tensor(Shape{t.n, t.c, t.h, t.w}, seed++);
    Tensor w = random_tensor(Shape{t.oc, t.c, t.kh, t.kw}, seed++);
    Tensor b = random_tensor(Shape{t.oc}, seed++);
    const int stride = t.stride, pad = t.pad;
    gradcheck(
        "conv2d",
        [=](const std::vector<Tensor>& in) { return conv2d(in[0], in[1], in[2], stride, pad); },
        {x, w, b});
  }
  // without bias, input without grad (the first layer)
  Tensor x = random_tensor(Shape{2, 1, 6, 6}, 40, false);
  Tensor w = random_tensor(Shape{2, 1, 3, 3}, 41);
  gradcheck("conv2d no bias",
            [](const std::vector<Tensor>& in) { return conv2d(in[0], in[1], Tensor(), 1, 1); },
            {x, w});
}

TEST_CASE("gradcheck max_pool2d and relu", "[gradcheck]") {
  gradcheck("max_pool2d 2/2", [](const std::vector<Tensor>& in) { return max_pool2d(in[0], 2, 2); },
            {spread_tensor(Shape{2, 3, 6, 6}, 1, 0.03f)});
  gradcheck("max_pool2d odd", [](const std::vector<Tensor>& in) { return max_pool2d(in[0], 2, 2); },
            {spread_tensor(Shape{1, 2, 7, 5}, 2, 0.03f)});
  gradcheck("max_pool2d 3/2", [](const std::vector<Tensor>& in) { return max_pool2d(in[0], 3, 2); },
            {spread_tensor(Shape{1, 2, 7, 8}, 3, 0.03f)});
  gradcheck("relu", [](const std::vector<Tensor>& in) { return relu(in[0]); },
            {spread_tensor(Shape{3, 7}, 4, 0.03f)});
}

TEST_CASE("gradcheck linear, reshape, flatten, add, mul, sum, mean", "[gradcheck]") {
  gradcheck(
      "linear", [](const std::vector<Tensor>& in) { return linear(in[0], in[1], in[2]); },
      {random_tensor(Shape{5, 7}, 1), random_tensor(Shape{3, 7}, 2), random_tensor(Shape{3}, 3)});
  gradcheck("linear no bias",
            [](const std::vector<Tensor>& in) { return linear(in[0], in[1], Tensor()); },
            {random_tensor(Shape{1, 4}, 4), random_tensor(Shape{6, 4}, 5)});
  gradcheck("flatten",
            [](const std::vector<Tensor>& in) { return mul(flatten(in[0]), flatten(in[0])); },
            {random_tensor(Shape{2, 3, 2, 3}, 6)});
  gradcheck("reshape",
            [](const std::vector<Tensor>& in) {
              return reshape(in[0], Shape{3, 4});
            },
            {random_tensor(Shape{2, 6}, 7)});
  gradcheck("add", [](const std::vector<Tensor>& in) { return add(in[0], in[1]); },
            {random_tensor(Shape{4, 5}, 8), random_tensor(Shape{4, 5}, 9)});
  gradcheck("add self", [](const std::vector<Tensor>& in) { return add(in[0], in[0]); },
            {random_tensor(Shape{3, 3}, 10)});
  gradcheck("mul", [](const std::vector<Tensor>& in) { return mul(in[0], in[1]); },
            {random_tensor(Shape{7}, 11), random_tensor(Shape{7}, 12)});
  gradcheck("sum", [](const std::vector<Tensor>& in) { return sum(in[0]); },
            {random_tensor(Shape{3, 5}, 13)});
  gradcheck("mean", [](const std::vector<Tensor>& in) { return mean(in[0]); },
            {random_tensor(Shape{3, 5}, 14)});
}

TEST_CASE("gradcheck log_softmax, nll_loss, cross_entropy (mean and sum)", "[gradcheck]") {
  const std::vector<int32_t> labels{0, 3, 2, 3, 1};
  gradcheck("log_softmax", [](const std::vector<Tensor>& in) { return log_softmax(in[0]); },
            {random_tensor(Shape{5, 4}, 1)});
  for (Reduction red : {Reduction::kMean, Reduction::kSum}) {
    gradcheck("nll_loss",
              [&](const std::vector<Tensor>& in) { return nll_loss(in[0], labels, red); },
              {random_tensor(Shape{5, 4}, 2)});
    gradcheck("cross_entropy",
              [&](const std::vector<Tensor>& in) { return cross_entropy(in[0], labels, red); },
              {random_tensor(Shape{5, 4}, 3)});
  }
}

TEST_CASE("cross_entropy and argmax values", "[ops]") {
  Tensor x = Tensor::from(Shape{2, 3}, {1, 2, 3, 0, 0, 0});
  const std::vector<int32_t> labels{2, 1};
  const double l0 = -(3.0 - std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0)));
  const double l1 = std::log(3.0);
  CHECK(cross_entropy(x, labels, Reduction::kSum).item() == Approx(l0 + l1));
  CHECK(cross_entropy(x, labels, Reduction::kMean).item() == Approx((l0 + l1) / 2));
  CHECK(argmax(x) == std::vector<int32_t>{2, 0});
  CHECK_THROWS_WITH(nll_loss(x, std::vector<int32_t>{0}), "nll_loss: expected 2 labels, got 1");
  CHECK_THROWS_WITH(nll_loss(x, std::vector<int32_t>{0, 3}),
                    "nll_loss: expected labels in [0, 3), got 3 at 1");
}

TEST_CASE("ops reject mismatched shapes with both shapes in the message", "[ops]") {
  Tensor a = Tensor::zeros(Shape{2, 3}), b = Tensor::zeros(Shape{3, 2});
  CHECK_THROWS_WITH(add(a, b), "add: expected shape (2, 3), got (3, 2)");
  CHECK_THROWS_WITH(linear(a, Tensor::zeros(Shape{4, 5}), Tensor()),
                    "linear: expected input (N, 5) for weight (4, 5), got (2, 3)");
  CHECK_THROWS_WITH(
      conv2d(Tensor::zeros(Shape{1, 2, 5, 5}), Tensor::zeros(Shape{4, 3, 3, 3}), Tensor()),
      "conv2d: expected input with 3 channels (weight (4, 3, 3, 3)), got (1, 2, 5, 5)");
  CHECK_THROWS_WITH(reshape(a, Shape{4}),
                    "reshape: expected a shape of 6 elements like (2, 3), got (4)");
}
