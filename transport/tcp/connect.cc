// The tcp backend's registry entry: it connects any pair (every rank has a listener) and sets
// up the striped sockets of a channel and each pair's control socket, lower ranks accepting and
// higher ranks dialling.
#include <unistd.h>

#include <algorithm>

#include "common/env.h"
#include "common/log.h"
#include "transport/acceptor.h"
#include "transport/tcp/link.h"

namespace chorus::transport {
namespace {

struct TcpConfig {
  int nsocks = 2;
  size_t stripe = 256 << 10;
  int dial_delay_ms = 0;  // CHORUS_TEST_LINK_DIAL_DELAY_MS: a test hook, see connect()
};

class TcpTransport final : public Transport {
 public:
  explicit TcpTransport(TcpConfig cfg) : cfg_(cfg) {}
  const char* name() const override { return "tcp"; }
  int preference() const override { return 10; }
  bool can_connect(const PeerInfo&, const PeerInfo&) const override { return true; }
  // Measured 2026-11-21 with examples/bcast_barrier and bench/ on the 2-core project machine.
  // A piece is at most one staging buffer (collectives/comm.h, StagingBuffers::kBytes).
  LinkModel model() const override { return {"tcp", 12.0e-6, 2.5e9, 256 << 10, 0}; }
  Status connect(const ConnectCtx& ctx, const std::vector<int>& remote, LinkSet& set) override;

 private:
  Status accept_links(const ConnectCtx& ctx, const std::vector<int>& remote,
                      std::vector<std::vector<Fd>>& socks);
  TcpConfig cfg_;
};

bool contains(const std::vector<int>& v, int x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

// Waits for the sockets of the higher ranks in `remote`, checking each hello.
Status TcpTransport::accept_links(const ConnectCtx& ctx, const std::vector<int>& remote,
                                  std::vector<std::vector<Fd>>& socks) {
  const int rank = ctx.rank, size = static_cast<int>(ctx.peers.size());
  const int nconn = cfg_.nsocks + 1;  // the data sockets and the control socket
  int expected = 0;
  for (int p : remote)
    if (p > rank) {
      expected += nconn;
      socks[p].resize(nconn);
    }
  AcceptorOptions ao;
  ao.allowed_kinds = kind_bit(ConnKind::kLink);
  ao.what = fmt::format("tcp (links of rank {})", rank);
  Acceptor acceptor(ctx.listener.get(), ctx.secret, ao);
  Deadline deadline = ctx.deadline;
  while (expected > 0) {
    if (deadline.expired())
      return make_error(Code::kTimeout, "tcp: rank {} waited {:.0f} s for {} link connections",
                        rank, deadline.total(), expected);
    if (ctx.interrupt) CHORUS_TRY(ctx.interrupt());
    for (auto& a : acceptor.poll(deadline.slice_ms(100))) {
      const Hello& h = a.hello;
      int p = h.rank;
      bool ok = h.comm_uid == ctx.uid && h.world == size && p > rank && p < size &&
                contains(remote, p) && h.channel >= 0 && h.channel < nconn &&
                !socks[p][h.channel].valid();
      if (!ok) {
        auto msg = fmt::format(
            "unexpected link hello (rank {}, world {}, channel {}, comm {:#x}); expected comm "
            "{:#x} of {} ranks",
            h.rank, h.world, h.channel, h.comm_uid, ctx.uid, size);
        log_warn("tcp: refused connection from {}: {}", a.peer, msg);
        (void)send_verdict(a.fd.get(), Code::kInvalidUsage, msg);
        continue;
      }
      CHORUS_TRY(send_verdict(a.fd.get(), Code::kOk, ""));
      socks[p][h.channel] = std::move(a.fd);
      --expected;
    }
  }
  return Status::ok();
}

// Lower ranks accept, higher ranks connect: connect first (the kernel queues them), then
// accept. Accepted connections handshake side by side (acceptor.h), so a stranger on the port
// delays nobody.
Status TcpTransport::connect(const ConnectCtx& ctx, const std::vector<int>& remote, LinkSet& set) {
  const int rank = ctx.rank, size = static_cast<int>(ctx.peers.size());
  std::vector<std::vector<Fd>> socks(size);
  // Test hook: whoever dials waits first, so that a stranger gets to a peer's port before it.
  if (cfg_.dial_delay_ms > 0 &&
      std::any_of(remote.begin(), remote.end(), [&](int p) { return p < rank; }))
    usleep(static_cast<useconds_t>(cfg_.dial_delay_ms) * 1000);
  for (int p : remote) {
    if (p > rank) continue;
    for (int ch = 0; ch <= cfg_.nsocks; ++ch) {  // the last one is the control socket
      Hello h = make_hello(ConnKind::kLink, rank, size, ctx.uid, ch);
      std::string peer = fmt::format("rank {} ({})", p, ctx.peers[p].addr.to_string());
      CHORUS_ASSIGN_OR_RETURN(Fd fd, dial(ctx.peers[p].addr, ctx.secret, h, peer, ctx.deadline));
      socks[p].push_back(std::move(fd));
    }
  }
  CHORUS_TRY(accept_links(ctx, remote, socks));
  auto wake = std::make_unique<TcpWake>();
  for (int p : remote) {
    Fd control = std::move(socks[p].back());
    socks[p].pop_back();
    set.links[p] =
        std::make_unique<TcpLink>(p, fmt::format("rank {} ({})", p, ctx.peers[p].addr.to_string()),
                                  std::move(socks[p]), cfg_.stripe, wake.get(), std::move(control));
  }
  set.wake_sources.push_back(std::move(wake));
  return Status::ok();
}

}  // namespace

Result<std::unique_ptr<Transport>> make_tcp_transport() {
  CHORUS_ASSIGN_OR_RETURN(int64_t nsocks, env_int_in("CHORUS_NSOCKS", 2, 1, 64));
  CHORUS_ASSIGN_OR_RETURN(int64_t stripe,
                          env_int_in("CHORUS_SOCKET_STRIPE_BYTES", 256 << 10, 4096, 1 << 30));
  CHORUS_ASSIGN_OR_RETURN(int64_t dial_delay,
                          env_int_in("CHORUS_TEST_LINK_DIAL_DELAY_MS", 0, 0, 10000));
  TcpConfig cfg;
  cfg.dial_delay_ms = static_cast<int>(dial_delay);
  cfg.nsocks = static_cast<int>(nsocks);
  cfg.stripe = static_cast<size_t>(stripe);
  return std::unique_ptr<Transport>(new TcpTransport(cfg));
}

}  // namespace chorus::transport
