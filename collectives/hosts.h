// Which ranks share a host (transport/topology.h host_id), for the algorithms that care: the
// ring that crosses each host boundary once, and the hierarchical all-reduce.
#pragma once

#include <string>
#include <vector>

namespace chorus {

// Hosts are numbered in the order of their lowest rank; a host's ranks are kept in rank order,
// the first of them its leader.
struct HostLayout {
  std::vector<int> host_of;               // per rank
  std::vector<std::vector<int>> members;  // per host
  std::vector<int> leaders;               // per host: members[h][0]
  std::vector<int> ring;                  // every rank, host by host
  std::vector<int> ring_pos;              // per rank: its position in `ring`

  // One host id per rank.
  static HostLayout from_hosts(const std::vector<std::string>& host_ids);
  int nhosts() const { return static_cast<int>(members.size()); }
  int max_local() const;  // the most ranks any host has
};

}  // namespace chorus
