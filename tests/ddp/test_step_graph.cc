// The training step as a CUDA graph (ddp/train/step_graph.h, train_cnn --cuda-graph), host side,
// on the emulated GPU (emulated_gpu.h), whose capture records each kernel with its arguments and
// runs nothing, and whose replay runs the recording, as CUDA's do: so a step that depends on
// anything but its static inputs and its own memory gives other bits than the eager one here.
// Checked: the trainer with cuda_graph ends with the eager trainer's losses and parameters bit for
// bit (the last, smaller batch of each epoch eager, between replays); a step that waits for the
// GPU inside the capture is refused naming what; the allocator's graph pool never hands out
// memory the graph writes; Labels on the device give cross_entropy's bits.
// With DDP (2 ranks, the communicator's device path emulated): one graph a step, the all-reduces
// captured inside it, on one host and on two; or, asked for, two graphs, the all-reduces launched
// between them; the eager DDP trainer's bits every way.
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "ddp/data/data_loader.h"
#include "ddp/data/dataset.h"
#include "ddp/dist/distributed.h"
#include "ddp/nn/modules.h"
#include "ddp/nn/optim.h"
#include "ddp/ops/ops.h"
#include "ddp/tensor/device_cache.h"
#include "ddp/train/step_graph.h"
#include "ddp/train/trainer.h"
#include "emulated_gpu.h"
#include "error_of.h"
#include "harness.h"

using namespace chorus;
using chorus::test::error_of;
using chorus::test::run_ranks;
using chorus::test::RunOptions;

namespace {

const Device kGpu = Device::cuda(0);

void emulate() {
  static const bool once = [] {
    test::use_emulated_gpu();
    return true;
  }();
  (void)once;
}

struct Run {
  std::vector<float> losses;
  std::vector<std::vector<float>> params;
  std::vector<double> test_acc;
  size_t backend_allocs_epoch2 = 0;  // new device blocks during the second epoch
};

// Two epochs of 200 samples at batch 32: six full batches and one of 8 in each. With `comm`:
// DDP over it (several buckets), each rank on data of its own.
Run train(bool cuda_graph, Communicator* comm = nullptr, bool split = false) {
  const uint64_t seed = 5 + static_cast<uint64_t>(comm ? comm->rank() : 0);
  auto data = make_synthetic(200, Shape{3, 32, 32}, 10, seed);
  auto test = make_synthetic(64, Shape{3, 32, 32}, 10, 5, 1);
  Net net(3, 32, 7);
  net.to(kGpu);
  std::unique_ptr<DistributedDataParallel> ddp;
  if (comm) {
    DdpOptions o;
    o.device = kGpu.str();
    o.reducer.first_bucket_bytes = 4096;
    o.reducer.bucket_cap_bytes = 65536;
    ddp = std::make_unique<DistributedDataParallel>(net, *comm, o);
  }
  Sgd opt(net.parameters(), {.lr = 0.02f, .momentum = 0.9f, .weight_decay = 5e-4f});
  LoaderOptions lo;
  lo.batch_size = 32;
  lo.seed = 3;
  DataLoader loader(data, lo);
  TrainOptions to;
  to.device = kGpu;
  to.epochs = 2;
  to.progress = false;
  to.record_step_losses = true;
  to.cuda_graph = cuda_graph;
  to.cuda_graph_split = split;
  to.comm = comm;
  to.ddp = ddp.get();
  std::FILE* devnull = std::fopen("/dev/null", "w");
  to.out = devnull;
  Trainer trainer(net, opt, loader, test.get(), to);
  Run r;
  size_t allocs_before = 0;
  int epoch = 0;
  trainer.run([&](const EpochStats& s) {
    r.losses.insert(r.losses.end(), s.step_losses.begin(), s.step_losses.end());
    r.test_acc.push_back(s.test_acc);
    if (++epoch == 1)
      allocs_before = device_cache_stats().backend_allocs;
    else
      r.backend_allocs_epoch2 = device_cache_stats().backend_allocs - allocs_before;
  });
  std::fclose(devnull);
  for (const Tensor& p : net.parameters()) r.params.push_back(p.to_vector());
  return r;
}

}  // namespace

