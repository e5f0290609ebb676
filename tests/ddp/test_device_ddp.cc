// GPU training's host side end to end on an emulated GPU: "cuda:0" memory is shared host memory
// (tests/collectives/fake_gpu.h: the communicator's device path runs over it, CUDA IPC and stream
// order emulated), the tensors' device backend allocates it, and the CUDA kernel table is the
// CPU's (the memory is readable). So the ops' dispatch by device, autograd's accumulation, SGD,
// the DDP reducer's buckets on the device (all-reduced by the device path), the parameter
// broadcast, and the model split across the cpu and the device (a bucket each) all run here --
// and must give the same parameters as the same training on the cpu. The kernels themselves are
// the GPU's only where one is lent (ddp_cuda_ops).
#include <catch2/catch.hpp>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "../collectives/fake_gpu.h"
#include "chorus/chorus.hpp"
#include "ddp/dist/distributed.h"
#include "ddp/nn/modules.h"
#include "ddp/nn/optim.h"
#include "ddp/ops/kernel_table.h"
#include "ddp/ops/ops.h"
#include "ddp/tensor/device_cache.h"
#include "emulated_gpu.h"
#include "harness.h"

using namespace chorus;
using chorus::test::run_ranks;
using chorus::test::RunOptions;

namespace {

using chorus::test::emulated_gpu;
using chorus::test::EmulatedGpu;
using chorus::test::use_emulated_gpu;

RunOptions opts() {
  RunOptions o;
  o.env = {{"CHORUS_TIMEOUT", "30"},
           {"CHORUS_TEST_GPU_UUID", "GPU-emulated-0"},
           {"CHORUS_ALLOW_SHARED_GPU", "1"}};
  o.limit_seconds = 120;
  return o;
}

// The split model of examples/ddp_model_parallel: net1 on d0, net2 on d1.
struct SplitModel : Module {
  std::shared_ptr<Linear> net1, net2;
  Device d0, d1;
  SplitModel(Generator& g, Device a, Device b) : d0(a), d1(b) {
    net1 = register_module("net1", std::make_shared<Linear>(12, 16, g));
    net2 = register_module("net2", std::make_shared<Linear>(16, 5, g));
    net1->to(d0);
    net2->to(d1);
  }
  Tensor forward(const Tensor& x) override {
    return net2->forward(to_device(relu(net1->forward(to_device(x, d0))), d1));
  }
};

// Trains `steps` DDP steps of `model` on this rank's batches; returns every parameter's values.
std::vector<float> train(Module& model, Communicator& comm, const std::string& device, int steps,
                         const Shape& batch, size_t* buckets) {
  DdpOptions o;
  o.device = device;
  o.reducer.first_bucket_bytes = 1024;  // several buckets
  o.reducer.bucket_cap_bytes = 4096;
  DistributedDataParallel ddp(model, comm, o);
  if (buckets) *buckets = ddp.reducer().buckets().size();
  Sgd opt(model.parameters(), {.lr = 0.05f, .momentum = 0.9f, .weight_decay = 1e-3f});
  Generator data(100 + static_cast<uint64_t>(comm.rank()));
  for (int step = 0; step < steps; ++step) {
    Tensor x = Tensor::empty(batch);
    for (int64_t i = 0; i < x.numel(); ++i) x.data()[i] = data.normal();
    std::vector<int32_t> labels(8);
    for (auto& l : labels) l = static_cast<int32_t>(data.below(5));
    opt.zero_grad();
    Tensor loss = cross_entropy(ddp.forward(x), labels);
    loss.backward();
    ddp.finish_gradient_sync();
    opt.step();
  }
  std::vector<float> all;
  for (const Tensor& t : model.parameters()) {
    const auto v = t.to_vector();
    all.insert(all.end(), v.begin(), v.end());
  }
  return all;
}

int fail_with(int rank, const std::string& what) {
  std::fprintf(stderr, "rank %d: %s\n", rank, what.c_str());
  return 1;
}

}  // namespace

