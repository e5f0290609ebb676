// The transport registry: every backend chorus has, and the choice of one per pair of ranks.
//
// Adding a transport: a folder transport/<name>/ with link.{h,cc} and connect.cc (the
// Transport subclass and its factory), a subdir line in transport/meson.build and one line in
// kRegistry (registry.cc). CHORUS_TRANSPORT=<name> restricts a communicator to one backend.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "transport/transport.h"

namespace chorus::transport {

// The backends a communicator may use, in preference order.
class Transports {
 public:
  // Opens every registered backend (each reads and checks its own CHORUS_* knobs), keeping
  // only the one CHORUS_TRANSPORT names when it is set.
  static Result<Transports> from_env();
  // Same with the restriction given: "" for all, else a registered name.
  static Result<Transports> open(const std::string& only);
  // The names in the registry, comma-separated: "shm, tcp".
  static std::string registered_names();

  // The most preferred backend that can connect a and b, or null.
  Transport* choose(const PeerInfo& a, const PeerInfo& b) const;
  // The model of the slowest backend that any pair of `peers` uses (the same on every rank).
  LinkModel model_for(const std::vector<PeerInfo>& peers) const;
  const std::string& only() const { return only_; }  // "" when all may be used
  const std::vector<std::shared_ptr<Transport>>& all() const { return all_; }

 private:
  std::vector<std::shared_ptr<Transport>> all_;
  std::string only_;
};

}  // namespace chorus::transport
