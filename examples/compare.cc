// ddp_compare (compare.cc): the forum thread's four modes, with chorus (seeds/000, "Mode" script):
//   ddp          W ranks, batch B/W each, DistributedSampler (1/W of the data each), E*int(0.66*W)
//   epochs ddp_single   1 process, batch B, the data once, the same number of epochs as ddp      (=
//   ddp) dmack        W ranks, batch B each, every rank the whole data set (no sampler), E epochs
//   dmack_single 1 process, batch B*W, the data set repeated W times, E epochs           (= dmack)
// Each mode prints its global loss per interval and its time; `--mode all` runs the four in turn
// (the distributed ones through chorus-run) and prints a table.
//
//   build/examples/ddp_compare --mode all -n 2 --subset 12000
//   chorus-run -n 2 build/examples/ddp_compare --mode ddp
#include <unistd.h>
#include <chorus/chorus.hpp>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "ddp/data/data_loader.h"
#include "ddp/data/dataset.h"
#include "ddp/data/sampler.h"
#include "ddp/dist/dist_utils.h"
#include "ddp/dist/distributed.h"
#include "ddp/nn/modules.h"
#include "ddp/nn/optim.h"
#include "ddp/tensor/random.h"
#include "ddp/train/trainer.h"

namespace {

// The first n samples of base, repeated `times` times (ConcatDataset of copies).
class RepeatDataset : public chorus::Dataset {
 public:
  RepeatDataset(std::shared_ptr<const chorus::Dataset> base, int64_t n, int times)
      : base_(std::move(base)), n_(n), times_(times) {}
  int64_t size() const override { return n_ * times_; }
  chorus::Shape sample_shape() const override { return base_->sample_shape(); }
  int num_classes() const override { return base_->num_classes(); }
  int32_t get(int64_t i, float* out) const override { return base_->get(i % n_, out); }

