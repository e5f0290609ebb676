// The training loop shared by examples/train_cnn and (next) DDP: epochs of
// zero_grad -> forward -> cross_entropy -> backward -> step, then a test pass.
//
// Deterministic: same model seed, loader seed and thread count -> bit-identical losses.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <vector>

#include "ddp/data_loader.h"
#include "ddp/nn.h"
#include "ddp/optim.h"

namespace chorus {

struct EpochStats {
  int epoch = 0;            // 1-based
  double train_loss = 0.0;  // mean over the epoch's samples
  double images_per_s = 0.0;  // training loop only (not the test pass), like ../shared/peers/train
  double seconds = 0.0;
  double cpu_seconds = 0.0;  // process CPU time over the same span (all threads, like Python's process_time)
  double test_acc = -1.0;   // -1 when no test set
  int64_t images = 0;
  std::vector<float> step_losses;  // one per step when TrainOptions::record_step_losses
};

struct TrainOptions {
  int epochs = 1;
  int64_t max_steps_per_epoch = -1;  // < 0: the whole epoch
  bool progress = true;              // ProgressBar on `out`
  bool record_step_losses = false;
  std::FILE* out = stdout;
  int eval_batch_size = 1000;
  // Called after each loss.backward() and before optimizer.step(): where DDP waits for its
  // bucket all-reduces to finish. Optional.
  std::function<void()> after_backward;
};

class Trainer {
 public:
  Trainer(Module& model, Sgd& optimizer, DataLoader& train, const Dataset* test, TrainOptions options);
  // Runs one epoch (epoch is 1-based; the loader is shuffled with epoch - 1, like set_epoch).
  EpochStats run_epoch(int epoch);
  // Runs all epochs, calling on_epoch after each.
  std::vector<EpochStats> run(const std::function<void(const EpochStats&)>& on_epoch = nullptr);

 private:
  Module& model_;
  Sgd& optimizer_;
  DataLoader& train_;
  const Dataset* test_;
  TrainOptions options_;
};

// Fraction of correct argmax predictions over the whole data set, in eval mode without grad.
double evaluate(Module& model, const Dataset& data, int64_t batch_size = 1000);

}  // namespace chorus
