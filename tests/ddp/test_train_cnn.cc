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
