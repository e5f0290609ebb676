// Point-to-point send and receive.
//
// Messages between two ranks travel in call order on their link; each starts with the
// operation's header, so a receive that does not match the send (count, type or tag) fails on
// the receiving rank -- and, through the job's watch channel, on the sender too -- instead of
// delivering the wrong bytes. The receiver reads the header before it takes any data.
#include "collectives/prims.h"

namespace chorus {

Status run_send(OpCtx& ctx, const void* buf, size_t bytes) {
  Steps s(ctx, kernels::DType::kU8, kernels::RedOp::kSum);
  CHORUS_TRY(s.send_message(ctx.desc().peer, static_cast<const char*>(buf), bytes));
  return s.finish();
}

Status run_recv(OpCtx& ctx, void* buf, size_t bytes) {
  Steps s(ctx, kernels::DType::kU8, kernels::RedOp::kSum);
  return s.recv_message(ctx.desc().peer, static_cast<char*>(buf), bytes);
}

}  // namespace chorus
