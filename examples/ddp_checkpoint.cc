// ddp_checkpoint: the forum thread's demo_checkpoint done right. Rank 0 saves (atomically), every
// rank waits at a barrier that all ranks call, every rank loads the snapshot, training goes on,
// and the communicator is destroyed once, at the end (RAII). The snapshot is kept, not removed,
// so it can be loaded again for testing.
//
//   chorus-run -n 2 build/examples/ddp_checkpoint [DIR]
#include <chorus/chorus.hpp>

#include <cstdio>
#include <exception>
#include <filesystem>
#include <memory>
#include <string>

#include "ddp/dist/dist_utils.h"
#include "ddp/dist/distributed.h"
#include "ddp/nn/modules.h"
#include "ddp/nn/optim.h"
#include "ddp/ops/ops.h"
#include "ddp/tensor/random.h"
#include "ddp/train/checkpoint.h"

int main(int argc, char** argv) {
  try {
    const std::string dir =
        argc > 1 ? argv[1]
                 : (std::filesystem::temp_directory_path() / "chorus-ddp-checkpoint").string();
    auto comm = chorus::Communicator::from_env();
    const int rank = comm.rank();
    std::printf("running checkpoint DDP example on rank %d\n", rank);
    chorus::Net model(1, 28, 7);
    chorus::DistributedDataParallel ddp(model, comm);
    chorus::Sgd opt(model.parameters(), {.lr = 0.001f, .momentum = 0.9f});

    chorus::TrainState state;
    state.world_size = comm.size();
    // Rank 0 writes; save_checkpoint then puts every rank (not only rank 0) through the barrier,
    // so nobody reads the file before it is complete.
    const std::string path = chorus::save_checkpoint(&comm, dir, model, opt, state);
    const chorus::Snapshot snap = chorus::read_snapshot(path);
    chorus::apply_snapshot(snap, model, opt);

    chorus::Generator g(static_cast<uint64_t>(rank));
    for (int step = 1; step <= 3; ++step) {
      chorus::Tensor x = chorus::Tensor::empty(chorus::Shape{16, 1, 28, 28});
      for (int64_t i = 0; i < x.numel(); ++i) x.data()[i] = g.normal();
      std::vector<int32_t> labels(16);
      for (auto& l : labels) l = static_cast<int32_t>(g.below(10));
      opt.zero_grad();
      chorus::Tensor loss = chorus::cross_entropy(ddp.forward(x), labels);
      loss.backward();
      ddp.finish_gradient_sync();
      opt.step();
      chorus::print_primary(&comm, "step {}: loss {:.4f}\n", step,
                            chorus::reduce_mean(comm, loss.item()));
    }
    state.global_step = 3;
    const std::string after = chorus::save_checkpoint(&comm, dir, model, opt, state);
    chorus::print_primary(&comm, "saved {} (kept for testing; loaded from {} before training)\n",
                          after, path);
    return 0;  // the communicator is destroyed here, once
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddp_checkpoint: error: %s\n", e.what());
    return 1;
  }
}