TEST_CASE("the trainer's step as a CUDA graph ends with the eager trainer's bits", "[graph]") {
  emulate();
  const Run eager = train(false);
  test::EmulatedGpu& gpu = test::emulated_gpu();
  gpu.graph_launches = 0;
  const Run graphed = train(true);
  REQUIRE(eager.losses.size() == 14);
  CHECK(graphed.losses == eager.losses);  // every step, the smaller last batches eager
  CHECK(graphed.params == eager.params);
  CHECK(graphed.test_acc == eager.test_acc);
  // 12 full batches: 2 eager warm-up steps, then the capture and its launch, 9 replays after.
  CHECK(gpu.graph_launches == 10);
  CHECK(gpu.captured_kernels > 40);  // forward, loss, backward, 10 parameters' updates
  // Warm caches: the second epoch's replays and eager steps take no new device memory.
  CHECK(graphed.backend_allocs_epoch2 == 0);
}

TEST_CASE("a learning rate changed after the capture is refused, naming both values", "[graph]") {
  emulate();
  auto data = make_synthetic(256, Shape{3, 32, 32}, 10, 5);
  Net net(3, 32, 7);
  net.to(kGpu);
  Sgd opt(net.parameters(), {.lr = 0.02f});
  LoaderOptions lo;
  lo.batch_size = 32;
  DataLoader loader(data, lo);
  TrainOptions to;
  to.device = kGpu;
  to.progress = false;
  to.cuda_graph = true;
  to.out = std::fopen("/dev/null", "w");
  int64_t last = 0;
  to.after_step = [&](int64_t step) {
    last = step;
    if (step == 4) opt.set_lr(0.01f);  // warm-ups 1 and 2, the capture 3, a replay 4
  };
  Trainer trainer(net, opt, loader, nullptr, to);
  CHECK(error_of([&] { trainer.run(); }) ==
        "Trainer: the learning rate changed from 0.02 to 0.01 after the step was captured as a "
        "CUDA graph, whose update keeps the one it was captured with (train without cuda_graph "
        "to change it)");
  CHECK(last == 4);
  std::fclose(to.out);
}

TEST_CASE("a step that waits for the GPU inside the capture is refused naming what", "[graph]") {
  emulate();
  Tensor x = Tensor::full(Shape{4}, 2.0f, kGpu);
  {
    StepGraph g(kGpu, 0);
    CHECK_THAT(error_of([&] { g.run([&] { (void)relu(x).to_vector(); }); }),
               Catch::Contains("a copy inside a captured step"));
    CHECK_FALSE(g.captured());
  }
  {
    StepGraph g(kGpu, 0);
    Tensor logits = Tensor::full(Shape{2, 3}, 1.0f, kGpu);
    CHECK_THAT(error_of([&] { g.run([&] { (void)argmax(logits); }); }), Catch::Contains("argmax"));
  }
  {
    StepGraph g(kGpu, 0);
    Tensor logits = Tensor::full(Shape{2, 3}, 1.0f, kGpu);
    const std::vector<int32_t> host{0, 2};
    CHECK_THAT(error_of([&] { g.run([&] { (void)cross_entropy(logits, host); }); }),
               Catch::Contains("NLL labels from host memory"));
  }
  // After a refused capture, kernels run again at once; a good step captures and replays.
  CHECK(relu(x).to_vector() == std::vector<float>(4, 2.0f));
  Tensor y = Tensor::zeros(Shape{4}, kGpu), out;
  StepGraph g(kGpu, 1);
  int calls = 0;
  for (float v : {1.0f, 2.0f, 3.0f, 4.0f}) {
    x.copy_from(Tensor::full(Shape{4}, v));  // the static input, refilled before each run
    g.run([&] {
      ++calls;
      out = relu(add(y, x));
    });
    CHECK(out.to_vector() == std::vector<float>(4, v));
  }
  CHECK(calls == 2);  // the warm-up and the capture; then the graph alone
  CHECK(g.captured());
}

