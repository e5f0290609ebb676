// Broadcast, pipelined along a chain that starts at the root.
//
// Vocabulary: the buffer is cut into chunks of chunk_bytes. Ranks form a chain in rank order
// starting at the root (root, root+1, ..., wrapping). Each rank receives chunk i from its
// predecessor and forwards it to its successor while chunk i+1 is still arriving, so for
// large buffers every link is busy at once and the time approaches bytes / link bandwidth,
// independent of the number of ranks (the pipelined chain of Traff's and NCCL's ring
// broadcast). Each rank checks its predecessor's header before trusting any data.
#include <cstring>

#include "collectives/prims.h"

namespace chorus {

Status run_broadcast(OpCtx& ctx, const void* send, void* recv, size_t bytes, size_t chunk_bytes) {
  const int n = ctx.size(), r = ctx.rank(), root = ctx.desc().root;
  const int pos = (r - root + n) % n;
  const int prev = pos > 0 ? (r - 1 + n) % n : -1;
  const int next = pos < n - 1 ? (r + 1) % n : -1;
  char* data = static_cast<char*>(recv);
  if (prev < 0 && send != recv && bytes > 0) std::memcpy(recv, send, bytes);
  if (n == 1) return Status::ok();

  Steps s(ctx, kernels::DType::kU8, kernels::RedOp::kSum);
  if (prev >= 0) CHORUS_TRY(s.recv_header(prev));
  if (next >= 0) CHORUS_TRY(s.send_header(next));
  for (size_t off = 0; off < bytes; off += chunk_bytes) {
    const size_t len = std::min(chunk_bytes, bytes - off);
    if (prev < 0)
      CHORUS_TRY(s.send(next, data + off, len));  // root
    else if (next >= 0)
      CHORUS_TRY(s.recv_copy_send(prev, next, data + off, len));  // middle
    else
      CHORUS_TRY(s.recv(prev, data + off, len));  // last
  }
  return s.finish();
}

}  // namespace chorus
