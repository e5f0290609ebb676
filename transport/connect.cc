// Link set-up through the bootstrap store.
#include "transport/connect.h"

#include <unistd.h>

#include <sstream>

#include "common/log.h"
#include "transport/topology.h"

namespace chorus::transport {
namespace {

std::string encode(const PeerInfo& p) {
  return fmt::format("{}\n{}\n{}\n{}\n{}", p.host, p.pid, p.addr.host, p.addr.port,
                     p.ib.empty() ? "-" : p.ib);
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
  if (!std::getline(in, p.host) || !std::getline(in, pid) || !std::getline(in, p.addr.host) ||
      !std::getline(in, port) || !std::getline(in, p.ib) || p.ib.empty() || p.ib.size() > 80)
    return make_error(Code::kRemoteError, "bootstrap: malformed address record from rank {}", rank);
  if (p.ib == "-") p.ib.clear();
  CHORUS_ASSIGN_OR_RETURN(p.pid, record_int(pid, "pid", 1, (1L << 31) - 1, rank));
  CHORUS_ASSIGN_OR_RETURN(p.addr.port, record_int(port, "port", 1, 65535, rank));
  return p;
}

// Everyone's record, mine published first.
Status exchange_records(StoreClient& store, const std::string& prefix, int rank, const PeerInfo& me,
                        Deadline deadline, const std::function<Status()>& interrupt,
                        std::vector<PeerInfo>& peers) {
  CHORUS_TRY(store.set(fmt::format("{}/addr/{}", prefix, rank), encode(me)));
  for (int r = 0; r < static_cast<int>(peers.size()); ++r) {
    if (r == rank) {
      peers[r] = me;
      continue;
    }
    CHORUS_ASSIGN_OR_RETURN(std::string rec,
                            store.get(fmt::format("{}/addr/{}", prefix, r), deadline, interrupt));
    CHORUS_ASSIGN_OR_RETURN(peers[r], decode(rec, r));
  }
  return Status::ok();
}

// Peers per backend (index into transports.all()); an error when none can connect a pair.
Result<std::vector<std::vector<int>>> assign_peers(const Transports& transports,
                                                   const std::vector<PeerInfo>& peers, int rank) {
  std::vector<std::vector<int>> by_backend(transports.all().size());
  for (int r = 0; r < static_cast<int>(peers.size()); ++r) {
    if (r == rank) continue;
    Transport* t = transports.choose(peers[rank], peers[r]);
    if (!t)
      return make_error(
          Code::kInvalidUsage,
          "links: no transport connects rank {} (host {}) to rank {} (host {}); "
          "CHORUS_TRANSPORT={} allows {}",
          rank, peers[rank].host, r, peers[r].host,
          transports.only().empty() ? "(unset)" : transports.only(),
          transports.only().empty() ? Transports::registered_names() : transports.only());
    for (size_t k = 0; k < transports.all().size(); ++k)
      if (transports.all()[k].get() == t) by_backend[k].push_back(r);
  }
  return by_backend;
}

}  // namespace

Result<LinkSet> connect_links(StoreClient& store, const std::string& prefix, uint64_t uid,
                              const Secret& secret, int rank, int size,
                              const Transports& transports, Deadline deadline,
                              const std::function<Status()>& interrupt,
                              const std::vector<std::string>& preferred_ifnames) {
  LinkSet set;
  set.links.resize(size);
  set.peers.resize(size);
  CHORUS_ASSIGN_OR_RETURN(std::string host, local_address(preferred_ifnames));
  if (!preferred_ifnames.empty())
    log_info("links: rank {}: listening on {} (interfaces preferred: {})", rank, host,
             fmt::join(preferred_ifnames, ","));
  SockAddr bound;
  CHORUS_ASSIGN_OR_RETURN(Fd listener, tcp_listen(host, 0, &bound));
  PeerInfo me{host_id(), getpid(), bound, ""};
  for (auto& t : transports.all()) t->describe(me);
  CHORUS_TRY(exchange_records(store, prefix, rank, me, deadline, interrupt, set.peers));
  CHORUS_ASSIGN_OR_RETURN(auto by_backend, assign_peers(transports, set.peers, rank));
  ConnectCtx ctx{store, prefix, uid, secret, rank, set.peers, listener, deadline, interrupt};
  std::string summary;
  for (size_t k = 0; k < by_backend.size(); ++k) {
    Transport& t = *transports.all()[k];
    if (by_backend[k].empty()) continue;
    // Every pair's link, for CHORUS_DEBUG=INFO: "1 shm peer(s) (1), 2 tcp peer(s) (2,3)".
    summary += fmt::format("{}{} {} peer(s) ({})", summary.empty() ? "" : ", ",
                           by_backend[k].size(), t.name(), fmt::join(by_backend[k], ","));
    Status s = t.connect(ctx, by_backend[k], set);
    if (!s.is_ok()) {
      for (auto& b : transports.all()) b->clean_up_after_failure(ctx);
      return s;
    }
  }
  log_info("links: rank {}: {}", rank, summary.empty() ? "no peers" : summary);
  return set;
}

}  // namespace chorus::transport
