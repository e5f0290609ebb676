// Trainer: the epoch/step loop and evaluation.
#include "ddp/trainer.h"

#include <fmt/format.h>

#include <time.h>

#include <chrono>

#include "ddp/autograd.h"
#include "ddp/ops.h"
#include "ddp/progress.h"

namespace chorus {
namespace {

double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

}  // namespace

Trainer::Trainer(Module& model, Sgd& optimizer, DataLoader& train, const Dataset* test, TrainOptions options)
    : model_(model), optimizer_(optimizer), train_(train), test_(test), options_(options) {}

EpochStats Trainer::run_epoch(int epoch) {
  EpochStats st;
  st.epoch = epoch;
  model_.train();
  train_.begin_epoch(epoch - 1);
  int64_t steps = train_.batches_per_epoch();
  if (options_.max_steps_per_epoch >= 0 && options_.max_steps_per_epoch < steps) steps = options_.max_steps_per_epoch;
  ProgressBar bar(options_.out, fmt::format("epoch {}", epoch), steps, options_.progress);
  double loss_sum = 0.0;
  const auto t0 = std::chrono::steady_clock::now();
  const double c0 = process_cpu_seconds();
  Batch batch;
  for (int64_t step = 0; step < steps && train_.next(batch); ++step) {
    optimizer_.zero_grad();
    Tensor loss = cross_entropy(model_.forward(batch.images), batch.labels);
    loss.backward();
    if (options_.after_backward) options_.after_backward();
    optimizer_.step();
    const float l = loss.item();
    if (options_.record_step_losses) st.step_losses.push_back(l);
    loss_sum += static_cast<double>(l) * static_cast<double>(batch.size());
    st.images += batch.size();
    bar.update(step + 1, loss_sum / static_cast<double>(st.images), st.images);
  }
  st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  st.cpu_seconds = process_cpu_seconds() - c0;
  bar.finish();
  train_.end_epoch();  // stops the prefetch thread when steps were capped
  st.train_loss = st.images ? loss_sum / static_cast<double>(st.images) : 0.0;
  st.images_per_s = st.seconds > 0 ? static_cast<double>(st.images) / st.seconds : 0.0;
  if (test_) st.test_acc = evaluate(model_, *test_, options_.eval_batch_size);
  return st;
}

std::vector<EpochStats> Trainer::run(const std::function<void(const EpochStats&)>& on_epoch) {
  std::vector<EpochStats> all;
  for (int e = 1; e <= options_.epochs; ++e) {
    all.push_back(run_epoch(e));
    if (on_epoch) on_epoch(all.back());
  }
  return all;
}

double evaluate(Module& model, const Dataset& data, int64_t batch_size) {
  NoGradGuard no_grad;
  const bool was_training = model.is_training();
  model.eval();
  const Shape s = data.sample_shape();
  int64_t correct = 0;
  for (int64_t first = 0; first < data.size(); first += batch_size) {
    const int64_t count = std::min(batch_size, data.size() - first);
    Tensor x = Tensor::empty(Shape{count, s[0], s[1], s[2]});
    std::vector<int32_t> labels(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) labels[static_cast<size_t>(i)] = data.get(first + i, x.data() + i * s.numel());
    const std::vector<int32_t> pred = argmax(model.forward(x));
    for (int64_t i = 0; i < count; ++i) correct += pred[static_cast<size_t>(i)] == labels[static_cast<size_t>(i)];
  }
  model.train(was_training);
  return data.size() ? static_cast<double>(correct) / static_cast<double>(data.size()) : 0.0;
}

}  // namespace chorus
