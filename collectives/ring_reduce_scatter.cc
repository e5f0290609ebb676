// Reduce-scatter on a ring (the step sequence of NCCL's reduce_scatter.h runRing).
//
// sendbuff holds n blocks of count elements; rank r must end with the reduction of block r.
// In step 0 each rank sends its part of block r-1; in each of the next n-2 steps it adds its
// part of the block arriving from its predecessor and passes the sum on; in the last step the
// block that arrives is block r, missing only this rank's part: add it and store it.
// Pieces pipeline; each rank sends and receives (n-1)/n of the input.
#include "collectives/prims.h"

namespace chorus {

Status run_ring_reduce_scatter(OpCtx& ctx, const char* send, char* recv) {
  const OpDesc& d = ctx.desc();
  const int n = ctx.size(), r = ctx.rank();
  auto dt = *kernel_dtype(d.dtype);
  const size_t es = kernels::dtype_size(dt);
  const size_t block = d.count * es;
  if (n == 1) return copy_local(send, recv, block);
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  CHORUS_TRY(ctx.exchange_headers({next}, {prev}));
  Steps s(ctx, dt, *kernel_redop(d.redop));
  s.set_streaming(use_streaming(block * n));
  s.set_own_first(n == 2 && r == 0);  // two ranks: x0 op x1, as in ring_allreduce.cc
  auto mod = [n](int x) { return ((x % n) + n) % n; };
  const size_t piece = std::max(es, d.piece - d.piece % es);
  const bool avg = d.redop == chorusAvg;
  for (size_t off = 0; off < block; off += piece) {
    size_t len = std::min(piece, block - off);
    CHORUS_TRY(s.send(next, send + mod(r - 1) * block + off, len));  // step 0
    for (int j = 2; j < n; ++j)                                      // add, pass on
      CHORUS_TRY(s.recv_reduce_send(prev, next, send + mod(r - j) * block + off, len));
    CHORUS_TRY(
        s.recv_reduce_copy(prev, send + r * block + off, recv + off, len, avg));  // ours: store
  }
  return s.finish();
}

}  // namespace chorus
