// Crafted files from outside: IDX and CIFAR-10 data, safetensors, snapshot records, and files
// planted where an atomic write puts its temp file. Each is refused with an error naming the file
// and the field -- never a crash (the 16-byte IDX file below once segfaulted on its first
// sample), never a read outside the snapshot directory, never a write through a planted link.
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "ddp/data/dataset.h"
#include "ddp/nn/modules.h"
#include "ddp/nn/optim.h"
#include "ddp/train/checkpoint.h"

using namespace chorus;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

struct TempDir {
  fs::path path;
  TempDir() {
    char p[] = "/tmp/chorus-crafted-XXXXXX";
    REQUIRE(mkdtemp(p) != nullptr);
    path = p;
  }
  ~TempDir() { fs::remove_all(path); }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

void put_be32(std::string& v, uint32_t x) {
  for (int s = 24; s >= 0; s -= 8) v.push_back(static_cast<char>(x >> s));
}

void write(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary);
  f << bytes;
}

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string idx_header(uint32_t magic, std::vector<uint32_t> dims) {
  std::string v;
  put_be32(v, magic);
  for (uint32_t d : dims) put_be32(v, d);
  return v;
}

std::string idx_labels(uint32_t n) {
  std::string v = idx_header(0x801, {n});
  for (uint32_t i = 0; i < n; ++i) v.push_back(static_cast<char>(i % 10));
  return v;
}

// Runs fn in a child process: a crash there fails this test with the signal instead of ending
// the whole binary. The child's exit code is fn's result (0: as expected).
int in_child(const std::function<int()>& fn) {
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    int rc = 1;
    try {
      rc = fn();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "unexpected exception: %s\n", e.what());
    }
    std::fflush(nullptr);
    _exit(rc);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
}

// 0 when f throws std::exception whose message holds every part; prints what happened.
int throws_with(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
  } catch (const std::exception& e) {
    const std::string what = e.what();
    for (const std::string& p : parts)
      if (what.find(p) == std::string::npos)
        return std::fprintf(stderr, "message \"%s\" lacks \"%s\"\n", what.c_str(), p.c_str()), 2;
    return 0;
  }
  return std::fprintf(stderr, "no error\n"), 3;
}

std::string safetensors_with_header(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i)
    out[static_cast<size_t>(i)] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  return out + header + data;
}

}  // namespace

TEST_CASE("idx: dimensions whose product wraps are refused, naming the file",
          "[adversarial][files]") {
  TempDir d;
  // 8 x 2^30 x 2^31 = 2^64 wraps to 0, so 16 bytes "match" a payload of 0 bytes.
  const std::string images = d.file("train-images-idx3-ubyte");
  write(images, idx_header(0x803, {8, 1u << 30, 1u << 31}));
  write(d.file("train-labels-idx1-ubyte"), idx_labels(8));
  const int rc = in_child([&] {
    return throws_with(
        [&] {
          auto ds = load_mnist_dir(d.path.string(), true);
          std::vector<float> sample(1 << 20);
          ds->get(0, sample.data());  // used to segfault here
        },
        {"idx: " + images + ": dimensions 8 x 1073741824 x 2147483648 multiply past 2^64 bytes"});
  });
  CHECK(rc == 0);
}

TEST_CASE("idx: empty dimensions are refused, naming the file and the dimension",
          "[adversarial][files]") {
  TempDir d;
  const std::string images = d.file("train-images-idx3-ubyte");
  // 0 images of 2^31 x 2^31: no bytes, but the sample shape would overflow.
  write(images, idx_header(0x803, {0, 1u << 31, 1u << 31}));
  write(d.file("train-labels-idx1-ubyte"), idx_labels(0));
  CHECK(in_child([&] {
          return throws_with([&] { load_mnist_dir(d.path.string(), true); },
                             {"idx: " + images + ": dimension 0 (images) is 0, expected >= 1"});
        }) == 0);
  write(images, idx_header(0x803, {2, 3, 0}));
  write(d.file("train-labels-idx1-ubyte"), idx_labels(2));
  CHECK(in_child([&] {
          return throws_with([&] { load_mnist_dir(d.path.string(), true); },
                             {"idx: " + images + ": dimension 2 (columns) is 0"});
        }) == 0);
}

TEST_CASE("cifar10: crafted batches are refused, naming the file", "[adversarial][files]") {
  TempDir d;
  const std::string f = d.file("data_batch_1.bin");
  std::string rec(kCifarRecord, '\x01');
  write(f, rec + rec.substr(0, 100));
  CHECK(throws_with([&] { load_cifar10_files({f}); },
                    {"cifar10: " + f + ": expected a non-zero multiple of 3073"}) == 0);
  rec[0] = static_cast<char>(200);
  write(f, rec);
  CHECK(throws_with([&] { load_cifar10_files({f}); },
                    {"cifar10: " + f + ": expected labels 0..9, got 200 in record 0"}) == 0);
  write(f, "");
  CHECK(throws_with([&] { load_cifar10_files({f}); }, {"cifar10: " + f, "got 0 bytes"}) == 0);
}

