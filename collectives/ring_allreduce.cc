// All-reduce on a ring: reduce-scatter, then all-gather (Patarasuk and Yuan, "Bandwidth optimal
// all-reduce algorithms for clusters of workstations", JPDC 2009; the step sequence of NCCL's
// runRing in all_reduce.h).
//
// Vocabulary: the buffer is cut into n chunks, one per rank; each chunk into pieces, and the
// whole sequence of 2n-1 steps runs once per piece index, so consecutive pieces pipeline
// through the links' slots. In step s rank r works on chunk (r - s) mod n: it receives the
// partial sum of that chunk from its predecessor, adds its own part and passes it on. After
// n-1 steps rank r holds the complete chunk r+1... n-1 steps later every rank holds all.
// Each rank sends and receives 2(n-1)/n of the buffer: optimal in bandwidth for large messages.
#include <algorithm>

#include "collectives/prims.h"

namespace chorus {

namespace {
// Elements [begin, begin + len) of piece p of chunk c.
struct Piece {
  size_t begin, len;
};
Piece piece_of(size_t count, int n, size_t chunk_elems, size_t piece_elems, int c, size_t p) {
  size_t cb = std::min(count, c * chunk_elems), ce = std::min(count, cb + chunk_elems);
  size_t b = std::min(ce, cb + p * piece_elems), e = std::min(ce, b + piece_elems);
  (void)n;
  return {b, e - b};
}
}  // namespace

// The ring runs host by host (hosts.h): each host boundary is crossed once per direction.
Status run_ring_allreduce(OpCtx& ctx, const char* send, char* recv) {
  const std::vector<int>& ring = ctx.hosts().ring;
  const int n = ctx.size(), pos = ctx.hosts().ring_pos[ctx.rank()];
  if (n == 1)
    return copy_local(send, recv,
                      ctx.desc().count * kernels::dtype_size(*kernel_dtype(ctx.desc().dtype)));
  CHORUS_TRY(ctx.exchange_headers({ring[(pos + 1) % n]}, {ring[(pos + n - 1) % n]}));
  return ring_allreduce_steps(ctx, ring, send, recv);
}

Status ring_allreduce_steps(OpCtx& ctx, std::span<const int> ring, const char* send, char* recv) {
  const OpDesc& d = ctx.desc();
  const int n = static_cast<int>(ring.size());
  const int r = static_cast<int>(std::find(ring.begin(), ring.end(), ctx.rank()) - ring.begin());
  auto dt = *kernel_dtype(d.dtype);
  auto op = *kernel_redop(d.redop);
  const size_t es = kernels::dtype_size(dt);
  const bool avg = d.redop == chorusAvg;  // divides by the communicator's size
  if (n == 1) return copy_local(send, recv, d.count * es);
  const int next = ring[(r + 1) % n], prev = ring[(r + n - 1) % n];
  Steps s(ctx, dt, op);
  s.set_streaming(use_streaming(d.count * es));
  // Two ranks combine each element once, in rank order: x0 op x1, the deterministic mode's
  // fold (chorus.h), whatever the chunks and pieces -- so that mode runs this ring there.
  s.set_own_first(n == 2 && ctx.rank() < prev);
  const size_t chunk_elems = (d.count + n - 1) / n;
  const size_t piece_elems = std::max<size_t>(1, d.piece / es);
  const size_t npieces = chunk_elems == 0 ? 0 : (chunk_elems + piece_elems - 1) / piece_elems;
  auto mod = [n](int x) { return ((x % n) + n) % n; };
  for (size_t p = 0; p < npieces; ++p) {
    auto at = [&](int c) { return piece_of(d.count, n, chunk_elems, piece_elems, c, p); };
    Piece x = at(mod(r - 1));  // step 0: push our part of chunk r-1
    CHORUS_TRY(s.send(next, send + x.begin * es, x.len * es));
    for (int j = 2; j < n; ++j) {  // n-2 steps: add ours, pass it on
      x = at(mod(r - j));
      CHORUS_TRY(s.recv_reduce_send(prev, next, send + x.begin * es, x.len * es));
    }
    x = at(r);  // chunk r is complete here: keep and pass on
    CHORUS_TRY(s.recv_reduce_copy_send(prev, next, send + x.begin * es, recv + x.begin * es,
                                       x.len * es, avg));
    for (int j = 1; j < n - 1; ++j) {  // n-2 steps: copy and pass on
      x = at(mod(r - j));
      CHORUS_TRY(s.recv_copy_send(prev, next, recv + x.begin * es, x.len * es));
    }
    x = at(mod(r + 1));  // the last complete chunk arrives
    CHORUS_TRY(s.recv(prev, recv + x.begin * es, x.len * es));
  }
  return s.finish();
}

}  // namespace chorus
