// Data sets: the Dataset interface, an in-memory TensorDataset, per-channel normalisation, and the
// readers (Fashion-MNIST/MNIST IDX, CIFAR-10 binary) and a synthetic generator that build one.
//
// Readers load the whole file and check it before use: a missing file, a wrong magic number, a
// size that disagrees with the header, or a label out of range throws std::runtime_error naming
// the file and what was expected and found. Nothing is ever read partially.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ddp/tensor/tensor.h"

namespace chorus {

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  virtual Shape sample_shape() const = 0;  // (C, H, W)
  virtual int num_classes() const = 0;
  // Copies sample i (sample_shape().numel() floats) to out and returns its label; throws
  // std::out_of_range for an i outside 0..size()-1.
  virtual int32_t get(int64_t i, float* out) const = 0;
  // Where the samples came from, for messages: the file(s) read, or "" when not from files.
  virtual std::string origin() const { return {}; }
};

// Samples held in memory as normalised f32, (N, C, H, W), with int32 labels.
class TensorDataset : public Dataset {
 public:
  TensorDataset(Tensor images, std::vector<int32_t> labels, int num_classes);
  int64_t size() const override { return images_.dim(0); }
  Shape sample_shape() const override;
  int num_classes() const override { return num_classes_; }
  int32_t get(int64_t i, float* out) const override;
  std::string origin() const override { return origin_; }
  void set_origin(std::string origin) { origin_ = std::move(origin); }
  const Tensor& images() const { return images_; }
  const std::vector<int32_t>& labels() const { return labels_; }

 private:
  Tensor images_;
  std::vector<int32_t> labels_;
  int num_classes_;
  std::string origin_;
};

// x = (byte / 255 - mean[c]) / std[c], per channel, evaluated in f32 like torchvision's
// ToTensor + Normalize. The tutorial uses mean 0.5 and std 0.5 for every channel.
struct Normalize {
  std::vector<float> mean{0.5f};
  std::vector<float> std{0.5f};
};

// bytes (N, C, H, W) -> normalised f32 tensor of that shape; throws on a mean/std count that is
// neither 1 nor C.
Tensor normalise_bytes(const uint8_t* bytes, const Shape& shape, const Normalize& norm);

// Raw IDX array (the MNIST format): dims from the header and the unsigned-byte payload.
struct IdxArray {
  std::vector<int64_t> dims;
  std::vector<uint8_t> bytes;
};
// Reads plain or gzip files (detected by content). expected_ndim: 1 for labels, 3 for images.
IdxArray read_idx_file(const std::string& path, int expected_ndim);
// The same from bytes in memory; `path` names them in messages. The product of the dims must
// not overflow and must equal the payload's size.
IdxArray parse_idx(const uint8_t* data, size_t size, const std::string& path, int expected_ndim);
// Images (N, rows, columns) and labels (N) -> the data set; every dim >= 1, labels 0..9.
std::shared_ptr<TensorDataset> mnist_from_idx(const IdxArray& images, const std::string& image_path,
                                              const IdxArray& labels, const std::string& label_path,
                                              const Normalize& norm = {});

// Fashion-MNIST / MNIST from dir: {train,t10k}-{images-idx3,labels-idx1}-ubyte, with or without
// .gz.
std::shared_ptr<TensorDataset> load_mnist_dir(const std::string& dir, bool train,
                                              const Normalize& norm = {});
// The default data: Debian's dataset-fashion-mnist.
constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";

// CIFAR-10 binary: data_batch_1..5.bin (train) or test_batch.bin; each record is 1 label byte +
// 3072 pixel bytes (3x32x32).
std::shared_ptr<TensorDataset> load_cifar10_dir(const std::string& dir, bool train,
                                                const Normalize& norm = {});
std::shared_ptr<TensorDataset> load_cifar10_files(const std::vector<std::string>& files,
                                                  const Normalize& norm = {});
constexpr size_t kCifarRecord = 1 + 3 * 32 * 32;
// Appends the records of one batch in memory (`path` names it in messages) to pixels and labels.
void parse_cifar10(const uint8_t* data, size_t size, const std::string& path,
                   std::vector<uint8_t>* pixels, std::vector<int32_t>* labels);

// A learnable synthetic set: class k has a fixed random template (drawn from seed); a sample is its
// class template plus unit Gaussian noise (drawn from seed and split, so split 0 = train and
// split 1 = test share templates but no samples). Same arguments -> same data.
std::shared_ptr<TensorDataset> make_synthetic(int64_t n, const Shape& sample_shape, int num_classes,
                                              uint64_t seed, uint64_t split = 0);

}  // namespace chorus
