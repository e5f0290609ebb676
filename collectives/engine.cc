// OpCtx: how an operation waits. Spin briefly, then sleep on a wake-up -- never burn a core.
//
// Training keeps every core busy. A progress engine that only spins collapses when another
// process wants the core (OpenMPI's shared-memory path: 0.65 us -> 12 ms); one that only
// blocks never gets below tens of microseconds (Gloo). So: progress every busy link; while
// something moved within the last CHORUS_SPIN_US microseconds keep spinning; then announce
// that we sleep and sleep on the wake-up sources of the busy links, through the channel's
// transport::Waiter (an shm doorbell that peers ring after every change to a ring we share,
// polled tcp sockets). Sleeps last at most 100 ms so that deadlines, aborts and dead peers
// (Link::check_alive) are noticed promptly.
#include <unistd.h>

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <span>

#include "collectives/comm.h"

namespace chorus {

OpCtx::OpCtx(CommImpl& comm, const OpDesc& desc, int channel)
    : comm_(comm), ch_(*comm.channels_[channel]), desc_(desc) {
  my_header_ = make_header(desc, comm.rank_, comm.uid_);
  headers_ = ch_.headers.data();
}

void OpCtx::set_count(uint64_t count) {
  desc_.count = count;
  my_header_ = make_header(desc_, comm_.rank_, comm_.uid_);
}

uint64_t OpCtx::send_header(int peer) {
  return link(peer).post_send(&my_header_, sizeof my_header_);
}
uint64_t OpCtx::recv_header(int peer) {
  return link(peer).post_recv(&headers_[peer], sizeof(OpHeader));
}

Status OpCtx::exchange_headers(std::initializer_list<int> to, std::initializer_list<int> from) {
  auto seen_before = [](std::initializer_list<int> l, const int* p) {
    for (const int* q = l.begin(); q != p; ++q)
      if (*q == *p) return true;
    return false;
  };
  for (const int* p = to.begin(); p != to.end(); ++p)
    if (*p >= 0 && !seen_before(to, p)) send_header(*p);
  std::vector<std::pair<int, uint64_t>> tickets;
  for (const int* p = from.begin(); p != from.end(); ++p)
    if (*p >= 0 && !seen_before(from, p)) tickets.push_back({*p, recv_header(*p)});
  for (auto [p, t] : tickets) {
    CHORUS_TRY(wait_recv(p, t));
    CHORUS_TRY(check_header(p));
  }
  return Status::ok();
}

Status OpCtx::exchange_headers_with(std::span<const int> peers) {
  for (int p : peers) send_header(p);
  std::vector<std::pair<int, uint64_t>> pending;
  pending.reserve(peers.size());
  for (int p : peers) pending.push_back({p, recv_header(p)});
  Status mismatch;
  // Checks each header as it lands; done when all are in or one disagrees.
  CHORUS_TRY(wait(
      [&] {
        for (size_t i = 0; i < pending.size();) {
          auto [p, t] = pending[i];
          if (!link(p).recv_done(t)) {
            ++i;
            continue;
          }
          mismatch = check_header(p);
          if (!mismatch.is_ok()) return true;
          pending[i] = pending.back();
          pending.pop_back();
        }
        return pending.empty();
      },
      peers.size() == 1 ? peers.front() : -1));
  return mismatch;
}

void OpCtx::send_pair_header(int to, uint64_t send_count) {
  OpDesc out = desc_;
  out.count = send_count;
  OpHeader& h = ch_.pair_headers[to];  // stays put until sent: one header per peer and operation
  h = make_header(out, comm_.rank_, comm_.uid_);
  link(to).post_send(&h, sizeof h);
}

Status OpCtx::check_pair_header(int from, uint64_t recv_count) {
  OpDesc expect = desc_;
  expect.count = recv_count;
  expect.peer = from;
  return chorus::check_header(headers_[from], from, expect, comm_.rank_, comm_.uid_);
}

Result<const char*> OpCtx::eager_exchange(int peer, const void* data, size_t bytes) {
  const int peers[1] = {peer};
  CHORUS_TRY(eager_send(peers, data, bytes));
  StagingBuffers& st = ch_.staging;
  if (!link(peer).direct() && st.in.size() < bytes)
    st.in.resize(std::max(bytes, StagingBuffers::kBytes));
  CHORUS_ASSIGN_OR_RETURN(const char* theirs, eager_recv(peer, bytes, st.in.data()));
  if (!link(peer).direct())  // our staged send is gone: staging is free again
    CHORUS_TRY(wait([&] { return !link(peer).sends_pending(); }, peer));
  return theirs;
}

// Over links without direct slots one staging buffer holds header + data, posted to each peer
// (callers wait for those sends to leave before the buffer is written again).
Status OpCtx::eager_send(std::span<const int> peers, const void* data, size_t bytes) {
  const size_t total = sizeof(OpHeader) + bytes;
  bool staged = false;
  for (int peer : peers) {
    transport::Link& l = link(peer);
    transport::DirectSlots* d = l.direct();
    if (!d) {
      StagingBuffers& st = ch_.staging;
      if (!staged) {
        if (st.eager.size() < total) st.eager.resize(std::max(total, StagingBuffers::kBytes));
        std::memcpy(st.eager.data(), &my_header_, sizeof(OpHeader));
        if (bytes) std::memcpy(st.eager.data() + sizeof(OpHeader), data, bytes);
        staged = true;
      }
      l.post_send(st.eager.data(), total);
      continue;
    }
    std::pair<char*, size_t> out = d->send_reserve();  // (a free slot, mostly: no wait to set up)
    if (out.second < total || jittering())
      CHORUS_TRY(wait(
          [&] {
            out = d->send_reserve();
            return out.second >= total;
          },
          peer));
    std::memcpy(out.first, &my_header_, sizeof(OpHeader));
    if (bytes) std::memcpy(out.first + sizeof(OpHeader), data, bytes);
    d->send_commit(total);
  }
  return Status::ok();
}

// The header is read and checked before the data is asked for, so a peer in another call is
// caught instead of waited for (or read).
Result<const char*> OpCtx::eager_recv(int peer, size_t bytes, char* staged) {
  transport::Link& l = link(peer);
  const size_t total = sizeof(OpHeader) + bytes;
  transport::DirectSlots* d = l.direct();
  if (!d) {
    uint64_t th = l.post_recv(&headers_[peer], sizeof(OpHeader));
    CHORUS_TRY(wait([&] { return l.recv_done(th); }, peer));
    CHORUS_TRY(check_header(peer));
    uint64_t td = l.post_recv(staged, bytes);
    CHORUS_TRY(wait([&] { return l.recv_done(td); }, peer));
    return static_cast<const char*>(staged);
  }
  std::pair<const char*, size_t> in = d->recv_peek();
  if (in.second == 0 || jittering())
    CHORUS_TRY(wait(
        [&] {
          in = d->recv_peek();
          return in.second > 0;
        },
        peer));
  if (in.second < sizeof(OpHeader))
    return make_error(
        Code::kMismatch,
        "{} on rank {}: rank {} sent a {} byte message where a {} byte header was due",
        describe(desc_), comm_.rank_, peer, in.second, sizeof(OpHeader));
  std::memcpy(&headers_[peer], in.first, sizeof(OpHeader));
  CHORUS_TRY(check_header(peer));
  if (in.second != total)
    return make_error(Code::kRemoteError, "{} on rank {}: rank {} sent {} bytes, expected {}",
                      describe(desc_), comm_.rank_, peer, in.second, total);
  return in.first + sizeof(OpHeader);
}

Status OpCtx::drain() {
  auto idle = [&] {
    for (auto& l : ch_.links.links)
      if (l && l->busy()) return false;
    return true;
  };
  return idle() && !jittering() ? Status::ok() : wait(idle, -1);
}

// A collective's peers send the header this rank sent, but for the sender: one compare of 48
// bytes accepts it (a receive expects a send's header, so it always takes the full check).
Status OpCtx::check_header(int peer) {
  if (desc_.kind != OpKind::kRecv && same_but_sender(headers_[peer], my_header_, peer))
    return Status::ok();
  return chorus::check_header(headers_[peer], peer, desc_, comm_.rank_, comm_.uid_);
}

// A peer that fails an operation (a mismatch, a timeout) tells everyone through the watch
// channel and may then exit, closing its links. Its explanation is worth more than our
// "connection closed", so give it a moment to arrive before reporting the link's error.
Status OpCtx::explain_link_failure(const Status& link_error) {
  // A peer's revocation came over the link itself (the store may be gone): no news to wait for.
  if (link_error.code() == Code::kRevoked)
    return Status(Code::kRevoked, fmt::format("{} on rank {}: {}", describe(desc_), comm_.rank_,
                                              link_error.message()));
  for (int i = 0; i < 100 && !comm_.failed_.load(); ++i) usleep(5000);
  if (comm_.failed_.load()) return comm_.error();
  return Status(link_error.code(), fmt::format("{} on rank {}: {}", describe(desc_), comm_.rank_,
                                               link_error.message()));
}

Result<bool> OpCtx::progress_all() {
  bool moved = false;
  for (auto& l : ch_.links.links) {
    if (!l || !l->busy()) continue;
    auto r = l->progress();
    if (!r.is_ok()) return explain_link_failure(r.status());
    moved |= *r;
  }
  return moved;
}

void OpCtx::jitter() {
  // xorshift64, one stream per thread, seeded by rank and thread so every run differs.
  thread_local uint64_t x = 0x9e3779b97f4a7c15ull ^ (static_cast<uint64_t>(comm_.rank_) << 32) ^
                            static_cast<uint64_t>(now_seconds() * 1e9) ^
                            reinterpret_cast<uintptr_t>(&x);
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  comm_.jitter_points_.fetch_add(1, std::memory_order_relaxed);
  if (x % 4 == 0)
    usleep(static_cast<useconds_t>((x >> 8) % static_cast<uint64_t>(comm_.jitter_us_ + 1)));
}

Deadline& OpCtx::deadline() {
  if (!deadline_set_) {
    deadline_ = Deadline::after_seconds(comm_.timeout_s_);
    deadline_set_ = true;
  }
  return deadline_;
}

// Most waits end within a few polls (the peer is running and already wrote): poll a little
// without touching the clock before the full spin-then-sleep loop. Many are over before they
// begin (a free slot to write, a message already in): those make no pass over the links.
Status OpCtx::wait(FunctionRef<bool()> done, int waiting_for) {
  if (comm_.jitter_us_ > 0) jitter();
  if (done()) return Status::ok();
  for (int i = 0; i < 256; ++i) {
    CHORUS_ASSIGN_OR_RETURN(bool moved, progress_all());
    (void)moved;
    if (done()) return Status::ok();
    if (comm_.failed_.load(std::memory_order_relaxed)) return comm_.error();
    _mm_pause();
  }
  return wait_slow(done, waiting_for);
}

// One sleep on the busy links' wake-up sources, unless a last look finds work. Returns whether
// that last look moved bytes; *slept tells whether it slept. The links checked for a dead or
// revoking peer: the busy ones, and the one to the peer awaited (`waiting_for`; -1: any, so every
// link), which is not busy when the step reads its slots directly.
Result<bool> OpCtx::sleep_once(FunctionRef<bool()> done, bool* slept, int waiting_for) {
  if (comm_.alive_check_lag_ms_ > 0)
    usleep(static_cast<useconds_t>(comm_.alive_check_lag_ms_) * 1000);
  std::array<transport::WakeSource*, 8> busy{};
  size_t nbusy = 0;
  // A peer may send its last message and exit between our last look and this check: what it
  // sent still counts. So a dead or revoking peer is reported only when one more look moves
  // nothing and leaves the wait unfinished (a dead peer's bytes run out: this ends).
  auto report = [&](const Status& alive) -> Result<bool> {
    auto r = progress_all();
    if (r.is_ok() && (*r || done())) return true;
    return explain_link_failure(alive);
  };
  for (size_t p = 0; p < ch_.links.links.size(); ++p) {
    auto& l = ch_.links.links[p];
    if (l && !l->busy() && (waiting_for < 0 || static_cast<int>(p) == waiting_for)) {
      Status alive = l->check_alive();
      if (!alive.is_ok()) return report(alive);
    }
    if (!l || !l->busy()) continue;
    transport::WakeSource* w = l->wake_source();
    if (nbusy < busy.size() &&
        std::find(busy.begin(), busy.begin() + nbusy, w) == busy.begin() + nbusy)
      busy[nbusy++] = w;
    Status alive = l->check_alive();
    if (!alive.is_ok()) return report(alive);
  }
  transport::Waiter& waiter = *ch_.waiter;
  waiter.arm();
  auto r = progress_all();
  if (!r.is_ok()) {
    waiter.disarm();
    return r.status();
  }
  if (!*r && !waiter.rung() && !done() && !comm_.failed_.load()) {
    // done() may have posted receives whose bytes are here already (a message's data, posted
    // once its header is in, often shares the header's slot): the peer rang before this armed,
    // so a sleep now would last the whole slice. One more look first.
    r = progress_all();
    if (!r.is_ok()) {
      waiter.disarm();
      return r.status();
    }
    if (!*r && !waiter.rung()) {
      waiter.sleep(std::span(busy.data(), nbusy), deadline().slice_ms(100));
      *slept = true;
    }
  }
  waiter.disarm();
  return *r;
}

Status OpCtx::wait_slow(FunctionRef<bool()> done, int waiting_for) {
  if (!deadline_set_) comm_.mark_waiting_since();
  double last_move = now_seconds();
  // Spinning pays when the peer is running; when the cores are oversubscribed it only burns
  // the time slice the peer needs. So the spin budget halves after every wait that had to
  // sleep anyway, and doubles back towards CHORUS_SPIN_US after waits that a spin satisfied.
  const int spin_us = comm_.spin_now_us_.load(std::memory_order_relaxed);
  const double spin_s = spin_us * 1e-6;
  bool slept = false;
  auto adapt = [&] {
    int next = slept ? std::max(2, spin_us / 2) : std::min(comm_.spin_us_, spin_us * 2 + 1);
    if (next != spin_us) comm_.spin_now_us_.store(next, std::memory_order_relaxed);
  };
  while (true) {
    CHORUS_ASSIGN_OR_RETURN(bool moved, progress_all());
    if (done()) {
      adapt();
      return Status::ok();
    }
    if (comm_.failed_.load()) return comm_.error();
    double now = now_seconds();
    if (moved) {
      last_move = now;
      continue;
    }
    if (now - last_move < spin_s) {
      _mm_pause();
      continue;
    }
    if (deadline().expired()) {
      std::string who = waiting_for >= 0 ? fmt::format(" waiting for rank {}", waiting_for) : "";
      return Status(Code::kTimeout, comm_.timeout_report(desc_, who));
    }
    CHORUS_ASSIGN_OR_RETURN(bool moved2, sleep_once(done, &slept, waiting_for));
    last_move = moved2 ? now_seconds() : last_move;
  }
}

}  // namespace chorus
