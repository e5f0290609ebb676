// The ib backend's registry entry: the port a rank uses (CHORUS_IB_HCA), which pairs it
// connects (both ranks have an active port; across hosts it is preferred to tcp, on one host
// shm is preferred to it) and the queue pairs' set-up through the bootstrap store.
#include <fmt/format.h>

#include "common/env.h"
#include "common/log.h"
#include "transport/ib/hca.h"
#include "transport/ib/link.h"

namespace chorus::transport {
namespace {

using ib::IbLink;
using ib::LinkConfig;
using ib::Nic;

// The links' wake-up source: the Nic's, kept alive by the links as well.
class NicWake final : public WakeSource {
 public:
  explicit NicWake(std::shared_ptr<Nic> nic) : nic_(std::move(nic)) {}
  std::vector<int> poll_fds() const override { return nic_->poll_fds(); }
  bool has_doorbell() const override { return nic_->has_doorbell(); }
  uint32_t arm() override { return nic_->arm(); }
  bool rung_since(uint32_t seen) const override { return nic_->rung_since(seen); }
  void wait(uint32_t seen, int ms) override { nic_->wait(seen, ms); }
  void disarm() override { nic_->disarm(); }
  void ring() override { nic_->ring(); }

 private:
  std::shared_ptr<Nic> nic_;
};

struct IbConfig {
  LinkConfig link;
  int gid_index = 0;
  bool bad_rkey = false;  // test hook: publish a wrong key, so the peer's writes fail
};

class IbTransport final : public Transport {
 public:
  IbTransport(IbConfig cfg, std::optional<ib::Port> port) : cfg_(cfg), port_(std::move(port)) {}
  const char* name() const override { return "ib"; }
  int preference() const override { return 50; }
  bool can_connect(const PeerInfo& a, const PeerInfo& b) const override {
    return !a.ib.empty() && !b.ib.empty();
  }
  void describe(PeerInfo& me) const override {
    if (port_) me.ib = port_->name();
  }
  // Not measured: no HCA here. An EDR-class link's order of magnitude; a piece is one slot.
  LinkModel model() const override { return {"ib", 3.0e-6, 10.0e9, cfg_.link.slot_bytes, 0, true}; }
  Status connect(const ConnectCtx& ctx, const std::vector<int>& remote, LinkSet& set) override;

