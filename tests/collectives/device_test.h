// What the device-operation tests on the emulated GPU share (test_device_ops.cc,
// test_device_staged.cc, test_device_graph.cc): a rank's failure said on stderr, a communicator
// made with the emulation installed, every rank's exit checked.
#pragma once

#include <catch2/catch.hpp>

#include <cstdio>
#include <initializer_list>
#include <string>
#include <vector>

#include "chorus/chorus.h"
#include "fake_gpu.h"
#include "harness.h"

namespace chorus::test {

// Says what failed on `rank`, and returns the rank's exit code for it (1).
inline int fail_with(int rank, const std::string& what, const std::string& msg) {
  std::fprintf(stderr, "rank %d: %s: %s\n", rank, what.c_str(), msg.c_str());
  return 1;
}

// The emulated GPU installed, then chorusCommInitFromEnv (NULL, said, when it fails).
inline chorusComm_t device_init(int rank) {
  install_fake_gpu();
  chorusComm_t comm = nullptr;
  if (chorusCommInitFromEnv(&comm) != chorusSuccess)
    std::fprintf(stderr, "rank %d: init: %s\n", rank, chorusGetLastError(nullptr));
  return comm;
}

// Each of `ranks` exited 0 (its output shown otherwise): the survivors of a test that kills one.
inline void check_ranks(const std::vector<RankResult>& res, std::initializer_list<int> ranks) {
  for (int r : ranks) {
    INFO("rank " << r << ":\n" << res[r].output);
    CHECK(res[r].exit_code == 0);
  }
}

// Every rank exited 0 (its output shown otherwise).
inline void check_all(const std::vector<RankResult>& res) {
  for (size_t r = 0; r < res.size(); ++r) {
    INFO("rank " << r << ":\n" << res[r].output);
    CHECK(res[r].exit_code == 0);
  }
}

}  // namespace chorus::test
