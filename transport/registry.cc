// The registry table and the choice of a backend per pair (see registry.h).
#include "transport/registry.h"

#include <algorithm>
#include <cstdint>

#include "common/env.h"
#include "transport/ib/link.h"
#include "transport/shm/link.h"
#include "transport/tcp/link.h"

namespace chorus::transport {
namespace {

struct Entry {
  const char* name;
  Result<std::unique_ptr<Transport>> (*make)();
};

// One line per backend.
constexpr Entry kRegistry[] = {
    {"shm", make_shm_transport},
    {"tcp", make_tcp_transport},
    {"ib", make_ib_transport},
};

}  // namespace

std::string Transports::registered_names() {
  std::string out;
  for (const Entry& e : kRegistry) out += (out.empty() ? "" : ", ") + std::string(e.name);
  return out;
}

Result<Transports> Transports::from_env() {
  return open(env_str("CHORUS_TRANSPORT", ""));
}

Result<Transports> Transports::open(const std::string& only) {
  Transports t;
  t.only_ = only;
  bool known = only.empty();
  for (const Entry& e : kRegistry) known |= only == e.name;
  if (!known)
    return make_error(Code::kInvalidArgument, "CHORUS_TRANSPORT='{}': expected one of {}", only,
                      registered_names());
  for (const Entry& e : kRegistry) {
    CHORUS_ASSIGN_OR_RETURN(std::unique_ptr<Transport> backend, e.make());  // checks its knobs
    if (only.empty() || only == e.name) t.all_.push_back(std::move(backend));
  }
  std::stable_sort(t.all_.begin(), t.all_.end(),
                   [](auto& a, auto& b) { return a->preference() > b->preference(); });
  return t;
}

Transport* Transports::choose(const PeerInfo& a, const PeerInfo& b) const {
  for (auto& t : all_)
    if (t->can_connect(a, b)) return t.get();
  return nullptr;
}

LinkModel Transports::model_for(const std::vector<PeerInfo>& peers) const {
  // Which backends are in use: asked per distinct pair of hosts and pids would be the same
  // question; peers are few enough to ask per pair of ranks.
  std::vector<bool> used(all_.size(), false);
  for (size_t i = 0; i < peers.size(); ++i)
    for (size_t j = i + 1; j < peers.size(); ++j)
      for (size_t k = 0; k < all_.size(); ++k)
        if (all_[k]->can_connect(peers[i], peers[j])) {
          used[k] = true;
          break;
        }
  // The slowest by latency; pieces no larger than any used link takes.
  LinkModel slowest{};
  bool any = false;
  size_t max_piece = SIZE_MAX;
  bool read_in_place = true;
  for (size_t k = 0; k < all_.size(); ++k) {
    if (!used[k]) continue;
    LinkModel m = all_[k]->model();
    max_piece = std::min(max_piece, m.max_piece);
    read_in_place = read_in_place && m.read_in_place;
    if (!any || m.alpha_s > slowest.alpha_s) slowest = m;
    any = true;
  }
  if (!any) return all_.front()->model();  // one rank: no pair, no links
  slowest.max_piece = max_piece;
  slowest.read_in_place = read_in_place;
  return slowest;
}

}  // namespace chorus::transport
