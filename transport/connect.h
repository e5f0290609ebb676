// Builds one link per peer of a communicator, choosing the transport per pair:
// same host -> shm, else tcp; CHORUS_TRANSPORT=tcp forces tcp (shm: requires one host).
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "transport/link.h"
#include "transport/shm.h"
#include "transport/store.h"

namespace chorus::transport {

struct LinkOptions {
  std::string force;  // "", "tcp" or "shm"
  int nsocks = 2;
  size_t stripe = 256 << 10;
  ShmConfig shm;
  static Result<LinkOptions> from_env();
};

struct PeerInfo {
  std::string host;  // host_id()
  int pid = 0;
  SockAddr addr;     // tcp listener
};

struct LinkSet {
  std::vector<std::unique_ptr<Link>> links;  // indexed by peer rank; null for self
  std::unique_ptr<ShmSegment> own_segment;   // holds my doorbell and inbound rings
  std::vector<PeerInfo> peers;
  std::vector<int> tcp_fds;                  // every tcp socket, for epoll
};

// Collective over the communicator's ranks: every rank must call it with the same prefix.
// `prefix` is unique per communicator (keys in the store), `uid` goes into every link hello.
// `interrupt` is polled while waiting for peers: an error from it (a peer failed or died)
// ends the set-up at once. On failure, the shm segments of local peers that died are unlinked.
Result<LinkSet> connect_links(StoreClient& store, const std::string& prefix, uint64_t uid,
                              const Secret& secret, int rank, int size, const LinkOptions& opt,
                              Deadline deadline, const std::function<Status()>& interrupt = {});
// The /dev/shm name of a rank's segment.
std::string shm_segment_name(int pid, const std::string& prefix, int rank);

}  // namespace chorus::transport
