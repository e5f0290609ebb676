// Checkpoints: safetensors layout, snapshot round trip, corrupt and partial files.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <fmt/format.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "ddp/nn/modules.h"
#include "ddp/nn/optim.h"
#include "ddp/ops/ops.h"
#include "ddp/train/checkpoint.h"
#include "fake_gpus.h"

using namespace chorus;
namespace fs = std::filesystem;

namespace {

std::string temp_dir() {
  char path[] = "/tmp/chorus-ckpt-XXXXXX";
  REQUIRE(mkdtemp(path) != nullptr);
  return path;
}

std::string slurp(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void one_step(Net& net, Sgd& opt) {
  Tensor x = Tensor::full(Shape{2, 1, 16, 16}, 0.3f);
  opt.zero_grad();
  cross_entropy(net.forward(x), std::vector<int32_t>{1, 2}).backward();
  opt.step();
}

}  // namespace

TEST_CASE("safetensors files follow the format", "[checkpoint]") {
  const std::string dir = temp_dir();
  const std::string p = dir + "/t.safetensors";
  write_safetensors(
      p, {{"a", Tensor::from(Shape{2, 2}, {1, 2, 3, 4})}, {"b", Tensor::from(Shape{3}, {5, 6, 7})}},
      {{"k", "v"}});
  const std::string bytes = slurp(p);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);  // little-endian host
  auto header = nlohmann::json::parse(bytes.substr(8, n));
  CHECK(header["a"]["dtype"] == "F32");
  CHECK(header["a"]["shape"] == nlohmann::json({2, 2}));
  CHECK(header["a"]["data_offsets"] == nlohmann::json({0, 16}));
  CHECK(header["b"]["data_offsets"] == nlohmann::json({16, 28}));
  CHECK(header["__metadata__"]["k"] == "v");
  CHECK(bytes.size() == 8 + n + 28);
  std::map<std::string, std::string> meta;
  auto back = read_safetensors(p, &meta);
  REQUIRE(back.size() == 2);
  CHECK(back[0].first == "a");
  CHECK(back[1].second.to_vector() == std::vector<float>{5, 6, 7});
  CHECK(meta["k"] == "v");
  fs::remove_all(dir);
}

TEST_CASE("snapshot round trip restores model, momentum and state exactly", "[checkpoint]") {
  const std::string dir = temp_dir();
  Net a(1, 16, 1);
  Sgd oa(a.parameters(), {.lr = 0.1f, .momentum = 0.9f});
  one_step(a, oa);
  TrainState st;
  st.epoch = 2;
  st.step_in_epoch = 7;
  st.global_step = 42;
  st.seed = 9;
  st.world_size = 2;
  st.batch_size = 32;
  st.lr = 0.1;
  const std::string path = write_snapshot(dir, a, oa, st);
  CHECK(fs::exists(path));
  Net b(1, 16, 2);
  Sgd ob(b.parameters(), {.lr = 0.1f, .momentum = 0.9f});
  auto snap = load_latest_snapshot(dir);
  REQUIRE(snap);
  apply_snapshot(*snap, b, ob);
  CHECK(snap->state.epoch == 2);
  CHECK(snap->state.step_in_epoch == 7);
  CHECK(snap->state.global_step == 42);
  CHECK(snap->state.seed == 9);
  auto pa = a.named_parameters(), pb = b.named_parameters();
  for (size_t i = 0; i < pa.size(); ++i)
    CHECK(pa[i].second.to_vector() == pb[i].second.to_vector());
  for (size_t i = 0; i < pa.size(); ++i)
    CHECK(oa.momentum_buffers()[i].to_vector() == ob.momentum_buffers()[i].to_vector());
  // The next step is identical too.
  one_step(a, oa);
  one_step(b, ob);
  pa = a.named_parameters();
  pb = b.named_parameters();
  for (size_t i = 0; i < pa.size(); ++i)
    CHECK(pa[i].second.to_vector() == pb[i].second.to_vector());
  fs::remove_all(dir);
}

