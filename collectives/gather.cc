// Gather to a root, flat: every rank sends its block straight to the root, which stores its own
// block and then takes the others' one rank after another (root+1, root+2, ...).
//
// Why flat and not a binomial tree (MPICH's and Gloo's choice for small blocks at scale): the
// root must take in (n-1) blocks whatever the shape, so a tree cannot shorten the root's part;
// it saves message starts (log2 n instead of n-1 at the root) by forwarding every block up to
// log2 n times. Here links are memory copies or sockets between a few ranks, where each byte
// moved once is worth more than a few saved starts; a tree can join later as another file.
//
// Headers both ways: the root sends its header to every rank and checks every rank's before it
// reads any block; the others send header and block at once and check the root's header
// meanwhile (Steps::send_recv's gate). So a rank in another call (a scatter, another root or
// count) is named at once on both sides, never read as data -- also when two ranks each take
// the other for the root and their rings are full.
#include <cstring>
#include <vector>

#include "collectives/prims.h"

namespace chorus {

Status run_gather(OpCtx& ctx, const char* send, char* recv) {
  const OpDesc& d = ctx.desc();
  const int n = ctx.size(), r = ctx.rank(), root = d.root;
  const size_t block = d.count * dtype_size(d.dtype);
  // The root's own block first: sendbuff may lie anywhere in recvbuff (in place).
  if (r == root && block > 0 && send != recv + root * block)
    std::memmove(recv + root * block, send, block);
  if (n == 1) return Status::ok();
  // Gathers move bytes only; u8 steps never split an element of any type.
  Steps s(ctx, kernels::DType::kU8, kernels::RedOp::kSum);
  if (r != root) {
    // Header and block out at once; the root's header is checked meanwhile.
    ctx.send_header(root);
    auto check = [&] { return ctx.check_header(root); };  // outlives the gate that refers to it
    const Steps::HeaderGate gate{ctx.recv_header(root), check};
    CHORUS_TRY(s.send_recv(root, send, block, root, nullptr, 0, &gate));  // ours, to the root
    return s.finish();
  }
  const std::vector<int> others = ranks_after(root, n);
  CHORUS_TRY(ctx.exchange_headers_with(others));
  s.set_streaming(use_streaming(block * n));
  for (int from : others) CHORUS_TRY(s.recv(from, recv + from * block, block));  // theirs
  return s.finish();
}

}  // namespace chorus
