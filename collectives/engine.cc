// OpCtx: how an operation waits. Spin briefly, then sleep on a wake-up -- never burn a core.
//
// Training keeps every core busy. A progress engine that only spins collapses when another
// process wants the core (OpenMPI's shared-memory path: 0.65 us -> 12 ms); one that only
// blocks never gets below tens of microseconds (Gloo). So: progress every busy link; while
// something moved within the last CHORUS_SPIN_US microseconds keep spinning; then announce
// that we sleep and sleep on our doorbell (shm peers ring it after every change they make to
// a ring we share) or on epoll (tcp sockets). Sleeps last at most 100 ms so that deadlines,
// aborts and dead shm peers (checked with kill(pid, 0)) are noticed promptly.
#include <sys/epoll.h>
#include <unistd.h>

#include <immintrin.h>

#include "collectives/comm.h"

namespace chorus {

OpCtx::OpCtx(Comm& comm, const OpDesc& desc)
    : comm_(comm), desc_(desc), deadline_(Deadline::after_seconds(comm.timeout_s_)) {
  my_header_ = make_header(desc, comm.rank_, comm.uid_);
  headers_ = comm.header_scratch_.data();
}

uint64_t OpCtx::send_header(int peer) { return link(peer).post_send(&my_header_, sizeof my_header_); }
uint64_t OpCtx::recv_header(int peer) { return link(peer).post_recv(&headers_[peer], sizeof(OpHeader)); }

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

Status OpCtx::drain() {
  return wait([&] {
    for (auto& l : comm_.links_.links)
      if (l && l->busy()) return false;
    return true;
  }, -1);
}

Status OpCtx::check_header(int peer) {
  Status s = chorus::check_header(headers_[peer], peer, desc_, comm_.rank_, comm_.uid_);
  return s;
}

// A peer that fails an operation (a mismatch, a timeout) tells everyone through the watch
// channel and may then exit, closing its links. Its explanation is worth more than our
// "connection closed", so give it a moment to arrive before reporting the link's error.
Status OpCtx::explain_link_failure(const Status& link_error) {
  for (int i = 0; i < 100 && !comm_.failed_.load(); ++i) usleep(5000);
  if (comm_.failed_.load()) return comm_.error();
  return Status(link_error.code(), fmt::format("{} on rank {}: {}", describe(desc_), comm_.rank_, link_error.message()));
}

Result<bool> OpCtx::progress_all() {
  bool moved = false;
  for (auto& l : comm_.links_.links) {
    if (!l || !l->busy()) continue;
    auto r = l->progress();
    if (!r.is_ok()) return explain_link_failure(r.status());
    moved |= *r;
  }
  return moved;
}

void OpCtx::sleep_once(uint32_t seen, bool has_tcp, bool has_shm) {
  int ms = deadline_.slice_ms(100);
  if (has_tcp) {
    epoll_event evs[16];
    int n = epoll_wait(comm_.epoll_fd_, evs, 16, has_shm ? std::min(ms, 1) : ms);
    for (int i = 0; i < n; ++i)
      if (evs[i].data.fd == comm_.event_fd_) {
        uint64_t v;
        (void)!read(comm_.event_fd_, &v, sizeof v);
      }
    return;
  }
  auto* db = comm_.links_.own_segment ? comm_.links_.own_segment->doorbell() : nullptr;
  if (db) {
    transport::doorbell_wait(db, seen, ms);
    return;
  }
  usleep(1000);  // a one-rank communicator has nothing to wait for; not reached in practice
}

Status OpCtx::wait(FunctionRef<bool()> done, int waiting_for) {
  auto* db = comm_.links_.own_segment ? comm_.links_.own_segment->doorbell() : nullptr;
  double last_move = now_seconds();
  const double spin_s = comm_.spin_us_ * 1e-6;
  while (true) {
    CHORUS_ASSIGN_OR_RETURN(bool moved, progress_all());
    if (done()) return Status::ok();
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
    if (deadline_.expired()) {
      std::string who = waiting_for >= 0 ? fmt::format(" waiting for rank {}", waiting_for) : "";
      return Status(Code::kTimeout, comm_.timeout_report(desc_, who));
    }
    bool has_tcp = false, has_shm = false;
    for (auto& l : comm_.links_.links) {
      if (!l || !l->busy()) continue;
      if (l->kind() == transport::LinkKind::kTcp) has_tcp = true;
      else has_shm = true;
      Status alive = l->check_alive();
      if (!alive.is_ok()) return explain_link_failure(alive);
    }
    if (db) db->sleepers.fetch_add(1, std::memory_order_seq_cst);
    uint32_t seen = db ? db->seq.load(std::memory_order_seq_cst) : 0;
    auto r2 = progress_all();
    if (!r2.is_ok()) {
      if (db) db->sleepers.fetch_sub(1, std::memory_order_seq_cst);
      return r2.status();
    }
    bool moved2 = *r2;
    bool changed = db && db->seq.load(std::memory_order_seq_cst) != seen;
    if (!moved2 && !changed && !done() && !comm_.failed_.load()) sleep_once(seen, has_tcp, has_shm);
    if (db) db->sleepers.fetch_sub(1, std::memory_order_seq_cst);
    last_move = moved2 ? now_seconds() : last_move;
  }
}

}  // namespace chorus
