// Data readers on small generated files (plain, gzip, truncated, corrupt) and the DataLoader.
#include <zlib.h>
#include <catch2/catch.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "ddp/data/data_loader.h"
#include "ddp/data/dataset.h"

using namespace chorus;
namespace fs = std::filesystem;

namespace {

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() /
           ("chorus_test_data_" + std::to_string(::getpid()) + "_" + std::to_string(counter()++));
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string file(const std::string& name) const { return (path / name).string(); }
  static int& counter() {
    static int c = 0;
    return c;
  }
};

void put_be32(std::vector<uint8_t>& v, uint32_t x) {
  for (int s = 24; s >= 0; s -= 8) v.push_back(static_cast<uint8_t>(x >> s));
}

std::vector<uint8_t> idx_images(uint32_t n, uint32_t h, uint32_t w) {
  std::vector<uint8_t> v;
  put_be32(v, 0x00000803);
  put_be32(v, n), put_be32(v, h), put_be32(v, w);
  for (uint32_t i = 0; i < n * h * w; ++i) v.push_back(static_cast<uint8_t>(i % 256));
  return v;
}

std::vector<uint8_t> idx_labels(uint32_t n) {
  std::vector<uint8_t> v;
  put_be32(v, 0x00000801);
  put_be32(v, n);
  for (uint32_t i = 0; i < n; ++i) v.push_back(static_cast<uint8_t>(i % 10));
  return v;
}

void write_file(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

void write_gz(const std::string& path, const std::vector<uint8_t>& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
  gzclose(f);
}

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
}

void write_mnist(const TempDir& d, bool gz, uint32_t n = 5) {
  auto put = gz ? write_gz : write_file;
  const std::string ext = gz ? ".gz" : "";
  put(d.file("train-images-idx3-ubyte" + ext), idx_images(n, 4, 3));
  put(d.file("train-labels-idx1-ubyte" + ext), idx_labels(n));
}

}  // namespace

TEST_CASE("idx: plain and gzip files load with the tutorial normalisation", "[data]") {
  for (bool gz : {false, true}) {
    TempDir d;
    write_mnist(d, gz);
    auto ds = load_mnist_dir(d.path.string(), true);
    CHECK(ds->size() == 5);
    CHECK(ds->sample_shape() == Shape{1, 4, 3});
    std::vector<float> x(12);
    CHECK(ds->get(3, x.data()) == 3);
    CHECK(x[0] == Approx((36.0f / 255.0f - 0.5f) / 0.5f));  // byte 36 = 3 * 12
    CHECK(ds->images().data()[0] == -1.0f);
  }
}

TEST_CASE("idx: missing, truncated, trailing, wrong magic, corrupt gzip and bad labels are errors",
          "[data]") {
  TempDir d;
  CHECK_THROWS_WITH(load_mnist_dir(d.path.string(), true),
                    Catch::Contains("train-images-idx3-ubyte: file not found"));
  const std::string img = d.file("train-images-idx3-ubyte");
  auto good = idx_images(5, 4, 3);

  auto truncated = good;
  truncated.resize(good.size() - 7);
  write_file(img, truncated);
  CHECK_THROWS_WITH(
      read_idx_file(img, 3),
      "idx: " + img +
          ": expected 76 bytes (16-byte header + 60 data for dims 5 x 4 x 3), got 69 (truncated)");
  auto trailing = good;
  trailing.push_back(0);
  write_file(img, trailing);
  CHECK_THROWS_WITH(read_idx_file(img, 3), Catch::Contains("got 77 (trailing bytes)"));

  auto bad_magic = good;
  bad_magic[2] = 0x0d;  // float data
  write_file(img, bad_magic);
  CHECK_THROWS_WITH(
      read_idx_file(img, 3),
      Catch::Contains("expected magic number 0x00000803 (unsigned bytes, 3 dims), got 0x00000d03"));
  write_file(img, {0, 0});
  CHECK_THROWS_WITH(read_idx_file(img, 3),
                    Catch::Contains("expected at least a 4-byte header, got 2 bytes"));

  // gzip: cut the compressed stream short, and flip bytes inside it
  const std::string gz = d.file("x.gz");
  write_gz(gz, idx_images(50, 28, 28));
  auto compressed = read_bytes(gz);
  auto cut = compressed;
  cut.resize(compressed.size() / 2);
  write_file(gz, cut);
  CHECK_THROWS_WITH(read_idx_file(gz, 3), Catch::Contains(gz));
  auto flipped = compressed;
  for (size_t i = 20; i < 60 && i < flipped.size(); ++i) flipped[i] ^= 0x5a;
  write_file(gz, flipped);
  CHECK_THROWS_WITH(read_idx_file(gz, 3), Catch::Contains(gz));

  // labels: count mismatch and out of range
  write_file(img, good);
  write_file(d.file("train-labels-idx1-ubyte"), idx_labels(4));
  CHECK_THROWS_WITH(load_mnist_dir(d.path.string(), true),
                    Catch::Contains("expected 5 labels to match"));
  auto labels = idx_labels(5);
  labels.back() = 12;
  write_file(d.file("train-labels-idx1-ubyte"), labels);
  CHECK_THROWS_WITH(load_mnist_dir(d.path.string(), true),
                    Catch::Contains("expected labels 0..9, got 12 at index 4"));
}

