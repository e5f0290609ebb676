// The plans of the device operations (device_plan.h): which blocks each rank folds or copies
// where, whom it meets, and all-to-all-v's arrays checked -- from the call alone.
#include "collectives/device_plan.h"

#include <algorithm>

namespace chorus {
namespace {

// Slice s of `count` elements cut into `parts`: [lo, lo + n), starting at multiples of align.
struct Slice {
  size_t lo, n;
};
Slice slice_of(size_t count, int parts, int s, size_t align) {
  const size_t per = ((count + parts - 1) / parts + align - 1) / align * align;
  const size_t lo = std::min(count, per * s);
  return {lo, std::min(per, count - lo)};
}

std::vector<BufRef> every_send(int p, size_t elem) {
  std::vector<BufRef> in;
  for (int q = 0; q < p; ++q) in.push_back({q, false, elem});
  return in;
}

}  // namespace

bool device_uses_send(OpKind kind, int rank, int root) {
  return (kind != OpKind::kBroadcast && kind != OpKind::kScatter) || rank == root;
}

bool device_uses_recv(OpKind kind, int rank, int root) {
  return (kind != OpKind::kReduce && kind != OpKind::kGather) || rank == root;
}

size_t device_send_count(OpKind kind, size_t count, int nranks) {
  const bool blocks =
      kind == OpKind::kReduceScatter || kind == OpKind::kScatter || kind == OpKind::kAllToAll;
  return blocks ? count * nranks : count;
}

size_t device_recv_count(OpKind kind, size_t count, int nranks) {
  const bool blocks =
      kind == OpKind::kAllGather || kind == OpKind::kGather || kind == OpKind::kAllToAll;
  return blocks ? count * nranks : count;
}

int device_leader(OpKind kind, int root) {
  const bool rooted = kind == OpKind::kReduce || kind == OpKind::kBroadcast ||
                      kind == OpKind::kGather || kind == OpKind::kScatter;
  return rooted ? root : 0;
}

DeviceMeet device_meet(int rank, int peer, int leader, bool star, bool barrier) {
  if (!star || barrier) return {true, true, !barrier, !barrier};  // a barrier: every rank
  if (rank == leader) return {false, true, true, false};
  if (peer == leader) return {true, false, false, true};
  return {};
}

std::vector<DeviceTask> plan_device_op(const DevicePlanArgs& a) {
  const int p = a.nranks, r = a.rank;
  const size_t n = a.count;
  const int leader = device_leader(a.kind, a.root);
  std::vector<DeviceTask> tasks;
  if (n == 0 || (a.one_gpu && r != leader)) return tasks;
  // The ranks whose outputs this rank writes: all of them for the one-GPU leader, else its own.
  std::vector<int> outs;
  for (int d = 0; d < p; ++d)
    if (a.one_gpu || d == r) outs.push_back(d);
  switch (a.kind) {
    case OpKind::kAllReduce:
    case OpKind::kReduce: {
      const Slice s = a.one_gpu ? Slice{0, n} : slice_of(n, p, r, a.align);
      if (s.n == 0) break;
      std::vector<BufRef> to;  // reduce: the root's output; all-reduce: every rank's
      for (int d = 0; d < p; ++d)
        if (a.kind == OpKind::kAllReduce || d == a.root) to.push_back({d, true, s.lo});
      tasks.push_back({every_send(p, s.lo), to, s.n, true});
      break;
    }
    case OpKind::kBroadcast: {
      std::vector<BufRef> to;
      for (int d : outs) to.push_back({d, true, 0});
      tasks.push_back({{{a.root, false, 0}}, to, n, false});
      break;
    }
    case OpKind::kAllGather:
      for (int q = 0; q < p; ++q) {
        std::vector<BufRef> to;
        for (int d : outs) to.push_back({d, true, q * n});
        tasks.push_back({{{q, false, 0}}, to, n, false});
      }
      break;
    case OpKind::kReduceScatter:
      for (int d : outs) tasks.push_back({every_send(p, d * n), {{d, true, 0}}, n, true});
      break;
    case OpKind::kGather:  // the root's output only; its own block first
      if (r != a.root) break;
      tasks.push_back({{{r, false, 0}}, {{r, true, r * n}}, n, false});
      for (int q = 0; q < p; ++q)
        if (q != r) tasks.push_back({{{q, false, 0}}, {{r, true, q * n}}, n, false});
      break;
    case OpKind::kScatter:
      for (int d : outs) tasks.push_back({{{a.root, false, d * n}}, {{d, true, 0}}, n, false});
      break;
    case OpKind::kAllToAll:  // rank d's block q: rank q's block d
      for (int d : outs)
        for (int q = 0; q < p; ++q)
          tasks.push_back({{{q, false, d * n}}, {{d, true, q * n}}, n, false});
      break;
    default:
      break;
  }
  return tasks;
}

std::vector<DeviceTask> plan_device_alltoallv(int nranks, int rank, bool one_gpu,
                                              std::span<const PerRankCounts> all) {
  std::vector<DeviceTask> tasks;
  if (one_gpu && rank != 0) return tasks;
  for (int d = 0; d < nranks; ++d) {
    if (!one_gpu && d != rank) continue;
    for (int q = 0; q < nranks; ++q) {
      const size_t n = all[q].sendcounts[d];
      if (n > 0)
        tasks.push_back(
            {{{q, false, all[q].sdispls[d]}}, {{d, true, all[d].rdispls[q]}}, n, false});
    }
  }
  return tasks;
}

size_t device_extent(const size_t* counts, const size_t* displs, int nranks) {
  size_t end = 0;
  for (int j = 0; j < nranks; ++j)
    if (counts[j] > 0) end = std::max(end, displs[j] + counts[j]);
  return end;
}

int device_alltoallv_out_of_range(std::span<const PerRankCounts> all, size_t most) {
  const int p = int(all.size());
  for (int q = 0; q < p; ++q)
    for (int j = 0; j < p; ++j)
      for (auto [count, displ] : {std::pair{all[q].sendcounts[j], all[q].sdispls[j]},
                                  std::pair{all[q].recvcounts[j], all[q].rdispls[j]}})
        if (count > most || displ > most - count) return q;
  return -1;
}

std::pair<int, int> device_alltoallv_mismatch(std::span<const PerRankCounts> all) {
  const int p = int(all.size());
  for (int q = 0; q < p; ++q)
    for (int d = 0; d < p; ++d)
      if (all[q].sendcounts[d] != all[d].recvcounts[q]) return {q, d};
  return {-1, -1};
}

}  // namespace chorus
