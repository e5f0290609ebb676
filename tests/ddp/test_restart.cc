// Fault tolerance end to end: train_cnn under chorus-run --max-restarts 1, one rank SIGKILLed
// mid-epoch, resumes from the newest snapshot and ends with exactly the parameters of a run that
// was never interrupted (deterministic settings: fixed seeds, one thread per rank).
// CHORUS_TEST_TRAIN_DEVICE=cuda:0 trains on the GPU instead, both ranks sharing it
// (tests/gpu/run.sh: issue 12's "resume continues bit for bit where the same devices are used").
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "ddp/train/checkpoint.h"
#include "harness.h"

using chorus::test::contains;
namespace fs = std::filesystem;

namespace {

using Run = chorus::test::ShellResult;
Run sh(const std::string& cmd) {
  return chorus::test::run_shell(cmd);
}

std::string train_cmd(const std::string& dir, const std::string& extra) {
  const char* run = std::getenv("CHORUS_RUN");
  const char* train = std::getenv("TRAIN_CNN");
  REQUIRE(run != nullptr);
  REQUIRE(train != nullptr);
  const char* device = std::getenv("CHORUS_TEST_TRAIN_DEVICE");
  const std::string on = device && *device ? device : "cpu";
  return (on == "cpu" ? std::string() : std::string("CHORUS_ALLOW_SHARED_GPU=1 ")) + run +
         " -n 2 " + extra + " " + train + " --device " + on +
         " --data synthetic --synthetic-size 384 --synthetic-shape 1x16x16 --batch-size 8"
         " --lr 0.05 --no-progress --log-every 8 --checkpoint-every 5 --checkpoint-dir " +
         dir;
}

}  // namespace

TEST_CASE("kill -9 mid-epoch under --max-restarts 1 ends where an uninterrupted run ends",
          "[ddp][restart]") {
  char tmpl[] = "/tmp/chorus-restart-XXXXXX";
  REQUIRE(mkdtemp(tmpl) != nullptr);
  const std::string base = tmpl;
  const Run clean = sh(train_cmd(base + "/clean", "") + " --epochs 2");
  INFO(clean.output);
  REQUIRE(clean.status == 0);
  // 384 / (2 * 8) = 24 steps per epoch; the kill lands at global step 37 (epoch 2, step 13),
  // after the snapshot of step 35.
  const Run crashed = sh(train_cmd(base + "/crash", "--max-restarts 1") +
                         " --epochs 2 --fail-at-step 37 --fail-rank 1");
  INFO(crashed.output);
  REQUIRE(crashed.status == 0);
  CHECK(contains(crashed.output, "killed by signal 9"));
  CHECK(contains(crashed.output, "resuming from"));
  CHECK(contains(crashed.output, "global step 35"));
  auto a = chorus::load_latest_snapshot(base + "/clean");
  auto b = chorus::load_latest_snapshot(base + "/crash");
  REQUIRE(a);
  REQUIRE(b);
  CHECK(a->state.global_step == 48);
  CHECK(b->state.global_step == 48);
  REQUIRE(a->model.size() == b->model.size());
  for (size_t i = 0; i < a->model.size(); ++i) {
    INFO(a->model[i].first);
    CHECK(a->model[i].second.to_vector() == b->model[i].second.to_vector());  // bit-identical
  }
  // A restarted job with nothing left to do finishes at once from the final snapshot.
  const Run again = sh(train_cmd(base + "/clean", "") + " --epochs 2");
  CHECK(again.status == 0);
  CHECK(contains(again.output, "resuming from"));
  fs::remove_all(base);
}

TEST_CASE("a corrupt newest snapshot: train_cnn says so and resumes from the previous one",
          "[ddp][restart]") {
  char tmpl[] = "/tmp/chorus-restart-XXXXXX";
  REQUIRE(mkdtemp(tmpl) != nullptr);
  const std::string dir = std::string(tmpl) + "/ck";
  const Run first = sh(train_cmd(dir, "") + " --max-steps 10 --epochs 1");
  INFO(first.output);
  REQUIRE(first.status == 0);
  // Snapshots at step 5 and at the epoch end (10): damage the newest tensor file.
  const std::string newest = chorus::snapshot_json_path(dir, 10);
  const std::string tensors = newest.substr(0, newest.size() - 5) + ".safetensors";
  REQUIRE(fs::exists(tensors));
  fs::resize_file(tensors, fs::file_size(tensors) / 2);
  const Run second = sh(train_cmd(dir, "") + " --max-steps 10 --epochs 1");
  INFO(second.output);
  CHECK(second.status == 0);
  CHECK(contains(second.output, "partial or replaced file"));
  CHECK(contains(second.output, "resuming from " + chorus::snapshot_json_path(dir, 5)));
  fs::remove_all(tmpl);
}

TEST_CASE("train_cnn: two ranks given --device cuda:0 stop at once, naming both and the fix",
          "[ddp][errors]") {
  const Run r =
      sh(std::string(std::getenv("CHORUS_RUN")) + " -n 2 " + std::getenv("TRAIN_CNN") +
         " --data synthetic --synthetic-size 64 --synthetic-shape 1x16x16 --device cuda:0");
  INFO(r.output);
  CHECK(r.status != 0);
  CHECK(contains(r.output, "ranks 0 and 1 on host"));
  CHECK(contains(r.output, "both given device cuda:0"));
  CHECK(contains(r.output, "--device cuda:$LOCAL_RANK"));
}
