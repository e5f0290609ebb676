// A send/recv above 2^31 bytes on each link: sizes must never pass through an int.
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstring>
#include <vector>

#include "chorus/chorus.hpp"
#include "harness.h"

TEST_CASE("send/recv above 2^31 bytes", "[p2p][large]") {
  auto transport = GENERATE(std::string("shm"), std::string("tcp"));
  chorus::test::RunOptions opt;
  opt.env["CHORUS_TRANSPORT"] = transport;
  opt.limit_seconds = 120;
  auto res = chorus::test::run_ranks(
      2,
      [](int rank) {
        auto comm = chorus::Communicator::from_env();
        const size_t n = (size_t{1} << 31) + 4099;
        std::vector<unsigned char> buf(n);
        if (rank == 0) {
          for (size_t i = 0; i < n; i += 4096) buf[i] = static_cast<unsigned char>(i >> 12);
          buf[n - 1] = 0x5a;
          comm.send(buf.data(), n, chorusUint8, 1);
        } else {
          comm.recv(buf.data(), n, chorusUint8, 0);
          for (size_t i = 0; i < n; i += 4096)
            if (buf[i] != static_cast<unsigned char>(i >> 12)) {
              std::fprintf(stderr, "byte %zu wrong\n", i);
              return 1;
            }
          if (buf[n - 1] != 0x5a) {
            std::fprintf(stderr, "last byte wrong\n");
            return 1;
          }
        }
        return 0;
      },
      opt);
  for (auto& r : res) {
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
  }
}