// Issue 12 item 5, host side: a snapshot holds values only (safetensors, no device), so one
// written from GPU ranks loads onto the cpu and onto another GPU: wherever the model is. The GPUs
// are fake (tests/ddp/fake_gpus.h: every copy must name the right devices).
TEST_CASE("a snapshot written on one GPU loads on the cpu and on another GPU", "[checkpoint]") {
  chorus::test::UseFake fake;
  const std::string dir = temp_dir();
  Net a(1, 16, 1);
  Sgd oa(a.parameters(), {.lr = 0.1f, .momentum = 0.9f});
  one_step(a, oa);  // on the cpu: the kernels are there
  const auto values = a.named_parameters();
  std::vector<std::vector<float>> want;
  for (const auto& [name, t] : values) want.push_back(t.to_vector());
  a.to(Device::cuda(0));
  for (auto& buf : oa.momentum_buffers()) buf = buf.to(Device::cuda(0));
  REQUIRE(a.named_parameters()[0].second.device() == Device::cuda(0));
  TrainState st;
  st.global_step = 5;
  write_snapshot(dir, a, oa, st);
  auto snap = load_latest_snapshot(dir);
  REQUIRE(snap);
  Net cpu(1, 16, 2), gpu1(1, 16, 3);
  Sgd ocpu(cpu.parameters(), {.lr = 0.1f, .momentum = 0.9f});
  one_step(cpu, ocpu);  // momentum buffers exist, to be replaced
  gpu1.to(Device::cuda(1));
  Sgd ogpu(gpu1.parameters(), {.lr = 0.1f, .momentum = 0.9f});
  ogpu.momentum_buffers() = std::vector<Tensor>(gpu1.parameters().size());
  apply_snapshot(*snap, cpu, ocpu);
  apply_snapshot(*snap, gpu1, ogpu);
  const auto pc = cpu.named_parameters(), pg = gpu1.named_parameters();
  for (size_t i = 0; i < want.size(); ++i) {
    CHECK(pc[i].second.to_vector() == want[i]);
    CHECK(pg[i].second.device() == Device::cuda(1));
    CHECK(pg[i].second.to_vector() == want[i]);
    CHECK(ogpu.momentum_buffers()[i].device() == Device::cuda(1));
    CHECK(ogpu.momentum_buffers()[i].to_vector() == ocpu.momentum_buffers()[i].to_vector());
    CHECK(ocpu.momentum_buffers()[i].to_vector() == oa.momentum_buffers()[i].to_vector());
  }
  // The cpu copy trains on exactly like the original would have.
  a.to(Device::cpu());
  for (auto& buf : oa.momentum_buffers()) buf = buf.to(Device::cpu());
  one_step(a, oa);
  one_step(cpu, ocpu);
  const auto pa = a.named_parameters(), pc2 = cpu.named_parameters();
  for (size_t i = 0; i < pa.size(); ++i)
    CHECK(pa[i].second.to_vector() == pc2[i].second.to_vector());
  fs::remove_all(dir);
}

TEST_CASE("a corrupt or partial snapshot gives a clear error and the previous one stays usable",
          "[checkpoint]") {
  const std::string dir = temp_dir();
  Net a(1, 16, 1);
  Sgd oa(a.parameters(), {.lr = 0.1f, .momentum = 0.9f});
  TrainState st;
  st.global_step = 10;
  write_snapshot(dir, a, oa, st);
  one_step(a, oa);
  st.global_step = 20;
  const std::string newest = write_snapshot(dir, a, oa, st);
  const std::string tensors = newest.substr(0, newest.size() - 5) + ".safetensors";

  SECTION("flipped byte") {
    std::string bytes = slurp(tensors);
    bytes[bytes.size() - 3] ^= 0x40;
    std::ofstream(tensors, std::ios::binary) << bytes;
    CHECK_THROWS_WITH(read_snapshot(newest),
                      Catch::Contains("is corrupt") && Catch::Contains(tensors));
  }
  SECTION("truncated tensor file") {
    fs::resize_file(tensors, 100);
    CHECK_THROWS_WITH(read_snapshot(newest),
                      Catch::Contains("partial") && Catch::Contains("100 bytes"));
  }
  SECTION("truncated record") {
    fs::resize_file(newest, 20);
    CHECK_THROWS_WITH(read_snapshot(newest),
                      Catch::Contains("not a valid snapshot record") && Catch::Contains(newest));
  }
  auto snap = load_latest_snapshot(dir);
  REQUIRE(snap);
  CHECK(snap->state.global_step == 10);
  fs::remove_all(dir);
}

