// Multi-peer exchange (see multi_exchange.h).
#include "collectives/multi_exchange.h"

#include <algorithm>
#include <vector>

namespace chorus {
namespace {

constexpr size_t kStagePiece = StagingBuffers::kBytes;  // a multiple of every element size
constexpr int kDepth = 4;                               // staged pieces in flight per peer

// One incoming range. Direct links are read out of their slots; others either receive the
// whole range into its destination in one request (gather mode) or piece by piece into two
// staging buffers (fold mode: pieces of every peer must be at hand together).
struct InCursor {
  ExchangeIn in;
  transport::Link* link;
  transport::DirectSlots* slots;
  size_t done = 0;  // bytes stored or folded
  // staged (fold mode, no direct slots): a ring of kDepth pieces
  char* stage[kDepth] = {};
  uint64_t ticket[kDepth] = {};
  size_t len[kDepth] = {};
  int head = 0;
  size_t used = 0;    // of stage[head]
  size_t posted = 0;  // bytes asked of the link so far
  // whole (gather mode, no direct slots)
  bool whole = false;
  uint64_t whole_ticket = 0;

  void post_next(int k) {
    len[k] = std::min(kStagePiece, in.bytes - posted);
    if (len[k] == 0) return;
    ticket[k] = link->post_recv(stage[k], len[k]);
    posted += len[k];
  }
  // The bytes available now at the cursor (contiguous), or {nullptr, 0}.
  std::pair<const char*, size_t> peek() {
    if (slots) return slots->recv_peek();
    if (len[head] == 0 || !link->recv_done(ticket[head])) return {nullptr, 0};
    return {stage[head] + used, len[head] - used};
  }
  void consume(size_t n) {
    done += n;
    if (slots) return slots->recv_consume(n);
    used += n;
    if (used < len[head]) return;
    used = 0;
    post_next(head);
    head = (head + 1) % kDepth;
  }
};

// One outgoing range. Direct links copy into slots; others post pieces straight out of the
// caller's memory, at most kDepth at once (bursts of megabytes would starve the receive side
// of this rank's progress calls).
struct OutCursor {
  ExchangeOut out;
  transport::Link* link;
  transport::DirectSlots* slots;
  size_t sent = 0;  // direct: committed; else posted
  uint64_t tickets[kDepth] = {};
  int inflight = 0, oldest = 0;

