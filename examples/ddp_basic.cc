// ddp_basic: the forum thread's demo_basic done right. Every rank builds a toy model, wraps it in
// DistributedDataParallel (rank 0's parameters are broadcast), trains a few steps on its own
// random batch, and the ranks end with identical parameters; rank 0 prints one global loss.
//
//   chorus-run -n 2 build/examples/ddp_basic        (or: mpirun -n 2 build/examples/ddp_basic)
#include <chorus/chorus.hpp>

#include <cstdio>
#include <exception>
#include <memory>

#include "ddp/dist/dist_utils.h"
#include "ddp/dist/distributed.h"
#include "ddp/nn/modules.h"
#include "ddp/nn/optim.h"
#include "ddp/ops/ops.h"
#include "ddp/tensor/random.h"

namespace {

// The tutorial's ToyModel: Linear(10, 10) -> ReLU -> Linear(10, 5).
struct ToyModel : chorus::Module {
  std::shared_ptr<chorus::Linear> net1, net2;
  explicit ToyModel(chorus::Generator& g) {
    net1 = register_module("net1", std::make_shared<chorus::Linear>(10, 10, g));
    net2 = register_module("net2", std::make_shared<chorus::Linear>(10, 5, g));
  }
  chorus::Tensor forward(const chorus::Tensor& x) override {
    return net2->forward(chorus::relu(net1->forward(x)));
  }
};

}  // namespace

int main() {
  try {
    auto comm = chorus::Communicator::from_env();
    const int rank = comm.rank();
    std::printf("running basic DDP example on rank %d of %d\n", rank, comm.size());
    chorus::Generator init(
        1000 + static_cast<uint64_t>(rank));  // different on purpose: DDP broadcasts rank 0's
    ToyModel model(init);
    chorus::DistributedDataParallel ddp(model, comm);
    chorus::Sgd opt(model.parameters(), {.lr = 0.001f});
    chorus::Generator data(static_cast<uint64_t>(rank));  // each rank its own batch
    for (int step = 1; step <= 5; ++step) {
      chorus::Tensor x = chorus::Tensor::empty(chorus::Shape{20, 10});
      for (int64_t i = 0; i < x.numel(); ++i) x.data()[i] = data.normal();
      std::vector<int32_t> labels(20);
      for (auto& l : labels) l = static_cast<int32_t>(data.below(5));
      opt.zero_grad();
      chorus::Tensor loss = chorus::cross_entropy(ddp.forward(x), labels);
      loss.backward();
      ddp.finish_gradient_sync();
      opt.step();
      const double global = chorus::reduce_mean(comm, loss.item());
      chorus::print_primary(&comm, "step {}: loss {:.4f} (mean over {} ranks)\n", step, global,
                            comm.size());
    }
    // The ranks hold the same parameters: compare a checksum with rank 0's.
    double sum = 0;
    for (auto& t : model.parameters())
      for (float v : t.to_vector()) sum += v;
    double root = sum;
    comm.broadcast(&root, 1, chorusFloat64, 0);
    std::printf("rank %d: parameter checksum %.9f, %s rank 0\n", rank, sum,
                sum == root ? "same as" : "DIFFERENT FROM");
    comm.barrier();  // every rank, not inside `if rank == 0`
    return sum == root ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddp_basic: error: %s\n", e.what());
    return 1;
  }
}
