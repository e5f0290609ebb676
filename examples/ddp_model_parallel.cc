// ddp_model_parallel: the forum's ToyMpModel -- a model split across two devices inside each
// rank, wrapped in DDP with no single device (DdpOptions.device ""). net1 runs on DEV0, its
// activations are copied to DEV1 (differentiably: to_device), net2 runs there and the loss with
// it; backward copies the gradient back. DDP keeps a bucket per device and all-reduces each
// where it lies. The ranks end with identical parameters; rank 0 prints one global loss.
//
//   chorus-run -n 2 build/examples/ddp_model_parallel cuda:0 cuda:1   # two GPUs per rank
//   chorus-run -n 2 build/examples/ddp_model_parallel cpu cuda        # one GPU: cpu +
//   cuda:LOCAL_RANK chorus-run -n 2 build/examples/ddp_model_parallel                 # cpu cpu (no
//   GPU)
#include <chorus/chorus.hpp>

#include <cstdio>
#include <exception>
#include <memory>
#include <string>

#include "ddp/dist/dist_utils.h"
#include "ddp/dist/distributed.h"
#include "ddp/nn/modules.h"
#include "ddp/nn/optim.h"
#include "ddp/ops/ops.h"
#include "ddp/tensor/random.h"

namespace {

struct ToyMpModel : chorus::Module {
  std::shared_ptr<chorus::Linear> net1, net2;
  chorus::Device dev0, dev1;
  ToyMpModel(chorus::Generator& g, chorus::Device d0, chorus::Device d1) : dev0(d0), dev1(d1) {
    net1 = register_module("net1", std::make_shared<chorus::Linear>(10, 10, g));
    net2 = register_module("net2", std::make_shared<chorus::Linear>(10, 5, g));
    net1->to(dev0);
    net2->to(dev1);
  }
  chorus::Tensor forward(const chorus::Tensor& x) override {
    chorus::Tensor h = chorus::relu(net1->forward(chorus::to_device(x, dev0)));
    return net2->forward(chorus::to_device(h, dev1));
  }
};

}  // namespace

int main(int argc, char** argv) {
  try {
    auto comm = chorus::Communicator::from_env();
    const int rank = comm.rank();
    const int local = chorus::env_local_rank();
    const chorus::Device d0 = chorus::Device::parse(argc > 1 ? argv[1] : "cpu", local);
    const chorus::Device d1 = chorus::Device::parse(argc > 2 ? argv[2] : "cpu", local);
    chorus::print_primary(&comm, "model parallel DDP: net1 on {}, net2 on {}, {} ranks\n", d0.str(),
                          d1.str(), comm.size());
    chorus::Generator init(1000 + static_cast<uint64_t>(rank));  // DDP broadcasts rank 0's
    ToyMpModel model(init, d0, d1);
    chorus::DdpOptions options;
    options.device = "";  // no single device: a bucket per device
    chorus::DistributedDataParallel ddp(model, comm, options);
    chorus::Sgd opt(model.parameters(), {.lr = 0.05f, .momentum = 0.9f});
    chorus::Generator data(static_cast<uint64_t>(rank));  // each rank its own batch
    double first = 0, last = 0;
    for (int step = 1; step <= 20; ++step) {
      chorus::Tensor x = chorus::Tensor::empty(chorus::Shape{20, 10});
      for (int64_t i = 0; i < x.numel(); ++i) x.data()[i] = data.normal();
      std::vector<int32_t> labels(20);
      for (int64_t i = 0; i < 20; ++i)  // learnable: the label follows the first feature
        labels[static_cast<size_t>(i)] = x.data()[i * 10] > 0 ? 1 : 3;
      opt.zero_grad();
      chorus::Tensor loss = chorus::cross_entropy(ddp.forward(x), labels);
      loss.backward();
      ddp.finish_gradient_sync();
      opt.step();
      last = chorus::reduce_mean(comm, loss.item());
      if (step == 1) first = last;
      if (step % 5 == 0) chorus::print_primary(&comm, "step {}: loss {:.4f}\n", step, last);
    }
    double sum = 0;  // the ranks hold the same parameters: a checksum against rank 0's
    for (auto& t : model.parameters())
      for (float v : t.to_vector()) sum += v;
    double root = sum;
    comm.broadcast(&root, 1, chorusFloat64, 0);
    std::printf("rank %d: %zu bucket(s), parameter checksum %.9f, %s rank 0; loss %.4f -> %.4f\n",
                rank, ddp.reducer().buckets().size(), sum,
                sum == root ? "same as" : "DIFFERENT FROM", first, last);
    comm.barrier();
    return sum == root && last < first ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddp_model_parallel: error: %s\n", e.what());
    return 1;
  }
}
