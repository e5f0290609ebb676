// Broadcast, pipelined along a chain that starts at the root.
//
// Vocabulary: the buffer is cut into chunks of chunk_bytes. Ranks form a chain in rank order
// starting at the root (root, root+1, ..., wrapping). Each rank receives chunk i from its
// predecessor and forwards it to its successor while chunk i+1 is still arriving, so for
// large buffers every link is busy at once and the time approaches bytes / link bandwidth,
// independent of the number of ranks (the pipelined chain of Traff's and NCCL's ring
// broadcast). Each rank checks its predecessor's header before trusting any data.
#include <cstring>
#include <vector>

#include "collectives/comm.h"

namespace chorus {

Status run_broadcast(OpCtx& ctx, const void* send, void* recv, size_t bytes, size_t chunk_bytes) {
  const int n = ctx.size(), r = ctx.rank(), root = ctx.desc().root;
  const int pos = (r - root + n) % n;
  const int prev = pos > 0 ? (r - 1 + n) % n : -1;
  const int next = pos < n - 1 ? (r + 1) % n : -1;
  char* data = static_cast<char*>(recv);
  if (prev < 0 && send != recv && bytes > 0) std::memcpy(recv, send, bytes);
  if (n == 1) return Status::ok();

  if (prev >= 0) {
    uint64_t h = ctx.recv_header(prev);
    CHORUS_TRY(ctx.wait_recv(prev, h));
    CHORUS_TRY(ctx.check_header(prev));
  }
  uint64_t last_send = 0;
  bool sent = false;
  if (next >= 0) {
    last_send = ctx.send_header(next);
    sent = true;
  }
  const size_t nchunks = bytes == 0 ? 0 : (bytes + chunk_bytes - 1) / chunk_bytes;
  std::vector<uint64_t> recv_tickets(nchunks);
  if (prev >= 0)
    for (size_t i = 0; i < nchunks; ++i)
      recv_tickets[i] = ctx.link(prev).post_recv(data + i * chunk_bytes, std::min(chunk_bytes, bytes - i * chunk_bytes));
  for (size_t i = 0; i < nchunks; ++i) {
    if (prev >= 0) CHORUS_TRY(ctx.wait_recv(prev, recv_tickets[i]));
    if (next >= 0) last_send = ctx.link(next).post_send(data + i * chunk_bytes, std::min(chunk_bytes, bytes - i * chunk_bytes));
  }
  if (sent) CHORUS_TRY(ctx.wait_send(next, last_send));
  return Status::ok();
}

}  // namespace chorus
