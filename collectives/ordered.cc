// Ordered reductions: the algorithms of the deterministic mode (chorus.h, "Deterministic
// reductions"). Each element of a result is reduce_fold of the W ranks' contributions in rank
// order, computed by exactly one rank from all W raw inputs, so no partial sum ever depends on
// which rank owned a chunk, how the buffer was cut or which algorithm ran.
//
//   fold    every rank sends its whole buffer to every other and folds all W inputs itself:
//           one round, (W-1)N bytes out per rank -- the latency path (and what rd and tree
//           mean when forced in this mode).
//   direct  an ordered direct reduce-scatter -- rank r receives slice r of every rank's buffer
//           and folds the W slices in rank order -- then a direct all-gather of the folded
//           slices: 2(W-1)/W N bytes each way per rank, the same as the ring, in two rounds
//           (what ring means when forced in this mode).
// Reduce folds at the root (fold) or runs the direct reduce-scatter and gathers the slices at
// the root (direct). Reduce-scatter is the first half of direct.
#include <span>
#include <vector>

#include "collectives/multi_exchange.h"
#include "collectives/prims.h"

namespace chorus {
namespace {

constexpr uint64_t kRoundSliceBytes = 2 << 20;  // direct all-reduce: one round's slice per rank

struct Kit {
  kernels::DType dt;
  kernels::RedOp op;
  size_t es;
  int avg_n;  // W for avg, else 0
};

Kit kit_of(const OpCtx& ctx) {
  const OpDesc& d = ctx.desc();
  const kernels::DType dt = *kernel_dtype(d.dtype);
  return {dt, *kernel_redop(d.redop), kernels::dtype_size(dt),
          d.redop == chorusAvg ? ctx.size() : 0};
}

// Every rank but this one, in rank order: kept in the channel's staging (no allocation per call).
std::span<const int> others(OpCtx& ctx) {
  std::vector<int>& v = ctx.staging().peers;
  if (v.size() + 1 != static_cast<size_t>(ctx.size())) {
    v.clear();
    for (int p = 0; p < ctx.size(); ++p)
      if (p != ctx.rank()) v.push_back(p);
  }
  return v;
}

// Rank k's slice of `count` elements: [begin, begin + len).
struct Slice {
  size_t begin, len;
};
Slice slice_of(uint64_t count, int n, int k) {
  const size_t b = count * k / n, e = count * (k + 1) / n;
  return {b, e - b};
}

// Folds slice r (this rank's) of every rank's buffer into dst (the reduce-scatter half).
// slice(p): where rank p's slice starts in `send` and its length, in elements.
template <class SliceFn>
Status ordered_reduce_scatter(OpCtx& ctx, const Kit& k, const char* send, char* dst, SliceFn slice,
                              bool streaming) {
  const int r = ctx.rank();
  std::vector<ExchangeOut> outs;
  std::vector<ExchangeIn> ins;
  const Slice mine = slice(r);
  for (int p : others(ctx)) {
    const Slice s = slice(p);
    outs.push_back({p, send + s.begin * k.es, s.len * k.es});
    ins.push_back({p, nullptr, mine.len * k.es});
  }
  const ExchangeFold f{.dtype = k.dt,
                       .op = k.op,
                       .me = r,
                       .own = send + mine.begin * k.es,
                       .dst = dst,
                       .bytes = mine.len * k.es,
                       .avg_n = k.avg_n,
                       .streaming = streaming};
  return multi_exchange(ctx, cpu_executor(), k.es, outs, ins, &f);
}

// Every rank sends `whole` to `to` (each of them) and folds what `from` (each of them, sorted)
// send, with `own` at this rank's place, into dst.
Status fold_from(OpCtx& ctx, const Kit& k, std::span<const int> to, const char* own,
                 std::span<const int> from, char* dst, size_t bytes) {
  std::vector<ExchangeOut> outs;
  std::vector<ExchangeIn> ins;
  for (int p : to) outs.push_back({p, own, bytes});
  int me = 0;
  for (int p : from) {
    ins.push_back({p, nullptr, bytes});
    if (p < ctx.rank()) ++me;
  }
  const ExchangeFold f{k.dt, k.op, me, own, dst, from.empty() ? 0 : bytes, k.avg_n};
  return multi_exchange(ctx, cpu_executor(), k.es, outs, ins, &f);
}

// Small buffers: header and data in one message to each of `to`, then each message of `from`
// folded straight out of its slot (over tcp: out of per-peer staging) -- one hop, no header
// round. Every rank decides the same way (eager_path: whether header + data fit one message on
// every link it uses -- a slot over shm, 64 KiB over tcp; the ranks of a job share those
// limits: one host has shm links only, and on several every rank also has tcp links), so a
// rank never waits for a header its peer sent glued to its data.
bool eager_path(OpCtx& ctx, std::span<const int> peers, size_t bytes) {
  for (int p : peers)
    if (!ctx.eager_fits(p, bytes)) return false;
  return true;
}

Status eager_fold(OpCtx& ctx, const Kit& k, std::span<const int> to, const char* own,
                  std::span<const int> from, char* dst, size_t bytes) {
  CHORUS_TRY(ctx.eager_send(to, own, bytes));  // copies own out: dst may be own
  std::vector<char>& staged = ctx.staging().multi;
  if (staged.size() < from.size() * bytes) staged.resize(from.size() * bytes);
  std::vector<const char*>& parts = ctx.staging().parts;
  parts.clear();
  for (size_t j = 0; j < from.size(); ++j) {
    if (from[j] > ctx.rank() && parts.size() == j) parts.push_back(own);
    CHORUS_ASSIGN_OR_RETURN(const char* theirs,
                            ctx.eager_recv(from[j], bytes, staged.data() + j * bytes));
    parts.push_back(theirs);
  }
  if (parts.size() == from.size()) parts.push_back(own);
  if (!from.empty())
    cpu_executor().reduce_fold(k.dt, k.op, parts.data(), static_cast<int>(parts.size()), dst,
                               bytes / k.es, k.avg_n);
  for (int p : from) ctx.eager_release(p, bytes);
  for (int p : to) CHORUS_TRY(ctx.wait([&] { return !ctx.link(p).sends_pending(); }, p));
  return Status::ok();
}

// In place, a rank would fold into the bytes it is still sending: send a copy instead.
const char* aside_if_in_place(OpCtx& ctx, const char* send, const char* recv, size_t bytes) {
  if (send != recv) return send;
  std::vector<char>& a = ctx.staging().aside;
  if (a.size() < bytes) a.resize(bytes);
  std::memcpy(a.data(), send, bytes);
  return a.data();
}

}  // namespace

Status run_ordered_allreduce(OpCtx& ctx, const char* send, char* recv) {
  const OpDesc& d = ctx.desc();
  const Kit k = kit_of(ctx);
  const int n = ctx.size(), r = ctx.rank();
  const size_t bytes = d.count * k.es;
  if (n == 1) return copy_local(send, recv, bytes);
  const std::span<const int> peers = others(ctx);
  if (d.algo == Algo::kFold && eager_path(ctx, peers, bytes))
    return eager_fold(ctx, k, peers, send, peers, recv, bytes);
  CHORUS_TRY(ctx.exchange_headers_with(peers));
  if (d.algo == Algo::kFold) {
    const char* own = aside_if_in_place(ctx, send, recv, bytes);
    return fold_from(ctx, k, peers, own, peers, recv, bytes);
  }
  // Rounds of about kRoundSliceBytes per rank, each a reduce-scatter then an all-gather: a
  // rank's folded slice is sent on while it is still in cache (the ring's per-piece pipeline
  // gets the same for free); every element is still folded once, from the same W inputs.
  const uint64_t per_round =
      std::max<uint64_t>(1, kRoundSliceBytes / k.es * static_cast<uint64_t>(n));
  for (uint64_t b = 0; b == 0 || b < d.count; b += per_round) {
    const uint64_t count = std::min(per_round, d.count - b);
    auto slice = [&](int p) {
      Slice s = slice_of(count, n, p);
      s.begin += b;
      return s;
    };
    const Slice mine = slice(r);
    // No streaming stores: the slice is sent on next, from the cache.
    CHORUS_TRY(ordered_reduce_scatter(ctx, k, send, recv + mine.begin * k.es, slice, false));
    std::vector<ExchangeOut> outs;
    std::vector<ExchangeIn> ins;
    for (int p : peers) {
      outs.push_back({p, recv + mine.begin * k.es, mine.len * k.es});
      ins.push_back({p, recv + slice(p).begin * k.es, slice(p).len * k.es});
    }
    CHORUS_TRY(multi_exchange(ctx, cpu_executor(), k.es, outs, ins, nullptr));
  }
  return Status::ok();
}

Status run_ordered_reduce(OpCtx& ctx, const char* send, char* recv) {
  const OpDesc& d = ctx.desc();
  const Kit k = kit_of(ctx);
  const int n = ctx.size(), r = ctx.rank(), root = d.root;
  const size_t bytes = d.count * k.es;
  if (n == 1) return copy_local(send, recv, bytes);
  const std::span<const int> peers = others(ctx);
  const std::span<const int> to_root(&root, 1);
  if (d.algo == Algo::kFold && eager_path(ctx, peers, bytes)) {
    if (r != root) return eager_fold(ctx, k, to_root, send, {}, nullptr, bytes);
    return eager_fold(ctx, k, {}, send, peers, recv, bytes);
  }
  if (d.algo == Algo::kFold) {
    if (r != root) {
      CHORUS_TRY(ctx.exchange_headers({root}, {root}));
      return fold_from(ctx, k, to_root, send, {}, nullptr, bytes);
    }
    CHORUS_TRY(ctx.exchange_headers_with(peers));
    return fold_from(ctx, k, {}, send, peers, recv, bytes);
  }
  CHORUS_TRY(ctx.exchange_headers_with(peers));
  auto slice = [&](int p) { return slice_of(d.count, n, p); };
  const Slice mine = slice(r);
  char* dst = recv + mine.begin * k.es;  // the root folds straight into its result
  if (r != root) {
    std::vector<char>& a = ctx.staging().aside;
    if (a.size() < mine.len * k.es) a.resize(mine.len * k.es);
    dst = a.data();
  }
  CHORUS_TRY(ordered_reduce_scatter(ctx, k, send, dst, slice, false));
  std::vector<ExchangeOut> outs;
  std::vector<ExchangeIn> ins;
  if (r != root) outs.push_back({root, dst, mine.len * k.es});
  for (int p : peers)
    if (r == root) ins.push_back({p, recv + slice(p).begin * k.es, slice(p).len * k.es});
  return multi_exchange(ctx, cpu_executor(), k.es, outs, ins, nullptr);
}

Status run_ordered_reduce_scatter(OpCtx& ctx, const char* send, char* recv) {
  const OpDesc& d = ctx.desc();
  const Kit k = kit_of(ctx);
  if (ctx.size() == 1) return copy_local(send, recv, d.count * k.es);
  CHORUS_TRY(ctx.exchange_headers_with(others(ctx)));
  return ordered_reduce_scatter(
      ctx, k, send, recv,
      [&](int p) {
        return Slice{d.count * p, d.count};
      },
      use_streaming(d.count * k.es * ctx.size()));
}

}  // namespace chorus
