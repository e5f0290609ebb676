// Transport: what a backend (transport/<name>/) tells the registry and how it connects links.
//
// Every backend answers the same questions, in NCCL's manner ("can you connect these two
// ranks?"): can_connect(a, b) for a pair of ranks (same host, same device, a reachable NIC),
// its preference among those that can, its cost model for the tuner, and connect() for the
// peers the registry gave it. The registry (registry.h) asks them in preference order.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/socket.h"
#include "transport/link.h"
#include "transport/store.h"
#include "transport/wire.h"

namespace chorus::transport {

// Where a rank lives, as every rank publishes it through the store before links exist.
struct PeerInfo {
  std::string host;  // host_id()
  int pid = 0;
  SockAddr addr;   // this rank's tcp listener
  std::string ib;  // the verbs port this rank uses ("mlx5_0:1"), empty for none
};

// The tuner's view of a backend: latency per message, bandwidth, and the largest piece a
// link takes at once. rd_two_rank_bytes: up to this size two ranks exchange a buffer whole
// (recursive doubling) rather than in the ring's steps -- a measured crossover, 0 for none.
// read_in_place: a receive is read where it lands (shared-memory slots), so a fold of several
// peers' inputs needs no staging copy; the deterministic mode's direct algorithm wants that.
struct LinkModel {
  const char* name;
  double alpha_s;
  double beta_bytes_per_s;
  size_t max_piece;
  size_t rd_two_rank_bytes;
  bool read_in_place = false;
};

// The links of one channel, indexed by peer rank (null for self), and what the backends keep
// for them besides: their wake-up sources, which the links point into.
struct LinkSet {
  std::vector<std::unique_ptr<Link>> links;
  std::vector<std::unique_ptr<WakeSource>> wake_sources;
  std::vector<PeerInfo> peers;
};

// What connect() gets: the bootstrap store, the communicator's identity and everyone's record.
struct ConnectCtx {
  StoreClient& store;
  const std::string& prefix;  // unique per communicator and channel (store keys)
  uint64_t uid;               // goes into every link hello
  const Secret& secret;
  int rank;
  const std::vector<PeerInfo>& peers;
  const Fd& listener;  // my tcp listener (its address is peers[rank].addr)
  Deadline deadline;
  const std::function<Status()>& interrupt;  // polled while waiting: a peer failed or died
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual const char* name() const = 0;
  // Higher is preferred when several backends can connect a pair.
  virtual int preference() const = 0;
  // Must be symmetric: both ranks of a pair pick the same backend from the same records.
  virtual bool can_connect(const PeerInfo& a, const PeerInfo& b) const = 0;
  virtual LinkModel model() const = 0;
  // Adds what peers need to know about this rank before links exist (ib: its port).
  virtual void describe(PeerInfo&) const {}
  // Collective among `peers` (every one of them calls it with this rank in its list): puts a
  // link to each into set.links, and any wake-up source they share into set.wake_sources.
  virtual Status connect(const ConnectCtx& ctx, const std::vector<int>& peers, LinkSet& set) = 0;
  // After a failed set-up: release what dead peers cannot (shm: their segments' names).
  virtual void clean_up_after_failure(const ConnectCtx&) {}
};

}  // namespace chorus::transport
