// chorus-run --bind cores|numa|none: the CPUs each local rank is bound to (hwloc), applied in
// the worker between fork and exec, so every thread it ever starts inherits them.
#pragma once

#include <sched.h>

#include <string>
#include <vector>

namespace chorus::run {

struct Binding {
  bool bound = false;  // false: --bind none, the worker inherits the launcher's CPUs
  cpu_set_t cpus;      // valid when bound
  std::string text;    // "core 1 (CPUs 1)", "NUMA node 0 (CPUs 0-15)"
};

// One binding per local rank, in order: cores round-robin over the cores this process may use
// (each rank gets all PUs of its core), numa round-robin over the NUMA nodes. On failure returns
// false with `error` set (hwloc could not read the machine; no usable core).
bool plan_bindings(const std::string& mode, int nproc, std::vector<Binding>& out,
                   std::string& error);

}  // namespace chorus::run
