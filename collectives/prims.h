// Step primitives, in the NCCL manner: every collective algorithm is written as a sequence of
// these, one line per step (see ring_allreduce.cc).
//
//   send              to <- own
//   recv              dst <- from
//   recvReduceSend    to <- (from op own)
//   recvReduceCopySend dst <- (from op own); to <- dst
//   recvReduceCopy    dst <- (from op own)
//   recvCopySend      dst <- from; to <- from
//
// Each call moves `bytes` in pieces no larger than a link slot. Over shared memory a piece is
// reduced straight out of the peer's slot into our outgoing slot (no staging copy). Over tcp a
// piece is received into a staging buffer (the socket's copy is the only one) and sends go out
// of the user's buffer, or of a staging buffer for results that have no home in user memory.
// Calls block (with the operation's deadline) until their piece is in and out; the rings on
// every link keep several pieces in flight, so consecutive calls pipeline.
#pragma once

#include <array>
#include <vector>

#include "collectives/comm.h"
#include "kernels/cpu/reduce.h"

namespace chorus {

class Steps {
 public:
  Steps(OpCtx& ctx, kernels::DType dtype, kernels::RedOp op);

  Status send(int to, const char* own, size_t bytes) { return step(-1, to, own, nullptr, bytes, false, false); }
  Status recv(int from, char* dst, size_t bytes) { return step(from, -1, nullptr, dst, bytes, false, false); }
  Status recv_reduce_send(int from, int to, const char* own, size_t bytes) {
    return step(from, to, own, nullptr, bytes, true, false);
  }
  // avg: divide the (final) sum by the number of ranks before it is stored and sent on.
  Status recv_reduce_copy_send(int from, int to, const char* own, char* dst, size_t bytes, bool avg = false) {
    return step(from, to, own, dst, bytes, true, avg);
  }
  Status recv_reduce_copy(int from, const char* own, char* dst, size_t bytes, bool avg = false) {
    return step(from, -1, own, dst, bytes, true, avg);
  }
  Status recv_copy_send(int from, int to, char* dst, size_t bytes) { return step(from, to, nullptr, dst, bytes, false, false); }
  // send, but the bytes are copied out at once (tcp included): `own` may change right after.
  Status send_copy(int to, const char* own, size_t bytes) {
    copy_sends_ = true;
    Status s = step(-1, to, own, nullptr, bytes, false, false);
    copy_sends_ = false;
    return s;
  }
  // Reductions compute `own op received` instead of `received op own`. Two ranks that reduce
  // each other's data pick opposite orders so both get the same bits (min/max of -0 and +0).
  void set_own_first(bool v) { own_first_ = v; }
  // Results stored into user memory go out with streaming stores (no read-for-ownership):
  // worth it for buffers far larger than the caches, see use_streaming().
  void set_streaming(bool v) { streaming_ = v; }
  // Waits until every send this object posted has left (tcp); shm sends are done when written.
  Status finish();

  size_t elem_size() const { return esize_; }

 private:
  Status step(int from, int to, const char* own, char* dst, size_t bytes, bool reduce, bool avg);
  Result<const char*> take_input(int from, char* dst, bool reduce, size_t* n);
  Result<char*> take_output(int to, size_t* n);
  char* stage_out(int to, size_t n);
  char* scratch(size_t n);
  void store(char* dst, const char* src, size_t n);  // into user memory

  OpCtx& ctx_;
  kernels::DType dtype_;
  kernels::RedOp op_;
  size_t esize_;
  static constexpr int kOutStages = StagingBuffers::kOut;
  StagingBuffers& stage_;  // the communicator's: allocated once, reused by every operation
  std::array<std::pair<int, uint64_t>, kOutStages> stage_ticket_{};  // (peer, send ticket)
  std::array<bool, kOutStages> stage_used_{};
  int next_stage_ = 0;
  bool copy_sends_ = false;
  bool own_first_ = false;
  bool streaming_ = false;
  std::vector<std::pair<int, uint64_t>> pending_;  // last posted send per peer
};

// Buffers from this size up are written with streaming stores (they do not fit in L2 anyway).
constexpr size_t kStreamingBytes = 4 << 20;
inline bool use_streaming(size_t total_bytes) { return total_bytes >= kStreamingBytes; }

// Runs an operation cut into ctx.desc().nchannels parts of whole elements: part k (elements
// [begin, begin + count)) on channel k, all at once; with one channel, the whole on ctx.
Status run_parts(OpCtx& ctx, FunctionRef<Status(OpCtx&, uint64_t begin, uint64_t count)> part);

// One rank: the result is the input (avg over one rank divides by one).
Status copy_local(const char* send, char* recv, size_t bytes);

// Bytes a piece may have: a link slot, so a piece never straddles two slots.
size_t piece_bytes_for(size_t requested, size_t elem_size);

}  // namespace chorus