  // Links without direct slots: retire finished pieces, post new ones; true if any posted.
  bool post_more() {
    while (inflight > 0 && link->send_done(tickets[oldest])) {
      oldest = (oldest + 1) % kDepth;
      --inflight;
    }
    bool posted = false;
    while (inflight < kDepth && sent < out.bytes) {
      const size_t n = std::min(kStagePiece, out.bytes - sent);
      tickets[(oldest + inflight) % kDepth] = link->post_send(out.src + sent, n);
      ++inflight;
      sent += n;
      posted = true;
    }
    return posted;
  }
  bool done() const { return sent == out.bytes && (slots || inflight == 0); }
};

}  // namespace

Status multi_exchange(OpCtx& ctx, Executor& exec, size_t es, std::span<const ExchangeOut> outs,
                      std::span<const ExchangeIn> ins, const ExchangeFold* fold) {
  std::vector<OutCursor> os;
  os.reserve(outs.size());
  for (const ExchangeOut& o : outs) {
    if (o.bytes == 0) continue;
    OutCursor c{o, &ctx.link(o.peer), ctx.link(o.peer).direct()};
    if (!c.slots) c.post_more();
    os.push_back(c);
  }
  std::vector<InCursor> is;
  is.reserve(ins.size());
  const bool folding = fold && fold->bytes > 0;
  if (folding) {
    StagingBuffers& st = ctx.staging();
    const size_t need = ins.size() * kDepth * kStagePiece;
    if (st.multi.size() < need) st.multi.resize(need);
  }
  for (const ExchangeIn& i : ins) {
    if (i.bytes == 0) continue;
    InCursor c{i, &ctx.link(i.peer), ctx.link(i.peer).direct()};
    if (!c.slots && folding) {
      char* base = ctx.staging().multi.data() + is.size() * kDepth * kStagePiece;
      for (int k = 0; k < kDepth; ++k) {
        c.stage[k] = base + k * kStagePiece;
        c.post_next(k);
      }
    } else if (!c.slots) {
      c.whole = true;
      c.whole_ticket = c.link->post_recv(i.dst, i.bytes);
      c.done = i.bytes;
    }
    is.push_back(c);
  }
  // Fold mode: the contributions of one piece, in rank order.
  std::vector<const char*> parts(folding ? is.size() + 1 : 0);
  size_t folded = 0;

  auto sends_left = [&] {
    for (const OutCursor& c : os)
      if (c.sent < c.out.bytes) return true;
    return false;
  };
  auto recvs_left = [&] {
    if (folding) return folded < fold->bytes;
    for (const InCursor& c : is)
      if (c.done < c.in.bytes) return true;
    return false;
  };
  // Moves what can move now without waiting; true if anything moved.
  auto step = [&]() -> bool {
    bool moved = false;
    for (OutCursor& c : os) {
      if (c.sent == c.out.bytes) continue;
      if (!c.slots) {
        moved |= c.post_more();
        continue;
      }
      auto [p, room] = c.slots->send_reserve();
      size_t n = std::min(c.out.bytes - c.sent, room - room % es);
      if (n == 0) continue;
      exec.copy(p, c.out.src + c.sent, n);
      c.slots->send_commit(n);
      c.sent += n;
      moved = true;
    }
    if (folding) {
      if (folded == fold->bytes) return moved;
      size_t n = fold->bytes - folded;
      size_t k = 0;
      for (size_t j = 0; j < is.size(); ++j) {
        if (static_cast<int>(j) == fold->me) parts[k++] = fold->own + folded;
        auto [p, avail] = is[j].peek();
        n = std::min(n, avail - avail % es);
        parts[k++] = p;
      }
      if (static_cast<size_t>(fold->me) >= is.size()) parts[k++] = fold->own + folded;
      if (n == 0) return moved;
      char* out = fold->dst + folded;
      if (fold->streaming) {
        std::vector<char>& scratch = ctx.staging().scratch;
        if (scratch.size() < n) scratch.resize(std::max(n, kStagePiece));
        out = scratch.data();
      }
      exec.reduce_fold(fold->dtype, fold->op, parts.data(), static_cast<int>(parts.size()), out,
                       n / es, fold->avg_n);
      if (fold->streaming) exec.copy_streaming(fold->dst + folded, out, n);
      for (InCursor& c : is) c.consume(n);
      folded += n;
      return true;
    }
    for (InCursor& c : is) {
      if (c.whole || c.done == c.in.bytes) continue;
      auto [p, avail] = c.slots->recv_peek();
      size_t n = std::min(c.in.bytes - c.done, avail);
      if (n == 0) continue;
      exec.copy(c.in.dst + c.done, p, n);
      c.consume(n);
      moved = true;
    }
    return moved;
  };
  // Whom a timeout names: the first peer whose bytes are still due.
  auto waiting_for = [&] {
    for (const InCursor& c : is)
      if (c.whole ? !c.link->recv_done(c.whole_ticket) : c.done < c.in.bytes) return c.in.peer;
    for (const OutCursor& c : os)
      if (!c.done()) return c.out.peer;
    return -1;
  };
  while (sends_left() || recvs_left()) {
    if (step()) continue;
    CHORUS_TRY(ctx.wait(
        [&] {
          for (OutCursor& c : os) {
            if (c.sent == c.out.bytes) continue;
            if (!c.slots ? c.link->send_done(c.tickets[c.oldest])
                         : c.slots->send_reserve().second >= es)
              return true;
          }
          if (folding) {
            if (folded == fold->bytes) return false;
            for (InCursor& c : is)
              if (c.peek().second < es) return false;
            return true;
          }
          for (InCursor& c : is)
            if (!c.whole && c.done < c.in.bytes && c.slots->recv_peek().second > 0) return true;
          return false;
        },
        waiting_for()));
  }
  // Requests of links without direct slots: every send gone, every whole receive in.
  return ctx.wait(
      [&] {
        for (OutCursor& c : os) {
          if (!c.slots) c.post_more();
          if (!c.done()) return false;
        }
        for (const InCursor& c : is)
          if (c.whole && !c.link->recv_done(c.whole_ticket)) return false;
        return true;
      },
      waiting_for());
}

}  // namespace chorus
