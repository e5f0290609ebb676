// File readers: IDX (MNIST / Fashion-MNIST, plain or gzip) and CIFAR-10 binary batches.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <zlib.h>

#include <filesystem>
#include <stdexcept>

#include "ddp/data/dataset.h"

namespace chorus {

namespace {

// Whole file through zlib, which reads gzip and passes plain files through unchanged.
std::vector<uint8_t> read_all(const std::string& path) {
  if (!std::filesystem::exists(path))
    throw std::runtime_error(fmt::format("data: {}: file not found", path));
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) throw std::runtime_error(fmt::format("data: {}: cannot open", path));
  std::vector<uint8_t> out;
  std::vector<uint8_t> chunk(1 << 20);
  for (;;) {
    const int got = gzread(f, chunk.data(), static_cast<unsigned>(chunk.size()));
    if (got < 0) {
      int err = 0;
      std::string msg = gzerror(f, &err);
      gzclose(f);
      throw std::runtime_error(fmt::format("data: {}: corrupt compressed data after {} bytes: {}",
                                           path, out.size(), msg));
    }
    if (got == 0) break;
    out.insert(out.end(), chunk.begin(), chunk.begin() + got);
  }
  int err = 0;
  const char* msg = gzerror(f, &err);
  if (err != Z_OK && err != Z_STREAM_END) {
    std::string m = msg;
    gzclose(f);
    throw std::runtime_error(
        fmt::format("data: {}: corrupt compressed data after {} bytes: {}", path, out.size(), m));
  }
  gzclose(f);
  return out;
}

uint32_t big_endian(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

std::string find_idx(const std::string& dir, const std::string& name) {
  const std::string plain = dir + "/" + name;
  if (std::filesystem::exists(plain)) return plain;
  if (std::filesystem::exists(plain + ".gz")) return plain + ".gz";
  throw std::runtime_error(fmt::format("data: {}: file not found (nor {}.gz)", plain, plain));
}

}  // namespace

IdxArray parse_idx(const uint8_t* data, size_t size, const std::string& path, int expected_ndim) {
  if (size < 4)
    throw std::runtime_error(
        fmt::format("idx: {}: expected at least a 4-byte header, got {} bytes", path, size));
  const uint32_t magic = big_endian(data);
  const uint32_t expected_magic = 0x0800u | static_cast<uint32_t>(expected_ndim);
  if (magic != expected_magic)
    throw std::runtime_error(fmt::format(
        "idx: {}: expected magic number 0x{:08x} (unsigned bytes, {} dims), got 0x{:08x}", path,
        expected_magic, expected_ndim, magic));
  const size_t header = 4 + 4 * static_cast<size_t>(expected_ndim);
  if (size < header)
    throw std::runtime_error(
        fmt::format("idx: {}: expected a {}-byte header, got {} bytes", path, header, size));
  IdxArray a;
  uint64_t payload = 1;
  bool overflow = false;
  for (int d = 0; d < expected_ndim; ++d) {
    a.dims.push_back(big_endian(data + 4 + 4 * d));
    overflow |= __builtin_mul_overflow(payload, static_cast<uint64_t>(a.dims.back()), &payload);
  }
  if (overflow)
    throw std::runtime_error(
        fmt::format("idx: {}: dimensions {} multiply past 2^64 bytes (the file has {})", path,
                    fmt::join(a.dims, " x "), size));
  if (size - header != payload)
    throw std::runtime_error(fmt::format(
        "idx: {}: expected {} bytes ({}-byte header + {} data for dims {}), got {} ({})", path,
        header + payload, header, payload, fmt::join(a.dims, " x "), size,
        size - header < payload ? "truncated" : "trailing bytes"));
  a.bytes.assign(data + header, data + size);
  return a;
}

IdxArray read_idx_file(const std::string& path, int expected_ndim) {
  const std::vector<uint8_t> raw = read_all(path);
  return parse_idx(raw.data(), raw.size(), path, expected_ndim);
}

std::shared_ptr<TensorDataset> mnist_from_idx(const IdxArray& images, const std::string& image_path,
                                              const IdxArray& labels, const std::string& label_path,
                                              const Normalize& norm) {
  static const char* const kImageDims[] = {"images", "rows", "columns"};
  if (images.dims.size() != 3 || labels.dims.size() != 1)
    throw std::runtime_error(
        fmt::format("idx: {}: expected 3 image dims and 1 label dim, got {} and {}", image_path,
                    images.dims.size(), labels.dims.size()));
  for (size_t d = 0; d < 3; ++d)
    if (images.dims[d] < 1)
      throw std::runtime_error(fmt::format("idx: {}: dimension {} ({}) is {}, expected >= 1",
                                           image_path, d, kImageDims[d], images.dims[d]));
  if (images.dims[0] != labels.dims[0])
    throw std::runtime_error(fmt::format("idx: {}: expected {} labels to match {}, got {}",
                                         label_path, images.dims[0], image_path, labels.dims[0]));
  std::vector<int32_t> y(labels.bytes.begin(), labels.bytes.end());
  for (size_t i = 0; i < y.size(); ++i)
    if (y[i] > 9)
      throw std::runtime_error(
          fmt::format("idx: {}: expected labels 0..9, got {} at index {}", label_path, y[i], i));
  const Shape shape{images.dims[0], 1, images.dims[1], images.dims[2]};
  auto ds = std::make_shared<TensorDataset>(normalise_bytes(images.bytes.data(), shape, norm),
                                            std::move(y), 10);
  ds->set_origin(image_path);
  return ds;
}

std::shared_ptr<TensorDataset> load_mnist_dir(const std::string& dir, bool train,
                                              const Normalize& norm) {
  const std::string prefix = train ? "train" : "t10k";
  const std::string image_path = find_idx(dir, prefix + "-images-idx3-ubyte");
  const std::string label_path = find_idx(dir, prefix + "-labels-idx1-ubyte");
  return mnist_from_idx(read_idx_file(image_path, 3), image_path, read_idx_file(label_path, 1),
                        label_path, norm);
}

void parse_cifar10(const uint8_t* data, size_t size, const std::string& path,
                   std::vector<uint8_t>* pixels, std::vector<int32_t>* labels) {
  if (size == 0 || size % kCifarRecord != 0)
    throw std::runtime_error(fmt::format(
        "cifar10: {}: expected a non-zero multiple of {} bytes (10000 records = {}), got {} bytes",
        path, kCifarRecord, 10000 * kCifarRecord, size));
  for (size_t r = 0; r < size / kCifarRecord; ++r) {
    const uint8_t* rec = data + r * kCifarRecord;
    if (rec[0] > 9)
      throw std::runtime_error(
          fmt::format("cifar10: {}: expected labels 0..9, got {} in record {}", path, rec[0], r));
    labels->push_back(rec[0]);
    pixels->insert(pixels->end(), rec + 1, rec + kCifarRecord);
  }
}

std::shared_ptr<TensorDataset> load_cifar10_files(const std::vector<std::string>& files,
                                                  const Normalize& norm) {
  std::vector<uint8_t> pixels;
  std::vector<int32_t> labels;
  for (const std::string& path : files) {
    const std::vector<uint8_t> raw = read_all(path);
    parse_cifar10(raw.data(), raw.size(), path, &pixels, &labels);
  }
  if (labels.empty()) throw std::runtime_error("cifar10: expected at least one file, got none");
  const Shape shape{static_cast<int64_t>(labels.size()), 3, 32, 32};
  auto ds = std::make_shared<TensorDataset>(normalise_bytes(pixels.data(), shape, norm),
                                            std::move(labels), 10);
  ds->set_origin(fmt::format("{}", fmt::join(files, ", ")));
  return ds;
}

std::shared_ptr<TensorDataset> load_cifar10_dir(const std::string& dir, bool train,
                                                const Normalize& norm) {
  std::vector<std::string> files;
  if (train) {
    for (int i = 1; i <= 5; ++i) files.push_back(fmt::format("{}/data_batch_{}.bin", dir, i));
  } else {
    files.push_back(dir + "/test_batch.bin");
  }
  return load_cifar10_files(files, norm);
}

}  // namespace chorus
