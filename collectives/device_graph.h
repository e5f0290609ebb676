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
// default) that the peer waited for. (So a captured barrier meets on "done" as well as "ready",
// as the other collectives do: with "ready" alone -- the eager barrier's counted words need no
// more -- a peer released by this rank's signal could signal its next replay's "ready" before
// this rank's reset, which would wipe it.) The ranks agree on the slot: the lowest free on every
// rank, from the masks each sends in the host exchange at capture (GraphSlots); the slot comes back
// when CUDA destroys the graph. The eager words and counts are untouched, so eager calls and
// replays mix freely.
// Captured calls take buffers that CUDA IPC or VMM descriptors map (not the bounce buffer). The
// staged path's collectives are captured their own way (device_stage.h), with slots of its own.
//
// Sends and receives (device_p2p.cc) are a pair's, not every rank's: a captured send from s to d
// takes a slot of the pair's own words, the lowest free both in s's sends to d and in d's
// receives from s (the j-th lowest for a group's j-th send from s to d: a pair's sends and
// receives match in call order, so both sides count the same), and both sides must capture
// (the host exchange checks it). Two words a slot, the eager protocol's "buffer free" dropped
// (the receiver copies into its own buffer, after its own stream's earlier work):
//   sender:   signal "data ready" (1 into d's word for s); wait for "copied", reset it;
//   receiver: wait for "data ready", reset it; copy; signal "copied" (1 into s's word for d).
// The same argument holds: the sender's next "data ready" comes after its wait for "copied",
// which the receiver signals after its reset; the receiver's next "copied" comes after its wait
// for the next "data ready", which the sender signals after its reset. ("buffer free", kept,
// would break it: a receiver may signal its next one before the sender has reset the last.)
//
// A failure of the communicator: the eager words are released once (release_device_waits), but
// a replay already enqueued would reset a released word and wait again; so a keeper thread
// rewrites 1 into every used slot word every 20 ms, until destroy (graph_close).
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace chorus {

inline constexpr int kGraphSlots = 64;       // captured calls a communicator's live graphs may hold
inline constexpr int kGraphBlockWords = 32;  // kMaxDeviceRanks
inline constexpr int kGraphSlotWords = 2 * kGraphBlockWords;  // ready words, then done words
inline constexpr int kGraphPairSlots = 64;                    // the same per pair and direction
// The pairs' words, after the collectives' slots: for each peer, "data ready" then "copied".
inline constexpr size_t kGraphPairWords = size_t(kGraphBlockWords) * 2 * kGraphPairSlots;
inline constexpr size_t kGraphCollectiveWords = size_t(kGraphSlots) * kGraphSlotWords;
inline constexpr size_t kGraphFlagBytes = (kGraphCollectiveWords + kGraphPairWords) * 4;
enum PairWord : int { kPairData = 0, kPairCopied = 1 };

struct GraphKeeper;  // device_graph.cc

// The slots free on this rank, a bit each: the collectives', and each peer's sends and receives.
// A captured call takes the lowest slot free on every rank concerned (each tells its mask in the
// host exchange, so all choose the same), and gives it back when CUDA destroys the graph that
// holds it (graph_hold): a rank whose graph is gone may reuse its slot, but no rank takes a
// slot that a peer's live graph still holds. Shared with those destructors, which may run after
// the communicator is gone, on a thread of CUDA's.
struct GraphSlots {
  std::atomic<uint64_t> calls{~uint64_t(0)};
  std::array<std::atomic<uint64_t>, kGraphBlockWords> sends, recvs;
  GraphSlots() {
    for (auto* masks : {&sends, &recvs})
      for (std::atomic<uint64_t>& m : *masks) m.store(~uint64_t(0));
  }
};
static_assert(kGraphSlots == 64 && kGraphPairSlots == 64, "a slot mask is 64 bits");

struct GraphWords {
  void* flags = nullptr;        // this rank's slots (flags_alloc), at the first captured call
  std::vector<uint32_t*> peer;  // every rank's, mapped at first use
  std::shared_ptr<GraphSlots> slots = std::make_shared<GraphSlots>();
  // For the keeper, on another thread: the slots, their device, how many are used.
  std::atomic<void*> live{nullptr};
  std::atomic<int> live_device{-1};
  std::atomic<int> live_calls{0};       // 1 + the highest slot a captured collective took
  std::atomic<int> live_pair_slots{0};  // 1 + the highest slot a captured send or receive took
  std::atomic<int> live_ranks{kGraphBlockWords};  // the communicator's: the words in use
  std::shared_ptr<GraphKeeper> keeper;            // started by graph_release
  bool host = false;  // in host memory (device_words.h): the keeper stores; set before `live`
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
// A rank's word that peer q writes for the pair's captured send or receive `slot`.
inline uint32_t* pair_word(void* flags, int q, PairWord w, int slot) {
  return static_cast<uint32_t*>(flags) + kGraphCollectiveWords +
         (size_t(q) * 2 + w) * kGraphPairSlots + slot;
}

// A call captured on `stream` takes `bits` of `mask` (a mask of g.slots) until CUDA destroys the
// graph being captured, and the executable graphs made from it (a user object the graph holds:
// IpcBackend::graph_destructor); `mask` and `bits` in pairs. Fails when CUDA does (the slots stay
// free then).
int graph_hold(GraphWords& g, void* stream,
               const std::vector<std::pair<std::atomic<uint64_t>*, uint64_t>>& taken);
// The k-th lowest bit set in `mask` (k from 0), or -1.
int nth_free(uint64_t mask, int k);
// A capture's view of this rank's free slots in `mask`: when none is free, up to 200 ms more for
// one -- CUDA runs a destroyed graph's user-object destructors (graph_hold's) on a thread of its
// own, a moment after the graph goes, so a capture right after a destroy would be refused for
// nothing.
uint64_t settled_free(const std::atomic<uint64_t>& mask);
// Why a capture found no slot free on every rank concerned: "{head}: no slot for a captured
// {what} is free on {where} at once (64 each; ...)".
std::string no_free_slot(const std::string& head, const char* what, const char* where);

// A keeper: a thread that writes 1 (or `values`) into every word of `regions` every 20 ms until
// stop_keeper (started once: a second start is nothing). Any thread.
struct KeptWords {
  void* start;
  size_t count;
  bool host = false;  // in mapped host memory (host_words_alloc): stored into, no stream
  std::vector<uint32_t> values = {};  // word i gets values[i] (count of them); empty: 1s
};
// values[0..count) into `words`: flag words in device memory through flags_release (a stream
// write on `device`), or, `host`, words in mapped host memory by a store (a stream waiting on them
// sees it; no CUDA call). 0, or flags_release's error. Any thread.
int write_words(bool host, int device, void* words, const uint32_t* values, size_t count);
void start_keeper(std::shared_ptr<GraphKeeper>& keeper, int device, std::vector<KeptWords> regions);
void stop_keeper(std::shared_ptr<GraphKeeper>& keeper);

// A failure of the communicator: starts the keeper when calls were captured. Any thread.
void graph_release(GraphWords& g);
// At destroy: the keeper stops.
void graph_close(GraphWords& g);
// At destroy: captured calls of the communicator that CUDA graphs still hold (their slots not
// given back, after up to 200 ms for CUDA's destructors of graphs just destroyed), each a
// replay that would wait for ever once the communicator is gone; a warning on `rank` names how
// many. `masks`: the CUDA IPC path's and the staged path's.
int graph_warn_held(int rank, std::initializer_list<const GraphSlots*> masks);

}  // namespace chorus
