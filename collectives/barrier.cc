// Barrier by dissemination (Hensgen, Finkel and Manber, "Two algorithms for barrier
// synchronization", 1988): in round k each rank signals rank + 2^k and waits for rank - 2^k.
// After ceil(log2 n) rounds every rank has heard, directly or not, from every other.
// The signal is the operation's header itself, so a rank that is in another call is caught.
#include "collectives/comm.h"

namespace chorus {

Status run_barrier(OpCtx& ctx) {
  const int n = ctx.size(), r = ctx.rank();
  for (int k = 1; k < n; k <<= 1) {
    int to = (r + k) % n, from = (r - k + n) % n;
    uint64_t ts = ctx.send_header(to);
    uint64_t tr = ctx.recv_header(from);
    CHORUS_TRY(ctx.wait([&] { return ctx.link(from).recv_done(tr); }, from));
    CHORUS_TRY(ctx.check_header(from));
    CHORUS_TRY(ctx.wait_send(to, ts));
  }
  return Status::ok();
}

}  // namespace chorus
