// [cuda] Every operator of the CNN, forward and backward, on cuda:0 against the CPU (relative
// error <= 1e-5 of the largest value: TF32 off, the GEMM sums in float; with TF32 allowed, the
// linear and convolution layers within 2e-3 and not the float bits), SGD on its own, then 3 steps
// of the tutorial net (forward, loss, backward, SGD with momentum and weight decay) on both
// devices, losses, gradients and parameters compared; and 6 steps with the step captured as a
// CUDA graph against the eager GPU steps, bit for bit. Exits 77 with the reason where the CUDA
// kernels cannot run (no CUDA build, no device): tests/gpu/run.sh runs it where a GPU is lent.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "ddp/nn/modules.h"
#include "ddp/nn/optim.h"
#include "ddp/ops/kernel_table.h"
#include "ddp/ops/ops.h"
#include "ddp/train/step_graph.h"
#include "tests/ddp/separated_batch.h"

using namespace chorus;

namespace {

int g_failed = 0, g_checked = 0;
float g_tolerance = 1e-5f;  // of the largest value
const Device kGpu = Device::cuda(0);

Tensor random(const Shape& shape, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(shape.numel()));
  for (float& x : v) x = u(rng);
  return Tensor::from(shape, v);
}

void compare(const std::string& what, const Tensor& cpu, const Tensor& gpu) {
  ++g_checked;
  const std::vector<float> a = cpu.to_vector(), b = gpu.to_vector();
  if (a.size() != b.size()) {
    std::printf("FAIL %s: %zu elements on the cpu, %zu on the gpu\n", what.c_str(), a.size(),
                b.size());
    ++g_failed;
    return;
  }
  float scale = 1e-6f;
  for (float x : a) scale = std::max(scale, std::fabs(x));
  for (size_t i = 0; i < a.size(); ++i)
    if (!(std::fabs(a[i] - b[i]) <= g_tolerance * scale)) {
      std::printf("FAIL %s: element %zu: cpu %.9g, gpu %.9g (scale %g)\n", what.c_str(), i, a[i],
                  b[i], scale);
      ++g_failed;
      return;
    }
}

// op(inputs) on both devices; the outputs, then (through the sum of output * a fixed random
// weight) every input's gradient, compared.
void check_op(const std::string& name, std::vector<Tensor> inputs,
              const std::function<Tensor(const std::vector<Tensor>&)>& op, std::mt19937& rng) {
  std::vector<Tensor> on_gpu;
  for (Tensor& t : inputs) {
    t.set_requires_grad(true);
    on_gpu.push_back(t.detach().to(kGpu));
    on_gpu.back().set_requires_grad(true);
  }
  Tensor y_cpu = op(inputs), y_gpu = op(on_gpu);
  compare(name + " forward", y_cpu, y_gpu);
  Tensor w = random(y_cpu.shape(), rng);
  sum(mul(y_cpu, w)).backward();
  sum(mul(y_gpu, w.to(kGpu))).backward();
  for (size_t i = 0; i < inputs.size(); ++i)
    compare(name + " grad of input " + std::to_string(i), inputs[i].grad(), on_gpu[i].grad());
}

}  // namespace

