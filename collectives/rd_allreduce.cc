// All-reduce by recursive doubling, for small messages where latency rules (Thakur,
// Rabenseifner and Gropp, "Optimization of collective communication operations in MPICH",
// IJHPCA 2005, section 4.4).
//
// In round k each rank exchanges its whole partial result with the rank whose number differs
// in bit k and both add: log2(n) rounds instead of the ring's 2(n-1). For n not a power of two
// the first 2*rem ranks pair up beforehand (even ranks hand their data to the odd neighbour
// and wait) and get the result afterwards. Partners reduce in the same operand order (lower
// rank's data first) so every rank ends with the same bits. Pieces of one round are exchanged
// one at a time (send a piece, receive a piece), so no ring ever needs more than one free slot.
#include <bit>

#include "collectives/prims.h"

namespace chorus {

Status run_rd_allreduce(OpCtx& ctx, const char* send, char* recv) {
  const OpDesc& d = ctx.desc();
  const int n = ctx.size(), r = ctx.rank();
  auto dt = *kernel_dtype(d.dtype);
  const size_t es = kernels::dtype_size(dt);
  const size_t bytes = d.count * es;
  if (n == 1) return copy_local(send, recv, bytes);
  const bool avg = d.redop == chorusAvg;
  const int p2 = static_cast<int>(std::bit_floor(static_cast<unsigned>(n)));
  const int rem = n - p2;
  const int vrank = r < 2 * rem ? (r % 2 == 0 ? -1 : r / 2) : r - rem;  // -1: folded away
  auto real = [rem](int v) { return v < rem ? 2 * v + 1 : v + rem; };
  const int rounds = std::countr_zero(static_cast<unsigned>(p2));

  // Small buffers over shared memory go eagerly: header and data in one slot per round.
  bool eager = vrank >= 0;
  for (int k = 0; k < rounds && eager; ++k) eager = ctx.eager_fits(real(vrank ^ (1 << k)), bytes);
  // ... and partners agree on that: the choice depends only on the size and the link kind.

  // Headers with everyone this rank talks to (eager rounds carry their own).
  int fold_peer = r < 2 * rem ? (r % 2 == 0 ? r + 1 : r - 1) : -1;
  int partners[8] = {-1, -1, -1, -1, -1, -1, -1, -1};
  for (int k = 0; k < rounds && k < 8 && vrank >= 0 && !eager; ++k)
    partners[k] = real(vrank ^ (1 << k));
  // (more than 256 ranks: the rounds past 8 check their header on first contact below)
  if (fold_peer >= 0 || !eager)  // (eager with a power of two: nobody to send a header to)
    CHORUS_TRY(ctx.exchange_headers({fold_peer, partners[0], partners[1], partners[2], partners[3],
                                     partners[4], partners[5], partners[6], partners[7]},
                                    {fold_peer, partners[0], partners[1], partners[2], partners[3],
                                     partners[4], partners[5], partners[6], partners[7]}));
  for (int k = 8; k < rounds && vrank >= 0 && !eager; ++k) {
    int peer = real(vrank ^ (1 << k));
    CHORUS_TRY(ctx.exchange_headers({peer}, {peer}));
  }

  const auto op = *kernel_redop(d.redop);
  Steps s(ctx, dt, op);
  const size_t piece = std::max(es, d.piece - d.piece % es);
  if (vrank < 0) {  // folded: hand the data over, get the result back
    CHORUS_TRY(s.send(fold_peer, send, bytes));
    CHORUS_TRY(s.recv(fold_peer, recv, bytes));
    return s.finish();
  }
  const char* acc = send;
  if (fold_peer >= 0) {  // take the even neighbour's data first (its data is the left operand)
    s.set_own_first(false);
    CHORUS_TRY(s.recv_reduce_copy(fold_peer, acc, recv, bytes));
    acc = recv;
  }
  for (int k = 0; k < rounds && eager; ++k) {
    int vpeer = vrank ^ (1 << k);
    s.set_own_first(vrank < vpeer);
    CHORUS_TRY(s.exchange_reduce_copy(real(vpeer), acc, recv, bytes, avg && k == rounds - 1));
    acc = recv;
  }
  for (int k = 0; k < rounds && !eager; ++k) {
    int vpeer = vrank ^ (1 << k);
    int peer = real(vpeer);
    s.set_own_first(vrank < vpeer);
    bool last = k == rounds - 1;
    for (size_t off = 0; off < bytes; off += piece) {
      size_t len = std::min(piece, bytes - off);
      CHORUS_TRY(s.send_copy(peer, acc + off, len));
      CHORUS_TRY(s.recv_reduce_copy(peer, acc + off, recv + off, len, avg && last));
    }
    acc = recv;
  }
  if (fold_peer >= 0) CHORUS_TRY(s.send(fold_peer, recv, bytes));
  return s.finish();
}

}  // namespace chorus
