// Step primitives over links (see prims.h).
#include "collectives/prims.h"

#include "kernels/cpu/copy.h"

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

Status copy_local(const char* send, char* recv, size_t bytes) {
  if (send != recv && bytes > 0) std::memcpy(recv, send, bytes);
  return Status::ok();
}

size_t piece_bytes_for(size_t requested, size_t elem_size) {
  size_t p = std::max(requested, elem_size);
  return p - p % elem_size;
}

Steps::Steps(OpCtx& ctx, kernels::DType dtype, kernels::RedOp op)
    : ctx_(ctx), dtype_(dtype), op_(op), esize_(kernels::dtype_size(dtype)), stage_(ctx.staging()) {}

// The next piece of input from `from`, at most *n bytes; *n becomes the piece's size.
// Direct links hand out their slot; others receive into dst (plain copies) or a staging buffer.
Result<const char*> Steps::take_input(int from, char* dst, bool reduce, size_t* n) {
  transport::Link& l = ctx_.link(from);
  if (l.direct()) {
    std::pair<const char*, size_t> in;
    CHORUS_TRY(ctx_.wait([&] { in = l.recv_peek(); return in.second > 0; }, from));
    *n = std::min(*n, in.second);
    return in.first;
  }
  *n = std::min(*n, kStageBytes);
  char* target = (!reduce && dst) ? dst : nullptr;
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
  transport::Link& l = ctx_.link(to);
  if (!l.direct()) return static_cast<char*>(nullptr);
  std::pair<char*, size_t> out;
  CHORUS_TRY(ctx_.wait([&] { out = l.send_reserve(); return out.second >= esize_; }, to));
  size_t cap = out.second - out.second % esize_;
  *n = std::min(*n, cap);
  return out.first;
}

// A staging buffer for a result that must be posted to a non-direct link.
char* Steps::stage_out(int to, size_t n) {
  int k = next_stage_;
  next_stage_ = (next_stage_ + 1) % kOutStages;
  if (stage_used_[k]) {
    auto [peer, ticket] = stage_ticket_[k];
    Status s = ctx_.wait_send(peer, ticket);
    (void)s;  // a failure here resurfaces at the next wait, which checks the same state
  }
  if (stage_.out[k].size() < std::max(n, kStageBytes)) stage_.out[k].resize(std::max(n, kStageBytes));
  stage_used_[k] = true;
  stage_ticket_[k] = {to, 0};
  return stage_.out[k].data();
}

Status Steps::step(int from, int to, const char* own, char* dst, size_t bytes, bool reduce, bool avg) {
  size_t done = 0;
  while (done < bytes) {
    size_t n = bytes - done;
    const char* in = nullptr;
    if (from >= 0) {
      CHORUS_ASSIGN_OR_RETURN(in, take_input(from, dst ? dst + done : nullptr, reduce, &n));
    }
    char* slot = nullptr;
    if (to >= 0) {
      CHORUS_ASSIGN_OR_RETURN(slot, take_output(to, &n));
    }
    n -= n % esize_;
    CHORUS_ASSERT(n > 0);
    size_t count = n / esize_;
    // Compute the piece; `result` is where it lies afterwards (for posting to tcp).
    const char* result = nullptr;
    if (from < 0) {  // send
      if (slot) {
        std::memcpy(slot, own + done, n);
      } else if (copy_sends_) {
        char* keep = stage_out(to, n);
        std::memcpy(keep, own + done, n);
        result = keep;
      }
      if (!result) result = own + done;
    } else if (reduce) {
      char* d = dst ? dst + done : nullptr;
      const char* a = own_first_ ? own + done : in;
      const char* b = own_first_ ? in : own + done;
      if (d && slot && !avg && !streaming_) {
        kernels::reduce_copy(dtype_, op_, a, b, d, slot, count);  // one pass, two outputs
        result = d;
      } else {
        char* target = slot ? slot : (d ? (streaming_ ? scratch(n) : d) : stage_out(to, n));
        kernels::reduce(dtype_, op_, a, b, target, count);
        if (avg) kernels::scale_avg(dtype_, target, count, ctx_.size());
        if (d && target != d) store(d, target, n);
        result = d ? d : target;
      }
    } else {  // copy
      char* d = dst ? dst + done : nullptr;
      if (d && in != d) store(d, in, n);
      if (slot) std::memcpy(slot, in, n);
      result = d ? d : in;
    }
    if (from >= 0 && ctx_.link(from).direct()) ctx_.link(from).recv_consume(n);
    if (to >= 0) {
      transport::Link& out = ctx_.link(to);
      if (slot) {
        out.send_commit(n);
      } else {
        if (result == in && from >= 0 && !ctx_.link(from).direct() && !dst) {
          // recvCopySend without a destination: the input is in stage_in_, which the next piece reuses.
          char* keep = stage_out(to, n);
          std::memcpy(keep, in, n);
          result = keep;
        }
        uint64_t t = out.post_send(result, n);
        for (int k = 0; k < kOutStages; ++k)
          if (stage_used_[k] && stage_.out[k].data() == result) stage_ticket_[k] = {to, t};
        auto it = std::find_if(pending_.begin(), pending_.end(), [&](auto& p) { return p.first == to; });
        if (it == pending_.end()) pending_.push_back({to, t});
        else it->second = t;
      }
    }
    done += n;
  }
  return Status::ok();
}

char* Steps::scratch(size_t n) {
  if (stage_.scratch.size() < n) stage_.scratch.resize(std::max(n, kStageBytes));
  return stage_.scratch.data();
}

void Steps::store(char* dst, const char* src, size_t n) {
  if (streaming_) kernels::copy_streaming(dst, src, n);
  else std::memcpy(dst, src, n);
}

Status Steps::finish() {
  for (auto& [peer, ticket] : pending_) CHORUS_TRY(ctx_.wait_send(peer, ticket));
  pending_.clear();
  return Status::ok();
}

}  // namespace chorus
