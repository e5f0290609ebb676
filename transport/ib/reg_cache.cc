// Registration cache (reg_cache.h).
#include "transport/ib/reg_cache.h"

#include <unistd.h>

namespace chorus::transport::ib {

RegCache::~RegCache() {
  for (Entry& e : lru_) nic_->dereg(e.mr);
}

Result<RegCache::Entry*> RegCache::acquire(const void* p, size_t n) {
  for (auto it = lru_.begin(); it != lru_.end(); ++it)
    if (it->mr.covers(p, n)) {
      lru_.splice(lru_.begin(), lru_, it);
      ++stats_.hits;
      ++lru_.front().users;
      return &lru_.front();
    }
  // Whole pages, so neighbouring buffers of one allocation share entries less often wrongly
  // and a registration never splits a page.
  static const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  uintptr_t lo = reinterpret_cast<uintptr_t>(p) & ~(page - 1);
  uintptr_t hi = (reinterpret_cast<uintptr_t>(p) + n + page - 1) & ~(page - 1);
  size_t bytes = hi - lo;
  evict_to(budget_ > bytes ? budget_ - bytes : 0);
  CHORUS_ASSIGN_OR_RETURN(Mr mr, nic_->reg(reinterpret_cast<void*>(lo), bytes, false));
  ++stats_.misses;
  stats_.bytes += bytes;
  lru_.push_front({mr, 1});
  return &lru_.front();
}

void RegCache::release(Entry* e) {
  --e->users;
}

void RegCache::evict_to(size_t budget) {
  for (auto it = lru_.end(); stats_.bytes > budget && it != lru_.begin();) {
    --it;
    if (it->users > 0) continue;
    stats_.bytes -= it->mr.bytes;
    ++stats_.evictions;
    nic_->dereg(it->mr);
    it = lru_.erase(it);
  }
}

}  // namespace chorus::transport::ib
