// DistributedSampler: the global order, padding/truncation, and the strided share.
#include "ddp/data/sampler.h"

#include <fmt/format.h>

#include <numeric>
#include <stdexcept>

#include "ddp/tensor/random.h"

namespace chorus {

DistributedSampler::DistributedSampler(int64_t dataset_size, int num_replicas, int rank,
                                       bool shuffle, uint64_t seed, bool drop_last)
    : n_(dataset_size),
      num_replicas_(num_replicas),
      rank_(rank),
      shuffle_(shuffle),
      seed_(seed),
      drop_last_(drop_last) {
  if (num_replicas < 1)
    throw std::invalid_argument(
        fmt::format("distributed sampler: expected num_replicas >= 1, got {}", num_replicas));
  if (rank < 0 || rank >= num_replicas)
    throw std::invalid_argument(
        fmt::format("distributed sampler: invalid rank {}, rank should be in the interval [0, {}]",
                    rank, num_replicas - 1));
  if (dataset_size < 0) throw std::invalid_argument("distributed sampler: negative data set size");
  // PyTorch: drop_last and an uneven split -> ceil((n - R) / R), else ceil(n / R).
  if (drop_last_ && n_ % num_replicas_ != 0)
    num_samples_ = (n_ - num_replicas_ + num_replicas_ - 1) / num_replicas_;
  else
    num_samples_ = (n_ + num_replicas_ - 1) / num_replicas_;
  if (num_samples_ < 0) num_samples_ = 0;
}

void DistributedSampler::restart_at(int64_t start, int num_replicas, int rank) {
  if (drop_last_) throw std::invalid_argument("distributed sampler: restart_at with drop_last");
  if (num_replicas < 1 || rank < 0 || rank >= num_replicas || start < 0)
    throw std::invalid_argument(
        fmt::format("distributed sampler: restart_at({}, {}, {}): bad position, world or rank",
                    start, num_replicas, rank));
  start_ = std::min(start, n_);
  num_replicas_ = num_replicas;
  rank_ = rank;
  num_samples_ = (n_ - start_ + num_replicas_ - 1) / num_replicas_;  // start 0: as constructed
}

std::vector<int64_t> DistributedSampler::indices() const {
  std::vector<int64_t> order;
  if (shuffle_) {
    order = Generator(seed_ + static_cast<uint64_t>(epoch_)).permutation(n_);
  } else {
    order.resize(static_cast<size_t>(n_));
    std::iota(order.begin(), order.end(), 0);
  }
  if (start_ > 0) {  // restarted: the rest of the list, padded for this world
    std::vector<int64_t> rest(order.begin() + start_, order.end());
    const auto want = static_cast<size_t>(num_samples_ * num_replicas_);
    for (size_t i = 0; rest.size() < want && !rest.empty(); ++i) rest.push_back(rest[i]);
    std::vector<int64_t> mine;
    for (size_t i = static_cast<size_t>(rank_); i < want; i += static_cast<size_t>(num_replicas_))
      mine.push_back(rest[i]);
    return mine;
  }
  const auto total = static_cast<size_t>(total_size());
  if (!drop_last_) {
    for (size_t i = 0; order.size() < total && n_ > 0; ++i)
      order.push_back(order[i % static_cast<size_t>(n_)]);
  } else {
    order.resize(total);
  }
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(num_samples_));
  for (size_t i = static_cast<size_t>(rank_); i < total; i += static_cast<size_t>(num_replicas_))
    mine.push_back(order[i]);
  return mine;
}

}  // namespace chorus
