// A few training steps of the tutorial CNNs (forward, cross-entropy, backward, SGD with momentum)
// in every instruction-set build of the CPU kernels (kernels/cpu/isa.h): losses, gradients and
// parameters must come out bit for bit the same. OpenBLAS (the GEMMs) and libm (exp/log in the
// softmax) pick their own code from CPUID; within one process that choice is the same for every
// build of ours, so any difference here is ours.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "ddp/nn/modules.h"
#include "ddp/nn/optim.h"
#include "ddp/ops/kernel_table.h"
#include "ddp/ops/ops.h"
#include "ddp/tensor/random.h"
#include "kernels/cpu/isa.h"

using chorus::kernels::Isa;

namespace {

struct Trace {
  std::vector<float> losses, grads, params;
};

void append(std::vector<float>& out, const chorus::Tensor& t) {
  out.insert(out.end(), t.data(), t.data() + t.numel());
}

// `steps` steps on random batches (inputs with ties: a quarter of them exactly zero).
Trace train(int channels, int side, int64_t batch, int steps, int threads) {
  chorus::set_cpu_threads(threads);
  chorus::Net net(channels, side, 7);
  chorus::Sgd opt(net.parameters(), {.lr = 0.05f, .momentum = 0.9f, .weight_decay = 1e-4f});
  chorus::Generator gen(3);
  Trace tr;
  for (int s = 0; s < steps; ++s) {
    chorus::Tensor x = chorus::Tensor::empty(chorus::Shape{batch, channels, side, side});
    for (int64_t j = 0; j < x.numel(); ++j) x.data()[j] = j % 4 == 0 ? 0.0f : gen.normal();
    std::vector<int32_t> y(static_cast<size_t>(batch));
    for (auto& l : y) l = static_cast<int32_t>(gen.below(10));
    opt.zero_grad();
    chorus::Tensor loss = chorus::cross_entropy(net.forward(x), y);
    loss.backward();
    append(tr.losses, loss);
    for (const auto& p : net.parameters()) append(tr.grads, p.grad());
    opt.step();
  }
  for (const auto& p : net.parameters()) append(tr.params, p);
  chorus::set_cpu_threads(1);
  return tr;
}

// Index of the first element whose bits differ, or -1.
long first_difference(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return static_cast<long>(i);
  return -1;
}

}  // namespace

TEST_CASE("training steps give the same bits in every kernel build", "[kernels][isa][train]") {
  struct Net {
    int channels, side;
    int64_t batch;
    int threads;
  };
  // The Fashion-MNIST net (direct first conv, 24-wide rows) and the CIFAR one (28-wide), one and
  // two intra-op threads.
  for (Net n : {Net{1, 28, 16, 1}, Net{3, 32, 4, 1}, Net{1, 28, 16, 2}}) {
    Trace want;
    for (int i = 0; i < chorus::kernels::kNumIsas; ++i) {
      const Isa isa = Isa(i);
      if (!chorus::kernels::cpu_supports(isa)) continue;
      REQUIRE(chorus::kernels::set_isa(isa).is_ok());
      Trace got = train(n.channels, n.side, n.batch, 3, n.threads);
      if (isa == Isa::kScalar) {
        want = got;
        continue;
      }
      INFO(chorus::kernels::isa_name(isa)
           << " build vs scalar build, net " << n.channels << "x" << n.side << " batch " << n.batch
           << " threads " << n.threads);
      CHECK(first_difference(got.losses, want.losses) == -1);
      CHECK(first_difference(got.grads, want.grads) == -1);
      CHECK(first_difference(got.params, want.params) == -1);
    }
  }
  REQUIRE(chorus::kernels::set_isa(chorus::kernels::best_isa()).is_ok());
}
