// The keeper of captured calls' flag words after a failure (device_graph.h).
#include "collectives/device_graph.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <thread>

#include "common/log.h"
#include "kernels/cuda/ipc.h"

namespace chorus {

struct GraphKeeper {
  std::atomic<bool> stop{false};
};

namespace {

// Every word of `regions` (start, words) to 1, every 20 ms, until told to stop. Holds the
// keeper's state, not the communicator's: its object may go while this still runs (it then
// writes once more at most, into words that stay allocated: flag words are never freed).
void keep(std::shared_ptr<GraphKeeper> k, int device, std::vector<KeptWords> regions) {
  size_t most = 0;
  for (const KeptWords& r : regions) most = std::max(most, r.count);
  const std::vector<uint32_t> ones(most, 1u);
  bool warned = false;
  while (!k->stop.load()) {
    int rc = 0;
    for (const KeptWords& r : regions)
      if (rc == 0 && r.count > 0)
        rc = write_words(r.host, device, r.start, r.values.empty() ? ones.data() : r.values.data(),
                         r.count);
    if (rc != 0 && !warned) {
      warned = true;
      log_warn("releasing the waits of device calls failed: {}",
               kernels::cuda::ipc().error_string(rc));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

std::mutex g_keepers_mu;  // GraphWords::keeper, of every communicator

struct SlotRelease {
  std::shared_ptr<GraphSlots> slots;  // keeps the masks alive
  std::vector<std::pair<std::atomic<uint64_t>*, uint64_t>> taken;
};

// CUDA's destructor of a graph's user object (no CUDA calls here).
void release_slots(void* p) {
  auto* r = static_cast<SlotRelease*>(p);
  for (auto& [mask, bits] : r->taken) mask->fetch_or(bits);
  delete r;
}

}  // namespace

int graph_hold(GraphWords& g, void* stream,
               const std::vector<std::pair<std::atomic<uint64_t>*, uint64_t>>& taken) {
  auto* r = new SlotRelease{g.slots, taken};
  if (int rc = kernels::cuda::ipc().graph_destructor(stream, release_slots, r); rc != 0) {
    delete r;
    return rc;
  }
  for (auto& [mask, bits] : taken) mask->fetch_and(~bits);
  return 0;
}

int nth_free(uint64_t mask, int k) {
  for (int bit = 0; bit < 64; ++bit)
    if ((mask >> bit) & 1) {
      if (k == 0) return bit;
      --k;
    }
  return -1;
}

void start_keeper(std::shared_ptr<GraphKeeper>& keeper, int device,
                  std::vector<KeptWords> regions) {
  std::lock_guard<std::mutex> lock(g_keepers_mu);  // whichever thread fails it first
  if (keeper) return;
  keeper = std::make_shared<GraphKeeper>();
  std::thread(keep, keeper, device, std::move(regions)).detach();
}

void stop_keeper(std::shared_ptr<GraphKeeper>& keeper) {
  std::lock_guard<std::mutex> lock(g_keepers_mu);
  if (keeper) keeper->stop.store(true);
}

std::string no_free_slot(const std::string& head, const char* what, const char* where) {
  return fmt::format(
      "{}: no slot for a captured {} is free on {} at once ({} each; a slot is held until the "
      "CUDA graph that captured it is destroyed: destroy the graphs no longer replayed)",
      head, what, where, kGraphSlots);
}

// The used words of the collectives' slots (each block's first `ranks`), and of each peer's
// first `pair_slots` of both kinds: one write a word every 20 ms.
void graph_release(GraphWords& g) {
  void* flags = g.live.load();
  const int calls = g.live_calls.load();
  const int pair_slots = g.live_pair_slots.load();
  const int ranks = std::min(g.live_ranks.load(), kGraphBlockWords);
  if (flags == nullptr || (calls == 0 && pair_slots == 0)) return;
  std::vector<KeptWords> regions;
  for (int slot = 0; slot < calls; ++slot)
    for (int block : {0, 1})
      regions.push_back({graph_word(flags, slot, block, 0), size_t(ranks), g.host});
  for (int q = 0; q < ranks && pair_slots > 0; ++q)
    for (PairWord w : {kPairData, kPairCopied})
      regions.push_back({pair_word(flags, q, w, 0), size_t(pair_slots), g.host});
  start_keeper(g.keeper, g.live_device.load(), std::move(regions));
}

int write_words(bool host, int device, void* words, const uint32_t* values, size_t count) {
  if (!host) return kernels::cuda::ipc().flags_release(device, words, values, count);
  for (size_t i = 0; i < count; ++i)
    std::atomic_ref<uint32_t>(static_cast<uint32_t*>(words)[i])
        .store(values[i], std::memory_order_release);
  return 0;
}

void graph_close(GraphWords& g) {
  stop_keeper(g.keeper);
}

uint64_t settled_free(const std::atomic<uint64_t>& mask) {
  uint64_t free = mask.load();
  for (int i = 0; free == 0 && i < 40; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    free = mask.load();
  }
  return free;
}

int graph_warn_held(int rank, std::initializer_list<const GraphSlots*> masks) {
  auto held = [&] {
    int n = 0;
    for (const GraphSlots* m : masks) {
      n += __builtin_popcountll(~m->calls.load());
      for (const auto* pair : {&m->sends, &m->recvs})
        for (const std::atomic<uint64_t>& x : *pair) n += __builtin_popcountll(~x.load());
    }
    return n;
  };
  int n = held();
  for (int i = 0; n > 0 && i < 20; ++i) {  // destructors of graphs destroyed a moment ago
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    n = held();
  }
  if (n > 0)
    log_warn(
        "chorusCommDestroy on rank {}: {} captured call(s) of this communicator are still held by "
        "CUDA graphs not destroyed: a replay of them from now on waits for ever on its stream "
        "(destroy the graphs before the communicator, as with NCCL)",
        rank, n);
  return n;
}

GraphWords::~GraphWords() {
  graph_close(*this);
}

}  // namespace chorus
