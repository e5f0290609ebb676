// rank_zero_first and the metric reductions.
#include "ddp/dist/dist_utils.h"

namespace chorus {

void rank_zero_first(Communicator& comm, const std::function<void()>& fn) {
  if (comm.rank() == 0) {
    fn();
    comm.barrier();
    return;
  }
  comm.barrier();
  fn();
}

double reduce_mean(Communicator& comm, double value) {
  double sum = 0;
  comm.all_reduce(&value, &sum, 1, chorusFloat64, chorusSum);
  return sum / comm.size();
}

void reduce_sum(Communicator& comm, std::vector<double>& values) {
  if (values.empty()) return;
  comm.all_reduce(values.data(), values.data(), values.size(), chorusFloat64, chorusSum);
}

}  // namespace chorus
