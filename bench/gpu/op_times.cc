// op-times: where a training step of the tutorial CNN spends its time on a device, op by op
// (issue 12: "where missed, show where the time goes"). For batch 64 and 256: the whole step
// (zero_grad, forward, loss, backward, SGD), then each layer's forward and forward + backward,
// the loss, the optimizer step, and the GEMMs of the convolutions' weight gradients on their
// own (the shapes that ran on 5 and 10 blocks before the GEMM split k). Each figure: the median
// over rounds of (time of `reps` calls, the device drained before and after) / reps, in us.
//
//   op-times [--device cuda:0|cpu|null] [--reps 20] [--rounds 5] [--batches 64,256]
//
// `null`: cuda:0 served by kernels and a device that do nothing (host memory, no copies): the
// step's figure is then the host's own cost of it -- the tensor layer, autograd, the caching
// allocator, the optimizer -- which no GPU can take away. It also counts the step's copies
// between host and device, each a wait for the GPU on a real one, and fails when there are any
// (zero_grad and backward's seed gradient were 11 such copies a step until 2026-11-27).
//
// Exits 77 with the reason where the device has no kernels (no CUDA build, no GPU).
// tests/gpu/run.sh runs it on a lent GPU; the test suite runs it once on the cpu, small.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "ddp/nn/modules.h"
#include "ddp/nn/optim.h"
#include "ddp/ops/kernel_table.h"
#include "ddp/ops/ops.h"
#include "ddp/tensor/device_cache.h"

using namespace chorus;

namespace {

struct Options {
  Device device = Device::cuda(0);
  int reps = 20, rounds = 5;
  std::vector<int> batches{64, 256};
  bool null_device = false;  // --device null
};

Tensor random(const Shape& shape, Device device, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(shape.numel()));
  for (float& x : v) x = u(rng);
  return Tensor::from(shape, v).to(device);
}

// Waits for the device: a copy to the host is queued behind everything before it.
void drain(const Tensor& t) {
  (void)t.detach().to(Device::cpu());
}

void time_it(const Options& o, int batch, const std::string& what, const Tensor& anchor,
             const std::function<void()>& fn) {
  fn();  // warm: scratch, the allocator's cache
  drain(anchor);
  std::vector<double> us;
  for (int r = 0; r < o.rounds; ++r) {
    drain(anchor);
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < o.reps; ++i) fn();
    drain(anchor);
    us.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
        o.reps);
  }
  std::sort(us.begin(), us.end());
  std::printf("op-times %s batch %3d  %-34s %10.1f us  (%.1f-%.1f)\n",
              o.null_device ? "null" : o.device.str().c_str(), batch, what.c_str(),
              us[us.size() / 2], us.front(), us.back());
}

// --device null: a device whose kernels and copies do nothing.
long g_null_calls = 0;   // kernel-table calls made on the null device
long g_null_copies = 0;  // copies between host and device (on a GPU, a wait for it each)

class NullGpu final : public DeviceBackend {
 public:
  int count() override { return 1; }
  void* alloc(Device, size_t bytes) override { return std::malloc(bytes); }
  void free(Device, void* p) override { std::free(p); }
  void copy(void*, Device, const void*, Device, size_t) override { ++g_null_copies; }
  void add(Device, long, const float*, const float*, float*) override {}
  void fill(Device, long, float, float*) override {}
};

template <typename R, typename... A>
constexpr auto nothing(R (*)(A...)) {
  return +[](A...) -> R {
    ++g_null_calls;
    return R();
  };
}

const KernelTable& null_kernels() {
  static const KernelTable t = [] {
    KernelTable k{};
    const KernelTable& c = kernel_table_for(Device::cpu());  // for the signatures only
    k.gemm = nothing(c.gemm), k.conv2d_forward = nothing(c.conv2d_forward);
    k.conv2d_backward = nothing(c.conv2d_backward);
    k.max_pool2d_forward = nothing(c.max_pool2d_forward);
    k.max_pool2d_backward = nothing(c.max_pool2d_backward);
    k.relu_forward = nothing(c.relu_forward), k.relu_backward = nothing(c.relu_backward);
    k.add = nothing(c.add), k.mul = nothing(c.mul), k.scale = nothing(c.scale);
    k.div_scalar = nothing(c.div_scalar), k.fill = nothing(c.fill), k.sum = nothing(c.sum);
    k.add_row_bias = nothing(c.add_row_bias), k.sum_rows = nothing(c.sum_rows);
    k.log_softmax_forward = nothing(c.log_softmax_forward);
    k.log_softmax_backward = nothing(c.log_softmax_backward);
    k.nll_forward = nothing(c.nll_forward), k.nll_backward = nothing(c.nll_backward);
    k.argmax_rows = nothing(c.argmax_rows), k.sgd_update = nothing(c.sgd_update);
    return k;
  }();
  return t;
}

