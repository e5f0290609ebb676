// A training step captured once as a CUDA graph and replayed (train_cnn --cuda-graph): the
// launches of a step -- forward, loss, backward, the optimizer's update -- become one graph launch
// (for a network as small as the tutorial's, launches are expected to weigh most in a step; not
// yet measured on a GPU: bench/gpu/train_compare.py's "chorus 1 rank graph" row will say).
//
// As with PyTorch's torch.cuda.graphs, the step works on static inputs: tensors (and Labels) on
// the device that the caller refills before each run(), and whose addresses the graph keeps. The
// step's memory comes from a pool of its own (device_cache.h), reserved for the graph while it
// lives: its outputs (the loss, the logits) stay where the graph writes them, and are read after
// run(). The first `warmup` runs are eager, on the same inputs, so that the
// allocator's caches, the kernels' scratch buffers and the optimizer's momentum buffers reach
// their steady state; the next run captures the step and replays it (the capture itself runs
// nothing). Every run gives the bits the eager step would.
//
// The step must not wait for the GPU (read a device value on the host, copy between host and
// device): inside the capture that throws, naming the call, and nothing is captured. Nor may it
// depend on host state that changes between runs (the graph replays the first capture's launches
// with their arguments): the learning rate, the shapes, which parameters have gradients.
//
// With DDP the step is still one StepGraph: the buckets' all-reduces are forked onto the
// communication stream inside the capture and joined back (ddp/dist/distributed.h). Split
// (TrainOptions.cuda_graph_split) it is two -- forward and backward, then the optimizer's update
// -- and the host launches the all-reduces between them (Trainer::graphed_step,
// Reducer::sync_deferred).
#pragma once

#include <functional>

#include "ddp/tensor/storage.h"

namespace chorus {

class StepGraph {
 public:
  explicit StepGraph(Device device, int warmup = 2);
  ~StepGraph();
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;

  // One step: `step` itself while warming up; at the first run after, `step` captured and the
  // graph launched; from then on the graph launched alone (`step` is not called).
  void run(const std::function<void()>& step);
  bool captured() const { return graph_ != nullptr; }
  int pool() const { return pool_; }  // the graph's memory pool (-1 before the capture)

 private:
  Device device_;
  int warmup_;
  int eager_ = 0;
  void* graph_ = nullptr;
  int pool_ = -1;
};

}  // namespace chorus
