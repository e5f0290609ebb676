// Device allocations shared between processes: their frees found and passed on (device_freed.h).
#include "collectives/device_freed.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <random>

namespace chorus::capi::devcall {
namespace {

namespace kc = kernels::cuda;

// How many allocations the owner side watches (beyond that the lowest by address are dropped
// unwatched: their peers close them only as before, when a later buffer overlaps), and how many
// it checks per call.
constexpr size_t kMaxWatched = 4096;
constexpr size_t kChecksPerCall = 2;

// This process's exported allocations and its frees found. `watched`: by base, each with its
// size and identity; `next`, the base the next check starts at.
struct Watched {
  uint64_t size, id;
};
struct ExportLedger {
  std::mutex mu;
  std::map<uint64_t, Watched> watched;
  uint64_t next = 0;
  FreeNews freed{kFreesRemembered};
};

ExportLedger& ledger() {
  static ExportLedger* l = new ExportLedger;  // never destroyed: used until the process ends
  return *l;
}

// A few watched allocations checked, round the ledger: one whose address lies in no allocation
// any more, or in one of another identity, was freed. Any other answer (an error) keeps it.
void check_some(ExportLedger& l) {
  const kc::IpcBackend& ipc = kc::ipc();
  auto it = l.watched.lower_bound(l.next);
  for (size_t i = 0; i < std::min(kChecksPerCall, l.watched.size()); ++i) {
    if (it == l.watched.end()) it = l.watched.begin();
    uint64_t id = 0;
    const int rc = ipc.buffer_id(reinterpret_cast<const void*>(it->first), &id);
    if (rc == kc::kNotAllocated || (rc == 0 && id != it->second.id)) {
      l.freed.add(it->second.id);
      it = l.watched.erase(it);
    } else {
      ++it;
    }
  }
  l.next = it == l.watched.end() ? 0 : it->first;
}

// The peers' allocations this process has opened by CUDA IPC for user buffers (offsets left out).
struct PeerBuffers {
  std::mutex mu;
  std::vector<kc::IpcHandle> open;
};

PeerBuffers& peer_buffers() {
  static PeerBuffers* b = new PeerBuffers;  // never destroyed, as the backend's mappings
  return *b;
}

}  // namespace

uint64_t process_token() {
  static const uint64_t token = [] {
    std::random_device r;
    return (uint64_t{r()} << 32 | r()) | 1;  // never 0
  }();
  return token;
}

void note_export(kc::IpcHandle& h) {
  h.id = 0;
  uint64_t id = 0;
  if (kc::ipc().buffer_id(reinterpret_cast<const void*>(h.base), &id) != 0) return;  // unwatched
  h.id = id;
  ExportLedger& l = ledger();
  std::lock_guard<std::mutex> lock(l.mu);
  auto it = l.watched.find(h.base);
  if (it != l.watched.end() && it->second.id == id) return;  // watched already
  // Those that h's allocation overlaps were freed (one at its address, too).
  it = l.watched.lower_bound(h.base);
  if (it != l.watched.begin() && std::prev(it)->first + std::prev(it)->second.size > h.base) --it;
  while (it != l.watched.end() && it->first < h.base + h.size) {
    l.freed.add(it->second.id);
    it = l.watched.erase(it);
  }
  l.watched[h.base] = Watched{h.size, id};
  if (l.watched.size() > kMaxWatched) l.watched.erase(l.watched.begin());
}

void FreeNews::add(uint64_t id) {
  ids_.push_back(id);
  ++count_;
  if (ids_.size() > keep_) ids_.pop_front();
}

int FreeNews::tell(std::vector<uint64_t>& told, std::span<const int> to,
                   std::span<uint64_t> out) const {
  if (ids_.empty() || to.empty()) return 0;
  const int most = *std::max_element(to.begin(), to.end());
  if (told.size() <= size_t(most)) told.resize(size_t(most) + 1, 0);
  uint64_t from = count_;
  for (int q : to) from = std::min(from, told[size_t(q)]);
  const uint64_t first = count_ - ids_.size() + 1;  // the oldest number remembered
  const uint64_t start = std::max(from + 1, first);
  if (start > count_) return 0;
  const size_t n = size_t(std::min<uint64_t>(out.size(), count_ - start + 1));
  std::copy_n(ids_.begin() + ptrdiff_t(start - first), n, out.begin());
  for (int q : to) told[size_t(q)] = std::max(told[size_t(q)], start + n - 1);
  return int(n);
}

int announce_frees(std::vector<uint64_t>& told, std::span<const int> to,
                   std::span<uint64_t, kMaxAnnounced> out) {
  ExportLedger& l = ledger();
  std::lock_guard<std::mutex> lock(l.mu);
  check_some(l);
  return l.freed.tell(told, to, out);
}

void close_announced(uint64_t owner, std::span<const uint64_t> freed) {
  if (owner == 0 || freed.empty()) return;
  PeerBuffers& b = peer_buffers();
  std::lock_guard<std::mutex> lock(b.mu);
  std::erase_if(b.open, [&](const kc::IpcHandle& o) {
    if (o.owner != owner || o.id == 0 || std::find(freed.begin(), freed.end(), o.id) == freed.end())
      return false;
    kc::ipc().close(o);
    return true;
  });
}

void close_later(std::vector<kc::IpcHandle>& later) {
  for (const kc::IpcHandle& o : std::exchange(later, {})) kc::ipc().close(o);
}

void close_overlapped(const kc::IpcHandle& h, std::vector<kc::IpcHandle>* later) {
  if (h.owner == 0) return;  // not export_for_peers's: its owner is unknown
  PeerBuffers& b = peer_buffers();
  std::lock_guard<std::mutex> lock(b.mu);
  // Open already: the same owner's same handle, and no other identity known (0: CUDA did not
  // say).
  auto same = [&](const kc::IpcHandle& o) {
    return o.owner == h.owner && std::memcmp(o.bytes, h.bytes, sizeof h.bytes) == 0;
  };
  for (const kc::IpcHandle& o : b.open)
    if (same(o) && (o.id == h.id || o.id == 0 || h.id == 0)) return;
  // The same handle with another identity: a freed allocation whose handle came back with the
  // address (the backend's mapping of that handle is the old one's until it is closed).
  std::erase_if(b.open, [&](const kc::IpcHandle& o) {
    if (o.owner != h.owner ||
        (!same(o) && (o.base >= h.base + h.size || h.base >= o.base + o.size)))
      return false;
    if (later != nullptr && !same(o))
      later->push_back(o);
    else
      kc::ipc().close(o);
    return true;
  });
  kc::IpcHandle mine = h;
  mine.offset = 0;
  b.open.push_back(mine);
}

}  // namespace chorus::capi::devcall
