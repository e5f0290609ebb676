// DDP across real processes: bucket layout, overlap of the bucket all-reduces with backward, and
// the forum's mistakes ending in clear errors. (Equivalence with one process: test_equivalence.)
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "chorus/chorus.hpp"
#include "ddp/data/data_loader.h"
#include "ddp/data/dataset.h"
#include "ddp/data/sampler.h"
#include "ddp/dist/dist_utils.h"
#include "ddp/dist/distributed.h"
#include "ddp/nn/modules.h"
#include "ddp/nn/optim.h"
#include "ddp/ops/ops.h"
#include "ddp/train/checkpoint.h"
#include "harness.h"

using namespace chorus;
using chorus::test::contains;
using chorus::test::run_ranks;
using chorus::test::RunOptions;

namespace {

void check_all(const std::vector<chorus::test::RankResult>& res) {
  for (size_t r = 0; r < res.size(); ++r) {
    INFO("rank " << r << " output:\n" << res[r].output);
    CHECK(res[r].exit_code == 0);
  }
  if (!res.empty()) UNSCOPED_INFO(res[0].output);
}

}  // namespace

TEST_CASE("buckets follow reverse parameter order and the size caps", "[ddp][buckets]") {
  check_all(run_ranks(2, [](int) {
    auto comm = Communicator::from_env();
    Net net(1, 28, 0);  // fc1 weight 120x256 = 122880 B
    DdpOptions o;
    o.reducer.first_bucket_bytes = 1000;
    o.reducer.bucket_cap_bytes = 100000;
    DistributedDataParallel ddp(net, comm, o);
    const auto& b = ddp.reducer().buckets();
    // Bucket 0 closes once it holds >= 1000 B: fc3.bias (40 B), fc3.weight (3360 B).
    if (b.size() < 3 || b[0].params != std::vector<std::string>{"fc3.bias", "fc3.weight"}) return 2;
    // Every parameter's grad is a view into its bucket.
    for (auto& [name, t] : net.named_parameters())
      if (!t.grad().defined() || t.grad().numel() != t.numel()) return 3;
    return b.back().params.back() == "conv1.weight" ? 0 : 4;
  }));
}

TEST_CASE("a bucket's all-reduce starts (and finishes) before backward ends", "[ddp][overlap]") {
  check_all(run_ranks(2, [](int rank) {
    auto comm = Communicator::from_env();
    Net net(1, 28, 0);
    DdpOptions o;
    o.reducer.first_bucket_bytes = 4096;
    o.reducer.bucket_cap_bytes = 4096;
    DistributedDataParallel ddp(net, comm, o);
    const int nb = static_cast<int>(ddp.reducer().buckets().size());
    // conv1's gradients are the last to be ready: the hook runs inside backward, after DDP's.
    int launched_at_conv1 = -1;
    bool first_done_in_backward = false;
    net.conv1->weight.register_grad_ready_hook([&](Tensor&) {
      launched_at_conv1 = ddp.reducer().buckets_launched();
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (!(first_done_in_backward = ddp.reducer().bucket_done(0)) &&
             std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::microseconds(50));
    });
    auto ds = make_synthetic(8, Shape{1, 28, 28}, 10, rank);
    Tensor x = Tensor::empty(Shape{8, 1, 28, 28});
    std::vector<int32_t> y(8);
    for (int i = 0; i < 8; ++i) y[static_cast<size_t>(i)] = ds->get(i, x.data() + i * 784);
    cross_entropy(ddp.forward(x), y).backward();
    ddp.finish_gradient_sync();
    std::printf(
        "rank %d: %d buckets, %d launched when conv1.weight became ready, bucket 0 done inside "
        "backward: %d\n",
        rank, nb, launched_at_conv1, int(first_done_in_backward));
    // Every bucket but the last was launched before conv1.weight's gradient was ready; the last
    // one still waits for conv1.bias, which backward produces right after it.
    return nb > 3 && launched_at_conv1 == nb - 1 && first_done_in_backward ? 0 : 2;
  }));
}

TEST_CASE("a parameter without gradient is named, not a hang", "[ddp][errors]") {
  struct TwoHeads : Module {
    std::shared_ptr<Linear> used, unused;
    explicit TwoHeads(Generator& g) {
      used = register_module("used", std::make_shared<Linear>(4, 2, g));
      unused = register_module("unused", std::make_shared<Linear>(4, 2, g));
    }
    Tensor forward(const Tensor& x) override { return used->forward(x); }
  };
  auto res = run_ranks(2, [](int) {
    auto comm = Communicator::from_env();
    Generator g(0);
    TwoHeads m(g);
    DistributedDataParallel ddp(m, comm);
    cross_entropy(ddp.forward(Tensor::full(Shape{2, 4}, 1.0f)), std::vector<int32_t>{0, 1})
        .backward();
    try {
      ddp.finish_gradient_sync();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s\n", e.what());
      return 0;
    }
    return 2;
  });
  for (auto& r : res) {
    INFO(r.output);
    CHECK(r.exit_code == 0);
    CHECK(contains(r.output, "2 parameter(s) received no gradient"));
    CHECK(contains(r.output, "unused.bias, unused.weight"));
  }
}

