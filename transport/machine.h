// The machine as hwloc sees it: packages, NUMA nodes, cores, caches, and the GPUs and NICs with
// their PCI locality; which NIC is closest to each GPU; and the binding of progress threads next
// to their rank. chorus-topo prints it (tools/topo/).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace chorus::transport {

struct NumaInfo {
  int os_index = -1;
  std::string cpus;  // list form: "0-3,8"
  uint64_t bytes = 0;
};

struct CacheInfo {
  int level = 0;
  uint64_t bytes = 0;  // of one cache
  int count = 0;       // caches of this level
};

// A GPU or a NIC on the PCI bus.
struct PciInfo {
  std::string bus_id;         // "0000:3b:00.0"
  std::string vendor_device;  // "10de:2330"
  std::string names;          // its OS devices ("eth0", "mlx5_0"; "" when none is known)
  int numa = -1;              // os index of the NUMA node it hangs off (-1: not one node)
  std::string cpus;           // the CPUs local to it
};

struct Machine {
  int packages = 0, cores = 0, pus = 0;
  std::vector<NumaInfo> numa;
  std::vector<CacheInfo> caches;  // by level, lowest first
  std::vector<PciInfo> gpus, nics;
  // nic_for_gpu[g]: index in nics of the NIC closest to gpus[g] on the PCI tree (fewest hops
  // through their nearest common ancestor; ties to the lower index); -1 when there is no NIC.
  std::vector<int> nic_for_gpu;
};

// This machine, or the topology saved in an hwloc XML file (lstopo --of xml; tests use made-up
// machines).
Result<Machine> read_machine(const std::string& xml_path = "");

// The OS names of the NIC closest to the GPU at PCI address `gpu_bus_id` ("eth2", "ib0",
// "mlx5_0"; the order hwloc lists them), for the tcp links' choice of interface; empty when the
// GPU or a NIC is not on this machine's PCI bus.
std::vector<std::string> nic_names_near_gpu(const Machine& m, const std::string& gpu_bus_id);

// A few lines for people: what chorus-topo prints.
std::string describe(const Machine& m);

// Binds the calling thread to the CPUs of the NUMA node(s) the process is bound to, when the
// process is bound to fewer CPUs than it may use (chorus-run --bind, taskset, numactl): a
// progress thread then runs next to its rank, not on its core. Returns what it did in words
// ("" when the process is not bound).
Result<std::string> bind_thread_near_process();

}  // namespace chorus::transport
