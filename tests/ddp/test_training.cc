// Training end to end on synthetic data: loss goes down, and the same seed gives a bit-identical
// loss sequence.
//
// The learning rates leave a margin: at 0.05 (28x28, batch 16) and 0.01 (CIFAR, batch 4) a step's
// loss spiked to 8-16 in the second or third epoch, and whether training recovered depended on
// the GEMM's rounding -- it failed with OpenBLAS 0.3.21's Prescott kernels, which that version
// takes on CPUs it does not know (an Emerald Rapids Xeon), and with one BLAS thread. At 0.03 and
// 0.005 no step's loss passes 2.7, and the results hold for every OPENBLAS_CORETYPE tried
// (Prescott, Haswell, SkylakeX, Zen), CHORUS_CPU_ISA (scalar, avx2, avx512) and 1 or 2 threads.
#include <catch2/catch.hpp>

#include <cstdio>
#include <vector>

#include "ddp/data/data_loader.h"
#include "ddp/data/dataset.h"
#include "ddp/nn/modules.h"
#include "ddp/nn/optim.h"
#include "ddp/ops/kernel_table.h"
#include "ddp/train/trainer.h"

using namespace chorus;

namespace {

std::vector<EpochStats> train_once(uint64_t seed, const Shape& sample, int64_t batch, float lr,
                                   int64_t n) {
  auto train = make_synthetic(n, sample, 10, seed);
  auto test = make_synthetic(100, sample, 10, seed, 1);
  Net net(static_cast<int>(sample[0]), static_cast<int>(sample[1]), seed);
  Sgd opt(net.parameters(), {.lr = lr, .momentum = 0.9f});
  LoaderOptions lo;
  lo.batch_size = batch;
  lo.seed = seed;
  DataLoader loader(train, lo);
  TrainOptions to;
  to.epochs = 3;
  to.progress = false;
  to.record_step_losses = true;
  int64_t hooks = 0;
  to.after_backward = [&] { ++hooks; };
  Trainer trainer(net, opt, loader, test.get(), to);
  auto stats = trainer.run();
  CHECK(hooks == (n + batch - 1) / batch * to.epochs);
  return stats;
}

}  // namespace

TEST_CASE("training is deterministic and learns (Fashion-MNIST-shaped net)", "[training]") {
  auto a = train_once(0, Shape{1, 28, 28}, 16, 0.03f, 512);
  auto b = train_once(0, Shape{1, 28, 28}, 16, 0.03f, 512);
  auto c = train_once(1, Shape{1, 28, 28}, 16, 0.03f, 512);
  REQUIRE(a.size() == 3);
  for (size_t e = 0; e < a.size(); ++e) {
    CHECK(a[e].step_losses == b[e].step_losses);  // bit-identical
    CHECK(a[e].test_acc == b[e].test_acc);
  }
  CHECK(a[0].step_losses != c[0].step_losses);
  CHECK(a[2].train_loss < a[0].train_loss);
  CHECK(a[2].test_acc > 0.25);  // chance is 0.1
}

TEST_CASE("the CIFAR-shaped net trains at batch 4", "[training]") {
  auto a = train_once(2, Shape{3, 32, 32}, 4, 0.005f, 384);
  CHECK(a[2].train_loss < a[0].train_loss);
  CHECK(a[2].test_acc > 0.5);
  CHECK(a[0].step_losses.size() == 96);
}

TEST_CASE("two intra-op threads: same results as one (to rounding), and deterministic",
          "[training][threads]") {
  set_cpu_threads(2);
  auto a = train_once(0, Shape{1, 28, 28}, 16, 0.03f, 512);
  auto b = train_once(0, Shape{1, 28, 28}, 16, 0.03f, 512);
  set_cpu_threads(1);
  auto one = train_once(0, Shape{1, 28, 28}, 16, 0.03f, 512);
  CHECK(a[2].step_losses == b[2].step_losses);
  CHECK(a[0].step_losses[0] == Approx(one[0].step_losses[0]).epsilon(1e-5));
  CHECK(a[0].step_losses[5] == Approx(one[0].step_losses[5]).epsilon(1e-3));
}
