// Builds one link per peer of a communicator's channel: every rank publishes where it lives,
// then the registry (registry.h) picks a backend per pair and each backend connects its peers.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "transport/registry.h"
#include "transport/store.h"

namespace chorus::transport {

// Collective over the communicator's ranks: every rank must call it with the same prefix.
// `prefix` is unique per communicator (keys in the store), `uid` goes into every link hello.
// `interrupt` is polled while waiting for peers: an error from it (a peer failed or died)
// ends the set-up at once. On failure, backends release what dead peers left (shm segments).
Result<LinkSet> connect_links(StoreClient& store, const std::string& prefix, uint64_t uid,
                              const Secret& secret, int rank, int size,
                              const Transports& transports, Deadline deadline,
                              const std::function<Status()>& interrupt = {},
                              const std::vector<std::string>& preferred_ifnames = {});

}  // namespace chorus::transport
