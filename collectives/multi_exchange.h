// Multi-peer exchange: the primitive under the ordered (deterministic) algorithms (ordered.cc).
//
// One call moves a range to each of several peers and a range from each of several peers, all
// at once: whichever direction of whichever link can move, moves, so ranks that all send to
// all never wait on one another (the multi-peer form of Steps::send_recv). Received bytes are
// either stored (gather mode) or, in fold mode, combined as they arrive with this rank's own
// contribution in rank order -- in[0] op in[1] op ... op in[W-1], this rank's own bytes at
// its position -- by the executor's reduce_fold, so the result of an element depends only on
// the W contributions, never on how the stream was cut into pieces or which rank was late.
//
// Over links with direct slots (shm) bytes are folded straight out of every peer's slot; over
// others (tcp) each peer's contribution arrives piece by piece in two staging buffers per peer
// (one being folded, one being received) and sends go out of the caller's memory in one
// request per peer. The call returns when every byte has left and arrived (its tcp sends are
// complete, so the caller may overwrite the sent ranges at once).
// Headers are the caller's business: exchange and check them before calling.
#pragma once

#include <span>

#include "collectives/comm.h"
#include "collectives/executor.h"

namespace chorus {

struct ExchangeOut {
  int peer;
  const char* src;
  size_t bytes;
};
struct ExchangeIn {
  int peer;
  char* dst;  // gather mode: where the bytes go; unused in fold mode
  size_t bytes;
};
// Fold mode: every ExchangeIn carries `bytes` of the same elements (ins sorted by rank);
// dst = fold over ranks in order of (own at position `me`, the peers' bytes).
struct ExchangeFold {
  kernels::DType dtype;
  kernels::RedOp op;
  int me;  // this rank's position among the contributions (ranks in `ins` below and above it)
  const char* own;
  char* dst;
  size_t bytes;
  int avg_n;  // > 0: avg, divide the fold by this
  // Large results (use_streaming in prims.h): fold each piece into cache-resident scratch and
  // store it with streaming stores, so dst's lines are never read for ownership.
  bool streaming = false;
};

Status multi_exchange(OpCtx& ctx, Executor& exec, size_t elem_size,
                      std::span<const ExchangeOut> outs, std::span<const ExchangeIn> ins,
                      const ExchangeFold* fold);

}  // namespace chorus
