// train_step: images/s of one training step (forward + cross_entropy + backward + SGD) of the
// tutorial CNN on a fixed pool of random batches -- the chorus side of
// `baseline.py synth` in ../shared/peers/train. Prints median [min-max] over repetitions, by wall
// time and by this thread's CPU time (the latter shrugs off other programs on a busy machine).
//
//   train_step --shape 3x32x32 --batch 4 --reps 5 --min-time 2
#include <time.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include <fmt/format.h>

#include "ddp/nn/modules.h"
#include "ddp/nn/optim.h"
#include "ddp/ops/kernel_table.h"
#include "ddp/ops/ops.h"
#include "ddp/tensor/random.h"
#include "kernels/cpu/isa.h"

namespace {

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

struct Stat {
  double median, lo, hi;
};

Stat stat(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {v[v.size() / 2], v.front(), v.back()};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"time training steps of the tutorial CNN"};
  std::string shape = "3x32x32";
  int64_t batch = 4;
  int reps = 5, threads = 1, warmup = 20;
  double min_time = 2.0;
  app.add_option("--shape", shape, "1x28x28 (Fashion-MNIST net) or 3x32x32 (CIFAR net)")
      ->capture_default_str();
  app.add_option("--batch", batch)->capture_default_str();
  app.add_option("--reps", reps)->capture_default_str();
  app.add_option("--min-time", min_time, "seconds per repetition")->capture_default_str();
  app.add_option("--threads", threads)->capture_default_str();
  bool keep_denormals = false;
  app.add_flag("--keep-denormals", keep_denormals,
               "compute with denormals (default: flush to zero, like train_cnn)");
  CLI11_PARSE(app, argc, argv);
  chorus::set_flush_denormal(!keep_denormals);
  if (chorus::Status st = chorus::kernels::init_isa();
      !st.is_ok()) {  // CHORUS_CPU_ISA picks the build
    fmt::print(stderr, "train_step: {}\n", st.message());
    return 2;
  }
  int c = 0, h = 0, w = 0;
  if (std::sscanf(shape.c_str(), "%dx%dx%d", &c, &h, &w) != 3) {
    fmt::print(stderr, "train_step: expected --shape CxHxW, got '{}'\n", shape);
    return 2;
  }
  chorus::set_cpu_threads(threads);
  chorus::Net net(c, h, 0);
  chorus::Sgd opt(net.parameters(), {.lr = 0.001f, .momentum = 0.9f});
  chorus::Generator gen(0);
  std::vector<chorus::Tensor> xs;
  std::vector<std::vector<int32_t>> ys;
  for (int i = 0; i < 8; ++i) {
    chorus::Tensor x = chorus::Tensor::empty(chorus::Shape{batch, c, h, w});
    for (int64_t j = 0; j < x.numel(); ++j) x.data()[j] = gen.normal();
    std::vector<int32_t> y(static_cast<size_t>(batch));
    for (auto& l : y) l = static_cast<int32_t>(gen.below(10));
    xs.push_back(x);
    ys.push_back(y);
  }
  double fwd = 0, bwd = 0, stp = 0;
  auto step = [&](int64_t k) {
    const auto t0 = std::chrono::steady_clock::now();
    opt.zero_grad();
    chorus::Tensor loss = chorus::cross_entropy(net.forward(xs[k % 8]), ys[k % 8]);
    const auto t1 = std::chrono::steady_clock::now();
    loss.backward();
    const auto t2 = std::chrono::steady_clock::now();
    opt.step();
    const auto t3 = std::chrono::steady_clock::now();
    fwd += std::chrono::duration<double>(t1 - t0).count();
    bwd += std::chrono::duration<double>(t2 - t1).count();
    stp += std::chrono::duration<double>(t3 - t2).count();
  };
  for (int i = 0; i < warmup; ++i) step(i);
  std::vector<double> wall_ips, cpu_ips;
  int64_t total_iters = 0;
  fwd = bwd = stp = 0;
  for (int r = 0; r < reps; ++r) {
    const auto w0 = std::chrono::steady_clock::now();
    const double c0 = thread_cpu_seconds();
    int64_t it = 0;
    while (std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count() < min_time)
      step(it++);
    const double wall =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count();
    const double cpu = thread_cpu_seconds() - c0;
    wall_ips.push_back(static_cast<double>(it * batch) / wall);
    cpu_ips.push_back(static_cast<double>(it * batch) / cpu);
    total_iters += it;
  }
  const Stat sw = stat(wall_ips), sc = stat(cpu_ips);
  const double n = static_cast<double>(total_iters);
  fmt::print(
      "train_step shape {} batch {} threads {}{} kernels {}: images/s median {:.0f} "
      "[{:.0f}-{:.0f}] (wall), {:.0f} [{:.0f}-{:.0f}] "
      "(thread cpu), ms/iter fwd {:.3f} bwd {:.3f} step {:.3f}\n",
      shape, batch, threads, keep_denormals ? " keep-denormals" : "",
      chorus::kernels::isa_name(chorus::kernels::active_isa()), sw.median, sw.lo, sw.hi, sc.median,
      sc.lo, sc.hi, 1e3 * fwd / n, 1e3 * bwd / n, 1e3 * stp / n);
  std::string wall_list, cpu_list;
  for (size_t i = 0; i < wall_ips.size(); ++i) {
    wall_list += fmt::format(" {:.0f}", wall_ips[i]);
    cpu_list += fmt::format(" {:.0f}", cpu_ips[i]);
  }
  fmt::print("reps wall:{} | cpu:{}\n", wall_list, cpu_list);
  return 0;
}
