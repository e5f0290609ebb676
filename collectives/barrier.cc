// Barrier by dissemination (Hensgen, Finkel and Manber, "Two algorithms for barrier
// synchronization", 1988): in round k each rank signals rank + 2^k and waits for rank - 2^k.
// After ceil(log2 n) rounds every rank has heard, directly or not, from every other.
// The signal is the operation's header itself, so a rank that is in another call is caught.
#include "collectives/prims.h"

namespace chorus {

Status run_barrier(OpCtx& ctx) {
  const int n = ctx.size(), r = ctx.rank();
  Steps s(ctx, kernels::DType::kU8, kernels::RedOp::kSum);
  for (int k = 1; k < n; k <<= 1) {
    CHORUS_TRY(s.send_header((r + k) % n));      // signal rank + 2^k
    CHORUS_TRY(s.recv_header((r - k + n) % n));  // hear from rank - 2^k
    CHORUS_TRY(s.finish());
  }
  return Status::ok();
}

}  // namespace chorus
