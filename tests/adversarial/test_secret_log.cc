// At CHORUS_DEBUG=INFO a job says whether its secret is a secret. (A binary of its own: the
// log level is read once per process, and the ranks here are forked from a fresh one.)
#include <catch2/catch.hpp>

#include "chorus/chorus.hpp"
#include "harness.h"

using namespace chorus::test;

TEST_CASE("at CHORUS_DEBUG=INFO the job says whether its secret is a secret",
          "[adversarial][secret]") {
  RunOptions o;
  o.env = {{"CHORUS_DEBUG", "INFO"}, {"CHORUS_TIMEOUT", "20"}};
  auto body = [](int) {
    auto comm = chorus::Communicator::from_env();
    comm.barrier();
    return 0;
  };
  auto derived = run_ranks(2, body, o);
  INFO(derived[0].output);
  REQUIRE(derived[0].exit_code == 0);
  REQUIRE(contains(derived[0].output,
                   "the job secret is derived from the master address, port and world size"));
  REQUIRE(contains(derived[0].output, "which is not secret"));
  REQUIRE(contains(derived[0].output, "Set CHORUS_JOB_SECRET"));
  o.env["TORCHELASTIC_RUN_ID"] = "none";
  auto torchrun = run_ranks(2, body, o);
  REQUIRE(
      contains(torchrun[1].output, "derived from TORCHELASTIC_RUN_ID=none, which is not secret"));
  o.env["CHORUS_JOB_SECRET"] = "0123456789abcdef0123456789abcdef";
  auto given = run_ranks(2, body, o);
  INFO(given[0].output);
  REQUIRE(given[0].exit_code == 0);
  REQUIRE(contains(given[0].output, "the job secret comes from CHORUS_JOB_SECRET"));
  REQUIRE_FALSE(contains(given[0].output, "which is not secret"));
}
