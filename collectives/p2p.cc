// Point-to-point send and receive.
//
// Messages between two ranks travel in call order on their link; each starts with the
// operation's header, so a receive that does not match the send (count, type or tag) fails on
// the receiving rank -- and, through the job's watch channel, on the sender too -- instead of
// delivering the wrong bytes. The receiver reads the header before posting the data receive.
#include "collectives/comm.h"

namespace chorus {

Status run_send(OpCtx& ctx, const void* buf, size_t bytes) {
  int peer = ctx.desc().peer;
  ctx.send_header(peer);
  uint64_t t = ctx.link(peer).post_send(buf, bytes);
  return ctx.wait_send(peer, t);
}

Status run_recv(OpCtx& ctx, void* buf, size_t bytes) {
  int peer = ctx.desc().peer;
  uint64_t h = ctx.recv_header(peer);
  CHORUS_TRY(ctx.wait_recv(peer, h));
  CHORUS_TRY(ctx.check_header(peer));
  uint64_t t = ctx.link(peer).post_recv(buf, bytes);
  return ctx.wait_recv(peer, t);
}

}  // namespace chorus