TEST_CASE("DDP on an emulated cuda:0: the same parameters as on the cpu", "[device][ddp]") {
  // Two hosts: the device all-reduces take the staged path (the host collective on the progress
  // thread, collectives/device_stage.h), which returns before they are done.
  const bool two_hosts = GENERATE(false, true);
  INFO((two_hosts ? "two hosts" : "one host"));
  RunOptions o = opts();
  if (two_hosts) o.env["CHORUS_DEBUG"] = "INFO";
  auto res = run_ranks(
      2,
      [two_hosts](int rank) {
        if (two_hosts) setenv("CHORUS_HOSTID", rank == 0 ? "host-a" : "host-b", 1);
        use_emulated_gpu();
        auto comm = Communicator::from_env();
        Net on_cpu(1, 16, 3), on_gpu(1, 16, 3);
        on_gpu.to(Device::cuda(0));
        if (on_gpu.parameters().front().device() != Device::cuda(0))
          return fail_with(rank, "the model did not move");
        size_t buckets = 0;
        const auto a = train(on_cpu, comm, "cpu", 4, Shape{8, 1, 16, 16}, nullptr);
        const auto b = train(on_gpu, comm, "cuda:0", 4, Shape{8, 1, 16, 16}, &buckets);
        if (buckets < 2) return fail_with(rank, "expected several buckets");
        if (a != b) {
          size_t i = 0;
          while (i < a.size() && a[i] == b[i]) ++i;
          return fail_with(rank, "parameter " + std::to_string(i) + " differs: cpu " +
                                     std::to_string(a[i]) + ", cuda:0 " + std::to_string(b[i]));
        }
        return 0;
      },
      o);
  for (size_t r = 0; r < res.size(); ++r) {
    INFO("rank " << r << ":\n" << res[r].output);
    CHECK(res[r].exit_code == 0);
    if (two_hosts) CHECK(chorus::test::contains(res[r].output, "staged through host memory"));
  }
}

TEST_CASE(
    "DDP on an emulated cuda:0: each bucket all-reduced on a communication stream after an "
    "event behind its gradients; the default stream waits for them in finish",
    "[device][ddp]") {
  auto res = run_ranks(
      2,
      [](int rank) {
        use_emulated_gpu();
        auto comm = Communicator::from_env();
        Net net(1, 16, 3);
        net.to(Device::cuda(0));
        EmulatedGpu& gpu = emulated_gpu();
        gpu.trace.clear();
        size_t buckets = 0;
        constexpr int kSteps = 2;
        train(net, comm, "cuda:0", kSteps, Shape{8, 1, 16, 16}, &buckets);
        if (buckets < 2) return fail_with(rank, "expected several buckets");
        // The stream the last device operation went on (the last bucket's all-reduce).
        if (chorus::test::fake_last_stream() != EmulatedGpu::kCommStream)
          return fail_with(rank, "the all-reduces did not run on the communication stream");
        // One stream; per step: every bucket (events e1..eB, reused each step) recorded on the
        // default stream and waited for by the communication stream, in bucket order; then the
        // default stream waits for the end of the communication stream's work (e(B+1)).
        std::vector<std::string> want{"new comm"};
        for (int step = 0; step < kSteps; ++step) {
          for (size_t b = 1; b <= buckets; ++b) {
            want.push_back("record e" + std::to_string(b) + " on default");
            want.push_back("wait comm for e" + std::to_string(b));
          }
          want.push_back("record e" + std::to_string(buckets + 1) + " on comm");
          want.push_back("wait default for e" + std::to_string(buckets + 1));
        }
        if (gpu.trace != want) {
          std::string got;
          for (const auto& t : gpu.trace) got += "\n  " + t;
          return fail_with(rank, "streams and events asked for:" + got);
        }
        return 0;
      },
      opts());
  for (size_t r = 0; r < res.size(); ++r) {
    INFO("rank " << r << ":\n" << res[r].output);
    CHECK(res[r].exit_code == 0);
  }
}

TEST_CASE("a model split across the cpu and an emulated cuda:0 in DDP: a bucket per device",
          "[device][ddp]") {
  auto res = run_ranks(
      2,
      [](int rank) {
        use_emulated_gpu();
        auto comm = Communicator::from_env();
        Generator g1(9 + static_cast<uint64_t>(rank)), g2(9 + static_cast<uint64_t>(rank));
        SplitModel both_cpu(g1, Device::cpu(), Device::cpu());
        SplitModel split(g2, Device::cpu(), Device::cuda(0));
        size_t buckets_cpu = 0, buckets_split = 0;
        const auto a = train(both_cpu, comm, "", 5, Shape{8, 12}, &buckets_cpu);
        const auto b = train(split, comm, "", 5, Shape{8, 12}, &buckets_split);
        if (split.net2->parameters().front().device() != Device::cuda(0))
          return fail_with(rank, "net2 is not on cuda:0");
        if (buckets_split != buckets_cpu + 1 && buckets_split <= buckets_cpu)
          return fail_with(rank, "expected a bucket boundary at the device change: " +
                                     std::to_string(buckets_cpu) + " buckets on the cpu, " +
                                     std::to_string(buckets_split) + " split");
        if (a != b) return fail_with(rank, "the split model trained differently");
        // Given one device, DDP refuses a module that is not all there, naming both.
        try {
          DdpOptions o;
          o.device = "cpu";
          DistributedDataParallel refused(split, comm, o);
          return fail_with(rank, "a split module was taken with device cpu");
        } catch (const std::exception& e) {
          if (std::string(e.what()).find("is on cuda:0") == std::string::npos)
            return fail_with(rank, std::string("unexpected refusal: ") + e.what());
        }
        return 0;
      },
      opts());
  for (size_t r = 0; r < res.size(); ++r) {
    INFO("rank " << r << ":\n" << res[r].output);
    CHECK(res[r].exit_code == 0);
  }
}
