// The training loop shared by examples/train_cnn and DDP: epochs of
// zero_grad -> forward -> cross_entropy -> backward [-> DDP gradient sync] -> step, then a test
// pass.
//
// With a communicator (TrainOptions::comm) the loop is distributed: forward goes through the DDP
// wrapper, the gradient sync is awaited before the step, loss/accuracy/images are all-reduced so
// rank 0 prints one global line per interval, the test pass is split over the ranks, and
// snapshots are written by rank 0 (ddp/train/checkpoint.h). Every rank must run the same number of
// steps.
//
// Deterministic: same model seed, loader seed and thread count -> bit-identical losses.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "ddp/data/data_loader.h"
#include "ddp/data/sampler.h"
#include "ddp/dist/distributed.h"
#include "ddp/nn/modules.h"
#include "ddp/nn/optim.h"
#include "ddp/ops/ops.h"
#include "ddp/train/checkpoint.h"
#include "ddp/train/step_graph.h"

namespace chorus {

struct EpochStats {
  int epoch = 0;              // 1-based
  double train_loss = 0.0;    // mean over the epoch's samples
  double images_per_s = 0.0;  // training loop only (not the test pass), like ../shared/peers/train
  double seconds = 0.0;
  double cpu_seconds =
      0.0;  // process CPU time over the same span (all threads, like Python's process_time)
  double test_acc = -1.0;  // -1 when no test set
  int64_t images = 0;
  std::vector<float> step_losses;  // one per step when TrainOptions::record_step_losses
  // Distributed runs: loss/acc/images above are global (all ranks); these are rank 0's.
  double train_acc = -1.0;         // fraction of correct argmax predictions on the training batches
  double sync_wait_seconds = 0.0;  // waiting for the gradient all-reduce after backward
  double backward_seconds = 0.0;   // backward (which overlaps the bucket all-reduces)
  int64_t steps = 0;
};

struct TrainOptions {
  int epochs = 1;
  int64_t max_steps_per_epoch = -1;  // < 0: the whole epoch
  bool progress = true;              // ProgressBar on `out`
  bool record_step_losses = false;
  std::FILE* out = stdout;
  int eval_batch_size = 1000;
  Device device = Device::cpu();  // where the model is: each batch is copied there
  // Called after each loss.backward() and before optimizer.step(): where DDP waits for its
  // bucket all-reduces to finish. Optional.
  std::function<void()> after_backward;
  // Capture the step as a CUDA graph and replay it (ddp/train/step_graph.h; train_cnn
  // --cuda-graph): on a cuda device, no elastic options. Batches of the first batch's size go
  // through the graph (two eager warm-up steps, then the capture); a batch of another size (an
  // epoch's last) runs eagerly. The same bits as without. With DDP, where the buckets are on
  // the device (Reducer::capturable), the step is one graph, the buckets' all-reduces inside it,
  // overlapped with backward as in an eager step; before_sync is called before the step's graph
  // runs, after_backward after it. Elsewhere, or with cuda_graph_split, it is two graphs --
  // forward and backward, then the optimizer's update -- with the buckets' all-reduces between
  // them, launched by the host (Reducer::sync_deferred), and before_sync / after_backward
  // called there as in an eager step.
  bool cuda_graph = false;
  // With cuda_graph and DDP: two graphs a step even where the all-reduces could be captured (to
  // measure what capturing them gains).
  bool cuda_graph_split = false;

  // ---- distributed (all optional) ----
  Communicator* comm = nullptr;            // null: single process
  DistributedDataParallel* ddp = nullptr;  // forward + gradient sync go through it when set
  int64_t log_every = 0;                   // > 0: one global line every N steps (replaces the bar)
  bool per_rank_log = false;               // also print each rank's own interval line
  std::string checkpoint_dir;              // empty: no snapshots
  int64_t checkpoint_every = 0;            // > 0: also a snapshot every N global steps
  TrainState resume;                       // where to start (epoch, step_in_epoch, global_step)
  uint64_t seed = 0;                       // recorded in snapshots (sampler seed)
  int64_t batch_size = 0;                  // recorded in snapshots
  std::function<void(int64_t global_step)> after_step;  // e.g. fault injection in tests

