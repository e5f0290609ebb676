// InfiniBand verbs link: slots, credits and completions (see link.h).
#include "transport/ib/link.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace chorus::transport::ib {

std::string QpRecord::encode() const {
  return fmt::format("{}|{} {} {} {}", qp.encode(), slots.addr, slots.rkey, slot_bytes, nslots);
}

Result<QpRecord> QpRecord::decode(const std::string& s, int peer) {
  size_t bar = s.find('|');
  unsigned long long addr = 0, rkey = 0, slot = 0, n = 0;
  int end = 0;
  std::string tail = bar == std::string::npos ? "" : s.substr(bar + 1);
  if (bar == std::string::npos || tail.empty() || tail[0] < '0' || tail[0] > '9' ||
      std::sscanf(tail.c_str(), "%llu %llu %llu %llu%n", &addr, &rkey, &slot, &n, &end) != 4 ||
      static_cast<size_t>(end) != tail.size() || rkey > UINT32_MAX || slot > (1u << 30) || n > 4096)
    return make_error(Code::kRemoteError,
                      "ib: rank {}'s queue pair record is malformed: '{}' (expected '<qpn psn lid "
                      "gid>|<addr> <rkey> <slot bytes> <slots>')",
                      peer, s.substr(0, 160));
  QpRecord r;
  auto qp = QpAddr::decode(s.substr(0, bar));
  if (!qp.is_ok()) return qp.status().wrap(fmt::format("rank {}", peer));
  r.qp = *qp;
  r.slots = {addr, static_cast<uint32_t>(rkey)};
  r.slot_bytes = static_cast<size_t>(slot);
  r.nslots = static_cast<int>(n);
  return r;
}

IbLink::IbLink(int peer, std::string peer_name, std::shared_ptr<Nic> nic, WakeSource* wake,
               const LinkConfig& cfg, int qp)
    : Link(peer, std::move(peer_name), wake),
      nic_(std::move(nic)),
      cfg_(cfg),
      qp_(qp),
      depth_(2 * cfg.nslots + 4),
      cache_(nic_.get(), cfg.reg_cache_bytes),
      credits_(cfg.nslots),
      staged_busy_(cfg.nslots, false) {}

Result<std::unique_ptr<IbLink>> IbLink::create(int peer, std::string peer_name,
                                               std::shared_ptr<Nic> nic, WakeSource* wake,
                                               const LinkConfig& cfg, QpAddr* qp_addr,
                                               SlotsAddr* mine) {
  const int depth = 2 * cfg.nslots + 4;
  CHORUS_ASSIGN_OR_RETURN(int qp, nic->create_qp(depth, qp_addr));
  std::unique_ptr<IbLink> l(new IbLink(peer, std::move(peer_name), nic, wake, cfg, qp));
  const size_t bytes = cfg.slot_bytes * cfg.nslots;
  CHORUS_ASSIGN_OR_RETURN(l->rbuf_, nic->alloc_remote(bytes));
  CHORUS_ASSIGN_OR_RETURN(l->rmr_, nic->reg(l->rbuf_, bytes, true));
  void* s = nullptr;
  if (posix_memalign(&s, 4096, bytes) != 0)
    return make_error(Code::kSystemError, "ib: {}: cannot allocate {} bytes of send slots",
                      nic->name(), bytes);
  l->sbuf_ = static_cast<char*>(s);
  CHORUS_ASSIGN_OR_RETURN(l->smr_, nic->reg(l->sbuf_, bytes, false));
  for (int i = 0; i < depth; ++i) CHORUS_TRY(nic->post_recv(qp, static_cast<uint64_t>(i)));
  mine->addr = reinterpret_cast<uint64_t>(l->rbuf_);
  mine->rkey = l->rmr_.rkey;
  return l;
}

IbLink::~IbLink() {
  for (Pending& p : pend_)
    if (p.reg) cache_.release(p.reg);
  nic_->destroy_qp(qp_);
  if (rmr_.handle || rmr_.lkey) nic_->dereg(rmr_);
  if (smr_.handle || smr_.lkey) nic_->dereg(smr_);
  if (rbuf_) nic_->free_remote(rbuf_, cfg_.slot_bytes * cfg_.nslots);
  std::free(sbuf_);
}

Status IbLink::fail(const Wc& wc) {
  const char* what = wc.recv ? "a receive from" : "an RDMA write to";
  return make_error(Code::kRemoteError, "ib: {}: {} {} failed: {} (verbs status {})", nic_->name(),
                    what, peer_name(), wc_status_name(wc.status), wc.status);
}

