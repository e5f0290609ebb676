// The autograd engine: accumulation, no-grad, grad as a view into external storage, and the
// gradient-ready hook (once per parameter per backward, in the order gradients become final).
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "ddp/nn/modules.h"
#include "ddp/ops/kernel_table.h"
#include "ddp/ops/ops.h"
#include "ddp/tensor/autograd.h"

using namespace chorus;

TEST_CASE("gradients accumulate across backward calls and within one graph", "[autograd]") {
  Tensor x = Tensor::from(Shape{3}, {1, 2, 3}).set_requires_grad(true);
  sum(mul(x, x)).backward();  // d/dx sum(x^2) = 2x
  CHECK(x.grad().to_vector() == std::vector<float>{2, 4, 6});
  sum(add(x, x)).backward();  // + 2
  CHECK(x.grad().to_vector() == std::vector<float>{4, 6, 8});
}

TEST_CASE("no-grad scope records nothing; requires_grad propagates", "[autograd]") {
  Tensor x = Tensor::from(Shape{2}, {1, 2}).set_requires_grad(true);
  Tensor c = Tensor::from(Shape{2}, {3, 4});
  CHECK(add(x, c).requires_grad());
  CHECK_FALSE(add(c, c).requires_grad());
  {
    NoGradGuard ng;
    Tensor y = add(x, c);
    CHECK_FALSE(y.requires_grad());
    CHECK(y.grad_fn() == nullptr);
  }
  CHECK(grad_mode_enabled());
  CHECK_THROWS_WITH(sum(c).backward(),
                    "backward: expected a tensor that requires grad, got one that does not");
}

TEST_CASE("a grad replaced by a view into a flat buffer is accumulated in place",
          "[autograd][ddp]") {
  Tensor a = Tensor::from(Shape{2}, {1, 2}).set_requires_grad(true);
  Tensor b = Tensor::from(Shape{3}, {1, 1, 1}).set_requires_grad(true);
  Tensor bucket = Tensor::zeros(Shape{8});
  a.set_grad(Tensor::alias(bucket, 1, Shape{2}));
  b.set_grad(Tensor::alias(bucket, 4, Shape{3}));
  Tensor loss = add(sum(mul(a, a)), sum(b));
  loss.backward();
  CHECK(bucket.to_vector() == std::vector<float>{0, 2, 4, 0, 1, 1, 1, 0});
  CHECK(a.grad().storage() == bucket.storage());
  CHECK_THROWS_WITH(Tensor::alias(bucket, 6, Shape{3}),
                    "alias: view of 3 floats at offset 6 needs storage of 9, got 8");
  CHECK_THROWS_WITH(a.set_grad(Tensor::zeros(Shape{3})), "set_grad: expected shape (2), got (3)");
}

TEST_CASE("gradient-ready hooks fire once per parameter per backward, when final",
          "[autograd][ddp]") {
  Net net(1, 28, 0);
  std::vector<std::string> fired;
  for (auto& [name, p] : net.named_parameters()) {
    const std::string n = name;
    p.register_grad_ready_hook([&fired, n](Tensor& param) {
      fired.push_back(n);
      REQUIRE(param.grad().defined());
    });
  }
  Tensor x = Tensor::full(Shape{2, 1, 28, 28}, 0.5f);
  const std::vector<int32_t> labels{1, 7};
  cross_entropy(net.forward(x), labels).backward();
  // reverse order of use: the last layer's gradients are final first
  const std::vector<std::string> expected{"fc3.weight",   "fc3.bias",  "fc2.weight",   "fc2.bias",
                                          "fc1.weight",   "fc1.bias",  "conv2.weight", "conv2.bias",
                                          "conv1.weight", "conv1.bias"};
  auto sorted_pairs = [](std::vector<std::string> v) {  // order within one layer is not specified
    for (size_t i = 0; i + 1 < v.size(); i += 2)
      if (v[i] > v[i + 1]) std::swap(v[i], v[i + 1]);
    return v;
  };
  CHECK(sorted_pairs(fired) == sorted_pairs(expected));
  fired.clear();
  cross_entropy(net.forward(x), labels).backward();
  CHECK(fired.size() == 10);
}

TEST_CASE("a hook sees the complete gradient of a parameter used twice", "[autograd][ddp]") {
  Tensor w = Tensor::from(Shape{2}, {1, 2}).set_requires_grad(true);
  int calls = 0;
  std::vector<float> seen;
  w.register_grad_ready_hook([&](Tensor& p) {
    ++calls;
    seen = p.grad().to_vector();
  });
  Tensor y = add(mul(w, w), w);  // dy/dw = 2w + 1
  sum(mul(y, y)).backward();     // d/dw sum(y^2) = 2y(2w+1) = 2*(2,6)*(3,5) = (12, 60)
  CHECK(calls == 1);
  CHECK(seen == std::vector<float>{12, 60});
}

TEST_CASE("conv2d split over two threads matches one thread", "[autograd][threads]") {
  for (auto shape : {Shape{5, 1, 28, 28}, Shape{3, 6, 12, 12}}) {
    const int64_t c = shape[1];
    Tensor x = Tensor::empty(shape);
    for (int64_t i = 0; i < x.numel(); ++i)
      x.data()[i] = static_cast<float>((i * 37) % 101) / 50.0f - 1.0f;
    x.set_requires_grad(true);
    Tensor w = Tensor::full(Shape{4, c, 5, 5}, 0.01f).set_requires_grad(true);
    Tensor b = Tensor::full(Shape{4}, 0.1f).set_requires_grad(true);
    std::vector<std::vector<float>> results[2];
    for (int threads : {1, 2}) {
      set_cpu_threads(threads);
      x.set_grad(Tensor()), w.set_grad(Tensor()), b.set_grad(Tensor());
      Tensor y = conv2d(x, w, b);
      sum(mul(y, y)).backward();
      results[threads - 1] = {y.to_vector(), x.grad().to_vector(), w.grad().to_vector(),
                              b.grad().to_vector()};
    }
    set_cpu_threads(1);
    for (size_t k = 0; k < 4; ++k)
      for (size_t i = 0; i < results[0][k].size(); ++i)
        REQUIRE(results[1][k][i] == Approx(results[0][k][i]).epsilon(1e-4).margin(1e-5));
  }
}

TEST_CASE("relu and max_pool2d commute exactly, values and gradients (Net relies on it)",
          "[autograd]") {
  Tensor x = Tensor::empty(Shape{2, 3, 6, 6});
  for (int64_t i = 0; i < x.numel(); ++i)
    x.data()[i] = static_cast<float>((i * 7) % 5) - 2.0f;  // ties, zeros
  x.set_requires_grad(true);
  Tensor r = Tensor::empty(Shape{2, 3, 3, 3});
  for (int64_t i = 0; i < r.numel(); ++i) r.data()[i] = static_cast<float>(i % 4) + 0.5f;
  Tensor a = max_pool2d(relu(x), 2, 2);
  sum(mul(a, r)).backward();
  const std::vector<float> ga = x.grad().to_vector();
  x.set_grad(Tensor());
  Tensor b = relu(max_pool2d(x, 2, 2));
  sum(mul(b, r)).backward();
  CHECK(a.to_vector() == b.to_vector());
  CHECK(x.grad().to_vector() == ga);
}