int main() {
  if (const std::string why = kernels_unavailable(kGpu); !why.empty()) {
    std::printf("skip: [cuda] %s\n", why.c_str());
    return 77;
  }
  std::mt19937 rng(11);
  for (auto [stride_, pad_] : {std::pair{1, 0}, {2, 1}, {1, 2}}) {
    const int stride = stride_, pad = pad_;  // a lambda captures variables, not bindings
    check_op(
        "conv2d stride " + std::to_string(stride) + " pad " + std::to_string(pad),
        {random(Shape{5, 3, 12, 13}, rng), random(Shape{4, 3, 5, 5}, rng), random(Shape{4}, rng)},
        [=](const std::vector<Tensor>& t) { return conv2d(t[0], t[1], t[2], stride, pad); }, rng);
  }
  check_op(
      "conv2d lenet",
      {random(Shape{64, 3, 32, 32}, rng), random(Shape{6, 3, 5, 5}, rng), random(Shape{6}, rng)},
      [](const std::vector<Tensor>& t) { return conv2d(t[0], t[1], t[2]); }, rng);
  check_op(  // the net's second convolution, as it sees it at batch 64
      "conv2d lenet conv2",
      {random(Shape{64, 6, 14, 14}, rng), random(Shape{16, 6, 5, 5}, rng), random(Shape{16}, rng)},
      [](const std::vector<Tensor>& t) { return conv2d(t[0], t[1], t[2]); }, rng);
  for (auto [k_, s_] : {std::pair{2, 2}, {3, 2}, {3, 1}}) {
    const int k = k_, s = s_;
    check_op(
        "max_pool2d " + std::to_string(k) + "/" + std::to_string(s),
        {random(Shape{4, 3, 14, 15}, rng)},
        [=](const std::vector<Tensor>& t) { return max_pool2d(t[0], k, s); }, rng);
  }
  check_op(
      "relu", {random(Shape{1000}, rng)}, [](const std::vector<Tensor>& t) { return relu(t[0]); },
      rng);
  check_op(
      "linear",
      {random(Shape{64, 400}, rng), random(Shape{120, 400}, rng), random(Shape{120}, rng)},
      [](const std::vector<Tensor>& t) { return linear(t[0], t[1], t[2]); }, rng);
  check_op(
      "flatten", {random(Shape{8, 16, 5, 5}, rng)},
      [](const std::vector<Tensor>& t) { return flatten(t[0], 1); }, rng);
  check_op(
      "add", {random(Shape{77}, rng), random(Shape{77}, rng)},
      [](const std::vector<Tensor>& t) { return add(t[0], t[1]); }, rng);
  check_op(
      "mean", {random(Shape{3001}, rng)}, [](const std::vector<Tensor>& t) { return mean(t[0]); },
      rng);
  check_op(
      "log_softmax", {random(Shape{256, 10}, rng)},
      [](const std::vector<Tensor>& t) { return log_softmax(t[0]); }, rng);
  std::vector<int32_t> labels(256);
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = int32_t((i * 7) % 10);
  check_op(
      "cross_entropy", {random(Shape{256, 10}, rng)},
      [&](const std::vector<Tensor>& t) { return cross_entropy(t[0], labels); }, rng);
  {
    Tensor x = random(Shape{256, 10}, rng);
    ++g_checked;
    if (argmax(x) != argmax(x.to(kGpu))) {
      std::printf("FAIL argmax\n");
      ++g_failed;
    }
  }
  // TF32 (CHORUS_ALLOW_TF32=1): the GEMMs on the tensor cores with operands rounded to 10
  // mantissa bits, within 2e-3 of the largest value against the cpu (about 2^-11 a product);
  // not the float GEMM's bits (the switch reached the kernels); off again, the float GEMM's bits.
  {
    set_allow_tf32(true);
    g_tolerance = 2e-3f;
    check_op(
        "linear (tf32)",
        {random(Shape{64, 400}, rng), random(Shape{120, 400}, rng), random(Shape{120}, rng)},
        [](const std::vector<Tensor>& t) { return linear(t[0], t[1], t[2]); }, rng);
    check_op(
        "conv2d lenet (tf32)",
        {random(Shape{64, 3, 32, 32}, rng), random(Shape{6, 3, 5, 5}, rng), random(Shape{6}, rng)},
        [](const std::vector<Tensor>& t) { return conv2d(t[0], t[1], t[2]); }, rng);
    Tensor x = random(Shape{64, 400}, rng).to(kGpu), w = random(Shape{120, 400}, rng).to(kGpu),
           b = random(Shape{120}, rng).to(kGpu);
    const std::vector<float> tf32 = linear(x, w, b).to_vector(),
                             again = linear(x, w, b).to_vector();
    set_allow_tf32(false);
    g_tolerance = 1e-5f;
    const std::vector<float> plain = linear(x, w, b).to_vector();
    g_checked += 2;
    if (tf32 == plain) {
      std::printf("FAIL linear with TF32 allowed gave the float GEMM's bits\n");
      ++g_failed;
    }
    if (tf32 != again) {
      std::printf("FAIL linear with TF32: two runs differ\n");
      ++g_failed;
    }
  }
  // SGD with momentum and weight decay on its own: the same parameters and gradients on both
  // devices, 3 updates (elementwise: within 1e-6 of the largest value).
  {
    g_tolerance = 1e-6f;
    Tensor pc = random(Shape{1000}, rng).set_requires_grad(true), pg = pc.to(kGpu);
    pg.set_requires_grad(true);
    Sgd sc({pc}, {.lr = 0.05f, .momentum = 0.9f, .weight_decay = 5e-2f}),
        sg({pg}, {.lr = 0.05f, .momentum = 0.9f, .weight_decay = 5e-2f});
    for (int step = 0; step < 3; ++step) {
      Tensor g = random(Shape{1000}, rng);
      pc.set_grad(g);
      pg.set_grad(g.to(kGpu));
      sc.step();
      sg.step();
    }
    compare("sgd (momentum, weight decay) after 3 steps", pc, pg);
    g_tolerance = 1e-5f;
  }
  // Three steps of the tutorial net on both devices (issue 12: a step equal to the CPU step within
  // 1e-5): each step's loss, each parameter's gradient (of the largest gradient) and, after the
  // first step and after the third, each parameter (of the largest value), all within 1e-5; every
  // gradient's distance printed, so that a run shows where the devices part. The batches are
  // separated (tests/ddp/separated_batch.h): no pooling window's top two and no value before a
  // relu within 1e-5 of each other or of 0 in the cpu's forward. On an H100 (2026-11-27), with
  // plain random batches, the convolutions' parameters after 3 steps were 1.2e-6 to 6.1e-6 apart
  // (up to 8e-5 of their scale; the linear layers' within 1e-5): the size of one window's
  // gradient sent to its other element, which the cpu alone reproduces with conv weights 4 ulps
  // apart (test_separated_batch).
  Net cpu_net(3, 32, 5), gpu_net(3, 32, 5);
  gpu_net.to(kGpu);
  const SgdOptions so{.lr = 0.01f, .momentum = 0.9f, .weight_decay = 5e-4f};
  Sgd cpu_opt(cpu_net.parameters(), so), gpu_opt(gpu_net.parameters(), so);
  for (int step = 0; step < 3; ++step) {
    int redrawn = 0;
    Tensor x = chorus::testing::separated_batch(cpu_net, 64, 3, 32, rng, 1e-5f, &redrawn);
    std::printf("net step %d: %d images of 64 drawn again (close calls)\n", step, redrawn);
    std::vector<int32_t> y(64);
    for (size_t i = 0; i < y.size(); ++i) y[i] = int32_t(rng() % 10);
    cpu_opt.zero_grad();
    gpu_opt.zero_grad();
    Tensor lc = cross_entropy(cpu_net.forward(x), y),
           lg = cross_entropy(gpu_net.forward(x.to(kGpu)), y);
    const std::string at = "net step " + std::to_string(step);
    compare(at + " loss", lc, lg);
    lc.backward();
    lg.backward();
    const auto pc = cpu_net.named_parameters(), pg = gpu_net.named_parameters();
    for (size_t i = 0; i < pc.size(); ++i) {
      const std::vector<float> a = pc[i].second.grad().to_vector(),
                               b = pg[i].second.grad().to_vector();
      float largest = 0, apart = 0;
      for (size_t k = 0; k < a.size(); ++k) {
        largest = std::max(largest, std::fabs(a[k]));
        apart = std::max(apart, std::fabs(a[k] - b[k]));
      }
      std::printf("%s: %-12s gradient apart by %.3g of its largest %.3g (%.2g)\n", at.c_str(),
                  pc[i].first.c_str(), apart, largest, largest > 0 ? apart / largest : 0.0);
      compare(at + " gradient of " + pc[i].first, pc[i].second.grad(), pg[i].second.grad());
    }
    cpu_opt.step();
    gpu_opt.step();
    if (step == 0 || step == 2)
      for (size_t i = 0; i < pc.size(); ++i)
        compare(
            "net after " + std::to_string(step + 1) + " step" + (step ? "s: " : ": ") + pc[i].first,
            pc[i].second, pg[i].second);
  }
  // The step as a CUDA graph (ddp/train/step_graph.h: 2 eager warm-up steps, the capture, then
  // replays on static inputs): 6 steps end with the eager GPU run's losses and parameters, bit for
  // bit (the same kernels in the same order).
  {
    Net eager(3, 32, 5), graphed(3, 32, 5);
    eager.to(kGpu);
    graphed.to(kGpu);
    Sgd oe(eager.parameters(), so), og(graphed.parameters(), so);
    Tensor images = Tensor::empty(Shape{64, 3, 32, 32}, kGpu), loss;
    Labels labels(64, kGpu);
    StepGraph graph(kGpu);
    for (int step = 0; step < 6; ++step) {
      Tensor x = random(Shape{64, 3, 32, 32}, rng);
      std::vector<int32_t> y(64);
      for (size_t i = 0; i < y.size(); ++i) y[i] = int32_t(rng() % 10);
      oe.zero_grad();
      Tensor le = cross_entropy(eager.forward(x.to(kGpu)), y);
      le.backward();
      oe.step();
      images.copy_from(x);
      labels.set(y, 10);
      graph.run([&] {
        og.zero_grad();
        loss = cross_entropy(graphed.forward(images), labels);
        loss.backward();
        og.step();
      });
      ++g_checked;
      if (le.item() != loss.item()) {
        std::printf("FAIL graph step %d: loss %.9g eager, %.9g from the graph\n", step, le.item(),
                    loss.item());
        ++g_failed;
      }
    }
    const auto pe = eager.named_parameters(), pgr = graphed.named_parameters();
    for (size_t i = 0; i < pe.size(); ++i) {
      ++g_checked;
      if (pe[i].second.to_vector() != pgr[i].second.to_vector()) {
        std::printf("FAIL graph: %s differs from the eager run's after 6 steps\n",
                    pe[i].first.c_str());
        ++g_failed;
      }
    }
    if (!graph.captured()) {
      std::printf("FAIL graph: never captured\n");
      ++g_failed;
    }
  }
  std::printf("%d checks, %d failed\n", g_checked, g_failed);
  return g_failed ? 1 : 0;
}