bool IbLink::poll_cq() {
  Wc wc[16];
  bool any = false;
  int k;
  while (error_.is_ok() && (k = nic_->poll(qp_, wc, 16)) > 0) {
    any = true;
    for (int i = 0; i < k && error_.is_ok(); ++i) {
      const Wc& c = wc[i];
      if (c.status != kWcSuccess) {
        error_ = fail(c);
        break;
      }
      if (c.recv) {
        Status s = nic_->post_recv(qp_, c.wr_id);
        if (!s.is_ok()) error_ = s;
        if (c.imm == kRevokeImm) {
          error_ = make_error(Code::kRevoked,
                              "rank {} revoked the communicator (news over the ib link to {})",
                              peer(), peer_name());
        } else if (c.imm & kCreditBit) {
          credits_ += static_cast<int>(c.imm & ~kCreditBit);
        } else if (c.imm == 0 || c.imm > cfg_.slot_bytes || filled_.size() >= size_t(cfg_.nslots)) {
          error_ = make_error(Code::kRemoteError,
                              "ib: {}: {} wrote {} bytes into a slot ({} slots of {} bytes, {} "
                              "unread): the two sides disagree on the protocol",
                              nic_->name(), peer_name(), c.imm, cfg_.nslots, cfg_.slot_bytes,
                              filled_.size());
        } else {
          filled_.push_back(c.imm);
        }
        continue;
      }
      --sq_outstanding_;
      uint64_t v = c.wr_id & ((uint64_t{1} << 56) - 1);
      switch (c.wr_id >> 56) {
        case kStaged:
          staged_busy_[v] = false;
          break;
        case kZeroCopy:
          --pend_[v - sends_completed_].writes;
          break;
        default:
          break;  // credits
      }
    }
  }
  return any;
}

bool IbLink::can_write() const {
  return credits_ > 0 && sq_outstanding_ < depth_ - 2 && error_.is_ok();
}

Status IbLink::write_slot(uint64_t wr_id, const Mr& mr, const char* src, size_t n) {
  uint64_t raddr = remote_.addr + (out_seq_ % cfg_.nslots) * cfg_.slot_bytes;
  CHORUS_TRY(
      nic_->post_write_imm(qp_, wr_id, mr, src, n, raddr, remote_.rkey, static_cast<uint32_t>(n)));
  ++sq_outstanding_;
  ++out_seq_;
  --credits_;
  return Status::ok();
}

bool IbLink::progress_send() {
  bool moved = false;
  while (pend_.size() < sends_.size()) pend_.emplace_back();
  const bool zc_ok = cfg_.zero_copy_bytes > 0 && nic_->follows_mapping();
  auto zero_copy = [&](const Request& r) { return zc_ok && r.n >= cfg_.zero_copy_bytes; };
  while (cursor_ < sends_.size() && error_.is_ok()) {
    Request& r = sends_[cursor_];
    if (zero_copy(r)) {
      Pending& p = pend_[cursor_];
      if (!p.reg) {
        auto e = cache_.acquire(r.buf, r.n);
        if (!e.is_ok()) {
          error_ = e.status();
          break;
        }
        p.reg = *e;
      }
      const uint64_t ticket = sends_completed_ + cursor_;
      while (r.done < r.n && can_write()) {
        size_t chunk = std::min(cfg_.slot_bytes, r.n - r.done);
        Status s = write_slot(wr(kZeroCopy, ticket), p.reg->mr, r.buf + r.done, chunk);
        if (!s.is_ok()) {
          error_ = s;
          break;
        }
        ++p.writes;
        r.done += chunk;
        moved = true;
      }
      if (r.done < r.n) break;
      ++cursor_;
      continue;
    }
    // Staged: this request and the small ones after it, packed into one send slot.
    const uint64_t idx = out_seq_ % cfg_.nslots;
    if (!can_write() || staged_busy_[idx]) break;
    char* dst = out_slot(out_seq_);
    size_t used = 0;
    while (cursor_ < sends_.size() && used < cfg_.slot_bytes) {
      Request& q = sends_[cursor_];
      if (zero_copy(q)) break;
      size_t k = std::min(cfg_.slot_bytes - used, q.n - q.done);
      if (k) std::memcpy(dst + used, q.buf + q.done, k);  // a 0-byte request may have no buffer
      used += k;
      q.done += k;
      if (q.done < q.n) break;
      ++cursor_;
    }
    if (used == 0) continue;
    staged_busy_[idx] = true;
    Status s = write_slot(wr(kStaged, idx), smr_, dst, used);
    if (!s.is_ok()) error_ = s;
    moved = true;
  }
  // Requests complete in order: posted in full, their zero-copy writes finished.
  while (cursor_ > 0 && pend_.front().writes == 0) {
    if (pend_.front().reg) cache_.release(pend_.front().reg);
    pend_.pop_front();
    complete_send();
    --cursor_;
    moved = true;
  }
  return moved;
}