TEST_CASE("only the newest snapshots are kept; temp files never count", "[checkpoint]") {
  const std::string dir = temp_dir();
  Net a(1, 16, 1);
  Sgd oa(a.parameters(), {.lr = 0.1f});
  TrainState st;
  for (int s = 1; s <= 5; ++s) {
    st.global_step = s;
    write_snapshot(dir, a, oa, st, 2);
  }
  std::ofstream(dir + "/snapshot-000000009.json.tmp.123") << "{";
  int json = 0;
  for (auto& e : fs::directory_iterator(dir)) json += e.path().extension() == ".json";
  CHECK(json == 2);
  CHECK(load_latest_snapshot(dir)->state.global_step == 5);
  fs::remove_all(dir);
}

TEST_CASE("snapshot records parse field by field; the tensor file is a bare name", "[checkpoint]") {
  const std::string dir = temp_dir();
  Net a(1, 16, 1);
  Sgd oa(a.parameters(), {.lr = 0.25f});
  TrainState st;
  st.epoch = 3;
  st.global_step = 42;
  st.batch_size = 8;
  st.lr = 0.25;
  const std::string record = write_snapshot(dir, a, oa, st);
  const SnapshotRecord r = parse_snapshot_record(slurp(record), record);
  CHECK(r.state.epoch == 3);
  CHECK(r.state.global_step == 42);
  CHECK(r.state.batch_size == 8);
  CHECK(r.tensors == "snapshot-000000042.safetensors");
  CHECK(r.tensors_bytes == fs::file_size(dir + "/" + r.tensors));
  auto j = nlohmann::json::parse(slurp(record));
  j["tensors"] = "../snapshot-000000042.safetensors";
  CHECK_THROWS_WITH(parse_snapshot_record(j.dump(), record),
                    Catch::StartsWith("checkpoint: " + record +
                                      ": field tensors: is \"../snapshot-000000042.safetensors\""));
  fs::remove_all(dir);
}

TEST_CASE("safetensors: empty tensors and tensors in any header order tile the data",
          "[checkpoint]") {
  const std::string dir = temp_dir();
  const std::string p = dir + "/t.safetensors";
  write_safetensors(p, {{"e", Tensor::zeros(Shape{0, 3})},
                        {"a", Tensor::from(Shape{2}, {1, 2})},
                        {"z", Tensor::zeros(Shape{0})}});
  auto back = read_safetensors(p);
  REQUIRE(back.size() == 3);
  for (const auto& [name, t] : back)
    CHECK(t.to_vector() == (name == "a" ? std::vector<float>{1, 2} : std::vector<float>{}));
  CHECK(parse_safetensors(slurp(p), p).size() == 3);
  fs::remove_all(dir);
}

TEST_CASE("atomic writes leave no temp file and use no predictable name", "[checkpoint]") {
  const std::string dir = temp_dir();
  const std::string p = dir + "/f";
  for (int i = 0; i < 3; ++i) write_file_atomic(p, fmt::format("v{}", i));
  CHECK(slurp(p) == "v2");
  CHECK(std::distance(fs::directory_iterator(dir), fs::directory_iterator{}) == 1);
  // The old name <path>.tmp.<pid> held by someone else does not stop or redirect the write.
  const std::string old_temp = fmt::format("{}.tmp.{}", p, ::getpid());
  std::ofstream(old_temp) << "theirs";
  write_file_atomic(p, "mine");
  CHECK(slurp(p) == "mine");
  CHECK(slurp(old_temp) == "theirs");
  fs::remove_all(dir);
}
