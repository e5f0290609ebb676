// DistributedSampler: each of num_replicas ranks gets a disjoint 1/num_replicas share of a data
// set's indices per epoch, with PyTorch's semantics (torch.utils.data.DistributedSampler, 1.13):
//   - shuffle: a permutation drawn from Generator(seed + epoch), the same on every rank, so the
//     shares are disjoint; set_epoch() changes it each epoch. No shuffle: 0..n-1.
//   - drop_last false: the list is padded to a multiple of num_replicas by repeating its first
//     indices (cyclically when the padding exceeds n); true: the tail is dropped instead.
//   - rank r takes positions r, r + R, r + 2R, ... of that list: num_samples() indices.
#pragma once

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
  void set_epoch(int64_t epoch) { epoch_ = epoch; }
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
  int64_t num_samples_;
};

}  // namespace chorus