TEST_CASE("different models across ranks: the parameter and both shapes are named",
          "[ddp][errors]") {
  auto res = run_ranks(2, [](int rank) {
    auto comm = Communicator::from_env();
    Net net(1, rank == 0 ? 28 : 32, 0);  // fc1 256 -> 120 vs 400 -> 120
    DistributedDataParallel ddp(net, comm);
    return 0;
  });
  for (auto& r : res) {
    INFO(r.output);
    CHECK(r.exit_code != 0);
    CHECK(contains(r.output, "rank 0 has fc1.weight (120, 256), rank 1 has fc1.weight (120, 400)"));
  }
}

TEST_CASE("two ranks given the same device fail on every rank, naming both and the fix",
          "[ddp][errors]") {
  auto res = run_ranks(2, [](int) {
    auto comm = Communicator::from_env();
    Net net(1, 28, 0);
    DdpOptions o;
    o.device = "cuda:0";
    DistributedDataParallel ddp(net, comm, o);
    return 0;
  });
  for (auto& r : res) {
    INFO(r.output);
    CHECK(r.exit_code != 0);
    CHECK(contains(r.output, "ranks 0 and 1 on host"));
    CHECK(contains(r.output, "both given device cuda:0"));
    CHECK(contains(r.output, "LOCAL_RANK"));
  }
}

TEST_CASE("the forum's barrier inside `if rank == 0` ends in a clear error within seconds",
          "[ddp][errors]") {
  RunOptions opt;
  opt.env["CHORUS_TIMEOUT"] = "5";
  opt.limit_seconds = 30;
  const std::string dir = "/tmp/chorus-forum-barrier-" + std::to_string(::getpid());
  auto res = run_ranks(
      2,
      [&dir](int rank) {
        auto comm = Communicator::from_env();
        Net net(1, 28, 0);
        DistributedDataParallel ddp(net, comm);
        Sgd opt(net.parameters(), {.lr = 0.01f});
        // The thread's mistake: rank 0 saves and waits at a barrier that only it reaches; rank 1
        // goes on training, so its next collective is the gradient all-reduce.
        if (rank == 0) {
          write_snapshot(dir, net, opt, {});
          comm.barrier();
        }
        Tensor x = Tensor::full(Shape{2, 1, 28, 28}, 0.1f);
        cross_entropy(ddp.forward(x), std::vector<int32_t>{1, 2}).backward();
        ddp.finish_gradient_sync();
        return 0;
      },
      opt);
  std::filesystem::remove_all(dir);
  for (size_t r = 0; r < res.size(); ++r) {
    INFO("rank " << r << ": " << res[r].output);
    CHECK(res[r].exit_code != 0);
    CHECK(res[r].seconds < 15);
    CHECK(contains(res[r].output, "barrier"));
    CHECK(contains(res[r].output, "all_reduce"));
  }
}

TEST_CASE("metric helpers: reduce_mean, print_primary, rank_zero_first", "[ddp][metrics]") {
  auto res = run_ranks(3, [](int rank) {
    auto comm = Communicator::from_env();
    const double m = reduce_mean(comm, rank + 1.0);  // (1 + 2 + 3) / 3
    print_primary(&comm, "mean {}\n", m);
    const std::string flag = "/tmp/chorus-r0first-" + std::to_string(::getppid());
    bool saw = false;
    rank_zero_first(comm, [&] {
      if (comm.rank() == 0) {
        std::ofstream(flag) << "ready";
      } else {
        saw = std::ifstream(flag).good();
      }
    });
    comm.barrier();
    if (rank == 0) std::remove(flag.c_str());
    return m == 2.0 && (rank == 0 || saw) ? 0 : 2;
  });
  check_all(res);
  CHECK(contains(res[0].output, "mean 2"));
  CHECK(!contains(res[1].output, "mean"));
}

TEST_CASE("the launcher's local rank is read strictly: a bad value names the variable",
          "[ddp][env]") {
  const char* names[] = {"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"};
  for (const char* n : names) unsetenv(n);
  CHECK(chorus::env_local_rank() == 0);
  setenv("SLURM_LOCALID", "3", 1);
  CHECK(chorus::env_local_rank() == 3);
  setenv("LOCAL_RANK", "1", 1);  // torchrun's variable comes first
  CHECK(chorus::env_local_rank() == 1);
  for (const char* bad : {"abc", "1x", "-1", " 2", "99999999999"}) {
    setenv("LOCAL_RANK", bad, 1);
    try {
      (void)chorus::env_local_rank();
      FAIL("LOCAL_RANK='" << bad << "' was accepted");
    } catch (const std::invalid_argument& e) {
      CHECK(std::string(e.what()) == std::string("ddp: env LOCAL_RANK='") + bad +
                                         "' is not a local rank (expected an integer >= 0)");
    }
  }
  for (const char* n : names) unsetenv(n);
}
