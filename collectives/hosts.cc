#include "collectives/hosts.h"

#include <algorithm>
#include <map>

namespace chorus {

HostLayout HostLayout::from_hosts(const std::vector<std::string>& host_ids) {
  HostLayout l;
  std::map<std::string, int> index;
  for (const std::string& id : host_ids) {
    auto [it, fresh] = index.try_emplace(id, static_cast<int>(l.members.size()));
    if (fresh) l.members.emplace_back();
    l.members[it->second].push_back(static_cast<int>(l.host_of.size()));
    l.host_of.push_back(it->second);
  }
  l.ring_pos.resize(host_ids.size());
  for (const std::vector<int>& m : l.members) {
    l.leaders.push_back(m.front());
    for (int r : m) {
      l.ring_pos[r] = static_cast<int>(l.ring.size());
      l.ring.push_back(r);
    }
  }
  return l;
}

int HostLayout::max_local() const {
  size_t most = 0;
  for (const std::vector<int>& m : members) most = std::max(most, m.size());
  return static_cast<int>(most);
}

}  // namespace chorus
