// The shm backend's registry entry: which pairs it connects (one host) and how it sets up the
// segments and rings of a channel through the bootstrap store.
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>

#include "common/env.h"
#include "common/log.h"
#include "common/process.h"
#include "transport/shm/link.h"

namespace chorus::transport {
namespace {

int index_of(const std::vector<int>& v, int x) {
  for (size_t i = 0; i < v.size(); ++i)
    if (v[i] == x) return static_cast<int>(i);
  return -1;
}

class ShmTransport final : public Transport {
 public:
  ShmTransport(ShmConfig cfg, int die_rank) : cfg_(cfg), die_rank_(die_rank) {}
  const char* name() const override { return "shm"; }
  int preference() const override { return 100; }
  bool can_connect(const PeerInfo& a, const PeerInfo& b) const override { return a.host == b.host; }
  // Measured 2026-11-21 with examples/bcast_barrier and bench/ on the 2-core project machine;
  // the two-rank crossover is in bench/RESULTS.md, "tuner crossover".
  LinkModel model() const override {
    return {"shm", 1.0e-6, 6.0e9, std::min<size_t>(cfg_.slot_bytes, 256 << 10), 2 << 20, true};
  }
  Status connect(const ConnectCtx& ctx, const std::vector<int>& local, LinkSet& set) override;
  void clean_up_after_failure(const ConnectCtx& ctx) override;

 private:
  ShmConfig cfg_;
  int die_rank_;  // CHORUS_TEST_SHM_DIE: this rank kills itself once its segment exists
};

// `local`: the peers on my host, in rank order; index = their ring number in my segment.
Status ShmTransport::connect(const ConnectCtx& ctx, const std::vector<int>& local, LinkSet& set) {
  const int rank = ctx.rank;
  std::string name = shm_segment_name(getpid(), ctx.prefix, rank);
  CHORUS_ASSIGN_OR_RETURN(std::unique_ptr<ShmSegment> own,
                          ShmSegment::create(name, static_cast<int>(local.size()), cfg_));
  // The test hook: dead before any peer knows the segment's name (only its pid tells it), which
  // clean_up_after_failure must unlink.
  if (rank == die_rank_) raise(SIGKILL);
  auto wake = std::make_unique<ShmWake>(std::move(own));
  ShmWake* mine = wake.get();
  set.wake_sources.push_back(std::move(wake));
  CHORUS_TRY(ctx.store.set(fmt::format("{}/shm/{}", ctx.prefix, rank), name));
  for (int p : local) {
    CHORUS_ASSIGN_OR_RETURN(
        std::string pname,
        ctx.store.get(fmt::format("{}/shm/{}", ctx.prefix, p), ctx.deadline, ctx.interrupt));
    const std::string expected = shm_segment_name(ctx.peers[p].pid, ctx.prefix, p);
    if (pname != expected)
      return make_error(Code::kRemoteError, "shm: rank {} published segment '{}', expected '{}'", p,
                        pname, expected);
    CHORUS_ASSIGN_OR_RETURN(std::unique_ptr<ShmSegment> seg, ShmSegment::open(pname));
    std::shared_ptr<ShmSegment> theirs(std::move(seg));
    std::vector<int> their_local = local;  // the peer's local list: same host, same set
    their_local.erase(their_local.begin() + index_of(their_local, p));
    their_local.push_back(rank);
    std::sort(their_local.begin(), their_local.end());
    set.links[p] = std::make_unique<ShmLink>(
        p, fmt::format("rank {} (shm, pid {})", p, ctx.peers[p].pid), mine, index_of(local, p),
        theirs, index_of(their_local, rank), ctx.peers[p].pid);
  }
  // Once every local peer has mapped my segment, its name can go: nothing leaks if we crash.
  CHORUS_TRY(ctx.store.set(fmt::format("{}/mapped/{}", ctx.prefix, rank), "1"));
  for (int p : local)
    CHORUS_TRY(
        ctx.store.get(fmt::format("{}/mapped/{}", ctx.prefix, p), ctx.deadline, ctx.interrupt));
  mine->segment()->unlink();
  return Status::ok();
}

// A local peer that died cannot unlink its segment; do it for it (also when its launcher has not
// reaped it yet: a zombie still answers kill(pid, 0)).
void ShmTransport::clean_up_after_failure(const ConnectCtx& ctx) {
  for (int p = 0; p < static_cast<int>(ctx.peers.size()); ++p) {
    const PeerInfo& peer = ctx.peers[p];
    if (p == ctx.rank || peer.pid <= 0 || !can_connect(peer, ctx.peers[ctx.rank])) continue;
    if (!process_gone(peer.pid)) continue;
    std::string name = shm_segment_name(peer.pid, ctx.prefix, p);
    if (shm_unlink(name.c_str()) == 0)
      log_info("shm: unlinked /dev/shm{} of rank {} (pid {} died during link set-up)", name, p,
               peer.pid);
  }
}

}  // namespace

std::string shm_segment_name(int pid, const std::string& prefix, int rank) {
  std::string name = fmt::format("/chorus-{}-{}-r{}", pid, prefix, rank);
  for (size_t i = 1; i < name.size(); ++i)
    if (name[i] == '/') name[i] = '_';
  return name;
}

Result<std::unique_ptr<Transport>> make_shm_transport() {
  ShmConfig cfg;
  CHORUS_ASSIGN_OR_RETURN(
      int64_t slot,
      env_int_in("CHORUS_SHM_SLOT_BYTES", static_cast<int64_t>(cfg.slot_bytes), 4096, 1 << 30));
  CHORUS_ASSIGN_OR_RETURN(int64_t nslots, env_int_in("CHORUS_SHM_SLOTS", cfg.nslots, 2, 1024));
  cfg.slot_bytes = static_cast<size_t>(slot);
  cfg.nslots = static_cast<int>(nslots);
  CHORUS_ASSIGN_OR_RETURN(int64_t die, env_int_in("CHORUS_TEST_SHM_DIE", -1, -1, 65535));
  return std::unique_ptr<Transport>(new ShmTransport(cfg, static_cast<int>(die)));
}

}  // namespace chorus::transport
