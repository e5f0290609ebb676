// DistributedSampler: each of num_replicas ranks gets a disjoint 1/num_replicas share of a data
// set's indices per epoch, with PyTorch's semantics (torch.utils.data.DistributedSampler, 1.13):
//   - shuffle: a permutation drawn from Generator(seed + epoch), the same on every rank, so the
//     shares are disjoint; set_epoch() changes it each epoch. No shuffle: 0..n-1.
//   - drop_last false: the list is padded to a multiple of num_replicas by repeating its first
//     indices (cyclically when the padding exceeds n); true: the tail is dropped instead.
//   - rank r takes positions r, r + R, r + 2R, ... of that list: num_samples() indices.
// Elastic training (restart_at): after ranks are lost mid-epoch, the survivors take the rest of
// the same epoch's list from the first position nobody trained on, padded and strided the same
// way over the new world, so no sample of the epoch is lost or seen twice (beyond the padding an
// uninterrupted run has too). Step t of R ranks at batch B trains on positions [tBR, (t+1)BR).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace chorus {

struct SamplerState {
  uint64_t seed = 0;
  int64_t epoch = 0;
};

class DistributedSampler {
 public:
  DistributedSampler(int64_t dataset_size, int num_replicas, int rank, bool shuffle = true,
                     uint64_t seed = 0, bool drop_last = false);
  // A new epoch starts at its first position; the same epoch again keeps a restart_at().
  void set_epoch(int64_t epoch) {
    if (epoch != epoch_ && start_ > 0) restart_at(0, num_replicas_, rank_);
    epoch_ = epoch;
  }
  // The rest of this epoch, from position `start` of its (unpadded) list, over a new world: the
  // rest is padded to a multiple of it by repeating its first indices. Not with drop_last.
  void restart_at(int64_t start, int num_replicas, int rank);
  int64_t start() const { return start_; }
  // Where the epoch's list stands after `steps` steps of `batch` per rank since the (re)start.
  int64_t position_after(int64_t steps, int64_t batch) const {
    return std::min(n_, start_ + steps * batch * num_replicas_);
  }
  int64_t epoch() const { return epoch_; }
  // This rank's indices for the current epoch.
  std::vector<int64_t> indices() const;
  int64_t num_samples() const { return num_samples_; }
  int64_t total_size() const { return num_samples_ * num_replicas_; }
  int num_replicas() const { return num_replicas_; }
  int rank() const { return rank_; }
  bool shuffle() const { return shuffle_; }
  bool drop_last() const { return drop_last_; }
  SamplerState state() const { return {seed_, epoch_}; }

 private:
  int64_t n_;
  int num_replicas_, rank_;
  bool shuffle_;
  uint64_t seed_;
  bool drop_last_;
  int64_t epoch_ = 0;
  int64_t start_ = 0;  // restart_at: positions before it were trained on
  int64_t num_samples_;
};

}  // namespace chorus
