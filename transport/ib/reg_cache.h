// Registration cache: user buffers the ib link sends from without a staging copy, registered
// once per page range and kept (up to a byte budget, least recently used out first) so that
// repeated collectives on the same buffer register once, as NCCL's and UCX's caches do.
//
// Only for Nics whose registrations follow the mapping (Nic::follows_mapping): a pinned
// registration of a freed buffer would keep sending the old pages after the address is reused.
// Entries in use by posted writes are never evicted.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>

#include "transport/ib/verbs.h"

namespace chorus::transport::ib {

class RegCache {
 public:
  struct Stats {
    uint64_t hits = 0, misses = 0, evictions = 0;
    size_t bytes = 0;  // registered now
  };
  struct Entry {
    Mr mr;
    int users = 0;
  };
  RegCache(Nic* nic, size_t budget_bytes) : nic_(nic), budget_(budget_bytes) {}
  ~RegCache();
  RegCache(const RegCache&) = delete;
  RegCache& operator=(const RegCache&) = delete;

  // A registration covering [p, p+n), in use until release().
  Result<Entry*> acquire(const void* p, size_t n);
  void release(Entry* e);
  const Stats& stats() const { return stats_; }

 private:
  void evict_to(size_t budget);
  Nic* nic_;
  size_t budget_;
  std::list<Entry> lru_;  // front: most recently used
  Stats stats_;
};

}  // namespace chorus::transport::ib
