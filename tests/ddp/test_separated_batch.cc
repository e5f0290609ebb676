// tests/ddp/separated_batch.h, the batches on which test_cuda_ops compares the net on the gpu
// with the net on the cpu: which windows and values count as close calls, and that two nets a
// rounding apart stay a rounding apart over 3 steps on such batches (on the cpu: conv weights
// moved by 4 ulps stand in for the GPU's other summation order).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "ddp/nn/optim.h"
#include "tests/ddp/separated_batch.h"

using namespace chorus;
using chorus::testing::mark_close_to_zero;
using chorus::testing::mark_close_windows;
using chorus::testing::separated_batch;

namespace {

// One image, one channel, 2x4: two windows, the first {a, b, c, d}, the second 0.9, 0.1, 0.2, 0.3
// (the largest value 1 sets the scale).
bool window_close(float a, float b, float c, float d) {
  std::vector<char> close(1, 0);
  mark_close_windows(Tensor::from(Shape{1, 1, 2, 4}, {a, b, 0.9f, 0.1f, c, d, 0.2f, 1.0f}), 1e-5f,
                     close);
  return close[0];
}

Tensor random(const Shape& shape, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(shape.numel()));
  for (float& x : v) x = u(rng);
  return Tensor::from(shape, v);
}

// The largest distance between a's and b's parameters, each of the largest of a's.
double apart(Net& a, Net& b) {
  const auto pa = a.named_parameters(), pb = b.named_parameters();
  double worst = 0;
  for (size_t i = 0; i < pa.size(); ++i) {
    const std::vector<float> u = pa[i].second.to_vector(), v = pb[i].second.to_vector();
    float d = 0, s = 1e-12f;
    for (size_t k = 0; k < u.size(); ++k)
      d = std::max(d, std::fabs(u[k] - v[k])), s = std::max(s, std::fabs(u[k]));
    worst = std::max(worst, double(d) / s);
  }
  return worst;
}

// 3 steps of two nets from one init, b's conv weights moved `ulps` each way at random; the
// batches separated (in a's forward) or plain. Returns apart(a, b) after them.
double three_steps(uint32_t seed, int ulps, bool separated, int* redrawn) {
  std::mt19937 rng(100 + seed), noise(7 + seed);
  Net a(3, 32, 5), b(3, 32, 5);
  for (Conv2d* c : {b.conv1.get(), b.conv2.get()}) {
    std::vector<float> w = c->weight.to_vector();
    for (float& x : w) {
      const float to = (noise() & 1) ? 1.0f : -1.0f;
      for (int u = 0; u < ulps; ++u) x = std::nextafter(x, to);
    }
    c->weight.detach().copy_from(Tensor::from(c->weight.shape(), w));
  }
  const SgdOptions so{.lr = 0.01f, .momentum = 0.9f, .weight_decay = 5e-4f};
  Sgd oa(a.parameters(), so), ob(b.parameters(), so);
  for (int step = 0; step < 3; ++step) {
    Tensor x = separated ? separated_batch(a, 64, 3, 32, rng, 1e-5f, redrawn)
                         : random(Shape{64, 3, 32, 32}, rng);
    std::vector<int32_t> y(64);
    for (auto& l : y) l = int32_t(rng() % 10);
    oa.zero_grad();
    ob.zero_grad();
    cross_entropy(a.forward(x), y).backward();
    cross_entropy(b.forward(x), y).backward();
    oa.step();
    ob.step();
  }
  return apart(a, b);
}

}  // namespace

TEST_CASE("a pooling window is a close call when its top two or its maximum and 0 are near") {
  CHECK_FALSE(window_close(0.5f, 0.4f, 0.3f, 0.2f));
  CHECK(window_close(0.5f, 0.4f, 0.5f - 1e-7f, 0.2f));  // top two 1e-7 apart
  CHECK(window_close(0.5f, 0.5f, 0.3f, 0.2f));          // a tie
  CHECK(window_close(-0.5f, 1e-7f, -0.3f, -0.2f));      // the maximum at 0: relu decides
  CHECK(window_close(-0.5f, -1e-7f, -0.3f, -0.2f));
  CHECK_FALSE(window_close(-0.5f, -0.1f, -0.1f, -0.2f));  // a tie well below 0: relu's gradient 0
  CHECK_FALSE(window_close(0.5f, 0.5f - 1e-4f, 0.3f, 0.2f));
  // the scale is the tensor's largest value: 1e-7 apart is close on a scale of 1, not on 1e-3
  std::vector<char> close(1, 0);
  mark_close_windows(Tensor::from(Shape{1, 1, 2, 2}, {1e-3f, 1e-3f - 1e-7f, 0.0f, 0.0f}).detach(),
                     1e-5f, close);
  CHECK_FALSE(close[0]);
}

TEST_CASE("a value near 0 before a relu is a close call for its image") {
  std::vector<char> close(3, 0);
  mark_close_to_zero(Tensor::from(Shape{3, 2}, {1.0f, -0.5f, 0.3f, 1e-7f, -2.0f, 0.25f}), 1e-5f,
                     close);
  CHECK(close == std::vector<char>{0, 1, 0});
}

TEST_CASE("nets a rounding apart stay a rounding apart over 3 steps on separated batches") {
  // Without the separation some batches hold a window whose top two are ~1e-7 apart: the 4-ulp
  // net sends its gradient elsewhere and the convolutions part by 1e-5 of their scale or more
  // (on the build machine of 2026-11-27, seed 0 of these: 5e-5). Printed, not checked: which
  // seed has such a window depends on the cpu's kernels.
  int plain_parted = 0, redrawn = 0;
  double worst = 0;
  for (uint32_t seed = 0; seed < 12; ++seed) {
    const double plain = three_steps(seed, 4, false, nullptr);
    const double separated = three_steps(seed, 4, true, &redrawn);
    std::printf("seed %u: 4-ulp nets apart by %.2g (plain batches), %.2g (separated)\n", seed,
                plain, separated);
    plain_parted += plain > 1e-5;
    worst = std::max(worst, separated);
    CHECK(separated < 2e-6);
  }
  std::printf(
      "plain batches: %d of 12 seeds parted by > 1e-5; separated: worst %.2g, %d images "
      "drawn again\n",
      plain_parted, worst, redrawn);
  CHECK(redrawn > 0);  // the margin is not vacuous at this size
}
