// chorus-run --bind (see bind.h).
#include "tools/run/bind.h"

#include <hwloc.h>

#include <fmt/format.h>

namespace chorus::run {
namespace {

std::string cpu_list(hwloc_const_bitmap_t b) {
  char* s = nullptr;
  hwloc_bitmap_list_asprintf(&s, b);
  std::string out = s ? s : "?";
  free(s);
  return out;
}

// The usable objects of one type: those with at least one CPU this process may run on.
std::vector<hwloc_obj_t> usable(hwloc_topology_t t, hwloc_obj_type_t type) {
  std::vector<hwloc_obj_t> out;
  hwloc_const_cpuset_t allowed = hwloc_topology_get_allowed_cpuset(t);
  int n = hwloc_get_nbobjs_by_type(t, type);
  for (int i = 0; i < n; ++i) {
    hwloc_obj_t o = hwloc_get_obj_by_type(t, type, unsigned(i));
    if (o->cpuset && hwloc_bitmap_intersects(o->cpuset, allowed)) out.push_back(o);
  }
  return out;
}

}  // namespace

bool plan_bindings(const std::string& mode, int nproc, std::vector<Binding>& out,
                   std::string& error) {
  out.assign(size_t(nproc), Binding{});
  if (mode == "none") return true;
  hwloc_topology_t t = nullptr;
  if (hwloc_topology_init(&t) != 0 || hwloc_topology_load(t) != 0) {
    if (t) hwloc_topology_destroy(t);
    error = "--bind " + mode + ": hwloc could not read this machine's topology";
    return false;
  }
  bool cores = mode == "cores";
  std::vector<hwloc_obj_t> objs = usable(t, cores ? HWLOC_OBJ_CORE : HWLOC_OBJ_NUMANODE);
  if (objs.empty()) {
    hwloc_topology_destroy(t);
    error =
        fmt::format("--bind {}: this process may run on no {}", mode, cores ? "core" : "NUMA node");
    return false;
  }
  hwloc_bitmap_t set = hwloc_bitmap_alloc();
  for (int i = 0; i < nproc; ++i) {
    hwloc_obj_t o = objs[size_t(i) % objs.size()];
    hwloc_bitmap_and(set, o->cpuset, hwloc_topology_get_allowed_cpuset(t));
    Binding& b = out[size_t(i)];
    b.bound = true;
    CPU_ZERO(&b.cpus);
    for (int c = hwloc_bitmap_first(set); c >= 0; c = hwloc_bitmap_next(set, c))
      if (c < CPU_SETSIZE) CPU_SET(c, &b.cpus);
    b.text = fmt::format("{} {} (CPUs {}){}", cores ? "core" : "NUMA node", o->logical_index,
                         cpu_list(set), size_t(nproc) > objs.size() ? ", shared" : "");
  }
  hwloc_bitmap_free(set);
  hwloc_topology_destroy(t);
  return true;
}

}  // namespace chorus::run
