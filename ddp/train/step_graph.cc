// A training step as a CUDA graph (see step_graph.h).
#include "ddp/train/step_graph.h"

#include <stdexcept>

#include "ddp/tensor/device_cache.h"

namespace chorus {

StepGraph::StepGraph(Device device, int warmup) : device_(device), warmup_(warmup) {
  if (device.is_cpu())
    throw std::invalid_argument("StepGraph: a CUDA graph needs a cuda device, not the cpu");
}

StepGraph::~StepGraph() {
  if (graph_) cuda_backend().graph_destroy(device_, graph_);
  if (pool_ >= 0) device_pool_release(pool_);
}

void StepGraph::run(const std::function<void()>& step) {
  DeviceBackend& backend = cuda_backend();
  if (graph_) {
    backend.graph_launch(device_, graph_);
    return;
  }
  if (eager_ < warmup_) {
    step();
    ++eager_;
    return;
  }
  pool_ = device_pool_begin(device_);
  try {
    backend.capture_begin(device_);
    try {
      step();
    } catch (...) {
      try {
        void* broken = backend.capture_end(device_);
        backend.graph_destroy(device_, broken);
      } catch (...) {
        // The capture's own error adds nothing to the step's.
      }
      throw;
    }
    graph_ = backend.capture_end(device_);
  } catch (...) {
    device_pool_end(pool_);
    device_pool_release(pool_);
    pool_ = -1;
    throw;
  }
  device_pool_end(pool_);
  backend.graph_launch(device_, graph_);  // the captured step runs now
}

}  // namespace chorus
