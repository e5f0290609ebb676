// The lifetime of device allocations opened across processes (collectives/device_freed.h), alone,
// on a backend that only answers identities and records closes: the frees the owner finds and
// which ranks it tells of them (FreeNews), and what a peer closes -- also the case the emulated
// GPU never makes, a handle that comes back with another identity.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "collectives/device_freed.h"
#include "kernels/cuda/ipc.h"

namespace kc = chorus::kernels::cuda;
using chorus::capi::devcall::announce_frees;
using chorus::capi::devcall::close_announced;
using chorus::capi::devcall::close_overlapped;
using chorus::capi::devcall::FreeNews;
using chorus::capi::devcall::kMaxAnnounced;
using chorus::capi::devcall::note_export;

namespace {

// The owner's live allocations (base -> size, identity) and the peer's closes, by identity.
std::map<uint64_t, std::pair<uint64_t, uint64_t>> g_live;
std::vector<uint64_t> g_closed;

int buffer_id(const void* p, uint64_t* id) {
  const auto a = uint64_t(reinterpret_cast<uintptr_t>(p));
  auto it = g_live.upper_bound(a);
  if (it == g_live.begin() || a >= std::prev(it)->first + std::prev(it)->second.first)
    return kc::kNotAllocated;
  *id = std::prev(it)->second.second;
  return 0;
}
void close_handle(const kc::IpcHandle& h) {
  g_closed.push_back(h.id);
}
std::string error_string(int rc) {
  return "error " + std::to_string(rc);
}

const kc::IpcBackend kRecording{
    .close = close_handle, .buffer_id = buffer_id, .error_string = error_string};

struct UseRecording {
  UseRecording() {
    kc::set_ipc_backend_for_test(&kRecording);
    g_closed.clear();
  }
  ~UseRecording() { kc::set_ipc_backend_for_test(nullptr); }
};

// A handle of `owner`'s allocation [base, base + size) with identity `id`; its handle bytes say
// `tag` (a driver's handle may come back for a new allocation at the same address).
kc::IpcHandle handle(uint64_t owner, uint64_t base, uint64_t size, uint64_t id, int tag) {
  kc::IpcHandle h{};
  std::memset(h.bytes, tag, sizeof h.bytes);
  h.base = base;
  h.size = size;
  h.owner = owner;
  h.id = id;
  return h;
}

std::vector<uint64_t> tell(const FreeNews& news, std::vector<uint64_t>& told, std::vector<int> to) {
  std::vector<uint64_t> out(kMaxAnnounced);
  out.resize(size_t(news.tell(told, to, out)));
  return out;
}

}  // namespace

TEST_CASE("freed allocations: each rank of a communicator told once, oldest first, 8 a record") {
  FreeNews news(16);
  std::vector<uint64_t> told;
  CHECK(tell(news, told, {1, 2}).empty());
  for (uint64_t id = 1; id <= 10; ++id) news.add(100 + id);
  CHECK(tell(news, told, {1, 2}) == std::vector<uint64_t>{101, 102, 103, 104, 105, 106, 107, 108});
  CHECK(tell(news, told, {1, 2}) == std::vector<uint64_t>{109, 110});
  CHECK(tell(news, told, {1, 2}).empty());
  // A rank not in those calls hears of all of them in its first records.
  CHECK(tell(news, told, {3}).size() == 8);
  CHECK(tell(news, told, {3}) == std::vector<uint64_t>{109, 110});
  news.add(111);
  CHECK(tell(news, told, {2}) == std::vector<uint64_t>{111});
  // A call with ranks told up to different points tells all of them from the earliest.
  CHECK(tell(news, told, {1, 2}) == std::vector<uint64_t>{111});
  CHECK(tell(news, told, {1, 2, 3}) == std::vector<uint64_t>{111});
  // Another communicator (its own `told`) hears of them all again.
  std::vector<uint64_t> other;
  CHECK(tell(news, other, {0}).size() == 8);
}

TEST_CASE("freed allocations: only the last ones kept are told to a rank far behind") {
  FreeNews news(4);
  std::vector<uint64_t> told;
  for (uint64_t id = 1; id <= 10; ++id) news.add(id);
  CHECK(tell(news, told, {0}) == std::vector<uint64_t>{7, 8, 9, 10});
}

