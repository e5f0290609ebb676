// transport/machine.h on a made-up machine (data/two_sockets_gpus_nics.xml: two packages, one
// NUMA node each, a GPU and an InfiniBand NIC behind one PCI switch per package, and an Ethernet
// NIC on package 1's host bridge), and on this machine.
#include <catch2/catch.hpp>

#include <hwloc.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
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

namespace {
// In a child process (hwloc keeps its plugins loaded from the first topology on): whether
// loading this machine's topology, by read_machine or (`plain`) by hwloc with its defaults and
// I/O devices, loaded the stand-in OpenCL driver. -1: the test could not set up or the child
// failed. The driver is named to the loader both ways: Debian 12's ocl-icd reads the .icd
// files of OCL_ICD_VENDORS, newer loaders OCL_ICD_FILENAMES.
int loads_opencl_driver(bool plain) {
  char dir[] = "/tmp/chorus-ocl-XXXXXX";
  if (mkdtemp(dir) == nullptr) return -1;
  const std::string icd = std::string(dir) + "/marker.icd", marker = std::string(dir) + "/loaded";
  if (FILE* f = std::fopen(icd.c_str(), "w")) {
    std::fprintf(f, "%s\n", CHORUS_OCL_MARKER);
    std::fclose(f);
  }
  pid_t pid = fork();
  if (pid == 0) {
    setenv("OCL_ICD_VENDORS", dir, 1);
    setenv("OCL_ICD_FILENAMES", CHORUS_OCL_MARKER, 1);
    setenv("CHORUS_TEST_OCL_MARKER", marker.c_str(), 1);
    if (plain) {
      hwloc_topology_t t;
      if (hwloc_topology_init(&t) != 0) _exit(1);
      hwloc_topology_set_io_types_filter(t, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
      const int rc = hwloc_topology_load(t);
      hwloc_topology_destroy(t);
      _exit(rc == 0 ? 0 : 1);
    }
    _exit(read_machine().is_ok() ? 0 : 1);
  }
  int st = 0;
  const bool ran = pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0;
  const bool loaded = access(marker.c_str(), F_OK) == 0;
  unlink(marker.c_str());
  unlink(icd.c_str());
  rmdir(dir);
  return !ran ? -1 : loaded ? 1 : 0;
}
}  // namespace

// hwloc's GPU-API components would start the OpenCL loader (and with NVIDIA's driver, the GPU
// driver), an X connection, CUDA or NVML in every rank, for nothing the machine summary uses.
TEST_CASE("machine: reading this machine starts no GPU API (the OpenCL loader here)", "[machine]") {
  const int plain = loads_opencl_driver(true);
  REQUIRE(plain >= 0);
  if (plain == 0) {
    // hwloc's OpenCL plugin (Debian's libhwloc-plugins) or the OpenCL loader is missing.
    WARN(
        "skipped: hwloc with its defaults did not load an OpenCL driver here either (no "
        "hwloc OpenCL plugin or loader), so this machine cannot tell");
    return;
  }
  CHECK(loads_opencl_driver(false) == 0);
}

TEST_CASE("machine: an unbound thread stays unbound", "[machine]") {
  // The test runs unbound unless its launcher bound it; then the answer names the binding.
  auto r = bind_thread_near_process();
  REQUIRE(r.is_ok());
  if (!r->empty()) CHECK_THAT(*r, Catch::Contains("the process is bound to CPUs"));
}
