// Step primitives over links, each a loop over pieces (see prims.h).
#include "collectives/prims.h"

#include <algorithm>
#include <cstring>

namespace chorus {
namespace {
constexpr size_t kStageBytes = StagingBuffers::kBytes;
}

Status run_parts(OpCtx& ctx, FunctionRef<Status(OpCtx&, uint64_t, uint64_t)> part) {
  const OpDesc whole = ctx.desc();
  const int n = whole.nchannels;
  if (n <= 1) return part(ctx, 0, whole.count);
  return ctx.comm().run_channels(n, [&](int k) -> Status {
    const uint64_t b = whole.count * k / n, e = whole.count * (k + 1) / n;
    if (k == 0) {
      ctx.set_count(e - b);
      return part(ctx, b, e - b);
    }
    OpDesc dk = whole;
    dk.count = e - b;
    OpCtx sub(ctx.comm(), dk, k);
    Status s = part(sub, b, e - b);
    return s.is_ok() ? sub.drain() : s;
  });
}

std::vector<int> ranks_after(int rank, int n) {
  std::vector<int> out;
  out.reserve(static_cast<size_t>(n > 0 ? n - 1 : 0));
  for (int i = 1; i < n; ++i) out.push_back((rank + i) % n);
  return out;
}

Status copy_local(const char* send, char* recv, size_t bytes) {
  if (send != recv && bytes > 0) std::memcpy(recv, send, bytes);
  return Status::ok();
}

Steps::Steps(OpCtx& ctx, kernels::DType dtype, kernels::RedOp op, Executor& exec)
    : ctx_(ctx),
      exec_(exec),
      dtype_(dtype),
      op_(op),
      esize_(kernels::dtype_size(dtype)),
      stage_(ctx.staging()) {}

// ---- pieces: where a piece's input comes from and where its output goes ----

// The next piece of input from `from`, at most *n bytes; *n becomes the piece's size. Direct
// links hand out their slot; others receive into recv_into (plain copies) or a staging buffer.
Result<const char*> Steps::take_input(int from, char* recv_into, size_t* n) {
  transport::Link& l = ctx_.link(from);
  if (transport::DirectSlots* d = l.direct()) {
    std::pair<const char*, size_t> in;
    CHORUS_TRY(ctx_.wait(
        [&] {
          in = d->recv_peek();
          return in.second > 0;
        },
        from));
    *n = std::min(*n, in.second);
    return in.first;
  }
  *n = std::min(*n, kStageBytes);
  char* target = recv_into;
  if (!target) {
    if (stage_.in.size() < kStageBytes) stage_.in.resize(kStageBytes);
    target = stage_.in.data();
  }
  uint64_t t = l.post_recv(target, *n);
  CHORUS_TRY(ctx_.wait_recv(from, t));
  return static_cast<const char*>(target);
}

// Space for the next piece to `to`: a slot on direct links (shrinks *n to fit), else nullptr
// (the piece will be posted from wherever it lies).
Result<char*> Steps::take_output(int to, size_t* n) {
  transport::DirectSlots* d = ctx_.link(to).direct();
  if (!d) return static_cast<char*>(nullptr);
  std::pair<char*, size_t> out;
  CHORUS_TRY(ctx_.wait(
      [&] {
        out = d->send_reserve();
        return out.second >= esize_;
      },
      to));
  size_t cap = out.second - out.second % esize_;
  *n = std::min(*n, cap);
  return out.first;
}

Result<Steps::Piece> Steps::begin_piece(int from, int to, char* recv_into, size_t left) {
  Piece p;
  p.n = left;
  if (from >= 0) {
    CHORUS_ASSIGN_OR_RETURN(p.in, take_input(from, recv_into, &p.n));
  }
  if (to >= 0) {
    CHORUS_ASSIGN_OR_RETURN(p.slot, take_output(to, &p.n));
  }
  p.n -= p.n % esize_;
  CHORUS_ASSERT(p.n > 0);
  return p;
}

// Frees the piece's input slot and publishes its output: the slot, or `result` posted.
void Steps::end_piece(int from, int to, const Piece& p, const char* result) {
  if (from >= 0)
    if (transport::DirectSlots* d = ctx_.link(from).direct()) d->recv_consume(p.n);
  if (to < 0) return;
  if (p.slot) {
    ctx_.link(to).direct()->send_commit(p.n);
    return;
  }
  post(to, result, p.n);
}

void Steps::post(int to, const char* buf, size_t n) {
  uint64_t t = ctx_.link(to).post_send(buf, n);
  for (int k = 0; k < kOutStages; ++k)
    if (stage_used_[k] && stage_.out[k].data() == buf) stage_ticket_[k] = {to, t};
  auto it = std::find_if(pending_.begin(), pending_.end(), [&](auto& p) { return p.first == to; });
  if (it == pending_.end())
    pending_.push_back({to, t});
  else
    it->second = t;
}

// A staging buffer for a result that must be posted to a link without direct slots.
char* Steps::stage_out(int to, size_t n) {
  int k = next_stage_;
  next_stage_ = (next_stage_ + 1) % kOutStages;
  if (stage_used_[k]) {
    auto [peer, ticket] = stage_ticket_[k];
    Status s = ctx_.wait_send(peer, ticket);
    (void)s;  // a failure here resurfaces at the next wait, which checks the same state
  }
  if (stage_.out[k].size() < std::max(n, kStageBytes))
    stage_.out[k].resize(std::max(n, kStageBytes));
  stage_used_[k] = true;
  stage_ticket_[k] = {to, 0};
  return stage_.out[k].data();
}

char* Steps::scratch(size_t n) {
  if (stage_.scratch.size() < n) stage_.scratch.resize(std::max(n, kStageBytes));
  return stage_.scratch.data();
}

void Steps::store(char* dst, const char* src, size_t n) {
  if (streaming_)
    exec_.copy_streaming(dst, src, n);
  else
    exec_.copy(dst, src, n);
}

// out = in op own, or own op in (set_own_first). avg: the result divided by the rank count
// before it is rounded to the type (reduce_fold), so a 16-bit avg rounds once, as the
// deterministic mode's fold does: at two ranks this is x0 op x1 exactly as chorus.h defines it.
void Steps::reduce_piece(const char* in, const char* own, char* out, size_t n, bool avg) {
  const char* a = own_first_ ? own : in;
  const char* b = own_first_ ? in : own;
  if (!avg) return exec_.reduce(dtype_, op_, a, b, out, n / esize_);
  const char* const pair[2] = {a, b};
  exec_.reduce_fold(dtype_, op_, pair, 2, out, n / esize_, ctx_.size());
}

// ---- the primitives ----

// to <- own
Status Steps::send(int to, const char* own, size_t bytes) {
  for (size_t off = 0; off < bytes;) {
    CHORUS_ASSIGN_OR_RETURN(Piece p, begin_piece(-1, to, nullptr, bytes - off));
    if (p.slot) exec_.copy(p.slot, own + off, p.n);
    end_piece(-1, to, p, own + off);
    off += p.n;
  }
  return Status::ok();
}

// to <- own, copied out of `own` before the call returns
Status Steps::send_copy(int to, const char* own, size_t bytes) {
  for (size_t off = 0; off < bytes;) {
    CHORUS_ASSIGN_OR_RETURN(Piece p, begin_piece(-1, to, nullptr, bytes - off));
    char* out = p.slot ? p.slot : stage_out(to, p.n);
    exec_.copy(out, own + off, p.n);
    end_piece(-1, to, p, out);
    off += p.n;
  }
  return Status::ok();
}

// dst <- from. Without direct slots the link receives straight into dst, in one request.
Status Steps::recv(int from, char* dst, size_t bytes) {
  if (!ctx_.link(from).direct()) {
    if (bytes == 0) return Status::ok();
    return ctx_.wait_recv(from, ctx_.link(from).post_recv(dst, bytes));
  }
  for (size_t off = 0; off < bytes;) {
    CHORUS_ASSIGN_OR_RETURN(Piece p, begin_piece(from, -1, dst + off, bytes - off));
    store(dst + off, p.in, p.n);
    end_piece(from, -1, p, nullptr);
    off += p.n;
  }
  return Status::ok();
}

// to <- (from op own)
Status Steps::recv_reduce_send(int from, int to, const char* own, size_t bytes) {
  for (size_t off = 0; off < bytes;) {
    CHORUS_ASSIGN_OR_RETURN(Piece p, begin_piece(from, to, nullptr, bytes - off));
    char* out = p.slot ? p.slot : stage_out(to, p.n);
    reduce_piece(p.in, own + off, out, p.n);
    end_piece(from, to, p, out);
    off += p.n;
  }
  return Status::ok();
}

// dst <- (from op own); to <- dst. Into a slot and dst in one pass when nothing else is due.
Status Steps::recv_reduce_copy_send(int from, int to, const char* own, char* dst, size_t bytes,
                                    bool avg) {
  for (size_t off = 0; off < bytes;) {
    CHORUS_ASSIGN_OR_RETURN(Piece p, begin_piece(from, to, nullptr, bytes - off));
    char* d = dst + off;
    if (p.slot && !avg && !streaming_) {
      const char* a = own_first_ ? own + off : p.in;
      const char* b = own_first_ ? p.in : own + off;
      exec_.reduce_copy(dtype_, op_, a, b, d, p.slot, p.n / esize_);
    } else {
      char* target = p.slot ? p.slot : (streaming_ ? scratch(p.n) : d);
      reduce_piece(p.in, own + off, target, p.n, avg);
      if (target != d) store(d, target, p.n);
    }
    end_piece(from, to, p, d);
    off += p.n;
  }
  return Status::ok();
}

// dst <- (from op own)
Status Steps::recv_reduce_copy(int from, const char* own, char* dst, size_t bytes, bool avg) {
  for (size_t off = 0; off < bytes;) {
    CHORUS_ASSIGN_OR_RETURN(Piece p, begin_piece(from, -1, nullptr, bytes - off));
    char* d = dst + off;
    char* target = streaming_ ? scratch(p.n) : d;
    reduce_piece(p.in, own + off, target, p.n, avg);
    if (target != d) store(d, target, p.n);
    end_piece(from, -1, p, nullptr);
    off += p.n;
  }
  return Status::ok();
}

// dst <- from; to <- from
Status Steps::recv_copy_send(int from, int to, char* dst, size_t bytes) {
  for (size_t off = 0; off < bytes;) {
    CHORUS_ASSIGN_OR_RETURN(Piece p, begin_piece(from, to, dst + off, bytes - off));
    char* d = dst + off;
    if (p.in != d) store(d, p.in, p.n);
    if (p.slot) exec_.copy(p.slot, p.in, p.n);
    end_piece(from, to, p, d);
    off += p.n;
  }
  return Status::ok();
}

// to <- own and dst <- from. A send that waited for a free slot before its receive began
// would deadlock two ranks whose rings towards each other are both full; here each wait ends
// as soon as either direction can move (or the gate's header arrives). Links without direct
// slots take each direction as one posted request (a receive only once the gate is open, so
// no unchecked byte lands in dst), which the same waits progress.
Status Steps::send_recv(int to, const char* own, size_t send_bytes, int from, char* dst,
                        size_t recv_bytes, const HeaderGate* gate) {
  transport::DirectSlots* out_slots = ctx_.link(to).direct();
  transport::DirectSlots* in_slots = ctx_.link(from).direct();
  size_t sent = 0, got = 0;
  if (!out_slots && send_bytes > 0) {
    post(to, own, send_bytes);
    sent = send_bytes;
  }
  bool gated = gate != nullptr, posted_recv = false;
  uint64_t recv_ticket = 0;
  auto post_recv = [&] {
    if (in_slots || recv_bytes == 0) return;
    recv_ticket = ctx_.link(from).post_recv(dst, recv_bytes);
    posted_recv = true;
    got = recv_bytes;
  };
  if (!gated) post_recv();
  while (sent < send_bytes || gated || got < recv_bytes) {
    std::pair<char*, size_t> out{nullptr, 0};
    std::pair<const char*, size_t> in{nullptr, 0};
    bool header_in = false;
    CHORUS_TRY(ctx_.wait(
        [&] {
          if (sent < send_bytes) out = out_slots->send_reserve();
          if (gated) header_in = ctx_.link(from).recv_done(gate->ticket);
          if (!gated && got < recv_bytes) in = in_slots->recv_peek();
          return out.second > 0 || header_in || in.second > 0;
        },
        gated || got < recv_bytes ? from : to));
    if (header_in) {
      CHORUS_TRY(gate->check());
      gated = false;
      post_recv();
    }
    if (out.second > 0) {
      const size_t n = std::min(send_bytes - sent, out.second);
      exec_.copy(out.first, own + sent, n);
      out_slots->send_commit(n);
      sent += n;
    }
    if (in.second > 0) {
      const size_t n = std::min(recv_bytes - got, in.second);
      store(dst + got, in.first, n);
      in_slots->recv_consume(n);
      got += n;
    }
  }
  if (posted_recv) CHORUS_TRY(ctx_.wait_recv(from, recv_ticket));
  return Status::ok();
}

Status Steps::send_header(int to) {
  uint64_t t = ctx_.send_header(to);
  auto it = std::find_if(pending_.begin(), pending_.end(), [&](auto& p) { return p.first == to; });
  if (it == pending_.end())
    pending_.push_back({to, t});
  else
    it->second = t;
  return Status::ok();
}

Status Steps::recv_header(int from) {
  CHORUS_TRY(ctx_.wait_recv(from, ctx_.recv_header(from)));
  return ctx_.check_header(from);
}

// Header + data in one slot when they fit one, else the header posted and the data in steps
// behind it (a link without direct slots packs both into one send anyway).
Status Steps::send_message(int to, const char* own, size_t bytes) {
  transport::DirectSlots* d = ctx_.link(to).direct();
  if (!d || d->slot_capacity() < sizeof(OpHeader) + bytes) {
    CHORUS_TRY(send_header(to));
    return send(to, own, bytes);
  }
  std::pair<char*, size_t> out;
  CHORUS_TRY(ctx_.wait(
      [&] {
        out = d->send_reserve();
        return out.second >= sizeof(OpHeader) + bytes;
      },
      to));
  ctx_.write_header(out.first);
  if (bytes) exec_.copy(out.first + sizeof(OpHeader), own, bytes);
  d->send_commit(sizeof(OpHeader) + bytes);
  return Status::ok();
}

// The header is checked before any data is taken, so a mismatched send is caught, not read.
Status Steps::recv_message(int from, char* dst, size_t bytes) {
  CHORUS_TRY(recv_header(from));
  return recv(from, dst, bytes);
}

Status Steps::exchange_reduce_copy(int peer, const char* own, char* dst, size_t bytes, bool avg) {
  CHORUS_ASSIGN_OR_RETURN(const char* theirs, ctx_.eager_exchange(peer, own, bytes));
  reduce_piece(theirs, own, dst, bytes, avg);
  ctx_.eager_release(peer, bytes);
  return Status::ok();
}

Status Steps::finish() {
  for (auto& [peer, ticket] : pending_) CHORUS_TRY(ctx_.wait_send(peer, ticket));
  pending_.clear();
  return Status::ok();
}

}  // namespace chorus
