// All-to-all (and all-to-all-v) by pairwise exchange: the schedule of MPICH's MPI_Alltoall for
// long messages (Thakur, Rabenseifner and Gropp, "Optimization of collective communication
// operations in MPICH", IJHPCA 2005).
//
// Vocabulary: block j of sendbuff goes to rank j; block i of recvbuff comes from rank i. Rank r
// first copies its own block (r to r), then in step k = 1 .. n-1 sends block r+k to rank r+k
// and receives block r-k from rank r-k, both at once (Steps::send_recv), so in every step each
// rank feeds exactly one rank and drains exactly one, and no pair of ranks -- nor any cycle of
// them -- waits on the other whatever the block sizes, over shm rings or tcp sockets alike.
// Every byte crosses one link once. Each step sends our header with our block and checks the
// incoming header before reading the incoming block, so a rank in another call is caught before
// its data is read, without a round trip per step.
//
// All-to-all-v: blocks have per-pair counts and displacements. Each step's header carries
// what the sender sends this receiver, checked against what the receiver expects from it; a
// disagreement fails naming both ranks and both counts (never a truncated block). A zero-count
// pair still exchanges headers.
//
// In place: when sendbuff's blocks overlap recvbuff's (sendbuff == recvbuff included), a block
// received in step k would overwrite one this rank sends only later, so the input is first
// copied aside (one extra copy of it, in a buffer of the communicator freed when the call ends).
#include <algorithm>
#include <cstring>

#include "collectives/prims.h"

namespace chorus {
namespace {

// Bytes [lo, hi) of a buffer that a side's non-empty blocks cover; lo == hi when none.
struct Extent {
  size_t lo = 0, hi = 0;
};

Extent extent(const ExchangeLayout& l, int n, size_t es, bool send) {
  Extent e{SIZE_MAX, 0};
  for (int j = 0; j < n; ++j) {
    const size_t count = send ? l.send_count(j) : l.recv_count(j);
    if (count == 0) continue;
    const size_t at = (send ? l.send_displ(j) : l.recv_displ(j)) * es;
    e.lo = std::min(e.lo, at);
    e.hi = std::max(e.hi, at + count * es);
  }
  return e.hi == 0 ? Extent{} : e;
}

bool overlap(const char* a, Extent ea, const char* b, Extent eb) {
  if (ea.lo == ea.hi || eb.lo == eb.hi) return false;
  const auto pa = reinterpret_cast<uintptr_t>(a), pb = reinterpret_cast<uintptr_t>(b);
  return pa + ea.lo < pb + eb.hi && pb + eb.lo < pa + ea.hi;
}

}  // namespace

Status run_pairwise_alltoall(OpCtx& ctx, const char* send, char* recv, const ExchangeLayout& l) {
  const OpDesc& d = ctx.desc();
  const int n = ctx.size(), r = ctx.rank();
  const size_t es = dtype_size(d.dtype);
  const bool per_pair = d.kind == OpKind::kAllToAllv;
  const Extent in = extent(l, n, es, true), out = extent(l, n, es, false);
  // Where block j of the input is read from: sendbuff, or its copy aside.
  const char* src_base = send;
  size_t src_lo = 0;
  std::vector<char>& aside = ctx.staging().aside;
  if (overlap(send, in, recv, out)) {
    aside.assign(send + in.lo, send + in.hi);
    src_base = aside.data();
    src_lo = in.lo;
  }
  auto src = [&](int j) {
    return l.send_count(j) ? src_base + (l.send_displ(j) * es - src_lo) : nullptr;
  };
  auto dst = [&](int j) { return l.recv_count(j) ? recv + l.recv_displ(j) * es : nullptr; };
  if (l.send_count(r) > 0) std::memmove(dst(r), src(r), l.send_count(r) * es);  // our own

  Steps s(ctx, kernels::DType::kU8, kernels::RedOp::kSum);  // bytes only
  s.set_streaming(use_streaming(out.hi - out.lo));
  for (int k = 1; k < n; ++k) {
    const int to = (r + k) % n, from = (r - k + n) % n;
    // Our header and block go out at once; theirs are checked before their block is read.
    if (per_pair)
      ctx.send_pair_header(to, l.send_count(to));
    else
      ctx.send_header(to);
    auto check = [&]() -> Status {
      return per_pair ? ctx.check_pair_header(from, l.recv_count(from)) : ctx.check_header(from);
    };
    const Steps::HeaderGate gate{ctx.recv_header(from), check};
    CHORUS_TRY(s.send_recv(to, src(to), l.send_count(to) * es, from, dst(from),
                           l.recv_count(from) * es, &gate));  // block r+k out, block r-k in
  }
  CHORUS_TRY(s.finish());
  if (!aside.empty()) std::vector<char>().swap(aside);  // sent: tcp no longer reads it
  return Status::ok();
}

}  // namespace chorus