TEST_CASE("a graph's memory pool never hands out a block the graph uses", "[graph]") {
  emulate();
  device_cache_release();
  const int pool = device_pool_begin(kGpu);
  CHECK_THROWS_AS(device_pool_begin(kGpu), std::logic_error);  // one capture at a time
  void* a = device_cache_get(kGpu, 1000);
  void* b = device_cache_get(kGpu, 1000);
  device_cache_put(kGpu, a, 1000);
  void* c = device_cache_get(kGpu, 1000);
  CHECK(c == a);  // freed and taken again inside the capture: stream order makes it safe
  device_pool_end(pool);
  CHECK(device_pool_blocks(pool) == 2);
  device_cache_put(kGpu, b, 1000);  // after the capture: back to the pool, not the cache
  device_cache_put(kGpu, c, 1000);
  std::set<void*> outside;
  for (int i = 0; i < 4; ++i) outside.insert(device_cache_get(kGpu, 1000));
  CHECK(outside.count(a) == 0);
  CHECK(outside.count(b) == 0);
  for (void* p : outside) device_cache_put(kGpu, p, 1000);
  device_pool_release(pool);  // the graph is gone: its blocks serve anyone
  CHECK(device_pool_blocks(pool) == 0);
  std::set<void*> after;
  for (int i = 0; i < 6; ++i) after.insert(device_cache_get(kGpu, 1000));
  CHECK(after.count(a) == 1);
  CHECK(after.count(b) == 1);
  for (void* p : after) device_cache_put(kGpu, p, 1000);
  device_cache_release();
}

TEST_CASE("Labels on the device give cross_entropy's bits; bad labels are named", "[graph]") {
  emulate();
  std::vector<float> v(5 * 4);
  for (size_t i = 0; i < v.size(); ++i) v[i] = 0.1f * static_cast<float>(i % 7) - 0.3f;
  const std::vector<int32_t> host{3, 0, 1, 3, 2};
  for (Device d : {Device::cpu(), kGpu}) {
    Tensor a = Tensor::from(Shape{5, 4}, v).to(d), b = Tensor::from(Shape{5, 4}, v).to(d);
    a.set_requires_grad(true);
    b.set_requires_grad(true);
    Labels labels(5, d);
    labels.set(host, 4);
    Tensor la = cross_entropy(a, host), lb = cross_entropy(b, labels);
    CHECK(la.to_vector() == lb.to_vector());
    la.backward();
    lb.backward();
    CHECK(a.grad().to_vector() == b.grad().to_vector());
  }
  Labels labels(3, kGpu);
  CHECK(error_of([&] {
          labels.set(std::vector<int32_t>{0, 4, 1}, 4);
        }) == "nll_loss: expected labels in [0, 4), got 4 at 1");
  CHECK(error_of([&] {
          labels.set(std::vector<int32_t>{0, 1}, 4);
        }) == "nll_loss: expected 3 labels, got 2");
  labels.set(std::vector<int32_t>{0, 1, 2}, 3);
  CHECK(error_of([&] {
          cross_entropy(Tensor::zeros(Shape{3, 4}, kGpu), labels);
        }) == "nll_loss: the labels were checked against 3 classes, the input has 4");
  CHECK(error_of([&] {
          cross_entropy(Tensor::zeros(Shape{3, 3}), labels);
        }) == "nll_loss: input is on cpu but labels are on cuda:0");
}

TEST_CASE(
    "cuda_graph is refused on the cpu, with a parameter elsewhere and with elastic training, "
    "naming why",
    "[graph]") {
  emulate();
  auto data = make_synthetic(8, Shape{3, 32, 32}, 10, 5);
  Net net(3, 32, 7);
  Sgd opt(net.parameters(), {.lr = 0.01f});
  DataLoader loader(data, LoaderOptions{});
  TrainOptions to;
  to.cuda_graph = true;
  CHECK(error_of([&] { Trainer(net, opt, loader, nullptr, to); }) ==
        "Trainer: cuda_graph needs a cuda device, got cpu");
  to.device = kGpu;
  // The net is still on the cpu: its kernels would run at the capture only.
  CHECK(error_of([&] { Trainer(net, opt, loader, nullptr, to); }) ==
        "Trainer: cuda_graph captures the step on cuda:0, but parameter conv1.weight is on cpu (a "
        "graph replays one device's kernels: train a model split across devices without it)");
  net.to(kGpu);
  to.leave = [](int64_t) { return std::optional<TrainOptions::Recovered>(); };
  CHECK_THAT(error_of([&] { Trainer(net, opt, loader, nullptr, to); }),
             Catch::StartsWith("Trainer: cuda_graph with elastic training"));
}

