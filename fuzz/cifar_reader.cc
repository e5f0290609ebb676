// libFuzzer target: the CIFAR-10 binary reader on arbitrary bytes (one batch file), built into a
// data set as load_cifar10_files builds it, whose every sample is read back. It must return or
// throw std::runtime_error/std::invalid_argument; a crash, a leak, an out-of-bounds access or
// any other exception is a finding.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "ddp/data/dataset.h"
#include "ddp/tensor/buffer_cache.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<uint8_t> pixels;
  std::vector<int32_t> labels;
  try {
    chorus::parse_cifar10(data, size, "fuzz.bin", &pixels, &labels);
    const chorus::Shape shape{static_cast<int64_t>(labels.size()), 3, 32, 32};
    chorus::TensorDataset ds(chorus::normalise_bytes(pixels.data(), shape, {}), labels, 10);
    std::vector<float> sample(3 * 32 * 32);
    for (int64_t i = 0; i < std::min<int64_t>(ds.size(), 16); ++i)
      if (ds.get(i, sample.data()) != labels[static_cast<size_t>(i)]) __builtin_trap();
  } catch (const std::runtime_error&) {
  } catch (const std::invalid_argument&) {
  }
  chorus::buffer_cache_release();  // the cache keeps every size it saw: not a leak, but rss
  return 0;
}