TEST_CASE("cifar10: records load; bad sizes and labels are errors", "[data]") {
  TempDir d;
  std::vector<uint8_t> rec;
  for (int r = 0; r < 3; ++r) {
    rec.push_back(static_cast<uint8_t>(r + 7));
    for (int i = 0; i < 3072; ++i) rec.push_back(static_cast<uint8_t>(i < 1024 ? 0 : 255));
  }
  write_file(d.file("test_batch.bin"), rec);
  auto ds =
      load_cifar10_dir(d.path.string(), false, Normalize{{0.5f, 0.4f, 0.3f}, {0.5f, 0.5f, 0.5f}});
  CHECK(ds->size() == 3);
  CHECK(ds->labels() == std::vector<int32_t>{7, 8, 9});
  std::vector<float> x(3072);
  ds->get(1, x.data());
  CHECK(x[0] == -1.0f);                            // channel 0: (0 - 0.5) / 0.5
  CHECK(x[1024] == Approx((1.0f - 0.4f) / 0.5f));  // channel 1
  CHECK(x[2048] == Approx((1.0f - 0.3f) / 0.5f));  // channel 2
  CHECK_THROWS_WITH(load_cifar10_dir(d.path.string(), true),
                    Catch::Contains("data_batch_1.bin: file not found"));
  auto partial = rec;
  partial.resize(rec.size() - 5);
  write_file(d.file("test_batch.bin"), partial);
  CHECK_THROWS_WITH(
      load_cifar10_dir(d.path.string(), false),
      Catch::Contains(
          "expected a non-zero multiple of 3073 bytes (10000 records = 30730000), got 9214 bytes"));
  rec[3073] = 10;
  write_file(d.file("test_batch.bin"), rec);
  CHECK_THROWS_WITH(load_cifar10_dir(d.path.string(), false),
                    Catch::Contains("expected labels 0..9, got 10 in record 1"));
}

TEST_CASE("data loader: every sample once per epoch, seeded order, drop_last, prefetch", "[data]") {
  auto ds = make_synthetic(103, Shape{1, 2, 2}, 10, 5);
  auto epoch_batches = [&](LoaderOptions o, int64_t epoch) {
    DataLoader dl(ds, o);
    dl.begin_epoch(epoch);
    std::vector<Batch> out;
    Batch b;
    while (dl.next(b)) out.push_back(b);
    CHECK(static_cast<int64_t>(out.size()) == dl.batches_per_epoch());
    return out;
  };
  LoaderOptions o;
  o.batch_size = 10;
  o.seed = 3;
  auto a = epoch_batches(o, 0);
  REQUIRE(a.size() == 11);
  CHECK(a.back().size() == 3);
  std::multiset<float> seen;
  for (auto& b : a)
    for (int64_t i = 0; i < b.size(); ++i) seen.insert(b.images.data()[i * 4]);
  std::multiset<float> all;
  for (int64_t i = 0; i < 103; ++i) all.insert(ds->images().data()[i * 4]);
  CHECK(seen == all);

  auto again = epoch_batches(o, 0);
  auto next_epoch = epoch_batches(o, 1);
  CHECK(again[0].images.to_vector() == a[0].images.to_vector());
  CHECK(next_epoch[0].images.to_vector() != a[0].images.to_vector());
  LoaderOptions sync = o;
  sync.prefetch = 0;
  auto s = epoch_batches(sync, 0);
  for (size_t i = 0; i < a.size(); ++i) CHECK(s[i].labels == a[i].labels);
  LoaderOptions drop = o;
  drop.drop_last = true;
  CHECK(epoch_batches(drop, 0).size() == 10);
  // stopping early joins the prefetch thread cleanly
  DataLoader dl(ds, o);
  dl.begin_epoch(0);
  Batch b;
  CHECK(dl.next(b));
  dl.end_epoch();
}

TEST_CASE("idx from memory: overflowing and empty dimensions name the file and the field",
          "[data]") {
  std::vector<uint8_t> wrap;
  put_be32(wrap, 0x803);
  for (uint32_t d : {8u, 1u << 30, 1u << 31}) put_be32(wrap, d);
  CHECK_THROWS_WITH(parse_idx(wrap.data(), wrap.size(), "crafted", 3),
                    "idx: crafted: dimensions 8 x 1073741824 x 2147483648 multiply past 2^64 bytes "
                    "(the file has 16)");
  auto images = parse_idx(idx_images(2, 0, 3).data(), 16, "imgs", 3);
  auto labels = idx_labels(2);
  CHECK_THROWS_WITH(
      mnist_from_idx(images, "imgs", parse_idx(labels.data(), labels.size(), "lbls", 1), "lbls"),
      "idx: imgs: dimension 1 (rows) is 0, expected >= 1");
  auto good = idx_images(2, 4, 3);
  auto ds = mnist_from_idx(parse_idx(good.data(), good.size(), "imgs", 3), "imgs",
                           parse_idx(labels.data(), labels.size(), "lbls", 1), "lbls");
  CHECK(ds->size() == 2);
  CHECK(ds->origin() == "imgs");
}

TEST_CASE("dataset: a sample outside 0..size-1 is an error, not a read past the end", "[data]") {
  auto ds = make_synthetic(3, Shape{1, 2, 2}, 2, 7);
  std::vector<float> x(4);
  CHECK_NOTHROW(ds->get(2, x.data()));
  CHECK_THROWS_WITH(ds->get(3, x.data()), "dataset: sample 3 is outside 0..2");
  CHECK_THROWS_AS(ds->get(-1, x.data()), std::out_of_range);
}
