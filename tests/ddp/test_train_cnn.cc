// train_cnn's output under chorus-run: every line speaks for the whole job (one loss, the job's
// images/s), and a per-rank figure is labelled as such.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdlib>
#include <regex>
#include <string>
#include <vector>

#include "harness.h"

using chorus::test::contains;
using chorus::test::run_shell;

namespace {

std::string train_cmd(int ranks, const std::string& extra) {
  const char* run = std::getenv("CHORUS_RUN");
  const char* train = std::getenv("TRAIN_CNN");
  REQUIRE(run != nullptr);
  REQUIRE(train != nullptr);
  return std::string(run) + " -n " + std::to_string(ranks) + " " + train +
         " --data synthetic --synthetic-size 6144 --synthetic-shape 1x16x16 --batch-size 32 "
         "--epochs 1 " +
         extra;
}

std::vector<double> numbers(const std::string& text, const std::regex& re) {
  std::vector<double> out;
  for (std::sregex_iterator it(text.begin(), text.end(), re), end; it != end; ++it)
    out.push_back(std::stod((*it)[1]));
  return out;
}

double summary_rate(const std::string& out) {
  const auto v =
      numbers(out, std::regex(R"(epoch 1: train loss [\d.]+, train acc [\d.]+, (\d+) images/s)"));
  REQUIRE(v.size() == 1);
  return v[0];
}

double median(std::vector<double> v) {
  REQUIRE(!v.empty());
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

// The per-rank figure would be 1/2 of the job's: the interval and progress lines must sit near
// the summary's global figure, not near half of it.
TEST_CASE("with 2 ranks, interval lines and the progress display report the job's images/s",
          "[ddp][trainer]") {
  const auto logged = run_shell(train_cmd(2, "--log-every 24"));
  INFO(logged.output);
  REQUIRE(logged.status == 0);
  const auto interval = numbers(logged.output, std::regex(R"(\| (\d+) images/s \(2 ranks\))"));
  CHECK(interval.size() >= 3);
  const double global = summary_rate(logged.output);
  CHECK(median(interval) > 0.7 * global);

  const auto bar = run_shell(train_cmd(2, ""));  // not a terminal: the plain progress lines
  INFO(bar.output);
  REQUIRE(bar.status == 0);
  CHECK(contains(bar.output, "loss (rank 0)"));
  const auto shown = numbers(bar.output, std::regex(R"((\d+) images/s \(2 ranks\))"));
  CHECK(shown.size() >= 5);
  CHECK(median(shown) > 0.7 * summary_rate(bar.output));
}

TEST_CASE("--per-rank lines say they are per rank", "[ddp][trainer]") {
  const auto r = run_shell(train_cmd(2, "--log-every 48 --per-rank"));
  INFO(r.output);
  REQUIRE(r.status == 0);
  CHECK(contains(r.output, "images/s (this rank)"));
}

namespace {

// Trains 12 steps on 3 ranks with a checkpoint at the end; returns the parameter file's bytes.
std::string trained_params(const std::string& env, const std::string& extra, const char* tag) {
  const std::string dir = "train_cnn_repeat_" + std::string(tag);
  REQUIRE(run_shell("rm -rf " + dir).status == 0);
  const char* run = std::getenv("CHORUS_RUN");
  const char* train = std::getenv("TRAIN_CNN");
  REQUIRE(run != nullptr);
  REQUIRE(train != nullptr);
  const auto r = run_shell("env " + env + " " + run + " -n 3 " + train +
                           " --data synthetic --synthetic-size 1536 --synthetic-shape 3x32x32"
                           " --batch-size 16 --epochs 1 --max-steps 12 --no-progress"
                           " --checkpoint-dir " +
                           dir + " " + extra);
  INFO(r.output);
  REQUIRE(r.status == 0);
  const auto file = run_shell("cat " + dir + "/snapshot-000000012.safetensors");
  REQUIRE(file.status == 0);
  REQUIRE(file.output.size() > 200000);  // 62006 f32 parameters and their momenta
  run_shell("rm -rf " + dir);
  return file.output;
}

}  // namespace

// Issue 16, item 4: with the deterministic mode the gradient sums are the rank-order fold
// whatever the bucketing (which elements share a call), the algorithm, the transport or the
// kernel build, so the trained parameters are the same bits. Without it, the same two
// configurations differ (the ring adds the ranks in another order per chunk): the data can tell.
TEST_CASE("deterministic mode: the same parameters whatever the buckets, algorithm, transport",
          "[ddp][trainer][deterministic]") {
  const std::string split = "--first-bucket-mb 0.02 --bucket-cap-mb 0.05";
  const std::string a = trained_params("CHORUS_DETERMINISTIC=1", "", "a");
  const std::string b =
      trained_params("CHORUS_DETERMINISTIC=1 CHORUS_ALGO=ring CHORUS_TRANSPORT=tcp", split, "b");
  const std::string c = trained_params(
      "CHORUS_DETERMINISTIC=1 CHORUS_ALGO=rd CHORUS_CPU_ISA=scalar CHORUS_TEST_JITTER_US=200",
      "--bucket-cap-mb 0.1", "c");
  CHECK(a == b);
  CHECK(a == c);
  const std::string d = trained_params("CHORUS_DETERMINISTIC=0", "", "d");
  const std::string e =
      trained_params("CHORUS_DETERMINISTIC=0 CHORUS_ALGO=ring CHORUS_TRANSPORT=tcp", split, "e");
  CHECK(d != e);
}

// --cuda-graph (ddp/train/step_graph.h) captures the step on a GPU: refused on the cpu, on one
// rank and on several (DDP's), naming why, before any training. (DDP with graphs trains in
// ddp_step_graph, on the emulated GPU.)
TEST_CASE("--cuda-graph is refused on the cpu, naming why", "[trainer]") {
  for (const std::string flag : {"--cuda-graph", "--cuda-graph-split"})
    for (int ranks : {1, 2}) {
      const auto r = run_shell(train_cmd(ranks, flag + " --device cpu") + " 2>&1");
      INFO(r.output);
      CHECK(r.status != 0);
      CHECK(contains(r.output, "[" + std::to_string(ranks - 1) + "] train_cnn: error: train_cnn: " +
                                   flag + " needs --device cuda, got cpu"));
    }
}
