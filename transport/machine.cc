// The machine through hwloc (see machine.h).
#include "transport/machine.h"

#include <hwloc.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <memory>

#include <fmt/format.h>

namespace chorus::transport {
namespace {

struct TopoDeleter {
  void operator()(hwloc_topology* t) const { hwloc_topology_destroy(t); }
};
using Topo = std::unique_ptr<hwloc_topology, TopoDeleter>;

struct BitmapDeleter {
  void operator()(hwloc_bitmap_s* b) const { hwloc_bitmap_free(b); }
};
using Bitmap = std::unique_ptr<hwloc_bitmap_s, BitmapDeleter>;

Result<Topo> load(const std::string& xml_path, bool io) {
  hwloc_topology_t raw = nullptr;
  if (hwloc_topology_init(&raw) != 0)
    return make_error(Code::kSystemError, "hwloc: hwloc_topology_init failed");
  Topo t(raw);
  if (io) hwloc_topology_set_io_types_filter(raw, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
  // PCI devices come from Linux's sysfs; the libpciaccess plugin, which finds the same ones,
  // leaks memory at every load (LeakSanitizer sees it).
  hwloc_topology_set_components(raw, HWLOC_TOPOLOGY_COMPONENTS_FLAG_BLACKLIST, "pci");
  // Binding needs only CPU and NUMA sets (sysfs): without the x86 backend, which binds the
  // loading thread to each PU in turn to run CPUID there.
  if (!io) hwloc_topology_set_components(raw, HWLOC_TOPOLOGY_COMPONENTS_FLAG_BLACKLIST, "x86");
  // GPUs as PCI devices are all we need of them. The components that ask a GPU API would, in
  // every rank, start the OpenCL ICD loader (with NVIDIA's ICD, the driver), talk to an X
  // server, or set up CUDA, NVML, ROCm SMI or Level Zero. The OpenCL one also took the thread
  // local storage of libOpenCL, which hwloc then unloads: LeakSanitizer's tracer (clang 14)
  // crashed on that storage at every rank's leak check (test_device_ops, 2026-11-28).
  for (const char* gpu_api : {"opencl", "gl", "cuda", "nvml", "rsmi", "levelzero"})
    hwloc_topology_set_components(raw, HWLOC_TOPOLOGY_COMPONENTS_FLAG_BLACKLIST, gpu_api);
  if (!xml_path.empty() && hwloc_topology_set_xml(raw, xml_path.c_str()) != 0)
    return make_error(Code::kInvalidArgument, "hwloc: cannot read the topology file {}", xml_path);
  if (hwloc_topology_load(raw) != 0)
    return make_error(Code::kSystemError, "hwloc: hwloc_topology_load failed{}",
                      xml_path.empty() ? "" : " for " + xml_path);
  return t;
}

std::string list(hwloc_const_bitmap_t b) {
  if (b == nullptr || hwloc_bitmap_iszero(b)) return "";
  char* s = nullptr;
  hwloc_bitmap_list_asprintf(&s, b);
  std::string out = s ? s : "";
  free(s);
  return out;
}

int count(hwloc_topology_t t, hwloc_obj_type_t type) {
  return std::max(0, hwloc_get_nbobjs_by_type(t, type));
}

// GPUs: 3D controllers, and NVIDIA's VGA controllers. NICs: network and InfiniBand controllers.
bool is_gpu(hwloc_obj_t o) {
  unsigned cls = o->attr->pcidev.class_id;
  return cls == 0x0302 || (cls == 0x0300 && o->attr->pcidev.vendor_id == 0x10de);
}
bool is_nic(hwloc_obj_t o) {
  return (o->attr->pcidev.class_id >> 8) == 0x02;
}

PciInfo pci_info(hwloc_topology_t t, hwloc_obj_t o) {
  PciInfo p;
  const auto& a = o->attr->pcidev;
  p.bus_id = fmt::format("{:04x}:{:02x}:{:02x}.{:x}", a.domain, a.bus, a.dev, a.func);
  p.vendor_device = fmt::format("{:04x}:{:04x}", a.vendor_id, a.device_id);
  for (hwloc_obj_t c = o->io_first_child; c; c = c->next_sibling)
    if (c->type == HWLOC_OBJ_OS_DEVICE && c->name) {
      if (!p.names.empty()) p.names += ',';
      p.names += c->name;
    }
  hwloc_obj_t host = hwloc_get_non_io_ancestor_obj(t, o);
  if (host) {
    p.cpus = list(host->cpuset);
    if (host->nodeset && hwloc_bitmap_weight(host->nodeset) == 1)
      p.numa = hwloc_bitmap_first(host->nodeset);
  }
  return p;
}

// Hops from a to b through their nearest common ancestor.
int hops(hwloc_obj_t a, hwloc_obj_t b) {
  int up_a = 0;
  for (hwloc_obj_t x = a; x; x = x->parent, ++up_a) {
    int up_b = 0;
    for (hwloc_obj_t y = b; y; y = y->parent, ++up_b)
      if (x == y) return up_a + up_b;
  }
  return 1 << 20;
}

std::string bytes_text(uint64_t b) {
  if (b >= (1ull << 30) && b % (1ull << 30) == 0) return fmt::format("{} GiB", b >> 30);
  if (b >= (1ull << 30)) return fmt::format("{:.1f} GiB", double(b) / double(1ull << 30));
  if (b >= (1ull << 20)) return fmt::format("{} MiB", b >> 20);
  return fmt::format("{} KiB", b >> 10);
}

}  // namespace

Result<Machine> read_machine(const std::string& xml_path) {
  CHORUS_ASSIGN_OR_RETURN(Topo topo, load(xml_path, /*io=*/true));
  hwloc_topology_t t = topo.get();
  Machine m;
  m.packages = count(t, HWLOC_OBJ_PACKAGE);
  m.cores = count(t, HWLOC_OBJ_CORE);
  m.pus = count(t, HWLOC_OBJ_PU);
  for (int i = 0; i < count(t, HWLOC_OBJ_NUMANODE); ++i) {
    hwloc_obj_t n = hwloc_get_obj_by_type(t, HWLOC_OBJ_NUMANODE, unsigned(i));
    m.numa.push_back({int(n->os_index), list(n->cpuset), n->attr->numanode.local_memory});
  }
  for (hwloc_obj_type_t type :
       {HWLOC_OBJ_L1CACHE, HWLOC_OBJ_L2CACHE, HWLOC_OBJ_L3CACHE, HWLOC_OBJ_L4CACHE}) {
    int n = count(t, type);
    if (n == 0) continue;
    hwloc_obj_t c = hwloc_get_obj_by_type(t, type, 0);
    m.caches.push_back({int(c->attr->cache.depth), c->attr->cache.size, n});
  }
  std::vector<hwloc_obj_t> gpu_objs, nic_objs;
  for (hwloc_obj_t o = hwloc_get_next_pcidev(t, nullptr); o; o = hwloc_get_next_pcidev(t, o)) {
    if (is_gpu(o)) {
      gpu_objs.push_back(o);
      m.gpus.push_back(pci_info(t, o));
    } else if (is_nic(o)) {
      nic_objs.push_back(o);
      m.nics.push_back(pci_info(t, o));
    }
  }
  for (hwloc_obj_t g : gpu_objs) {
    int best = -1, best_hops = 0;
    for (size_t k = 0; k < nic_objs.size(); ++k) {
      int h = hops(g, nic_objs[k]);
      if (best < 0 || h < best_hops) best = int(k), best_hops = h;
    }
    m.nic_for_gpu.push_back(best);
  }
  return m;
}

std::vector<std::string> nic_names_near_gpu(const Machine& m, const std::string& gpu_bus_id) {
  std::vector<std::string> names;
  for (size_t g = 0; g < m.gpus.size(); ++g) {
    if (m.gpus[g].bus_id != gpu_bus_id || m.nic_for_gpu[g] < 0) continue;
    const std::string& all = m.nics[size_t(m.nic_for_gpu[g])].names;
    for (size_t b = 0; b < all.size();) {
      size_t e = all.find(',', b);
      if (e == std::string::npos) e = all.size();
      if (e > b) names.push_back(all.substr(b, e - b));
      b = e + 1;
    }
  }
  return names;
}

std::string describe(const Machine& m) {
  std::string s = fmt::format("machine: {} package(s), {} NUMA node(s), {} core(s), {} PU(s)\n",
                              m.packages, m.numa.size(), m.cores, m.pus);
  for (const NumaInfo& n : m.numa)
    s += fmt::format("  NUMA node {}: CPUs {}, {}\n", n.os_index, n.cpus, bytes_text(n.bytes));
  for (const CacheInfo& c : m.caches)
    s += fmt::format("  L{} cache: {} x {}\n", c.level, c.count, bytes_text(c.bytes));
  auto where = [](const PciInfo& p) {
    return p.numa >= 0 ? fmt::format("NUMA node {}", p.numa) : fmt::format("CPUs {}", p.cpus);
  };
  for (size_t g = 0; g < m.gpus.size(); ++g) {
    const PciInfo& p = m.gpus[g];
    s += fmt::format("  GPU {}: {} [{}]{} near {}", g, p.bus_id, p.vendor_device,
                     p.names.empty() ? "" : " " + p.names, where(p));
    int k = m.nic_for_gpu[g];
    s += k >= 0 ? fmt::format("; closest NIC {} ({})\n", k, m.nics[size_t(k)].bus_id) : "\n";
  }
  for (size_t k = 0; k < m.nics.size(); ++k) {
    const PciInfo& p = m.nics[k];
    s += fmt::format("  NIC {}: {} [{}]{} near {}\n", k, p.bus_id, p.vendor_device,
                     p.names.empty() ? "" : " " + p.names, where(p));
  }
  if (m.gpus.empty()) s += "  no GPU on the PCI bus\n";
  if (m.nics.empty()) s += "  no NIC on the PCI bus\n";
  return s;
}

Result<std::string> bind_thread_near_process() {
  // Cheap first: a process that may run on every online CPU is not bound (no hwloc load).
  cpu_set_t mine;
  CPU_ZERO(&mine);
  if (sched_getaffinity(0, sizeof mine, &mine) == 0 &&
      CPU_COUNT(&mine) >= sysconf(_SC_NPROCESSORS_ONLN))
    return std::string();
  CHORUS_ASSIGN_OR_RETURN(Topo topo, load("", /*io=*/false));
  hwloc_topology_t t = topo.get();
  Bitmap bound(hwloc_bitmap_alloc()), nodes(hwloc_bitmap_alloc()), near(hwloc_bitmap_alloc());
  if (hwloc_get_cpubind(t, bound.get(), HWLOC_CPUBIND_PROCESS) != 0)
    return make_error(Code::kSystemError, "hwloc: hwloc_get_cpubind of the process failed");
  hwloc_const_cpuset_t allowed = hwloc_topology_get_allowed_cpuset(t);
  if (hwloc_bitmap_iszero(bound.get()) || hwloc_bitmap_isincluded(allowed, bound.get()))
    return std::string();  // not bound: threads run anywhere
  hwloc_cpuset_to_nodeset(t, bound.get(), nodes.get());
  hwloc_cpuset_from_nodeset(t, near.get(), nodes.get());
  hwloc_bitmap_and(near.get(), near.get(), allowed);
  if (hwloc_bitmap_iszero(near.get())) hwloc_bitmap_copy(near.get(), bound.get());
  if (hwloc_set_cpubind(t, near.get(), HWLOC_CPUBIND_THREAD) != 0)
    return make_error(Code::kSystemError, "hwloc: binding the thread to CPUs {} failed",
                      list(near.get()));
  return fmt::format("the process is bound to CPUs {}: thread bound to CPUs {} (NUMA node(s) {})",
                     list(bound.get()), list(near.get()), list(nodes.get()));
}

}  // namespace chorus::transport
