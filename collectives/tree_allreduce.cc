// All-reduce on a double binary tree, pipelined (Sanders, Speck and Traff, "Two-tree
// algorithms for full bandwidth broadcast, reduction and scan", Parallel Computing 2009; the
// scheme NCCL uses between nodes).
//
// Vocabulary: tree A is the binary heap over ranks (position = rank, children 2i+1 and 2i+2);
// tree B is the same heap over the mirrored order (position = n-1-rank), so most leaves of A
// are inner nodes of B. The first half of the buffer is reduced up tree A and broadcast back
// down it, the second half uses tree B, so both directions of every link carry data. Each half
// is cut into pieces; a node adds each child's piece into its own as it arrives and passes the
// sum up, so pieces stream through the tree. Latency grows with log2(n) instead of n.
#include "collectives/prims.h"

namespace chorus {

namespace {
struct TreeNode {
  int parent = -1;
  int child[2] = {-1, -1};
};

TreeNode heap_node(int rank, int n, bool mirror) {
  auto to_pos = [&](int r) { return mirror ? n - 1 - r : r; };
  auto to_rank = [&](int p) { return mirror ? n - 1 - p : p; };
  int pos = to_pos(rank);
  TreeNode t;
  if (pos > 0) t.parent = to_rank((pos - 1) / 2);
  for (int k = 0; k < 2; ++k)
    if (2 * pos + 1 + k < n) t.child[k] = to_rank(2 * pos + 1 + k);
  return t;
}

// Up: children's pieces are added into ours, the sum goes to the parent (the root keeps it).
Status up(Steps& s, const TreeNode& t, const char* own, char* dst, size_t bytes, bool avg) {
  int nchild = (t.child[0] >= 0) + (t.child[1] >= 0);
  if (nchild == 0) return t.parent >= 0 ? s.send(t.parent, own, bytes) : Status::ok();
  const char* acc = own;
  for (int k = 0; k < nchild; ++k) {
    bool last = k == nchild - 1;
    if (last && t.parent >= 0)
      CHORUS_TRY(s.recv_reduce_copy_send(t.child[k], t.parent, acc, dst, bytes));
    else
      CHORUS_TRY(s.recv_reduce_copy(t.child[k], acc, dst, bytes, avg && last && t.parent < 0));
    acc = dst;
  }
  return Status::ok();
}

// Down: the final piece comes from the parent (the root has it) and goes on to the children.
Status down(Steps& s, const TreeNode& t, char* dst, size_t bytes) {
  int first = 0;
  if (t.parent >= 0) {
    if (t.child[0] >= 0) {
      CHORUS_TRY(s.recv_copy_send(t.parent, t.child[0], dst, bytes));
      first = 1;
    } else {
      return s.recv(t.parent, dst, bytes);
    }
  }
  for (int k = first; k < 2; ++k)
    if (t.child[k] >= 0) CHORUS_TRY(s.send(t.child[k], dst, bytes));
  return Status::ok();
}
}  // namespace

Status run_tree_allreduce(OpCtx& ctx, const char* send, char* recv) {
  const OpDesc& d = ctx.desc();
  const int n = ctx.size(), r = ctx.rank();
  auto dt = *kernel_dtype(d.dtype);
  const size_t es = kernels::dtype_size(dt);
  if (n == 1) return copy_local(send, recv, d.count * es);
  const bool avg = d.redop == chorusAvg;
  TreeNode trees[2] = {heap_node(r, n, false), heap_node(r, n, true)};
  CHORUS_TRY(ctx.exchange_headers({trees[0].parent, trees[0].child[0], trees[0].child[1],
                                   trees[1].parent, trees[1].child[0], trees[1].child[1]},
                                  {trees[0].parent, trees[0].child[0], trees[0].child[1],
                                   trees[1].parent, trees[1].child[0], trees[1].child[1]}));
  Steps s(ctx, dt, *kernel_redop(d.redop));
  s.set_streaming(use_streaming(d.count * es));
  const size_t half[2] = {(d.count + 1) / 2, d.count / 2};
  const size_t base[2] = {0, half[0]};
  const size_t piece_elems = std::max<size_t>(1, d.piece / es);
  const size_t npieces = (half[0] + piece_elems - 1) / piece_elems;
  auto range = [&](int t, size_t p, size_t* b) {
    size_t lo = std::min(half[t], p * piece_elems), hi = std::min(half[t], lo + piece_elems);
    *b = (base[t] + lo) * es;
    return (hi - lo) * es;
  };
  for (size_t p = 0; p < npieces; ++p)
    for (int t = 0; t < 2; ++t) {
      size_t b, len = range(t, p, &b);
      CHORUS_TRY(up(s, trees[t], send + b, recv + b, len, avg));
    }
  for (size_t p = 0; p < npieces; ++p)
    for (int t = 0; t < 2; ++t) {
      size_t b, len = range(t, p, &b);
      CHORUS_TRY(down(s, trees[t], recv + b, len));
    }
  return s.finish();
}

}  // namespace chorus
