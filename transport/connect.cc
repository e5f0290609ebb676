// Link set-up through the bootstrap store.
#include "transport/connect.h"

#include <errno.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <sstream>

#include "common/env.h"
#include "common/log.h"
#include "transport/acceptor.h"
#include "transport/tcp.h"
#include "transport/topology.h"

namespace chorus::transport {

Result<LinkOptions> LinkOptions::from_env() {
  LinkOptions o;
  o.force = env_str("CHORUS_TRANSPORT", "");
  if (!o.force.empty() && o.force != "tcp" && o.force != "shm")
    return make_error(Code::kInvalidArgument, "CHORUS_TRANSPORT='{}': expected tcp or shm", o.force);
  CHORUS_ASSIGN_OR_RETURN(int64_t nsocks, env_int_in("CHORUS_NSOCKS", 2, 1, 64));
  CHORUS_ASSIGN_OR_RETURN(int64_t stripe,
                          env_int_in("CHORUS_SOCKET_STRIPE_BYTES", 256 << 10, 4096, 1 << 30));
  CHORUS_ASSIGN_OR_RETURN(int64_t slot,
                          env_int_in("CHORUS_SHM_SLOT_BYTES", 256 << 10, 4096, 1 << 30));
  CHORUS_ASSIGN_OR_RETURN(int64_t nslots, env_int_in("CHORUS_SHM_SLOTS", 8, 2, 1024));
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

Result<int> record_int(const std::string& v, const char* field, long lo, long hi, int rank) {
  char* end = nullptr;
  errno = 0;
  long x = std::strtol(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || errno != 0 || x < lo || x > hi)
    return make_error(Code::kRemoteError,
                      "bootstrap: rank {}'s address record has {} '{}' (expected {}..{})", rank,
                      field, v, lo, hi);
  return static_cast<int>(x);
}

Result<PeerInfo> decode(const std::string& s, int rank) {
  std::istringstream in(s);
  PeerInfo p;
  std::string pid, port;
  if (!std::getline(in, p.host) || !std::getline(in, pid) || !std::getline(in, p.addr.host) || !std::getline(in, port))
    return make_error(Code::kRemoteError, "bootstrap: malformed address record from rank {}", rank);
  CHORUS_ASSIGN_OR_RETURN(p.pid, record_int(pid, "pid", 1, (1L << 31) - 1, rank));
  CHORUS_ASSIGN_OR_RETURN(p.addr.port, record_int(port, "port", 1, 65535, rank));
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
                   const std::vector<int>& local, Deadline deadline,
                   const std::function<Status()>& interrupt, LinkSet& set) {
  std::string name = shm_segment_name(getpid(), prefix, rank);
  CHORUS_ASSIGN_OR_RETURN(set.own_segment, ShmSegment::create(name, static_cast<int>(local.size()), opt.shm));
  CHORUS_TRY(store.set(fmt::format("{}/shm/{}", prefix, rank), name));
  for (int p : local) {
    CHORUS_ASSIGN_OR_RETURN(std::string pname,
                            store.get(fmt::format("{}/shm/{}", prefix, p), deadline, interrupt));
    if (pname != shm_segment_name(set.peers[p].pid, prefix, p))
      return make_error(Code::kRemoteError, "shm: rank {} published segment '{}', expected '{}'", p,
                        pname, shm_segment_name(set.peers[p].pid, prefix, p));
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
  for (int p : local)
    CHORUS_TRY(store.get(fmt::format("{}/mapped/{}", prefix, p), deadline, interrupt));
  set.own_segment->unlink();
  return Status::ok();
}

// Lower ranks accept, higher ranks connect: connect first (the kernel queues them), then
// accept. Accepted connections handshake side by side (acceptor.h), so a stranger on the port
// delays nobody.
Status connect_tcp(const Fd& listener, int rank, uint64_t uid, const Secret& secret,
                   const LinkOptions& opt, const std::vector<int>& remote, Deadline deadline,
                   const std::function<Status()>& interrupt, LinkSet& set) {
  int size = static_cast<int>(set.peers.size());
  std::vector<std::vector<Fd>> socks(size);
  for (int p : remote) {
    if (p > rank) continue;
    for (int ch = 0; ch < opt.nsocks; ++ch) {
      Hello h = make_hello(ConnKind::kLink, rank, size, uid, ch);
      std::string peer = fmt::format("rank {} ({})", p, set.peers[p].addr.to_string());
      CHORUS_ASSIGN_OR_RETURN(Fd fd, dial(set.peers[p].addr, secret, h, peer, deadline));
      socks[p].push_back(std::move(fd));
    }
  }
  int expected = 0;
  for (int p : remote)
    if (p > rank) {
      expected += opt.nsocks;
      socks[p].resize(opt.nsocks);
    }
  AcceptorOptions ao;
  ao.allowed_kinds = kind_bit(ConnKind::kLink);
  ao.what = fmt::format("tcp (links of rank {})", rank);
  Acceptor acceptor(listener.get(), secret, ao);
  while (expected > 0) {
    if (deadline.expired())
      return make_error(Code::kTimeout, "tcp: rank {} waited {:.0f} s for {} link connections",
                        rank, deadline.total(), expected);
    if (interrupt) CHORUS_TRY(interrupt());
    for (auto& a : acceptor.poll(deadline.slice_ms(100))) {
      const Hello& h = a.hello;
      int p = h.rank;
      bool ok = h.comm_uid == uid && h.world == size && p > rank && p < size &&
                index_of(remote, p) >= 0 && h.channel >= 0 && h.channel < opt.nsocks &&
                !socks[p][h.channel].valid();
      if (!ok) {
        auto msg = fmt::format(
            "unexpected link hello (rank {}, world {}, channel {}, comm {:#x}); expected comm "
            "{:#x} of {} ranks",
            h.rank, h.world, h.channel, h.comm_uid, uid, size);
        log_warn("tcp: refused connection from {}: {}", a.peer, msg);
        (void)send_verdict(a.fd.get(), Code::kInvalidUsage, msg);
        continue;
      }
      CHORUS_TRY(send_verdict(a.fd.get(), Code::kOk, ""));
      socks[p][h.channel] = std::move(a.fd);
      --expected;
    }
  }
  for (int p : remote) {
    for (auto& f : socks[p]) set.tcp_fds.push_back(f.get());
    set.links[p] = std::make_unique<TcpLink>(p, fmt::format("rank {} ({})", p, set.peers[p].addr.to_string()),
                                             std::move(socks[p]), opt.stripe);
  }
  return Status::ok();
}

// After a failed set-up: a local peer that died cannot unlink its segment; do it for it.
void unlink_dead_peers_segments(const LinkSet& set, const std::string& prefix, int rank) {
  for (int p = 0; p < static_cast<int>(set.peers.size()); ++p) {
    const PeerInfo& peer = set.peers[p];
    if (p == rank || peer.pid <= 0 || peer.host != set.peers[rank].host) continue;
    if (kill(peer.pid, 0) == 0 || errno != ESRCH) continue;
    std::string name = shm_segment_name(peer.pid, prefix, p);
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

Result<LinkSet> connect_links(StoreClient& store, const std::string& prefix, uint64_t uid,
                              const Secret& secret, int rank, int size, const LinkOptions& opt,
                              Deadline deadline, const std::function<Status()>& interrupt) {
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
    CHORUS_ASSIGN_OR_RETURN(std::string rec,
                            store.get(fmt::format("{}/addr/{}", prefix, r), deadline, interrupt));
    CHORUS_ASSIGN_OR_RETURN(set.peers[r], decode(rec, r));
  }
  std::vector<int> local = opt.force == "tcp" ? std::vector<int>{} : local_peers(set.peers, rank);
  std::vector<int> remote;
  for (int r = 0; r < size; ++r)
    if (r != rank && index_of(local, r) < 0) remote.push_back(r);
  if (opt.force == "shm" && !remote.empty())
    return make_error(Code::kInvalidUsage, "CHORUS_TRANSPORT=shm, but rank {} is on another host ({} vs {})",
                      remote[0], set.peers[remote[0]].host, me.host);
  Status s;
  if (!local.empty()) s = connect_shm(store, prefix, rank, opt, local, deadline, interrupt, set);
  if (s.is_ok() && !remote.empty())
    s = connect_tcp(listener, rank, uid, secret, opt, remote, deadline, interrupt, set);
  if (!s.is_ok()) {
    unlink_dead_peers_segments(set, prefix, rank);
    return s;
  }
  log_info("links: rank {}: {} shm peer(s), {} tcp peer(s)", rank, local.size(), remote.size());
  return set;
}

}  // namespace chorus::transport