TEST_CASE("safetensors: impossible shapes are refused, naming the file, the tensor and the field",
          "[adversarial][files]") {
  TempDir d;
  const std::string f = d.file("x.safetensors");
  struct Crafted {
    std::string header, data;
    std::vector<std::string> parts;
  };
  const std::vector<Crafted> cases = {
      // 2^62 x 4 elements wrap to 0: once accepted with no data at all.
      {R"({"w":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,0]}})",
       "",
       {"tensor w: field shape: shape (4611686018427387904, 4): more than"}},
      // (-2) x (-2) = 4 elements: once accepted with 16 bytes of data.
      {R"({"w":{"dtype":"F32","shape":[-2,-2],"data_offsets":[0,16]}})",
       std::string(16, '\0'),
       {"tensor w: field shape: shape (-2, -2): dimension 0 is -2, expected >= 0"}},
      {R"({"w":{"dtype":"F32","shape":[18446744073709551615],"data_offsets":[0,0]}})",
       "",
       {"tensor w: field shape: dimension 18446744073709551615 is larger than 2^63"}},
      {R"({"w":{"dtype":"F32","shape":[1,1,1,1,1,1,1],"data_offsets":[0,4]}})",
       std::string(4, '\0'),
       {"tensor w: field shape: has 7 dims, expected at most 6"}},
      {R"({"w":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})",
       std::string(8, '\0'),
       {"tensor w: field shape: holds 2.5, expected integers"}},
      {R"({"w":{"dtype":"F32","shape":[[[[1]]]],"data_offsets":[0,4]}})",
       std::string(4, '\0'),
       {"tensor w: field shape: holds an array of 1, expected integers"}},
      {R"({"w":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})",
       std::string(8, '\0'),
       {"tensor w: field dtype: is \"I64\", expected \"F32\""}},
      {R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8000000000]}})",
       std::string(8, '\0'),
       {"tensor w: field data_offsets: [0, 8000000000] is outside the data (8 bytes)"}},
      {R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[-8,0]}})",
       std::string(8, '\0'),
       {"tensor w: field data_offsets: is [-8,0], expected [begin, end]"}},
      // Two tensors over the same bytes: each would be allocated in full.
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
       std::string(8, '\0'),
       {"field data_offsets: starts at 0, expected 8 (tensors must tile the data"}},
      {R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
       std::string(12, '\0'),
       {"data: is 12 bytes, the tensors cover 4"}},
      {R"({"w":{"dtype":"F32","shape":[1]}})",
       std::string(4, '\0'),
       {"tensor w: field data_offsets is missing"}},
      {R"({"w":7})", "", {"tensor w: is 7, expected an object"}},
      {R"([1,2,3])", "", {"header: is [1,2,3], expected a JSON object"}},
      {R"({"__metadata__":{"k":5}})", "", {"field __metadata__.k: is 5, expected a string"}},
  };
  for (const Crafted& c : cases) {
    write(f, safetensors_with_header(c.header, c.data));
    INFO(c.header);
    std::vector<std::string> parts = c.parts;
    parts.push_back("checkpoint: " + f + ": ");
    CHECK(in_child([&] { return throws_with([&] { read_safetensors(f); }, parts); }) == 0);
  }
  // Deep nesting is refused without recursion trouble.
  write(f, safetensors_with_header(R"({"w":{"dtype":"F32","shape":)" + std::string(100000, '[') +
                                       std::string(100000, ']') + R"(,"data_offsets":[0,4]}})",
                                   std::string(4, '\0')));
  CHECK(in_child([&] { return throws_with([&] { read_safetensors(f); }, {"checkpoint: " + f}); }) ==
        0);
}

namespace {

// A valid snapshot in dir; returns its record's path.
std::string good_snapshot(const std::string& dir) {
  Net net(1, 16, 1);
  Sgd opt(net.parameters(), {.lr = 0.1f});
  TrainState st;
  st.global_step = 7;
  st.batch_size = 4;
  return write_snapshot(dir, net, opt, st);
}

}  // namespace

TEST_CASE("snapshot records: the tensor file must sit beside the record", "[adversarial][files]") {
  TempDir d;
  fs::create_directories(d.path / "run");
  const std::string record = good_snapshot((d.path / "run").string());
  const json good = json::parse(slurp(record));
  // A copy of the real tensor file outside the snapshot directory, with the right size and hash.
  const std::string inside = (d.path / "run" / good["tensors"].get<std::string>()).string();
  fs::copy_file(inside, d.path / "outside.safetensors");
  for (const std::string& name :
       {std::string("../outside.safetensors"), (d.path / "outside.safetensors").string(),
        std::string("sub/x.safetensors"), std::string(".."), std::string(""),
        std::string("snapshot.json")}) {
    json j = good;
    j["tensors"] = name;
    write(record, j.dump());
    INFO(name);
    CHECK(throws_with([&] { read_snapshot(record); },
                      {"checkpoint: " + record + ": field tensors: is \"" + name +
                       "\", expected a file name"}) == 0);
  }
}

