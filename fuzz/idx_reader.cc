// libFuzzer target: the IDX reader (MNIST / Fashion-MNIST) on arbitrary bytes, as an images file
// (3 dims), as a labels file (1 dim), and as both -- the first byte splits the rest into an
// images part and a labels part -- built into a data set whose every sample is read back. Each
// step must return or throw std::runtime_error/std::invalid_argument/std::out_of_range; a crash,
// a leak, an out-of-bounds access or any other exception is a finding.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "ddp/data/dataset.h"
#include "ddp/tensor/buffer_cache.h"

namespace {

void read_every_sample(const chorus::Dataset& ds) {
  std::vector<float> sample(static_cast<size_t>(ds.sample_shape().numel()));
  for (int64_t i = 0; i < std::min<int64_t>(ds.size(), 64); ++i) ds.get(i, sample.data());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    chorus::parse_idx(data, size, "fuzz-images", 3);
  } catch (const std::runtime_error&) {
  }
  try {
    chorus::parse_idx(data, size, "fuzz-labels", 1);
  } catch (const std::runtime_error&) {
  }
  if (size < 1) return 0;
  const size_t split = 1 + static_cast<size_t>(data[0]) * (size - 1) / 255;
  try {
    const auto images = chorus::parse_idx(data + 1, split - 1, "fuzz-images", 3);
    const auto labels = chorus::parse_idx(data + split, size - split, "fuzz-labels", 1);
    read_every_sample(*chorus::mnist_from_idx(images, "fuzz-images", labels, "fuzz-labels"));
  } catch (const std::runtime_error&) {
  } catch (const std::invalid_argument&) {
  } catch (const std::out_of_range&) {
  }
  chorus::buffer_cache_release();  // the cache keeps every size it saw: not a leak, but rss
  return 0;
}
