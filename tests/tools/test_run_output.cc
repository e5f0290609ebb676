// chorus-run tests: rank prefixes on stdout and stderr, partial lines, large output, --no-prefix;
// and the LinePrefixer unit on its own.
#include <signal.h>

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "tests/tools/launch_harness.h"
#include "tools/run/output.h"

using chorus::run::LinePrefixer;
using chorus::test::helper;
using chorus::test::lines_of;
using chorus::test::run_launcher;

namespace {

// Checks that `text` holds, for each rank, exactly "[r] <word> i" for i = 0, step, 2*step ... < n
// in order (ranks interleaved only at line boundaries), then "[r] tail" when `tail`.
void check_rank_lines(const std::string& text, int ranks, long n, long step,
                      const std::string& word, bool tail) {
  std::vector<long> next(ranks, 0);
  std::vector<bool> tails(ranks, false);
  long bad = 0;
  for (const auto& line : lines_of(text)) {
    int r = -1;
    char rest[64] = {0};
    if (std::sscanf(line.c_str(), "[%d] %63[^\n]", &r, rest) != 2 || r < 0 || r >= ranks) {
      ++bad;
      continue;
    }
    if (std::string(rest) == "tail") {
      tails[r] = true;
    } else if (std::string(rest) == word + " " + std::to_string(next[r])) {
      next[r] += step;
    } else {
      ++bad;
    }
  }
  CHECK(bad == 0);
  for (int r = 0; r < ranks; ++r) {
    CAPTURE(r);
    CHECK(next[r] >= n);
    CHECK(next[r] < n + step);
    if (tail) CHECK(tails[r]);
  }
}

}  // namespace

TEST_CASE("chorus-run prefixes every line with its rank, on the right stream", "[chorus-run]") {
  auto r = run_launcher({"-n", "2", helper(), "lines", "50"});
  REQUIRE(r.exit_code == 0);
  check_rank_lines(r.out, 2, 50, 1, "out", true);
  check_rank_lines(r.err, 2, 50, 10, "err", false);
  CHECK_THAT(r.out, Catch::Contains("[0] tail\n"));
  CHECK_THAT(r.out, !Catch::Contains("err "));
  CHECK_THAT(r.err, !Catch::Contains("out "));
}

TEST_CASE("chorus-run passes 100k lines from each of 3 ranks complete", "[chorus-run]") {
  auto r = run_launcher({"-n", "3", helper(), "lines", "100000"}, {}, 30);
  REQUIRE(r.exit_code == 0);
  check_rank_lines(r.out, 3, 100000, 1, "out", true);
  check_rank_lines(r.err, 3, 100000, 10, "err", false);
}

TEST_CASE("chorus-run --no-prefix passes lines unchanged", "[chorus-run]") {
  auto r = run_launcher({"--no-prefix", "-n", "1", helper(), "lines", "3"});
  REQUIRE(r.exit_code == 0);
  CHECK(r.out == "out 0\nout 1\nout 2\ntail");
  CHECK(r.err == "err 0\n");
}

TEST_CASE("chorus-run does not wait forever on a pipe a worker's child keeps open",
          "[chorus-run]") {
  auto r = run_launcher({"-n", "1", helper(), "background"});
  CHECK(r.exit_code == 0);
  CHECK(r.seconds < 5);  // bounded drain (2 s), not the child's 20 s
  auto pgid = chorus::test::values_by_rank(r.out, "pgid");
  REQUIRE(pgid.count(0) == 1);
  kill(-std::stoi(pgid[0]), SIGKILL);  // the sleeping child shares the worker's process group
}

TEST_CASE("LinePrefixer emits whole prefixed lines across reads", "[chorus-run][unit]") {
  LinePrefixer p("[3] ");
  std::string out;
  p.feed("ab", 2, out);
  CHECK(out.empty());
  p.feed("c\nde\n\nf", 7, out);
  CHECK(out == "[3] abc\n[3] de\n[3] \n");
  out.clear();
  p.finish(out);
  CHECK(out == "[3] f\n");
  out.clear();
  p.finish(out);
  CHECK(out.empty());
}

TEST_CASE("LinePrefixer without a prefix keeps a final partial line as is", "[chorus-run][unit]") {
  LinePrefixer p("");
  std::string out;
  p.feed("x\ny", 3, out);
  p.finish(out);
  CHECK(out == "x\ny");
}

TEST_CASE("LinePrefixer cuts a line longer than its cap", "[chorus-run][unit]") {
  LinePrefixer p("[0] ");
  std::string big(LinePrefixer::kMaxLine + 10, 'a');
  std::string out;
  p.feed(big.data(), big.size(), out);
  CHECK(out == "[0] " + big.substr(0, LinePrefixer::kMaxLine) + "\n");
  out.clear();
  p.finish(out);
  CHECK(out == "[0] " + std::string(10, 'a') + "\n");
}

// Found by fuzz/run_output: a line was cut only after the read that took it past the cap, so
// lines came out up to a read longer than the cap, and a line of exactly the cap was split in
// two around its newline.
TEST_CASE("LinePrefixer cuts at exactly the cap, whatever the reads", "[chorus-run][unit][fuzz]") {
  LinePrefixer p("> ", 4);
  std::string out;
  p.feed("abc", 3, out);
  p.feed("defghij\nkl", 10, out);
  CHECK(out == "> abcd\n> efgh\n> ij\n");
  out.clear();
  p.feed("mn", 2, out);  // "klmn": exactly the cap, not yet ended
  p.feed("\nop", 3, out);
  CHECK(out == "> klmn\n");
  out.clear();
  p.finish(out);
  CHECK(out == "> op\n");
}