// DDP with the step as CUDA graphs, 2 ranks on the emulated GPU, the communicator's device path
// emulated (as in ddp_device_ddp); on a GPU where CHORUS_TEST_TRAIN_DEVICE=cuda:0
// (tests/gpu/run.sh), the two ranks sharing it. The whole step is one graph: the hooks fork the
// buckets' all-reduces into the capture (the communicator's calls recorded, not run: over CUDA
// IPC on one host, staged with a host node on two) and finish() joins them, and every replay
// runs them. With TrainOptions.cuda_graph_split forward and backward are captured (the gradient
// hooks' divisions with them), the all-reduces launched by the host between that graph and the
// update's.
TEST_CASE(
    "DDP with cuda_graph: the all-reduces inside the step's graph on one host and on two, or "
    "between two graphs when split; the eager bits",
    "[graph][ddp]") {
  const char* named = std::getenv("CHORUS_TEST_TRAIN_DEVICE");
  const bool real = named && *named;
  if (real && std::string(named) != kGpu.str())
    FAIL("CHORUS_TEST_TRAIN_DEVICE=" << named << ": this case runs on " << kGpu.str() << " only");
  struct Config {
    bool two_hosts, split;  // split: TrainOptions.cuda_graph_split, two graphs on one host too
  };
  for (const Config c :
       {Config{false, false}, Config{true, false}, Config{false, true}, Config{true, true}}) {
    const bool two_hosts = c.two_hosts, split = c.split;
    INFO((two_hosts ? "two hosts" : "one host") << (split ? ", split" : ""));
    RunOptions o;
    o.env = {{"CHORUS_TIMEOUT", "30"}, {"CHORUS_ALLOW_SHARED_GPU", "1"}};
    if (!real) o.env["CHORUS_TEST_GPU_UUID"] = "GPU-emulated-0";
    o.limit_seconds = 200;
    auto res = run_ranks(
        2,
        [real, two_hosts, split](int rank) {
          if (!real) test::use_emulated_gpu();
          if (two_hosts) setenv("CHORUS_HOSTID", rank == 0 ? "host-a" : "host-b", 1);
          auto comm = Communicator::from_env();
          auto fail = [rank](const std::string& what) {
            std::fprintf(stderr, "rank %d: %s\n", rank, what.c_str());
            return 1;
          };
          if (comm.capturable() == two_hosts)
            return fail("Communicator::capturable() says " + std::to_string(comm.capturable()));
          const Run eager = train(false, &comm);
          test::EmulatedGpu& gpu = test::emulated_gpu();
          gpu.graph_launches = 0;
          gpu.trace.clear();
          const Run graphed = train(true, &comm, split);
          if (eager.losses.size() != 14) return fail("expected 14 steps");
          if (graphed.losses != eager.losses) return fail("the losses differ from the eager run's");
          if (graphed.params != eager.params) return fail("the parameters differ");
          if (graphed.test_acc != eager.test_acc) return fail("the test accuracy differs");
          if (!real) {
            // 12 full batches: 2 eager warm-ups, the capture, 9 replays; a graph each, or two.
            const bool two = split;
            const int want = two ? 20 : 10;
            if (gpu.graph_launches != want)
              return fail("graph launches: " + std::to_string(gpu.graph_launches) + ", expected " +
                          std::to_string(want));
            // One graph: the capture forked the buckets' all-reduces into it and joined them
            // (events recorded and waited for inside it); split: no event inside.
            int captured = 0;
            for (const std::string& line : gpu.trace)
              captured += line.find("(captured)") != std::string::npos;
            if ((captured > 0) == two)
              return fail(std::to_string(captured) +
                          " events recorded or waited for in the capture");
          }
          // Every rank ends with the same parameters (the all-reduces ran at every replay).
          std::vector<float> flat, other;
          for (const auto& p : graphed.params) flat.insert(flat.end(), p.begin(), p.end());
          other = flat;
          comm.broadcast(other.data(), other.size(), chorusFloat32, 0);
          if (other != flat) return fail("the ranks' parameters differ");
          // A replay's sync before any captured backward went through is refused.
          Net net(3, 32, 7);
          net.to(kGpu);
          DdpOptions d;
          d.device = kGpu.str();
          DistributedDataParallel ddp(net, comm, d);
          if (!ddp.reducer().capturable(kGpu)) return fail("Reducer::capturable");
          const std::string why = error_of([&] { ddp.reducer().sync_deferred(true); });
          if (why.find("before any deferred backward finished") == std::string::npos)
            return fail("sync_deferred(replayed) first: " + why);
          return 0;
        },
        o);
    for (size_t r = 0; r < res.size(); ++r) {
      INFO("rank " << r << ":\n" << res[r].output);
      CHECK(res[r].exit_code == 0);
    }
  }
}
