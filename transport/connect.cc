// Link set-up through the bootstrap store.
#include "transport/connect.h"

#include <unistd.h>

#include <sstream>

#include "common/env.h"
#include "common/log.h"
#include "transport/tcp.h"
#include "transport/topology.h"

namespace chorus::transport {

Result<LinkOptions> LinkOptions::from_env() {
  LinkOptions o;
  o.force = env_str("CHORUS_TRANSPORT", "");
  if (!o.force.empty() && o.force != "tcp" && o.force != "shm")
    return make_error(Code::kInvalidArgument, "CHORUS_TRANSPORT='{}': expected tcp or shm", o.force);
  CHORUS_ASSIGN_OR_RETURN(int64_t nsocks, env_int("CHORUS_NSOCKS", 2));
  CHORUS_ASSIGN_OR_RETURN(int64_t stripe, env_int("CHORUS_SOCKET_STRIPE_BYTES", 256 << 10));
  CHORUS_ASSIGN_OR_RETURN(int64_t slot, env_int("CHORUS_SHM_SLOT_BYTES", 256 << 10));
  CHORUS_ASSIGN_OR_RETURN(int64_t nslots, env_int("CHORUS_SHM_SLOTS", 8));
  if (nsocks < 1 || nsocks > 64) return make_error(Code::kInvalidArgument, "CHORUS_NSOCKS={}: expected 1..64", nsocks);
  if (stripe < 4096) return make_error(Code::kInvalidArgument, "CHORUS_SOCKET_STRIPE_BYTES={}: expected >= 4096", stripe);
  if (slot < 4096 || nslots < 2)
    return make_error(Code::kInvalidArgument, "CHORUS_SHM_SLOT_BYTES={} / CHORUS_SHM_SLOTS={}: expected >= 4096 and >= 2", slot, nslots);
  o.nsocks = static_cast<int>(nsocks);
  o.stripe = static_cast<size_t>(stripe);
  o.shm.slot_bytes = static_cast<size_t>(slot);
  o.shm.nslots = static_cast<int>(nslots);
  return o;
}

namespace {

std::string encode(const PeerInfo& p) {
  return fmt::format("{}\n{}\n{}\n{}", p.host, p.pid, p.addr.host, p.addr.port);
}

Result<PeerInfo> decode(const std::string& s, int rank) {
  std::istringstream in(s);
  PeerInfo p;
  std::string pid, port;
  if (!std::getline(in, p.host) || !std::getline(in, pid) || !std::getline(in, p.addr.host) || !std::getline(in, port))
    return make_error(Code::kRemoteError, "bootstrap: malformed address record from rank {}", rank);
  p.pid = std::atoi(pid.c_str());
  p.addr.port = std::atoi(port.c_str());
  return p;
}

// Ranks (other than `rank`) that share my host, in rank order; index = their ring number.
std::vector<int> local_peers(const std::vector<PeerInfo>& peers, int rank) {
  std::vector<int> out;
  for (int r = 0; r < static_cast<int>(peers.size()); ++r)
    if (r != rank && peers[r].host == peers[rank].host) out.push_back(r);
  return out;
}

int index_of(const std::vector<int>& v, int x) {
  for (size_t i = 0; i < v.size(); ++i)
    if (v[i] == x) return static_cast<int>(i);
  return -1;
}

Status connect_shm(StoreClient& store, const std::string& prefix, int rank, const LinkOptions& opt,
                   const std::vector<int>& local, Deadline deadline, LinkSet& set) {
  std::string name = fmt::format("/chorus-{}-{}-r{}", getpid(), prefix, rank);
  for (auto& ch : name) if (ch == '/' && &ch != &name[0]) ch = '_';
  CHORUS_ASSIGN_OR_RETURN(set.own_segment, ShmSegment::create(name, static_cast<int>(local.size()), opt.shm));
  CHORUS_TRY(store.set(fmt::format("{}/shm/{}", prefix, rank), name));
  for (int p : local) {
    CHORUS_ASSIGN_OR_RETURN(std::string pname, store.get(fmt::format("{}/shm/{}", prefix, p), deadline));
    CHORUS_ASSIGN_OR_RETURN(std::unique_ptr<ShmSegment> seg, ShmSegment::open(pname));
    std::shared_ptr<ShmSegment> theirs(std::move(seg));
    std::vector<int> their_local = local;  // the peer's local list: same host, same set
    their_local.erase(their_local.begin() + index_of(their_local, p));
    their_local.push_back(rank);
    std::sort(their_local.begin(), their_local.end());
    auto link = std::make_unique<ShmLink>(p, fmt::format("rank {} (shm, pid {})", p, set.peers[p].pid),
                                          set.own_segment.get(), index_of(local, p), theirs,
                                          index_of(their_local, rank), set.peers[p].pid);
    set.links[p] = std::move(link);
  }
  // Once every local peer has mapped my segment, its name can go: nothing leaks if we crash.
  CHORUS_TRY(store.set(fmt::format("{}/mapped/{}", prefix, rank), "1"));
  for (int p : local) CHORUS_TRY(store.get(fmt::format("{}/mapped/{}", prefix, p), deadline));
  set.own_segment->unlink();
  return Status::ok();
}

Status connect_tcp(const Fd& listener, int rank, uint64_t uid, const Secret& secret, const LinkOptions& opt,
                   const std::vector<int>& remote, Deadline deadline, LinkSet& set) {
  int size = static_cast<int>(set.peers.size());
  std::vector<std::vector<Fd>> socks(size);
  // Lower ranks accept, higher ranks connect: connect first (the kernel queues them), then accept.
  for (int p : remote) {
    if (p > rank) continue;
    for (int ch = 0; ch < opt.nsocks; ++ch) {
      CHORUS_ASSIGN_OR_RETURN(Fd fd, tcp_connect(set.peers[p].addr, deadline));
      Hello h = make_hello(ConnKind::kLink, secret, rank, size, uid, ch);
      CHORUS_TRY(client_handshake(fd.get(), h, fmt::format("rank {} ({})", p, set.peers[p].addr.to_string()), deadline));
      socks[p].push_back(std::move(fd));
    }
  }
  int expected = 0;
  for (int p : remote)
    if (p > rank) {
      expected += opt.nsocks;
      socks[p].resize(opt.nsocks);
    }
  while (expected > 0) {
    SockAddr from;
    auto fd = tcp_accept(listener.get(), deadline, &from);
    if (!fd.is_ok()) return fd.status().wrap(fmt::format("tcp: rank {} waiting for {} link connections", rank, expected));
    auto h = server_handshake(fd->get(), secret, kind_bit(ConnKind::kLink), from.to_string());
    if (!h.is_ok()) continue;  // refused and logged; keep waiting for the real peers
    int p = h->rank;
    bool ok = h->comm_uid == uid && h->world == size && p > rank && p < size &&
              index_of(remote, p) >= 0 && h->channel >= 0 && h->channel < opt.nsocks && !socks[p][h->channel].valid();
    if (!ok) {
      auto msg = fmt::format("unexpected link hello (rank {}, world {}, channel {}, comm {:#x}); expected comm {:#x} of {} ranks",
                             h->rank, h->world, h->channel, h->comm_uid, uid, size);
      log_warn("tcp: refused connection from {}: {}", from.to_string(), msg);
      (void)send_verdict(fd->get(), Code::kInvalidUsage, msg);
      continue;
    }
    CHORUS_TRY(send_verdict(fd->get(), Code::kOk, ""));
    socks[p][h->channel] = std::move(fd.value());
    --expected;
  }
  for (int p : remote) {
    for (auto& f : socks[p]) set.tcp_fds.push_back(f.get());
    set.links[p] = std::make_unique<TcpLink>(p, fmt::format("rank {} ({})", p, set.peers[p].addr.to_string()),
                                             std::move(socks[p]), opt.stripe);
  }
  return Status::ok();
}

}  // namespace

Result<LinkSet> connect_links(StoreClient& store, const std::string& prefix, uint64_t uid, const Secret& secret,
                              int rank, int size, const LinkOptions& opt, Deadline deadline) {
  LinkSet set;
  set.links.resize(size);
  set.peers.resize(size);
  CHORUS_ASSIGN_OR_RETURN(std::string host, local_address());
  SockAddr bound;
  CHORUS_ASSIGN_OR_RETURN(Fd listener, tcp_listen(host, 0, &bound));
  PeerInfo me{host_id(), getpid(), bound};
  CHORUS_TRY(store.set(fmt::format("{}/addr/{}", prefix, rank), encode(me)));
  for (int r = 0; r < size; ++r) {
    if (r == rank) { set.peers[r] = me; continue; }
    CHORUS_ASSIGN_OR_RETURN(std::string rec, store.get(fmt::format("{}/addr/{}", prefix, r), deadline));
    CHORUS_ASSIGN_OR_RETURN(set.peers[r], decode(rec, r));
  }
  std::vector<int> local = opt.force == "tcp" ? std::vector<int>{} : local_peers(set.peers, rank);
  std::vector<int> remote;
  for (int r = 0; r < size; ++r)
    if (r != rank && index_of(local, r) < 0) remote.push_back(r);
  if (opt.force == "shm" && !remote.empty())
    return make_error(Code::kInvalidUsage, "CHORUS_TRANSPORT=shm, but rank {} is on another host ({} vs {})",
                      remote[0], set.peers[remote[0]].host, me.host);
  if (!local.empty()) CHORUS_TRY(connect_shm(store, prefix, rank, opt, local, deadline, set));
  if (!remote.empty()) CHORUS_TRY(connect_tcp(listener, rank, uid, secret, opt, remote, deadline, set));
  log_info("links: rank {}: {} shm peer(s), {} tcp peer(s)", rank, local.size(), remote.size());
  return set;
}

}  // namespace chorus::transport