TEST_CASE("snapshot records: every field is checked, naming the file and the field",
          "[adversarial][files]") {
  TempDir d;
  const std::string record = good_snapshot(d.path.string());
  const json good = json::parse(slurp(record));
  struct Change {
    std::string field;
    json value;
    std::string expect;
  };
  const std::vector<Change> changes = {
      {"epoch", 0, "field epoch: is 0, expected an integer in 1.."},
      {"step_in_epoch", -1, "field step_in_epoch: is -1"},
      {"global_step", "7", "field global_step: is \"7\""},
      {"world_size", 0, "field world_size: is 0, expected an integer in 1..65536"},
      {"world_size", 1u << 31, "field world_size: is 2147483648"},
      {"batch_size", 1.5, "field batch_size: is 1.5"},
      {"lr", "fast", "field lr: is \"fast\", expected a finite number >= 0"},
      {"lr", -0.1, "field lr: is -0.1"},
      {"tensors_bytes", -5, "field tensors_bytes: is -5"},
      {"tensors_fnv1a64", "xyz",
       "field tensors_fnv1a64: is \"xyz\", expected 16 lower-case hex digits"},
      {"sampler", json::object(), "field sampler: field seed: is missing"},
      {"format", "other", "field format: is \"other\", expected \"chorus-snapshot-1\""},
  };
  for (const Change& c : changes) {
    json j = good;
    j[c.field] = c.value;
    write(record, j.dump());
    INFO(c.field << " = " << c.value.dump());
    CHECK(throws_with([&] { read_snapshot(record); },
                      {"checkpoint: " + record + ": " + c.expect}) == 0);
  }
  json j = good;
  j.erase("lr");
  write(record, j.dump());
  CHECK(throws_with([&] { read_snapshot(record); },
                    {"checkpoint: " + record + ": field lr: is missing"}) == 0);
  write(record, "[]");
  CHECK(throws_with([&] { read_snapshot(record); }, {"checkpoint: " + record + ": field format"}) ==
        0);
}

TEST_CASE("atomic writes never write through a file or link planted at the temp name",
          "[adversarial][files]") {
  TempDir d;
  const std::string target = d.file("snapshot.json");
  const std::string victim = d.file("victim");
  write(victim, "precious");
  // The old temp name was predictable: <path>.tmp.<pid>. Plant a link there, and a file.
  const std::string planted_link = target + ".tmp." + std::to_string(::getpid());
  REQUIRE(::symlink(victim.c_str(), planted_link.c_str()) == 0);
  write_file_atomic(target, "new contents");
  CHECK(slurp(victim) == "precious");
  CHECK(slurp(target) == "new contents");
  CHECK(fs::is_symlink(planted_link));
  fs::remove(planted_link);
  write(planted_link, "planted");
  write_file_atomic(target, "newer contents");
  CHECK(slurp(planted_link) == "planted");
  CHECK(slurp(target) == "newer contents");
  // Nothing is left behind but the planted file.
  int files = 0;
  for (auto& e : fs::directory_iterator(d.path))
    files += e.path().string().find(".tmp.") != std::string::npos;
  CHECK(files == 1);
}

TEST_CASE("train_cnn names the data file whose images it cannot use", "[adversarial][files]") {
  const char* exe = std::getenv("TRAIN_CNN");
  if (!exe) {
    std::printf("skipped: TRAIN_CNN is not set (train_cnn is built only with CLI11)\n");
    return;
  }
  TempDir d;
  for (const char* split : {"train", "t10k"}) {
    std::string img = idx_header(0x803, {4, 8, 8});
    img += std::string(4 * 8 * 8, '\x10');
    write(d.file(std::string(split) + "-images-idx3-ubyte"), img);
    write(d.file(std::string(split) + "-labels-idx1-ubyte"), idx_labels(4));
  }
  const std::string cmd =
      std::string(exe) + " --data mnist:" + d.path.string() + " --no-progress 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  std::string out;
  char buf[512];
  while (std::fgets(buf, sizeof buf, p)) out += buf;
  const int status = ::pclose(p);
  INFO(out);
  CHECK(WEXITSTATUS(status) != 0);
  CHECK_THAT(out, Catch::Contains("train_cnn: " + d.file("train-images-idx3-ubyte") +
                                  ": expected square images of side >= 16, got (1, 8, 8)"));
}
