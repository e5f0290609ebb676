// Scatter from a root, flat: the root sends block i straight to rank i, one rank after another
// (root+1, root+2, ...), and stores its own block last. Flat rather than a tree for the
// reason gather.cc gives: the root must send (n-1) blocks whatever the shape.
//
// Headers both ways, as in gather.cc: the root checks every rank's before it sends a block, the
// others check the root's before they read theirs. The root's own block is stored only after every
// send has left (a tcp send reads sendbuff until then), so recvbuff may lie anywhere in
// sendbuff (in place).
#include <cstring>
#include <vector>

#include "collectives/prims.h"

namespace chorus {

Status run_scatter(OpCtx& ctx, const char* send, char* recv) {
  const OpDesc& d = ctx.desc();
  const int n = ctx.size(), r = ctx.rank(), root = d.root;
  const size_t block = d.count * dtype_size(d.dtype);
  Steps s(ctx, kernels::DType::kU8, kernels::RedOp::kSum);  // bytes only
  if (r != root) {
    ctx.send_header(root);
    auto check = [&] { return ctx.check_header(root); };  // outlives the gate that refers to it
    const Steps::HeaderGate gate{ctx.recv_header(root), check};
    s.set_streaming(use_streaming(block));
    CHORUS_TRY(s.send_recv(root, nullptr, 0, root, recv, block, &gate));  // ours, from the root
    return s.finish();
  }
  if (n > 1) {
    const std::vector<int> others = ranks_after(root, n);
    CHORUS_TRY(ctx.exchange_headers_with(others));
    for (int to : others) CHORUS_TRY(s.send(to, send + to * block, block));  // theirs
    CHORUS_TRY(s.finish());
  }
  if (block > 0 && recv != send + root * block) std::memmove(recv, send + root * block, block);
  return Status::ok();
}

}  // namespace chorus