 private:
  std::shared_ptr<const chorus::Dataset> base_;
  int64_t n_;
  int times_;
};

struct Args {
  std::string mode = "all", data = "fashion-mnist";
  int world = 2, epochs = 2;
  int64_t batch = 64, subset = 0;
  float lr = 0.001f;
  uint64_t seed = 0;
};

int run_all(const Args& a, const std::string& self) {
  const std::string launcher =
      (std::filesystem::path(self).parent_path().parent_path() / "tools" / "chorus-run").string();
  const std::string common =
      fmt::format(" --world-size {} --epochs {} --batch {} --subset {} --lr {} --seed {} --data {}",
                  a.world, a.epochs, a.batch, a.subset, a.lr, a.seed, a.data);
  std::vector<std::string> rows;
  for (const char* mode : {"ddp", "ddp_single", "dmack", "dmack_single"}) {
    const bool dist = std::string(mode) == "ddp" || std::string(mode) == "dmack";
    const std::string cmd =
        (dist ? fmt::format("{} -n {} --no-prefix ", launcher, a.world) : std::string()) + self +
        " --mode " + mode + common;
    fmt::print("== {} ==\n$ {}\n", mode, cmd);
    std::fflush(stdout);
    FILE* p = ::popen(cmd.c_str(), "r");
    if (!p) return 1;
    char line[4096];
    while (std::fgets(line, sizeof line, p)) {
      std::fputs(line, stdout);
      if (std::string(line).rfind("result: ", 0) == 0) rows.push_back(std::string(line + 8));
    }
    std::fflush(stdout);
    if (::pclose(p) != 0) {
      fmt::print(stderr, "compare: mode {} failed\n", mode);
      return 1;
    }
  }
  fmt::print("\n{:<13} {:>5} {:>10} {:>7} {:>8} {:>11} {:>9} {:>8}\n", "mode", "procs",
             "batch/proc", "epochs", "samples", "final loss", "test acc", "time s");
  for (auto& r : rows) std::fputs(r.c_str(), stdout);
  return 0;
}

int run_mode(const Args& a) {
  const bool dist = a.mode == "ddp" || a.mode == "dmack";
  if (!dist && a.mode != "ddp_single" && a.mode != "dmack_single")
    throw std::invalid_argument(fmt::format(
        "--mode: expected ddp, ddp_single, dmack, dmack_single or all, got '{}'", a.mode));
  std::optional<chorus::Communicator> comm;
  if (dist) comm.emplace(chorus::Communicator::from_env());
  const int rank = comm ? comm->rank() : 0, w = a.world;
  if (comm && comm->size() != w)
    throw std::invalid_argument(
        fmt::format("compare: --world-size {} but launched with {} ranks", w, comm->size()));
  std::shared_ptr<chorus::Dataset> train, test;
  if (a.data == "synthetic") {
    train = chorus::make_synthetic(a.subset > 0 ? a.subset : 6000, chorus::Shape{1, 28, 28}, 10,
                                   a.seed);
    test = chorus::make_synthetic(1000, chorus::Shape{1, 28, 28}, 10, a.seed, 1);
  } else {
    train = chorus::load_mnist_dir(chorus::kFashionMnistDir, true);
    test = chorus::load_mnist_dir(chorus::kFashionMnistDir, false);
  }
  const int64_t n = a.subset > 0 ? std::min(a.subset, train->size()) : train->size();
  int64_t batch = a.batch;
  int epochs = a.epochs;
  std::shared_ptr<chorus::Dataset> data = std::make_shared<RepeatDataset>(train, n, 1);
  if (a.mode == "ddp") batch = a.batch / w;
  if (a.mode == "ddp" || a.mode == "ddp_single")
    epochs = a.epochs * std::max(1, static_cast<int>(w * 0.66));
  if (a.mode == "dmack_single") {
    batch = a.batch * w;
    data = std::make_shared<RepeatDataset>(train, n, w);
  }
  chorus::Net model(1, 28, a.seed);
  std::unique_ptr<chorus::DistributedDataParallel> ddp;
  if (comm) ddp = std::make_unique<chorus::DistributedDataParallel>(model, *comm);
  chorus::Sgd opt(model.parameters(), {.lr = a.lr, .momentum = 0.9f});
  chorus::DistributedSampler sampler(data->size(), a.mode == "ddp" ? w : 1,
                                     a.mode == "ddp" ? rank : 0, true, a.seed);
  chorus::LoaderOptions lo;
  lo.batch_size = batch;
  chorus::OrderFn order = [&](int64_t epoch) {
    if (a.mode == "dmack")  // every rank shuffles the whole data set its own way (no sampler)
      return chorus::Generator(a.seed + 7919 * static_cast<uint64_t>(rank) +
                               static_cast<uint64_t>(epoch))
          .permutation(data->size());
    sampler.set_epoch(epoch);
    return sampler.indices();
  };
  chorus::DataLoader loader(data, lo, order);
  loader.begin_epoch(0);
  chorus::TrainOptions to;
  to.epochs = epochs;
  to.progress = false;
  to.comm = comm ? &*comm : nullptr;
  to.ddp = ddp.get();
  to.log_every =
      std::max<int64_t>(1, loader.batches_per_epoch() / 3);  // 3-4 lines per epoch, as the thread
  chorus::print_primary(
      to.comm, "mode {}: {} process(es), batch {} each, {} epochs over {} samples per process\n",
      a.mode, dist ? w : 1, batch, epochs, loader.samples_per_epoch());
  chorus::Trainer trainer(model, opt, loader, test.get(), to);
  const auto t0 = std::chrono::steady_clock::now();
  auto stats = trainer.run();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  chorus::print_primary(to.comm, "mode {}: finished training, elapsed time {:.3f} s\n", a.mode,
                        secs);
  chorus::print_primary(to.comm,
                        "result: {:<13} {:>5} {:>10} {:>7} {:>8} {:>11.4f} {:>9.4f} {:>8.2f}\n",
                        a.mode, dist ? w : 1, batch, epochs, loader.samples_per_epoch(),
                        stats.back().train_loss, stats.back().test_acc, secs);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"the forum's four modes (ddp, ddp_single, dmack, dmack_single) with chorus"};
  Args a;
  app.add_option("--mode", a.mode, "ddp | ddp_single | dmack | dmack_single | all")
      ->capture_default_str();
  app.add_option("-n,--world-size", a.world, "W: ranks of the distributed modes")
      ->capture_default_str();
  app.add_option("--epochs", a.epochs, "E")->capture_default_str();
  app.add_option("--batch", a.batch, "B")->capture_default_str();
  app.add_option("--subset", a.subset, "use the first N training samples (0: all)")
      ->capture_default_str();
  app.add_option("--lr", a.lr)->capture_default_str();
  app.add_option("--seed", a.seed)->capture_default_str();
  app.add_option("--data", a.data, "fashion-mnist | synthetic")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    if (a.mode == "all") return run_all(a, std::filesystem::canonical("/proc/self/exe").string());
    return run_mode(a);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "compare: error: %s\n", e.what());
    return 1;
  }
}
