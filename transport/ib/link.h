// InfiniBand verbs link: RDMA writes with immediate into the peer's staging slots, with credits.
//
// Each side owns `nslots` receive slots of `slot_bytes` in memory its peer may write (alloc_
// remote), and as many send slots registered for local reads. A sender may write slot k
// (k = message number mod nslots) only while it holds a credit: it starts with nslots, spends
// one per write, and gets them back from the receiver, which returns consumed slots in batches
// (a zero-byte write whose immediate has kCreditBit set and the count below it). A data write's
// immediate is its length; RC delivers writes in order, so the n-th receive completion names
// slot n mod nslots. Every message consumes a posted receive: 2 * nslots + 4 are kept posted,
// more than the data (nslots) and credit writes (nslots) that can be in flight.
//
// Sends pack small requests into one slot (a header and its payload travel in one write).
// A request of at least zero_copy_bytes on a Nic whose registrations follow the mapping is
// written straight from the user's buffer (registration cache), and completes on its last
// write's completion; otherwise bytes are copied into send slots and a request completes once
// copied. The link offers its slots directly (DirectSlots): steps reduce out of a received slot
// and into a send slot.
#pragma once

#include <deque>
#include <memory>

#include "transport/ib/reg_cache.h"
#include "transport/ib/verbs.h"
#include "transport/link.h"
#include "transport/transport.h"

namespace chorus::transport::ib {

struct LinkConfig {
  size_t slot_bytes = 256 << 10;
  int nslots = 8;
  size_t zero_copy_bytes = 1 << 20;  // 0: never
  size_t reg_cache_bytes = size_t{1} << 30;
};

constexpr uint32_t kCreditBit = 0x80000000u;
// A zero-byte write with this immediate: the sender revoked the communicator (signal_revoke).
// No data write carries it: a slot holds at most 64 MiB.
constexpr uint32_t kRevokeImm = 0x40000000u;

// What a peer publishes about its receive slots, next to its queue pair's address.
struct SlotsAddr {
  uint64_t addr = 0;
  uint32_t rkey = 0;
};

// What a rank publishes through the store for each ib peer: its queue pair's address and its
// receive slots. "<qp address>|<slots addr> <rkey> <slot bytes> <slots>".
struct QpRecord {
  QpAddr qp;
  SlotsAddr slots;
  size_t slot_bytes = 0;
  int nslots = 0;
  std::string encode() const;
  static Result<QpRecord> decode(const std::string& s, int peer);
};

class IbLink final : public Link, public DirectSlots {
 public:
  // Creates the queue pair, the slots and their registrations, and posts the receives; the
  // caller publishes *qp_addr and *mine, connects qp() to the peer's and calls set_remote
  // before the first progress().
  static Result<std::unique_ptr<IbLink>> create(int peer, std::string peer_name,
                                                std::shared_ptr<Nic> nic, WakeSource* wake,
                                                const LinkConfig& cfg, QpAddr* qp_addr,
                                                SlotsAddr* mine);
  ~IbLink() override;
  void set_remote(const SlotsAddr& theirs) { remote_ = theirs; }
  int qp() const { return qp_; }

  Result<bool> progress() override;
  Status check_alive() override;
  void signal_revoke() override;
  DirectSlots* direct() override { return this; }
  size_t slot_capacity() const override { return cfg_.slot_bytes; }
  std::pair<const char*, size_t> recv_peek() override;
  void recv_consume(size_t n) override;
  std::pair<char*, size_t> send_reserve() override;
  void send_commit(size_t n) override;
  const RegCache::Stats& reg_stats() const { return cache_.stats(); }

 private:
  IbLink(int peer, std::string peer_name, std::shared_ptr<Nic> nic, WakeSource* wake,
         const LinkConfig& cfg, int qp);
  enum Kind : uint64_t { kStaged = 1, kZeroCopy = 2, kCredit = 3 };
  static uint64_t wr(Kind k, uint64_t v) { return (uint64_t{k} << 56) | v; }
  bool poll_cq();  // takes completions; true when any came
  Status fail(const Wc& wc);
  bool can_write() const;
  Status write_slot(uint64_t wr_id, const Mr& mr, const char* src, size_t n);
  bool progress_send();
  bool progress_recv();
  void release_in_slot();
  void return_credits(bool force);
  char* out_slot(uint64_t k) const { return sbuf_ + (k % cfg_.nslots) * cfg_.slot_bytes; }
  char* in_slot(uint64_t k) const { return rbuf_ + (k % cfg_.nslots) * cfg_.slot_bytes; }

  std::shared_ptr<Nic> nic_;
  LinkConfig cfg_;
  int qp_;
  int depth_;
  char* rbuf_ = nullptr;  // receive slots (the peer writes)
  char* sbuf_ = nullptr;  // send slots
  Mr rmr_, smr_;
  SlotsAddr remote_;
  RegCache cache_;
  Status error_ = Status::ok();
  // Sending.
  int credits_;
  int sq_outstanding_ = 0;
  uint64_t out_seq_ = 0;           // next message number
  std::vector<bool> staged_busy_;  // send slot written, completion not yet seen
  struct Pending {
    int writes = 0;  // zero-copy writes not yet completed
    RegCache::Entry* reg = nullptr;
  };
  std::deque<Pending> pend_;  // mirrors sends_
  size_t cursor_ = 0;         // sends_[cursor_] is the first not fully posted
  // Receiving.
  std::deque<uint32_t> filled_;  // lengths of received, unconsumed slots, in order
  uint64_t in_seq_ = 0;          // message number of filled_.front()
  size_t in_off_ = 0;            // bytes consumed of it
  int freed_ = 0;                // consumed slots not yet returned as credits
};

}  // namespace chorus::transport::ib

namespace chorus::transport {
// The registry's factory (connect.cc): reads CHORUS_IB_HCA, CHORUS_IB_GID_INDEX,
// CHORUS_IB_SLOT_BYTES, CHORUS_IB_SLOTS, CHORUS_IB_ZERO_COPY_BYTES, CHORUS_IB_REG_CACHE_BYTES
// and CHORUS_IB_EMULATE (verbs.h).
Result<std::unique_ptr<Transport>> make_ib_transport();
}  // namespace chorus::transport
