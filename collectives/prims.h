// Step primitives, in the NCCL manner: every collective algorithm is written as a sequence of
// these, one line per step (see ring_allreduce.cc).
//
//   send              to <- own
//   recv              dst <- from
//   recvReduceSend    to <- (from op own)
//   recvReduceCopySend dst <- (from op own); to <- dst
//   recvReduceCopy    dst <- (from op own)
//   recvCopySend      dst <- from; to <- from
//   sendCopy          to <- own, copied out at once (own may change right after)
//   sendRecv          to <- own and dst <- from at once, sizes independent (all-to-all)
//
//   send_header / recv_header   the operation's header alone (a signal: barrier)
//   send_message / recv_message header + data to one peer (send/recv)
//   exchange_reduce_copy        dst <- (peer op own) in one eager message each way (small)
//
// Each call moves `bytes` in pieces no larger than a link slot. Over links with direct slots
// (shm) a piece is reduced straight out of the peer's slot into our outgoing slot (no staging
// copy). Over other links (tcp) a piece is received into a staging buffer (the socket's copy
// is the only one) and sends go out of the user's buffer, or of a staging buffer for results
// that have no home in user memory. Calls block (with the operation's deadline) until their
// piece is in and out; the rings on every link keep several pieces in flight, so consecutive
// calls pipeline. The copies and reductions themselves are the executor's (executor.h).
#pragma once

#include <array>
#include <vector>

#include "collectives/comm.h"
#include "collectives/executor.h"
#include "kernels/cpu/reduce.h"

namespace chorus {

class Steps {
 public:
  Steps(OpCtx& ctx, kernels::DType dtype, kernels::RedOp op, Executor& exec = cpu_executor());

  Status send(int to, const char* own, size_t bytes);
  // send, but the bytes are copied out at once (tcp included): `own` may change right after.
  Status send_copy(int to, const char* own, size_t bytes);
  Status recv(int from, char* dst, size_t bytes);
  Status recv_reduce_send(int from, int to, const char* own, size_t bytes);
  // avg: divide the (final) sum by the number of ranks before it is rounded, stored and sent on.
  Status recv_reduce_copy_send(int from, int to, const char* own, char* dst, size_t bytes,
                               bool avg = false);
  Status recv_reduce_copy(int from, const char* own, char* dst, size_t bytes, bool avg = false);
  Status recv_copy_send(int from, int to, char* dst, size_t bytes);
  // A posted receive of a peer's header (ctx.recv_header's ticket) and the check to run on it
  // before any of that peer's data is taken.
  struct HeaderGate {
    uint64_t ticket;
    FunctionRef<Status()> check;
  };
  // to <- own (send_bytes) and dst <- from (recv_bytes) at once: whichever direction can move
  // moves, so ranks that send to each other, or around any cycle, never wait on one another
  // whatever the sizes (either may be 0). With a gate, from's header is waited for and checked
  // (also when recv_bytes is 0) while our data already flows, and none of from's data is read
  // before it passes. Bytes only: pieces need not be whole elements.
  Status send_recv(int to, const char* own, size_t send_bytes, int from, char* dst,
                   size_t recv_bytes, const HeaderGate* gate = nullptr);
  Status send_header(int to);
  Status recv_header(int from);  // waits for it and checks it against this operation
  // A whole point-to-point message: header then data. A message that fits one direct slot
  // goes in one slot (one cache-line transfer for a few bytes).
  Status send_message(int to, const char* own, size_t bytes);
  Status recv_message(int from, char* dst, size_t bytes);
  // Both partners call it: each sends `own` with its header in one message, and stores
  // (own op theirs) -- in the order set_own_first says -- into dst. Use when ctx.eager_fits().
  Status exchange_reduce_copy(int peer, const char* own, char* dst, size_t bytes, bool avg);
  // Reductions compute `own op received` instead of `received op own`. Two ranks that reduce
  // each other's data pick opposite orders so both get the same bits (min/max of -0 and +0).
  void set_own_first(bool v) { own_first_ = v; }
  // Results stored into user memory go out with streaming stores (no read-for-ownership):
  // worth it for buffers far larger than the caches, see use_streaming().
  void set_streaming(bool v) { streaming_ = v; }
  // Waits until every send this object posted has left (tcp); slot writes are done when made.
  Status finish();

  size_t elem_size() const { return esize_; }

 private:
  // One piece of a step: its input (a received slot, a staging buffer, or the destination a
  // plain receive landed in) and its output slot (null: the result is posted).
  struct Piece {
    const char* in = nullptr;
    char* slot = nullptr;
    size_t n = 0;
  };
  Result<Piece> begin_piece(int from, int to, char* recv_into, size_t left);
  void end_piece(int from, int to, const Piece& p, const char* result);
  Result<const char*> take_input(int from, char* recv_into, size_t* n);
  Result<char*> take_output(int to, size_t* n);
  void reduce_piece(const char* in, const char* own, char* out, size_t n, bool avg = false);
  void post(int to, const char* buf, size_t n);
  char* stage_out(int to, size_t n);
  char* scratch(size_t n);
  void store(char* dst, const char* src, size_t n);  // into user memory

  OpCtx& ctx_;
  Executor& exec_;
  kernels::DType dtype_;
  kernels::RedOp op_;
  size_t esize_;
  static constexpr int kOutStages = StagingBuffers::kOut;
  StagingBuffers& stage_;  // the communicator's: allocated once, reused by every operation
  std::array<std::pair<int, uint64_t>, kOutStages> stage_ticket_{};  // (peer, send ticket)
  std::array<bool, kOutStages> stage_used_{};
  int next_stage_ = 0;
  bool own_first_ = false;
  bool streaming_ = false;
  std::vector<std::pair<int, uint64_t>> pending_;  // last posted send per peer
};

// Buffers from this size up are written with streaming stores (they do not fit in L2 anyway).
constexpr size_t kStreamingBytes = 4 << 20;
inline bool use_streaming(size_t total_bytes) {
  return total_bytes >= kStreamingBytes;
}

// Runs an operation cut into ctx.desc().nchannels parts of whole elements: part k (elements
// [begin, begin + count)) on channel k, all at once; with one channel, the whole on ctx.
Status run_parts(OpCtx& ctx, FunctionRef<Status(OpCtx&, uint64_t begin, uint64_t count)> part);

// Every rank but `rank`, from rank+1 on and wrapping: the order a root serves the others in.
std::vector<int> ranks_after(int rank, int n);

// One rank: the result is the input (avg over one rank divides by one).
Status copy_local(const char* send, char* recv, size_t bytes);

}  // namespace chorus
