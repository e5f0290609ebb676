// chorus-topo: prints the machine as chorus sees it through hwloc: packages, NUMA nodes, cores,
// caches, the GPUs and NICs with their locality, and the NIC closest to each GPU.
// Usage: chorus-topo [--xml FILE]   (FILE: a topology saved by `lstopo --of xml`)
// For a running job, CHORUS_DEBUG=INFO prints the link chosen for every pair of ranks.
#include <cstdio>
#include <string>

#include <CLI/CLI.hpp>

#include "transport/machine.h"

int main(int argc, char** argv) {
  CLI::App app("chorus-topo: the machine as chorus sees it (hwloc)");
  std::string xml;
  app.add_option("--xml", xml, "read the topology from an hwloc XML file instead of this machine")
      ->type_name("FILE");
  CLI11_PARSE(app, argc, argv);
  auto m = chorus::transport::read_machine(xml);
  if (!m.is_ok()) {
    std::fprintf(stderr, "chorus-topo: %s\n", m.status().message().c_str());
    return 1;
  }
  std::fputs(chorus::transport::describe(*m).c_str(), stdout);
  return 0;
}