void IbLink::return_credits(bool force) {
  if (freed_ == 0 || (!force && freed_ < std::max(1, cfg_.nslots / 2))) return;
  if (sq_outstanding_ >= depth_ || !error_.is_ok()) return;  // again at the next progress()
  Status s = nic_->post_write_imm(qp_, wr(kCredit, 0), smr_, sbuf_, 0, remote_.addr, remote_.rkey,
                                  kCreditBit | static_cast<uint32_t>(freed_));
  if (!s.is_ok()) {
    error_ = s;
    return;
  }
  ++sq_outstanding_;
  freed_ = 0;
}

void IbLink::release_in_slot() {
  filled_.pop_front();
  ++in_seq_;
  in_off_ = 0;
  ++freed_;
  return_credits(filled_.empty());
}

bool IbLink::progress_recv() {
  bool moved = false;
  while (!recvs_.empty()) {
    Request& r = recvs_.front();
    if (r.done < r.n) {
      if (filled_.empty()) break;
      size_t k = std::min<size_t>(filled_.front() - in_off_, r.n - r.done);
      std::memcpy(r.buf + r.done, in_slot(in_seq_) + in_off_, k);
      r.done += k;
      in_off_ += k;
      if (in_off_ == filled_.front()) release_in_slot();
    }
    if (r.done == r.n) complete_recv();
    moved = true;
  }
  return moved;
}

Result<bool> IbLink::progress() {
  if (!error_.is_ok()) return error_;
  bool moved = poll_cq();
  return_credits(filled_.empty());
  moved |= progress_send();
  moved |= progress_recv();
  if (!error_.is_ok()) return error_;
  return moved;
}

Status IbLink::check_alive() {
  if (error_.is_ok()) poll_cq();  // a revoke arrives as a completion
  if (!error_.is_ok()) return error_;
  Status s = nic_->peer_alive(qp_);
  if (!s.is_ok())
    return make_error(Code::kRemoteError, "ib: {}: {}: {}", nic_->name(), peer_name(), s.message());
  return Status::ok();
}

void IbLink::signal_revoke() {
  poll_cq();                                                 // frees send queue entries
  if (!error_.is_ok() || sq_outstanding_ >= depth_) return;  // the watch channel still carries it
  Status s = nic_->post_write_imm(qp_, wr(kCredit, 0), smr_, sbuf_, 0, remote_.addr, remote_.rkey,
                                  kRevokeImm);
  if (s.is_ok()) ++sq_outstanding_;
}

std::pair<const char*, size_t> IbLink::recv_peek() {
  if (!recvs_.empty()) return {nullptr, 0};  // posted receives come first in the stream
  if (filled_.empty()) poll_cq();
  if (filled_.empty() || !error_.is_ok()) return {nullptr, 0};
  return {in_slot(in_seq_) + in_off_, filled_.front() - in_off_};
}

void IbLink::recv_consume(size_t n) {
  in_off_ += n;
  if (in_off_ == filled_.front()) release_in_slot();
}

std::pair<char*, size_t> IbLink::send_reserve() {
  if (cursor_ < sends_.size()) return {nullptr, 0};  // posted sends not yet written go first
  if (!can_write() || staged_busy_[out_seq_ % cfg_.nslots]) poll_cq();
  if (!can_write() || staged_busy_[out_seq_ % cfg_.nslots]) return {nullptr, 0};
  return {out_slot(out_seq_), cfg_.slot_bytes};
}

void IbLink::send_commit(size_t n) {
  if (n == 0) return;
  const uint64_t idx = out_seq_ % cfg_.nslots;
  staged_busy_[idx] = true;
  Status s = write_slot(wr(kStaged, idx), smr_, out_slot(out_seq_), n);
  if (!s.is_ok()) error_ = s;
}

}  // namespace chorus::transport::ib
