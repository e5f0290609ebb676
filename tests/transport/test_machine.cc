// transport/machine.h on a made-up machine (data/two_sockets_gpus_nics.xml: two packages, one
// NUMA node each, a GPU and an InfiniBand NIC behind one PCI switch per package, and an Ethernet
// NIC on package 1's host bridge), and on this machine.
#include <catch2/catch.hpp>

#include <string>

#include "transport/machine.h"

using namespace chorus::transport;

namespace {
const std::string kXml =
    std::string(CHORUS_SOURCE_ROOT) + "/tests/transport/data/two_sockets_gpus_nics.xml";
}

TEST_CASE("machine: cores, NUMA nodes, caches, GPUs and NICs with their locality", "[machine]") {
  auto m = read_machine(kXml);
  INFO(m.status().message());
  REQUIRE(m.is_ok());
  CHECK(m->packages == 2);
  CHECK(m->cores == 4);
  CHECK(m->pus == 4);
  REQUIRE(m->numa.size() == 2);
  CHECK(m->numa[0].cpus == "0-1");
  CHECK(m->numa[1].cpus == "2-3");
  CHECK(m->numa[1].bytes == (16ull << 30));
  REQUIRE(m->caches.size() == 1);
  CHECK(m->caches[0].level == 3);
  CHECK(m->caches[0].count == 2);
  REQUIRE(m->gpus.size() == 2);
  CHECK(m->gpus[0].bus_id == "0000:11:00.0");
  CHECK(m->gpus[0].vendor_device == "10de:2330");
  CHECK(m->gpus[0].numa == 0);
  CHECK(m->gpus[1].numa == 1);
  CHECK(m->gpus[1].cpus == "2-3");
  REQUIRE(m->nics.size() == 3);
  CHECK(m->nics[0].names == "mlx5_0");
  CHECK(m->nics[1].names == "eth1");
  CHECK(m->nics[2].names == "mlx5_1");
}

TEST_CASE("machine: each GPU's closest NIC is the one behind its own PCI switch", "[machine]") {
  auto m = read_machine(kXml);
  REQUIRE(m.is_ok());
  // GPU 1 shares package 1 with both eth1 (on the host bridge) and mlx5_1 (behind its switch):
  // the switch is fewer hops away.
  REQUIRE(m->nic_for_gpu.size() == 2);
  CHECK(m->nic_for_gpu[0] == 0);
  CHECK(m->nic_for_gpu[1] == 2);
  std::string text = describe(*m);
  CHECK_THAT(text, Catch::Contains("machine: 2 package(s), 2 NUMA node(s), 4 core(s), 4 PU(s)"));
  CHECK_THAT(text, Catch::Contains("GPU 1: 0000:81:00.0 [10de:2330] near NUMA node 1; closest "
                                   "NIC 2 (0000:82:00.0)"));
  CHECK_THAT(text, Catch::Contains("NIC 1: 0000:80:00.0 [8086:1592] eth1 near NUMA node 1"));
}

TEST_CASE("machine: a missing topology file is an error naming it; this machine reads",
          "[machine]") {
  auto bad = read_machine("/nonexistent/topology.xml");
  REQUIRE_FALSE(bad.is_ok());
  CHECK_THAT(bad.status().message(), Catch::Contains("/nonexistent/topology.xml"));
  auto here = read_machine();
  INFO(here.status().message());
  REQUIRE(here.is_ok());
  CHECK(here->pus >= 1);
  CHECK(here->cores >= 1);
  CHECK_FALSE(here->numa.empty());
  CHECK(here->nic_for_gpu.size() == here->gpus.size());
}

TEST_CASE("machine: an unbound thread stays unbound", "[machine]") {
  // The test runs unbound unless its launcher bound it; then the answer names the binding.
  auto r = bind_thread_near_process();
  REQUIRE(r.is_ok());
  if (!r->empty()) CHECK_THAT(*r, Catch::Contains("the process is bound to CPUs"));
}
