// chorus-run tests: a failing rank stops the others, signals are reported and forwarded, a worker
// that ignores SIGTERM is SIGKILLed after the grace, and --max-restarts restarts.
#include <signal.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <set>
#include <string>

#include "tests/tools/launch_harness.h"

using chorus::test::helper;
using chorus::test::Launch;
using chorus::test::lines_of;
using chorus::test::run_launcher;

namespace {

int count_of(const std::string& text, const std::string& needle) {
  int n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

// Pids from "[r] ready pid=P" lines.
std::set<int> ready_pids(const std::string& out) {
  std::set<int> pids;
  for (const auto& line : lines_of(out)) {
    auto at = line.find("ready pid=");
    if (at != std::string::npos) pids.insert(std::stoi(line.substr(at + 10)));
  }
  return pids;
}

bool gone(int pid) {
  return kill(pid, 0) != 0 && errno == ESRCH;
}

}  // namespace

TEST_CASE("chorus-run stops the other ranks when one fails and passes on its code",
          "[chorus-run]") {
  auto r = run_launcher({"-n", "3", helper(), "fail-rank", "1", "3"});
  CHECK(r.exit_code == 3);
  CHECK(r.seconds < 4);  // the sleeping ranks were stopped, not waited for (they sleep 30 s)
  CHECK_THAT(r.err, Catch::Contains("chorus-run: rank 1 (pid ") &&
                        Catch::Contains("exited with code 3; stopping ranks 0,2"));
  CHECK_THAT(r.out, Catch::Contains("[0] got signal 15") && Catch::Contains("[2] got signal 15"));
}

TEST_CASE("chorus-run reports a worker killed by a signal", "[chorus-run]") {
  auto r = run_launcher({"-n", "2", helper(), "signal-rank", "1", "9"});
  CHECK(r.exit_code == 128 + 9);
  CHECK_THAT(r.err, Catch::Contains("rank 1 (pid ") &&
                        Catch::Contains("was killed by signal 9 (SIGKILL); stopping ranks 0"));
}

TEST_CASE("chorus-run SIGKILLs a worker that ignores SIGTERM after the grace", "[chorus-run]") {
  auto r = run_launcher({"-n", "2", "--grace", "0.5", helper(), "ignore-term-rank", "1"});
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.err, Catch::Contains("rank 1 (pid ") &&
                        Catch::Contains("exited with code 1; stopping ranks 0"));
  CHECK_THAT(r.err, Catch::Contains("rank 0 (pid ") && Catch::Contains("sending SIGKILL"));
  CHECK(r.seconds >= 0.9);  // 0.5 s before rank 1 fails, then the 0.5 s grace
  CHECK(r.seconds < 4);     // and not the 30 s rank 0 sleeps
}

TEST_CASE("chorus-run forwards SIGTERM and SIGINT to the workers", "[chorus-run]") {
  for (int sig : {SIGTERM, SIGINT}) {
    CAPTURE(sig);
    Launch launch({"-n", "2", helper(), "sleep"});
    REQUIRE(
        launch.read_until([](const std::string& out) { return ready_pids(out).size() == 2; }, 10));
    launch.signal(sig);
    auto r = launch.wait(10);
    REQUIRE_FALSE(r.timed_out);
    CHECK(r.exit_code == 128 + sig);
    CHECK(r.seconds < 4);  // the workers ended on the forwarded signal, not on SIGKILL after 5 s
    std::string got = "got signal " + std::to_string(sig);
    CHECK_THAT(r.out, Catch::Contains("[0] " + got) && Catch::Contains("[1] " + got));
    CHECK_THAT(r.err, Catch::Contains("forwarding it to ranks 0,1"));
    for (int pid : ready_pids(r.out)) CHECK(gone(pid));
  }
}

TEST_CASE("chorus-run --max-restarts restarts all workers with the count raised", "[chorus-run]") {
  auto r = run_launcher({"-n", "2", "--max-restarts", "2", helper(), "fail-first-attempt", "1"});
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.err,
             Catch::Contains("chorus-run: restarting all workers (restart 1 of 2) after rank 1 "
                             "exited with code 4"));
  CHECK_THAT(r.out, Catch::Contains("[1] restart=0 elastic=0"));
  CHECK_THAT(r.out, Catch::Contains("[0] restart=1 elastic=1") &&
                        Catch::Contains("[1] restart=1 elastic=1"));
  CHECK(count_of(r.out, "restart=2") == 0);
  // Same port and secret in every attempt.
  std::set<std::string> endpoints;
  for (const auto& line : lines_of(r.out)) {
    auto at = line.find("port=");
    if (at != std::string::npos) endpoints.insert(line.substr(at));
  }
  CHECK(endpoints.size() == 1);
}

TEST_CASE("chorus-run gives up when the restarts run out", "[chorus-run]") {
  auto r = run_launcher({"-n", "2", "--max-restarts", "1", helper(), "always-fail", "0", "5"});
  CHECK(r.exit_code == 5);
  // Two attempts' failure lines, plus the restart line and the giving-up line.
  CHECK(count_of(r.err, "chorus-run: rank 0 (pid ") == 2);
  CHECK(count_of(r.err, "exited with code 5") == 4);
  CHECK_THAT(r.err, Catch::Contains(
                        "restarting all workers (restart 1 of 1) after rank 0 exited with code 5"));
  CHECK_THAT(r.err, Catch::Contains("giving up after 1 restart: rank 0 exited with code 5"));
}
