// train_cnn: trains the PyTorch CIFAR-10 tutorial CNN in one process (Fashion-MNIST by default).
//
//   train_cnn --data fashion-mnist --epochs 3 --batch-size 64 --lr 0.01 --momentum 0.9 --seed 0
//   train_cnn --data cifar10:/path/to/cifar-10-batches-bin
//   train_cnn --data synthetic --synthetic-size 2000 --synthetic-shape 3x32x32
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <string>

#include <fmt/format.h>

#include "ddp/backend.h"
#include "ddp/data_loader.h"
#include "ddp/dataset.h"
#include "ddp/nn.h"
#include "ddp/optim.h"
#include "ddp/trainer.h"

namespace {

struct Data {
  std::shared_ptr<chorus::Dataset> train, test;
  std::string name;
};

chorus::Shape parse_shape(const std::string& s) {
  int c = 0, h = 0, w = 0;
  if (std::sscanf(s.c_str(), "%dx%dx%d", &c, &h, &w) != 3 || c < 1 || h < 1 || w < 1)
    throw std::invalid_argument(fmt::format("--synthetic-shape: expected CxHxW like 3x32x32, got '{}'", s));
  return chorus::Shape{c, h, w};
}

Data load_data(const std::string& spec, int64_t synthetic_size, const std::string& synthetic_shape, uint64_t seed) {
  const auto colon = spec.find(':');
  const std::string kind = spec.substr(0, colon);
  const std::string dir = colon == std::string::npos ? "" : spec.substr(colon + 1);
  if (kind == "fashion-mnist" || kind == "mnist") {
    const std::string d = dir.empty() ? chorus::kFashionMnistDir : dir;
    return {chorus::load_mnist_dir(d, true), chorus::load_mnist_dir(d, false), kind + " (" + d + ")"};
  }
  if (kind == "cifar10") {
    if (dir.empty()) throw std::invalid_argument("--data: expected cifar10:DIR, got cifar10 without a directory");
    return {chorus::load_cifar10_dir(dir, true), chorus::load_cifar10_dir(dir, false), "cifar10 (" + dir + ")"};
  }
  if (kind == "synthetic") {
    const chorus::Shape shape = parse_shape(synthetic_shape);
    const int64_t test_size = std::max<int64_t>(1, synthetic_size / 5);
    return {chorus::make_synthetic(synthetic_size, shape, 10, seed), chorus::make_synthetic(test_size, shape, 10, seed, 1),
            fmt::format("synthetic {} x {}", synthetic_size, shape.str())};
  }
  throw std::invalid_argument(
      fmt::format("--data: expected fashion-mnist[:DIR], mnist:DIR, cifar10:DIR or synthetic, got '{}'", spec));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"train the PyTorch CIFAR-10 tutorial CNN with chorus, single process"};
  std::string data_spec = "fashion-mnist", synthetic_shape = "3x32x32";
  int epochs = 3, threads = 1;
  int64_t batch_size = 64, synthetic_size = 10000, max_steps = -1;
  float lr = 0.01f, momentum = 0.9f, weight_decay = 0.0f;
  bool nesterov = false, no_progress = false, keep_denormals = false;
  uint64_t seed = 0;
  app.add_option("--data", data_spec, "fashion-mnist[:DIR] | mnist:DIR | cifar10:DIR | synthetic")->capture_default_str();
  app.add_option("--epochs", epochs)->capture_default_str();
  app.add_option("--batch-size", batch_size)->capture_default_str();
  app.add_option("--lr", lr)->capture_default_str();
  app.add_option("--momentum", momentum)->capture_default_str();
  app.add_option("--weight-decay", weight_decay)->capture_default_str();
  app.add_flag("--nesterov", nesterov);
  app.add_option("--seed", seed)->capture_default_str();
  app.add_option("--threads", threads, "intra-op threads")->capture_default_str();
  app.add_option("--synthetic-size", synthetic_size, "training samples for --data synthetic")->capture_default_str();
  app.add_option("--synthetic-shape", synthetic_shape, "CxHxW for --data synthetic")->capture_default_str();
  app.add_option("--max-steps", max_steps, "stop each epoch after this many steps (< 0: whole epoch)");
  app.add_flag("--no-progress", no_progress, "no progress bar or progress lines");
  app.add_flag("--keep-denormals", keep_denormals,
               "compute with denormal floats (default: flush them to zero, see ddp/backend.h)");
  CLI11_PARSE(app, argc, argv);

  try {
    chorus::set_cpu_threads(threads);
    chorus::set_flush_denormal(!keep_denormals);
    Data data = load_data(data_spec, synthetic_size, synthetic_shape, seed);
    const chorus::Shape s = data.train->sample_shape();
    if (s[1] != s[2] || s[1] < 16)
      throw std::invalid_argument(fmt::format("train_cnn: expected square images of side >= 16, got {}", s.str()));
    chorus::Net model(static_cast<int>(s[0]), static_cast<int>(s[1]), seed);
    chorus::Sgd optimizer(model.parameters(), {.lr = lr, .momentum = momentum, .dampening = 0.0f,
                                               .weight_decay = weight_decay, .nesterov = nesterov});
    chorus::LoaderOptions lo;
    lo.batch_size = batch_size;
    lo.seed = seed;
    chorus::DataLoader loader(data.train, lo);
    chorus::TrainOptions to;
    to.epochs = epochs;
    to.max_steps_per_epoch = max_steps;
    to.progress = !no_progress;
    fmt::print("train_cnn: data {}, train {} test {}, params {}, batch {}, lr {}, momentum {}, seed {}, threads {}\n",
               data.name, data.train->size(), data.test->size(), chorus::count_parameters(model), batch_size, lr,
               momentum, seed, threads);
    std::fflush(stdout);
    chorus::Trainer trainer(model, optimizer, loader, data.test.get(), to);
    trainer.run([](const chorus::EpochStats& e) {
      fmt::print("epoch {}: train loss {:.4f}, {:.0f} images/s, test acc {:.4f} | {:.2f} s, cpu {:.2f} s\n", e.epoch,
                 e.train_loss, e.images_per_s, e.test_acc, e.seconds, e.cpu_seconds);
      std::fflush(stdout);
    });
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    fmt::print("peak memory (max rss) {:.1f} MiB\n", static_cast<double>(ru.ru_maxrss) / 1024.0);
  } catch (const std::exception& e) {
    fmt::print(stderr, "train_cnn: error: {}\n", e.what());
    return 1;
  }
  return 0;
}