  // ---- elastic (issue 17): recover and sampler both set, or neither ----
  // A step that fails with a chorus::Error (a rank died, or the communicator was revoked) is
  // undone: `recover` (on every survivor) shrinks the communicator, builds DDP on the new one and
  // returns both and who was lost ("rank 2"); the caller owns them. The survivors then roll back
  // to the last step all of them completed (each keeps its last two in memory: equal bits on every
  // rank), re-divide the rest of the epoch (DistributedSampler::restart_at), keep the per-rank
  // batch and scale the learning rate by new world / old world (the linear scaling rule: the
  // global batch shrank by that factor), print one line, and go on.
  struct Recovered {
    Communicator* comm = nullptr;
    DistributedDataParallel* ddp = nullptr;
    std::string lost;
  };
  std::function<Recovered(const Error& error)> recover;
  DistributedSampler* sampler = nullptr;
  // Rejoining (grow; ddp/dist/rejoin.h). Before each step G rank 0 asks joiners_waiting(G) how
  // many restarted workers wait, and tells the others; when some do, `grow` (on every rank) grows
  // the communicator by that many and builds DDP on it, returning both and who joined. Rank 0 then
  // sends everyone its state after the last completed step (parameters, momenta, step, position
  // in the epoch, sums, lr), the rest of the epoch is re-divided over the larger world, and the
  // lr is scaled by new world / old world (the rule of `recover`, the other way). `joined`: this
  // process is such a newcomer (its comm already grown): run() starts by receiving that state.
  std::function<int(int64_t global_step)> joiners_waiting;
  std::function<Recovered(int n)> grow;
  bool joined = false;
  // Testing, the reference run of an elastic one: before step G + 1, leave(G) may return a smaller
  // communicator (ranks left on purpose: train_cnn --leave-at), and the others go on from step G
  // as after a recovery, without a failure: the same schedule of world sizes, no kill.
  std::function<std::optional<Recovered>(int64_t global_step)> leave;
  // Testing: "try G i i ..." before each step G (the samples of this rank's batch), and
  // "resume G" after a recovery: tries after G are void.
  std::FILE* sample_log = nullptr;
  // Testing: called after backward, before waiting for the gradient all-reduces of step G.
  std::function<void(int64_t global_step)> before_sync;
  // Testing: called before the epoch-end evaluation, with the global step (fault injection).
  std::function<void(int64_t global_step)> before_eval;
};

class Trainer {
 public:
  Trainer(Module& model, Sgd& optimizer, DataLoader& train, const Dataset* test,
          TrainOptions options);
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
  int64_t global_step_ = 0;
  void save(int64_t epoch, int64_t step_in_epoch);
  void graphed_step(const Batch& batch);
  // --cuda-graph: the graph, its static inputs and the outputs it writes.
  struct Graphed {
    std::unique_ptr<StepGraph> graph;
    std::unique_ptr<StepGraph> update;  // with DDP, two graphs a step: the optimizer's step
    bool whole = false;                 // with DDP: the all-reduces inside `graph` (no `update`)
    float lr = -1;                      // the learning rate captured (-1: not captured yet)
    int64_t batch = 0;
    Tensor images, logits, loss;
    Labels labels;
  };
  Graphed graphed_;

  // Elastic: the state after a completed step, kept in memory to roll back to.
  struct Snapshot {
    int64_t step = -1;  // steps of this epoch completed; -1: none held
    int64_t global_step = 0;
    int64_t position = 0;  // the epoch's list position after it (DistributedSampler)
    std::vector<std::vector<float>> params, momenta;  // momenta empty: none yet
    double sums[6] = {};                              // epoch and interval loss/correct/images
    int64_t images = 0;
  };
  void capture(Snapshot& s, int64_t step, int64_t position, const double* sums, int64_t images);
  void restore(const Snapshot& s);
  // Rank 0's cur_, epoch and lr to every rank of options_.comm (a grow's newcomers included),
  // except the loss/accuracy sums and image count: they are each rank's own part of a global
  // sum, so a member keeps its own and a newcomer starts from zero.
  void share_state(int64_t* epoch, bool newcomer);
  Snapshot prev_, cur_;
  bool join_pending_ = false;  // a newcomer's first epoch starts from the shared cur_
};

// Fraction of correct argmax predictions over the whole data set, in eval mode without grad.
double evaluate(Module& model, const Dataset& data, int64_t batch_size = 1000);
// The same over all ranks: rank r scores its contiguous share; the counts are all-reduced.
double evaluate_distributed(Communicator& comm, Module& model, const Dataset& data,
                            int64_t batch_size = 1000);

}  // namespace chorus
