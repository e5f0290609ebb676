// Where the bootstrap store listens, how long it lives, and what the logs say about the secret.
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "chorus/chorus.hpp"
#include "harness.h"
#include "probes.h"

using namespace chorus::test;

namespace {

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (auto& x : v) s += x + " ";
  return s;
}

// This host's first non-loopback IPv4 address, or "".
std::string public_address() {
  ifaddrs* ifa = nullptr;
  if (getifaddrs(&ifa) != 0) return "";
  std::string out;
  for (ifaddrs* p = ifa; p && out.empty(); p = p->ifa_next) {
    if (!p->ifa_addr || p->ifa_addr->sa_family != AF_INET || (p->ifa_flags & IFF_LOOPBACK))
      continue;
    char buf[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(p->ifa_addr)->sin_addr, buf, sizeof buf);
    out = buf;
  }
  freeifaddrs(ifa);
  return out;
}

// Runs a 2-rank job; rank 0 reports where it listens once the communicator is up.
std::string store_listens(const std::map<std::string, std::string>& env) {
  RunOptions o;
  o.env = env;
  o.env["CHORUS_TIMEOUT"] = std::to_string(20);
  o.limit_seconds = 30;
  auto res = run_ranks(
      2,
      [](int rank) {
        auto comm = chorus::Communicator::from_env();
        if (rank == 0) std::printf("listening: %s\n", joined(listening_addresses()).c_str());
        comm.barrier();
        return 0;
      },
      o);
  INFO(res[0].output << res[1].output);
  REQUIRE(res[0].exit_code == 0);
  REQUIRE(res[1].exit_code == 0);
  REQUIRE_FALSE(sanitizer_report(res[0].output + res[1].output));
  auto at = res[0].output.find("listening: ");
  REQUIRE(at != std::string::npos);
  return res[0].output.substr(at + 11, res[0].output.find('\n', at) - at - 11);
}

}  // namespace

TEST_CASE("the store listens where MASTER_ADDR points, or where CHORUS_STORE_BIND says",
          "[adversarial][bind]") {
  // Before: 0.0.0.0 (every interface) even for MASTER_ADDR=127.0.0.1.
  std::string lo = store_listens({{"MASTER_ADDR", "127.0.0.1"}});
  INFO("listening: " << lo);
  REQUIRE(lo.find("127.0.0.1:") != std::string::npos);
  REQUIRE(lo.find("0.0.0.0:") == std::string::npos);
  REQUIRE(store_listens({{"MASTER_ADDR", "localhost"}}).find("127.0.0.1:") != std::string::npos);
  REQUIRE(store_listens({{"CHORUS_STORE_BIND", "0.0.0.0"}}).find("0.0.0.0:") != std::string::npos);
  std::string pub = public_address();
  if (pub.empty()) {
    WARN("skipped the non-loopback case: this host has no non-loopback IPv4 address");
    return;
  }
  std::string on_pub = store_listens({{"MASTER_ADDR", pub}});
  REQUIRE(on_pub.find(pub + ":") != std::string::npos);
  REQUIRE(on_pub.find("0.0.0.0:") == std::string::npos);
}

TEST_CASE("chorusCommInitAll listens on loopback only, and its store stops with its communicators",
          "[adversarial][bind][uniqueid]") {
  int fds0 = open_fds(), threads0 = live_threads();
  for (int round = 0; round < 30; ++round) {
    chorusComm_t comms[3];
    REQUIRE(chorusCommInitAll(comms, 3, nullptr) == chorusSuccess);
    auto listening = listening_addresses();  // this job's store, perhaps the last one's (stopping)
    INFO("listening: " << joined(listening));
    REQUIRE(!listening.empty());
    for (auto& a : listening)
      REQUIRE(a.rfind("127.0.0.1:", 0) == 0);  // before: the first non-loopback address
    for (auto* c : comms) REQUIRE(chorusCommDestroy(c) == chorusSuccess);
  }
  // Each store stops once every rank of its job has left (before: all 30 kept listening).
  double until = now_s() + 3;
  while (!listening_addresses().empty() && now_s() < until) usleep(20000);
  INFO("still listening: " << joined(listening_addresses()));
  REQUIRE(listening_addresses().empty());
  chorusComm_t one;  // reaps the stopped stores
  REQUIRE(chorusCommInitAll(&one, 1, nullptr) == chorusSuccess);
  REQUIRE(chorusCommDestroy(one) == chorusSuccess);
  usleep(300000);
  std::fprintf(stderr, "fds %d -> %d, threads %d -> %d\n", fds0, open_fds(), threads0,
               live_threads());
  REQUIRE(open_fds() <= fds0 + 2);
  REQUIRE(live_threads() <= threads0 + 1);
}