TEST_CASE("freed allocations: a process's many frees, each call told what is new for its ranks") {
  using chorus::capi::devcall::kFreesRemembered;
  FreeNews news(kFreesRemembered);
  std::vector<uint64_t> told;
  const uint64_t n = kFreesRemembered + 1000;
  // Rank 1 hears of each free in the call after it; rank 2 takes part in none of them.
  for (uint64_t id = 1; id <= n; ++id) {
    news.add(id);
    REQUIRE(tell(news, told, {1}) == std::vector<uint64_t>{id});
  }
  CHECK(tell(news, told, {1}).empty());
  // Rank 2 starts from the oldest remembered, 8 a record, and catches up.
  CHECK(tell(news, told, {2}) ==
        std::vector<uint64_t>{1001, 1002, 1003, 1004, 1005, 1006, 1007, 1008});
  uint64_t heard = 8;
  while (tell(news, told, {2}).size() == 8) heard += 8;
  CHECK(told[2] == n);
  CHECK(heard == kFreesRemembered);  // every one remembered, none twice
}

TEST_CASE("freed allocations: the owner finds a free by address gone or identity changed") {
  UseRecording use;
  g_live = {{0x10000, {0x1000, 1}}, {0x20000, {0x1000, 2}}, {0x30000, {0x1000, 3}}};
  for (auto [base, v] : g_live) {
    kc::IpcHandle h = handle(7, base, v.first, 0, 1);
    note_export(h);
    CHECK(h.id == v.second);  // the export carries the identity
  }
  std::vector<uint64_t> told;
  std::vector<int> to{1};
  std::array<uint64_t, kMaxAnnounced> out{};
  // Nothing freed: nothing told, however often asked.
  for (int i = 0; i < 6; ++i) CHECK(announce_frees(told, to, out) == 0);
  // One freed with nothing at its address, one whose address holds another allocation now.
  g_live.erase(0x10000);
  g_live[0x30000] = {0x1000, 4};
  std::vector<uint64_t> heard;
  for (int i = 0; i < 4; ++i) {
    const int n = announce_frees(told, to, out);
    heard.insert(heard.end(), out.begin(), out.begin() + n);
  }
  std::sort(heard.begin(), heard.end());
  CHECK(heard == std::vector<uint64_t>{1, 3});
  // An export that overlaps a watched allocation: that one was freed (found at once).
  g_live.erase(0x20000);
  g_live[0x1f000] = {0x4000, 5};
  kc::IpcHandle h = handle(7, 0x1f000, 0x4000, 0, 1);
  note_export(h);
  CHECK(h.id == 5);
  std::vector<uint64_t> fresh;  // a rank of another communicator: told of all three
  CHECK(announce_frees(told, to, out) == 1);
  CHECK(out[0] == 2);
  const int n = announce_frees(fresh, to, out);
  std::vector<uint64_t> all(out.begin(), out.begin() + n);
  std::sort(all.begin(), all.end());
  CHECK(all == std::vector<uint64_t>{1, 2, 3});
  g_live.clear();
}

TEST_CASE("freed allocations: a peer closes what is named, overlapped, or back with a new id") {
  UseRecording use;
  const uint64_t owner = 0x5001, stranger = 0x6001;
  close_overlapped(handle(owner, 0x100000, 0x1000, 11, 1));
  close_overlapped(handle(owner, 0x100000, 0x1000, 11, 1));  // open already: nothing
  close_overlapped(handle(owner, 0x200000, 0x1000, 12, 2));
  close_overlapped(handle(stranger, 0x100000, 0x1000, 11, 1));  // another process's
  CHECK(g_closed.empty());
  // The same handle bytes with another identity: the driver gave the handle back for a new
  // allocation (here not even where the freed one lay); the old mapping is closed before the new
  // one opens.
  close_overlapped(handle(owner, 0x900000, 0x1000, 13, 1));
  CHECK(g_closed == std::vector<uint64_t>{11});
  // Another handle overlapping an open allocation of the owner: that one was freed.
  close_overlapped(handle(owner, 0x1ff800, 0x1000, 14, 3));
  CHECK(g_closed == std::vector<uint64_t>{11, 12});
  // Named by the owner: closed; an unknown identity or another owner's: nothing.
  close_announced(owner, std::vector<uint64_t>{99, 13});
  CHECK(g_closed == std::vector<uint64_t>{11, 12, 13});
  close_announced(0x7001, std::vector<uint64_t>{14});
  CHECK(g_closed.size() == 3);
  close_announced(owner, std::vector<uint64_t>{14});
  close_announced(stranger, std::vector<uint64_t>{11});
  CHECK(g_closed == std::vector<uint64_t>{11, 12, 13, 14, 11});
  // Closed once: named again, nothing more.
  close_announced(owner, std::vector<uint64_t>{11, 12, 13, 14});
  CHECK(g_closed.size() == 5);
}
