// A batch of random CIFAR-shaped images on which two runs of the tutorial net whose arithmetic
// differs by rounding (cpu against gpu: other summation orders) take the same branches: every
// 2x2 pooling window's maximum ahead of its runner-up, and every value that a relu sees away
// from 0, by more than `margin` of the layer's largest value -- in the forward of `net` on the
// cpu. Images with a close call are drawn again until none is left.
//
// Why: max pooling and relu are not continuous in their gradient. Where a window's two largest
// values are 1e-7 apart, a rounding difference sends that window's gradient to the other
// element, one image's whole contribution at one position moves, and the convolutions' gradients
// part by about 1% (one term of some 10^4 with random signs). On the cpu alone, conv weights 4
// ulps apart (which moves their outputs by about what the GPU's sums do) ended 3 steps 3e-8
// apart for 11 seeds of 12 and 2e-6 to 4e-6 (5e-5 of their scale) for the twelfth, a batch with
// a window 1.1e-7 apart: what the H100 showed on 2026-11-27. test_separated_batch checks this.
#pragma once

#include <algorithm>
#include <cmath>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "ddp/nn/modules.h"
#include "ddp/ops/ops.h"
#include "ddp/tensor/autograd.h"

namespace chorus::testing {

// Marks in `close` each image of y (N, C, H, W) with a 2x2/stride-2 window whose maximum is
// within `margin` of its runner-up or of 0 (a window well below 0 is left to relu: its gradient
// is 0 either way).
inline void mark_close_windows(const Tensor& y, float margin, std::vector<char>& close) {
  const std::vector<float> v = y.to_vector();
  float scale = 0;
  for (float x : v) scale = std::max(scale, std::fabs(x));
  const float m = margin * scale;
  const long n = y.dim(0), c = y.dim(1), h = y.dim(2), w = y.dim(3);
  for (long i = 0; i < n; ++i)
    for (long ch = 0; ch < c && !close[i]; ++ch) {
      const float* plane = v.data() + (i * c + ch) * h * w;
      for (long r = 0; r + 1 < h && !close[i]; r += 2)
        for (long s = 0; s + 1 < w; s += 2) {
          float q[4] = {plane[r * w + s], plane[r * w + s + 1], plane[(r + 1) * w + s],
                        plane[(r + 1) * w + s + 1]};
          std::sort(q, q + 4);
          if (q[3] > -m && (q[3] - q[2] < m || q[3] < m)) {
            close[i] = 1;
            break;
          }
        }
    }
}

// Marks each image of y (N, F) with a value within `margin` (of the largest) of 0.
inline void mark_close_to_zero(const Tensor& y, float margin, std::vector<char>& close) {
  const std::vector<float> v = y.to_vector();
  float scale = 0;
  for (float x : v) scale = std::max(scale, std::fabs(x));
  const long n = y.dim(0), f = y.dim(1);
  for (long i = 0; i < n; ++i)
    for (long k = 0; k < f; ++k)
      if (std::fabs(v[i * f + k]) < margin * scale) close[i] = 1;
}

// The images of `x` (N, C, H, W, on the cpu) with a close call in net's forward (on the cpu).
inline std::vector<char> close_calls(Net& net, const Tensor& x, float margin) {
  NoGradGuard no_grad;
  std::vector<char> close(static_cast<size_t>(x.dim(0)), 0);
  const auto conv = [](const std::shared_ptr<Conv2d>& c, const Tensor& in) {
    return conv2d(in, c->weight.detach().to(Device::cpu()), c->bias.detach().to(Device::cpu()));
  };
  const auto fc = [](const std::shared_ptr<Linear>& l, const Tensor& in) {
    return linear(in, l->weight.detach().to(Device::cpu()), l->bias.detach().to(Device::cpu()));
  };
  Tensor y = conv(net.conv1, x);
  mark_close_windows(y, margin, close);
  y = conv(net.conv2, relu(max_pool2d(y, 2, 2)));
  mark_close_windows(y, margin, close);
  y = fc(net.fc1, flatten(relu(max_pool2d(y, 2, 2)), 1));
  mark_close_to_zero(y, margin, close);
  y = fc(net.fc2, relu(y));
  mark_close_to_zero(y, margin, close);
  return close;
}

// `n` images of `channels` x `side` x `side`, uniform in [-1, 1), with no close call in net's
// forward; `redrawn` (if given) counts the images drawn again.
inline Tensor separated_batch(Net& net, int n, int channels, int side, std::mt19937& rng,
                              float margin = 1e-5f, int* redrawn = nullptr) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const size_t image = static_cast<size_t>(channels) * side * side;
  std::vector<float> v(image * n);
  for (float& x : v) x = u(rng);
  const Shape shape{n, channels, side, side};
  for (int round = 0; round < 100; ++round) {
    Tensor x = Tensor::from(shape, v);
    const std::vector<char> close = close_calls(net, x, margin);
    if (std::find(close.begin(), close.end(), 1) == close.end()) return x;
    for (size_t i = 0; i < close.size(); ++i)
      if (close[i]) {
        if (redrawn) ++*redrawn;
        for (size_t k = 0; k < image; ++k) v[i * image + k] = u(rng);
      }
  }
  throw std::runtime_error("separated_batch: images with a close call after 100 rounds (margin " +
                           std::to_string(margin) + ")");
}

}  // namespace chorus::testing
