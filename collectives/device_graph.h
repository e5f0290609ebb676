// Device collectives captured into CUDA graphs (device_ops.cc), as NCCL's can be.
//
// An eager call's stream waits carry the count of the communicator's device calls; a captured
// call's would carry the capture's count for ever, which every replay after the first finds
// reached already -- its waits would order nothing. So a captured call uses flag words of its own
// (a slot: a ready and a done word for each peer), with values 0 and 1 only:
//   signal: write 1 into the peer's word for this rank;
//   wait:   wait until this rank's word for the peer is >= 1, then write 0 into it (reset).
// Why a reset never wipes the peer's next signal: the peer writes that word again only in its
// next replay of the call (ready) or after this rank's next ready signal (done), and both come
// after this rank's reset on its stream, behind a write with a memory barrier (a stream write's
// default) that the peer waited for. The ranks agree on the slot (the host exchange at capture
// checks it); the eager words and counts are untouched, so eager calls and replays mix freely.
// Captured calls take buffers that CUDA IPC or VMM descriptors map (not the bounce buffer), and
// collectives only (send/recv and the staged path are refused under capture).
//
// A failure of the communicator: the eager words are released once (release_device_waits), but
// a replay already enqueued would reset a released word and wait again; so a keeper thread
// rewrites 1 into every used slot word every 20 ms, until destroy (graph_close).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace chorus {

inline constexpr int kGraphSlots = 64;       // captured calls a communicator may hold
inline constexpr int kGraphBlockWords = 32;  // kMaxDeviceRanks
inline constexpr int kGraphSlotWords = 2 * kGraphBlockWords;  // ready words, then done words
inline constexpr size_t kGraphFlagBytes = size_t(kGraphSlots) * kGraphSlotWords * 4;

struct GraphKeeper;  // device_graph.cc

struct GraphWords {
  void* flags = nullptr;        // this rank's slots (flags_alloc), at the first captured call
  std::vector<uint32_t*> peer;  // every rank's, mapped at first use
  int calls = 0;                // captured calls so far: the next one's slot
  // For the keeper, on another thread: the slots, their device, how many are used.
  std::atomic<void*> live{nullptr};
  std::atomic<int> live_device{-1};
  std::atomic<int> live_calls{0};
  std::shared_ptr<GraphKeeper> keeper;  // started by graph_release
  GraphWords() = default;
  GraphWords(const GraphWords&) = delete;
  GraphWords& operator=(const GraphWords&) = delete;
  ~GraphWords();
};

// Word `q` of `block` (0 ready, 1 done) in `slot` of a rank's slots.
inline uint32_t* graph_word(void* flags, int slot, int block, int q) {
  return static_cast<uint32_t*>(flags) + size_t(slot) * kGraphSlotWords + block * kGraphBlockWords +
         q;
}

// A failure of the communicator: starts the keeper when calls were captured. Any thread.
void graph_release(GraphWords& g);
// At destroy: the keeper stops.
void graph_close(GraphWords& g);

}  // namespace chorus