// False when a step on the null device copied between host and device: on a GPU each such copy
// (cudaMemcpy) waits for the work before it, so a step must make none.
bool run_batch(const Options& o, int B) {
  std::mt19937 rng(5);
  const Device d = o.device;
  Net net(3, 32, 5);
  net.to(d);
  Sgd opt(net.parameters(), SgdOptions{.lr = 0.01f, .momentum = 0.9f, .weight_decay = 0.0f});
  Tensor x = random(Shape{B, 3, 32, 32}, d, rng);
  std::vector<int32_t> labels(static_cast<size_t>(B));
  for (int i = 0; i < B; ++i) labels[size_t(i)] = int32_t(rng() % 10);
  const Tensor w1 = net.conv1->parameters()[0];
  time_it(o, B, o.null_device ? "step, host side only" : "step (fwd, loss, bwd, sgd)", w1, [&] {
    opt.zero_grad();
    Tensor loss = cross_entropy(net.forward(x), labels);
    loss.backward();
    opt.step();
  });
  if (o.null_device) {  // every other figure would be the same bookkeeping
    const long before = g_null_calls, copies_before = g_null_copies;
    opt.zero_grad();
    Tensor loss = cross_entropy(net.forward(x), labels);
    loss.backward();
    opt.step();
    const long copies = g_null_copies - copies_before;
    std::printf("op-times null batch %3d  kernel-table calls per step: %ld\n", B,
                g_null_calls - before);
    std::printf("op-times null batch %3d  copies between host and device per step: %ld\n", B,
                copies);
    if (copies > 0)
      std::fprintf(stderr,
                   "op-times: a step copied %ld times between host and device: on a GPU each "
                   "copy waits for the work queued before it\n",
                   copies);
    return copies == 0;
  }
  // Layer by layer, on inputs of the shapes the net gives them.
  Tensor a1 = random(Shape{B, 6, 14, 14}, d, rng), f0 = random(Shape{B, 400}, d, rng);
  Tensor c1 = random(Shape{B, 6, 28, 28}, d, rng), logits = random(Shape{B, 10}, d, rng);
  auto fwd_bwd = [&](const std::string& name, const std::function<Tensor()>& f) {
    time_it(o, B, name + " forward", w1, [&] { (void)f(); });
    time_it(o, B, name + " forward+backward", w1, [&] {
      opt.zero_grad();
      sum(f()).backward();
    });
  };
  fwd_bwd("conv1 3->6 5x5", [&] { return net.conv1->forward(x); });
  fwd_bwd("conv2 6->16 5x5", [&] { return net.conv2->forward(a1); });
  Tensor c1g = c1.detach();
  c1g.set_requires_grad(true);
  fwd_bwd("pool+relu 6x28x28", [&] { return max_pool2d(relu(c1g), 2, 2); });
  fwd_bwd("fc1 400->120", [&] { return net.fc1->forward(f0); });
  Tensor lg = logits.detach();
  lg.set_requires_grad(true);
  fwd_bwd("cross_entropy", [&] { return cross_entropy(lg, labels); });
  time_it(o, B, "sgd step (all parameters)", w1, [&] { opt.step(); });
  // The weight gradients' GEMMs alone: dw (OC, K) = dy (OC, N*P) x col^T.
  const KernelTable& kt = kernel_table_for(d);
  for (auto [oc_, K_, P] : {std::tuple{6, 75, 784}, {16, 150, 100}}) {
    const int oc = oc_, K = K_;  // a lambda of clang 14 takes no structured binding
    const long cols = long(B) * P;
    Tensor dy = random(Shape{oc, cols}, d, rng), col = random(Shape{K, cols}, d, rng);
    Tensor dw = Tensor::empty(Shape{oc, K}, d);
    std::ostringstream name;
    name << "gemm dw " << oc << "x" << K << "x" << cols;
    time_it(o, B, name.str(), w1, [&] {
      kt.gemm(Trans::kNo, Trans::kYes, oc, K, int(cols), 1.0f, dy.data(), int(cols), col.data(),
              int(cols), 0.0f, dw.data(), K);
    });
  }
  return true;
}

std::vector<int> parse_ints(const std::string& s) {
  std::vector<int> v;
  std::stringstream in(s);
  for (std::string t; std::getline(in, t, ',');) v.push_back(std::atoi(t.c_str()));
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--device" && v == "null") {
      o.null_device = true;
      o.device = Device::cuda(0);
    } else if (k == "--device") {
      o.device = Device::parse(v, 0);
    } else if (k == "--reps") {
      o.reps = std::max(1, std::atoi(v.c_str()));
    } else if (k == "--rounds") {
      o.rounds = std::max(1, std::atoi(v.c_str()));
    } else if (k == "--batches") {
      o.batches = parse_ints(v);
    } else {
      std::fprintf(stderr, "op-times: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  if (argc % 2 == 0) {
    std::fprintf(stderr, "op-times: %s needs a value\n", argv[argc - 1]);
    return 2;
  }
  static NullGpu null_gpu;
  if (o.null_device) {
    set_cuda_backend_for_test(&null_gpu);
    set_cuda_kernel_table_for_test(&null_kernels());
  }
  if (const std::string why = o.null_device ? "" : kernels_unavailable(o.device); !why.empty()) {
    std::printf("skip: %s\n", why.c_str());
    return 77;
  }
  bool ok = true;
  for (int b : o.batches) ok = run_batch(o, b) && ok;
  return ok ? 0 : 1;
}
