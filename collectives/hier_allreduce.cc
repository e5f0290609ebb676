// Hierarchical all-reduce for ranks on several hosts (hosts.h), in three phases:
//   1. inside each host, a chain reduces every rank's buffer into the host's leader (its
//      lowest rank): last -> ... -> second -> leader, pieces pipelined;
//   2. the leaders all-reduce the host sums with the ring (ring_allreduce.cc);
//   3. inside each host, a chain passes the result back: leader -> second -> ... -> last.
// Across hosts each leader sends and receives 2(h-1)/h of the buffer for h hosts, where the
// flat ring sends 2(n-1)/n through each host boundary for n ranks: with 2 hosts of 2 ranks,
// 1 buffer against 1.5. It pays where the links between hosts are the bottleneck; the tuner's
// model says when (tuner.cc). Phases do not overlap: a leader starts the ring when its host's
// sum is complete.
#include "collectives/prims.h"

namespace chorus {

Status run_hier_allreduce(OpCtx& ctx, const char* send, char* recv) {
  const OpDesc& d = ctx.desc();
  const HostLayout& hl = ctx.hosts();
  const int r = ctx.rank(), host = hl.host_of[r], h = hl.nhosts();
  const std::vector<int>& local = hl.members[host];
  const int m = static_cast<int>(local.size());
  const int li = static_cast<int>(std::find(local.begin(), local.end(), r) - local.begin());
  const int up = li > 0 ? local[li - 1] : -1;        // toward the leader
  const int down = li + 1 < m ? local[li + 1] : -1;  // away from it
  const bool leader = li == 0;
  const int next = leader && h > 1 ? hl.leaders[(host + 1) % h] : -1;
  const int prev = leader && h > 1 ? hl.leaders[(host + h - 1) % h] : -1;
  auto dt = *kernel_dtype(d.dtype);
  auto op = *kernel_redop(d.redop);
  const size_t bytes = d.count * kernels::dtype_size(dt);
  // avg divides once, at the last reduction: the leaders' ring, or the leader's chain step
  // when there is one host.
  const bool avg = d.redop == chorusAvg;
  CHORUS_TRY(ctx.exchange_headers({up, down, next}, {up, down, prev}));

  {  // 1. into the leader
    Steps s(ctx, dt, op);
    if (m == 1)
      CHORUS_TRY(copy_local(send, recv, bytes));
    else if (down < 0)
      CHORUS_TRY(s.send(up, send, bytes));
    else if (!leader)
      CHORUS_TRY(s.recv_reduce_send(down, up, send, bytes));
    else
      CHORUS_TRY(s.recv_reduce_copy(down, send, recv, bytes, avg && h == 1));
    CHORUS_TRY(s.finish());
  }
  if (leader && h > 1)  // 2. between the leaders, in place
    CHORUS_TRY(ring_allreduce_steps(ctx, hl.leaders, recv, recv));
  if (m == 1) return Status::ok();
  // 3. back out
  Steps s(ctx, dt, op);
  s.set_streaming(use_streaming(bytes));
  if (leader)
    CHORUS_TRY(s.send(down, recv, bytes));
  else if (down >= 0)
    CHORUS_TRY(s.recv_copy_send(up, down, recv, bytes));
  else
    CHORUS_TRY(s.recv(up, recv, bytes));
  return s.finish();
}

}  // namespace chorus
