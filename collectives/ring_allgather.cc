// All-gather on a ring (the step sequence of NCCL's all_gather.h runRing).
//
// Rank r's block starts at offset r * count of recvbuff. In step 0 each rank stores its own
// block and sends it on; in each of the next n-2 steps it stores the block arriving from its
// predecessor and forwards it; in the last step it only stores. Blocks are cut into pieces
// that pipeline. Each rank sends and receives (n-1)/n of the result: bandwidth optimal.
#include <cstring>

#include "collectives/prims.h"

namespace chorus {

Status run_ring_allgather(OpCtx& ctx, const char* send, char* recv) {
  const OpDesc& d = ctx.desc();
  const int n = ctx.size(), r = ctx.rank();
  const size_t es = dtype_size(d.dtype);
  const size_t block = d.count * es;  // bytes per rank
  char* mine = recv + r * block;
  if (send != mine && block > 0) std::memmove(mine, send, block);
  if (n == 1) return Status::ok();
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  CHORUS_TRY(ctx.exchange_headers({next}, {prev}));
  // Gathers move bytes only; u8 steps never split an element of any type.
  Steps s(ctx, kernels::DType::kU8, kernels::RedOp::kSum);
  s.set_streaming(use_streaming(block * n));
  auto mod = [n](int x) { return ((x % n) + n) % n; };
  const size_t piece = std::max<size_t>(es, d.piece - d.piece % es);
  for (size_t off = 0; off < block; off += piece) {
    size_t len = std::min(piece, block - off);
    CHORUS_TRY(s.send(next, mine + off, len));  // step 0: ours
    for (int j = 1; j < n - 1; ++j)             // n-2 steps: store, pass on
      CHORUS_TRY(s.recv_copy_send(prev, next, recv + mod(r - j) * block + off, len));
    CHORUS_TRY(s.recv(prev, recv + mod(r + 1) * block + off, len));  // last: store
  }
  return s.finish();
}

}  // namespace chorus
