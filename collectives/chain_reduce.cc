// Reduce to a root along a pipelined chain: root+1 -> root+2 -> ... -> root-1 -> root.
//
// The first rank of the chain sends its buffer piece by piece, every later rank adds its own
// piece to the one it receives and passes the sum on, and the root adds the last contribution
// into recvbuff. As with the broadcast chain, pieces stream, so for large buffers the time
// approaches bytes / link bandwidth whatever the number of ranks (the reduction half of the
// pipelined ring in Patarasuk and Yuan, JPDC 2009).
#include "collectives/prims.h"

namespace chorus {

Status run_chain_reduce(OpCtx& ctx, const char* send, char* recv) {
  const OpDesc& d = ctx.desc();
  const int n = ctx.size(), r = ctx.rank(), root = d.root;
  auto dt = *kernel_dtype(d.dtype);
  const size_t es = kernels::dtype_size(dt);
  const size_t bytes = d.count * es;
  if (n == 1) return copy_local(send, recv, bytes);
  const int pos = (r - root - 1 + 2 * n) % n;  // root is last (pos n-1)
  const int prev = pos > 0 ? (r - 1 + n) % n : -1;
  const int next = pos < n - 1 ? (r + 1) % n : -1;
  CHORUS_TRY(ctx.exchange_headers({next}, {prev}));
  Steps s(ctx, dt, *kernel_redop(d.redop));
  s.set_streaming(use_streaming(bytes));
  const size_t piece = std::max(es, d.piece - d.piece % es);
  const bool avg = d.redop == chorusAvg;
  for (size_t off = 0; off < bytes; off += piece) {
    size_t len = std::min(piece, bytes - off);
    if (prev < 0)
      CHORUS_TRY(s.send(next, send + off, len));
    else if (next >= 0)
      CHORUS_TRY(s.recv_reduce_send(prev, next, send + off, len));
    else
      CHORUS_TRY(s.recv_reduce_copy(prev, send + off, recv + off, len, avg));
  }
  return s.finish();
}

}  // namespace chorus