 private:
  IbConfig cfg_;
  std::optional<ib::Port> port_;
};

Status IbTransport::connect(const ConnectCtx& ctx, const std::vector<int>& remote, LinkSet& set) {
  const int rank = ctx.rank;
  CHORUS_ASSIGN_OR_RETURN(std::shared_ptr<Nic> nic, ib::open_nic(*port_, cfg_.gid_index));
  auto wake = std::make_unique<NicWake>(nic);
  std::vector<IbLink*> links;
  for (int p : remote) {
    ib::QpAddr qa;
    ib::SlotsAddr sa;
    CHORUS_ASSIGN_OR_RETURN(
        auto link,
        IbLink::create(p,
                       fmt::format("rank {} ({} on {})", p, ctx.peers[p].ib,
                                   ctx.peers[p].host.substr(0, ctx.peers[p].host.find('/'))),
                       nic, wake.get(), cfg_.link, &qa, &sa));
    if (cfg_.bad_rkey) sa.rkey += 1000;
    ib::QpRecord rec{qa, sa, cfg_.link.slot_bytes, cfg_.link.nslots};
    CHORUS_TRY(ctx.store.set(fmt::format("{}/ib/{}/{}", ctx.prefix, rank, p), rec.encode()));
    links.push_back(link.get());
    set.links[p] = std::move(link);
  }
  for (IbLink* l : links) {
    const int p = l->peer();
    CHORUS_ASSIGN_OR_RETURN(std::string text,
                            ctx.store.get(fmt::format("{}/ib/{}/{}", ctx.prefix, p, rank),
                                          ctx.deadline, ctx.interrupt));
    CHORUS_ASSIGN_OR_RETURN(ib::QpRecord rec, ib::QpRecord::decode(text, p));
    if (rec.slot_bytes != cfg_.link.slot_bytes || rec.nslots != cfg_.link.nslots)
      return make_error(Code::kInvalidUsage,
                        "ib: rank {} has {} slots of {} bytes, rank {} has {} of {}: set "
                        "CHORUS_IB_SLOTS and CHORUS_IB_SLOT_BYTES alike on every rank",
                        p, rec.nslots, rec.slot_bytes, rank, cfg_.link.nslots,
                        cfg_.link.slot_bytes);
    CHORUS_TRY(nic->connect_qp(l->qp(), rec.qp));
    CHORUS_TRY(nic->expect_writes(l->qp(), rec.slots.rkey));
    l->set_remote(rec.slots);
  }
  // Every peer's queue pair is ready to receive before anyone writes; then the emulation's
  // names can go (every peer has mapped what it writes into).
  CHORUS_TRY(ctx.store.set(fmt::format("{}/ibready/{}", ctx.prefix, rank), "1"));
  for (int p : remote)
    CHORUS_TRY(
        ctx.store.get(fmt::format("{}/ibready/{}", ctx.prefix, p), ctx.deadline, ctx.interrupt));
  nic->unlink_names();
  set.wake_sources.push_back(std::move(wake));
  return Status::ok();
}

}  // namespace

Result<std::unique_ptr<Transport>> make_ib_transport() {
  IbConfig cfg;
  CHORUS_ASSIGN_OR_RETURN(int64_t slot,
                          env_int_in("CHORUS_IB_SLOT_BYTES", 256 << 10, 4096, 64 << 20));
  CHORUS_ASSIGN_OR_RETURN(int64_t nslots, env_int_in("CHORUS_IB_SLOTS", 8, 2, 256));
  CHORUS_ASSIGN_OR_RETURN(int64_t zc,
                          env_int_in("CHORUS_IB_ZERO_COPY_BYTES", 1 << 20, 0, int64_t{1} << 40));
  CHORUS_ASSIGN_OR_RETURN(int64_t cache, env_int_in("CHORUS_IB_REG_CACHE_BYTES", int64_t{1} << 30,
                                                    0, int64_t{1} << 46));
  CHORUS_ASSIGN_OR_RETURN(int64_t gid, env_int_in("CHORUS_IB_GID_INDEX", 0, 0, 255));
  CHORUS_ASSIGN_OR_RETURN(int64_t bad, env_int_in("CHORUS_TEST_IB_BAD_RKEY", 0, 0, 1));
  cfg.link = {static_cast<size_t>(slot), static_cast<int>(nslots), static_cast<size_t>(zc),
              static_cast<size_t>(cache)};
  cfg.gid_index = static_cast<int>(gid);
  cfg.bad_rkey = bad != 0;
  const std::string spec = env_str("CHORUS_IB_HCA", "");
  CHORUS_ASSIGN_OR_RETURN(ib::HcaFilter filter, ib::parse_hca(spec));
  // No usable port is no error: the pairs go to tcp, and INFO says why.
  std::optional<ib::Port> port;
  auto ports = ib::list_ports();
  if (!ports.is_ok() && ib::emulated()) return ports.status();  // a malformed CHORUS_IB_EMULATE
  auto chosen = ports.is_ok() ? ib::choose_ports(*ports, filter, spec)
                              : Result<std::vector<ib::Port>>(ports.status());
  if (chosen.is_ok()) {
    port = chosen->front();
    log_info("ib: port {}{} (of {} allowed and active)", port->name(),
             ib::emulated() ? " (emulated, CHORUS_IB_EMULATE)" : "", chosen->size());
  } else {
    log_info("ib: not used ({}); ranks on other hosts connect over tcp", chosen.status().message());
  }
  return std::unique_ptr<Transport>(new IbTransport(cfg, std::move(port)));
}

}  // namespace chorus::transport
