// The keeper of captured calls' flag words after a failure (device_graph.h).
#include "collectives/device_graph.h"

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

// Every used word of `g`'s slots to 1, every 20 ms, until told to stop. Holds the keeper's state,
// not `g`: a communicator's object may go while it still runs (it then writes once more at most,
// into slots that stay allocated: flag words are never freed).
// The pairs' words likewise: each peer's first `pair_slots` of both kinds.
void keep(std::shared_ptr<GraphKeeper> k, void* flags, int device, int calls, int pair_slots) {
  const std::vector<uint32_t> ones(std::max(size_t(calls) * kGraphSlotWords, size_t(pair_slots)),
                                   1u);
  const kernels::cuda::IpcBackend& ipc = kernels::cuda::ipc();
  bool warned = false;
  while (!k->stop.load()) {
    int rc =
        calls ? ipc.flags_release(device, flags, ones.data(), size_t(calls) * kGraphSlotWords) : 0;
    for (int q = 0; q < kGraphBlockWords && rc == 0 && pair_slots > 0; ++q)
      for (PairWord w : {kPairData, kPairCopied})
        if (rc == 0)
          rc =
              ipc.flags_release(device, pair_word(flags, q, w, 0), ones.data(), size_t(pair_slots));
    if (rc != 0 && !warned) {
      warned = true;
      log_warn("releasing the waits of captured device calls failed: {}",
               kernels::cuda::ipc().error_string(rc));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

std::mutex g_keepers_mu;  // GraphWords::keeper, of every communicator

}  // namespace

void graph_release(GraphWords& g) {
  void* flags = g.live.load();
  const int calls = g.live_calls.load();
  const int pair_slots = g.live_pair_slots.load();
  if (flags == nullptr || (calls == 0 && pair_slots == 0)) return;
  std::lock_guard<std::mutex> lock(g_keepers_mu);  // whichever thread fails it first
  if (g.keeper) return;
  g.keeper = std::make_shared<GraphKeeper>();
  std::thread(keep, g.keeper, flags, g.live_device.load(), calls, pair_slots).detach();
}

void graph_close(GraphWords& g) {
  std::lock_guard<std::mutex> lock(g_keepers_mu);
  if (g.keeper) g.keeper->stop.store(true);
}

GraphWords::~GraphWords() {
  graph_close(*this);
}

}  // namespace chorus
