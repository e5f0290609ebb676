// TensorDataset, normalisation and the synthetic data set.
#include "ddp/data/dataset.h"

#include <fmt/format.h>

#include <cstring>
#include <stdexcept>

#include "ddp/tensor/random.h"

namespace chorus {

TensorDataset::TensorDataset(Tensor images, std::vector<int32_t> labels, int num_classes)
    : images_(std::move(images)), labels_(std::move(labels)), num_classes_(num_classes) {
  if (images_.ndim() != 4 || images_.dim(0) != static_cast<int64_t>(labels_.size()))
    throw std::invalid_argument(
        fmt::format("dataset: expected images (N, C, H, W) with N = {} labels, got {}",
                    labels_.size(), images_.shape().str()));
}

Shape TensorDataset::sample_shape() const {
  return Shape{images_.dim(1), images_.dim(2), images_.dim(3)};
}

int32_t TensorDataset::get(int64_t i, float* out) const {
  if (i < 0 || i >= size())
    throw std::out_of_range(fmt::format("dataset: sample {} is outside 0..{}", i, size() - 1));
  const int64_t per = sample_shape().numel();
  std::memcpy(out, images_.data() + i * per, sizeof(float) * static_cast<size_t>(per));
  return labels_[static_cast<size_t>(i)];
}

Tensor normalise_bytes(const uint8_t* bytes, const Shape& shape, const Normalize& norm) {
  const int64_t c = shape[1], plane = shape[2] * shape[3];
  if (norm.mean.size() != norm.std.size() ||
      (norm.mean.size() != 1 && static_cast<int64_t>(norm.mean.size()) != c))
    throw std::invalid_argument(
        fmt::format("normalize: expected 1 or {} means and stds, got {} and {}", c,
                    norm.mean.size(), norm.std.size()));
  Tensor t = Tensor::empty(shape);
  float* out = t.data();
  for (int64_t i = 0; i < shape.numel(); ++i) {
    const size_t ch = norm.mean.size() == 1 ? 0 : static_cast<size_t>((i / plane) % c);
    out[i] = (static_cast<float>(bytes[i]) / 255.0f - norm.mean[ch]) / norm.std[ch];
  }
  return t;
}

std::shared_ptr<TensorDataset> make_synthetic(int64_t n, const Shape& sample_shape, int num_classes,
                                              uint64_t seed, uint64_t split) {
  if (n <= 0 || sample_shape.ndim() != 3 || num_classes < 1)
    throw std::invalid_argument(fmt::format(
        "synthetic: expected n > 0 and a (C, H, W) shape, got {} and {}", n, sample_shape.str()));
  Generator gen(seed);
  const int64_t per = sample_shape.numel();
  std::vector<float> templates(static_cast<size_t>(per * num_classes));
  for (float& v : templates) v = gen.normal();
  gen = Generator(seed * 0x9e3779b97f4a7c15ull + split + 1);
  Tensor images = Tensor::empty(Shape{n, sample_shape[0], sample_shape[1], sample_shape[2]});
  std::vector<int32_t> labels(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const auto label = static_cast<int32_t>(gen.below(static_cast<uint64_t>(num_classes)));
    labels[static_cast<size_t>(i)] = label;
    const float* tmpl = templates.data() + label * per;
    float* out = images.data() + i * per;
    for (int64_t j = 0; j < per; ++j) out[j] = tmpl[j] + gen.normal();
  }
  return std::make_shared<TensorDataset>(images, std::move(labels), num_classes);
}

}  // namespace chorus
