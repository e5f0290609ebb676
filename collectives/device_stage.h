// The staged path's state (device_staged.cc): device calls of ranks that CUDA IPC cannot join,
// run as host collectives by the communicator's progress thread, so that the calling thread
// returns once the call is enqueued -- as NCCL's network path does.
//
// One staged call, on its stream S (the caller's thread enqueues; nothing waits on the host):
//   S: copy the input into page-locked host memory; record mark `ready`;
//      wait until the stage word >= n (n: this call's number); copy the result to recvbuff;
//      record mark `done`.
//   progress thread, in call order with every other operation of the communicator: wait until
//      `ready` is reached (bounded by the communicator's timeout), run the host collective,
//      then write n into the stage word -- also when the collective failed or never ran, after
//      the communicator has recorded why, so that no stream waits for ever (its results are
//      void, and every later call says so).
// The stage word lies in page-locked host memory mapped for the GPU (host_words_alloc,
// kernels/cuda/ipc.h): the write is a store of the progress thread's, no CUDA call. A stream
// write there (flags_release's release stream) would be GPU work behind S's wait, which CUDA
// does not know it must run first: where streams share a hardware queue (as all of a process's do
// with CUDA_DEVICE_MAX_CONNECTIONS=1, and any two may beyond 8 streams) it could sit behind the
// very wait it ends. Device memory and the release stream remain where host memory is refused,
// or with CHORUS_STAGE_WORDS=device.
// A call's host buffer is reused once its `done` mark is reached. A failure of the communicator
// does not write the word itself (as release_device_waits does the CUDA IPC path's words): the
// running host part ends within moments of it (every wait of a failed communicator does), the
// queued ones are dropped, and each then writes its number; a release before that would let the
// stream copy out of host memory that the host part is still writing.
//
// Captured into a CUDA graph (device_staged_graph.cc), a staged call (a collective, or sends and
// receives) runs its host part at every replay, when the stream gets there: a host node hands it
// to a thread of the communicator's own (StagedReplays), which runs it on a communicator of
// replays -- for collectives one split off at the first collective's capture; for sends and
// receives one of the pair's two ranks alone, made (CommImpl::pair) on a thread of its own from
// the pair's first capture on, so that no capture waits for another rank's -- their host parts in
// replay order on every rank, apart from the eager calls'
// (sharing one queue, an eager call waiting for its stream's work behind a replay, and the replay
// waiting behind it, would never end) -- then writes 1 into the call's own word of this rank (a
// slot, as the CUDA IPC path's captured calls have: device_graph.h); the stream waits for it,
// resets it to 0, and copies the result back. The copies in and out go through page-locked memory
// of the call's own, given back (with its slot) once CUDA destroys the graph. After a failure
// the replays' communicators are aborted, the host parts still to come are skipped, and, once the
// host part under way has left (before, a stream let go could copy out of or into memory it still
// used), a keeper writes 1 into the used words every 20 ms until destroy: replays go on, on void
// results, as the CUDA IPC path's (device_graph.h). The first staged call may be a captured one:
// the words are allocated then, with the thread's capture mode relaxed
// (kernels/cuda/capture_mode.h); a capture takes the page-locked memory of destroyed graphs' calls
// before it allocates any, and none is freed until destroy.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "collectives/device_graph.h"

namespace chorus {

struct StagedReplays;  // device_staged_graph.cc

// A staged call's page-locked host memory: its input, then its output.
struct StageBuffer {
  void* host = nullptr;
  size_t bytes = 0;
  void* ready = nullptr;  // marks (events): after the input's copy, after the output's
  void* done = nullptr;
  bool used = false;
};

struct StageState {
  // Made at the first call: in mapped host memory (host_words_alloc; host_word), which the host
  // part ends a call by storing into, or device memory (flags_alloc), written through a release
  // stream -- where host memory is refused, or CHORUS_STAGE_WORDS=device (want_host_words).
  std::atomic<void*> word{nullptr};
  bool host_word = false;  // set with `word`
  bool want_host_words = true;
  // Captured calls' words, kGraphSlots after `word`; their free slots (GraphSlots::calls), the
  // highest used + 1 (for the keeper after a failure), the keeper; the replays' thread.
  std::shared_ptr<GraphSlots> graph_slots = std::make_shared<GraphSlots>();
  std::atomic<int> graph_live{0};
  std::shared_ptr<GraphKeeper> keeper;
  std::shared_ptr<StagedReplays> replays;
  int device = -1;
  uint32_t calls = 0;  // staged calls so far (the calling thread's)
  // The word's latest value, written under mu: signals from the progress thread and from
  // destroy's drop of the queue never lower it.
  std::mutex mu;
  uint32_t written = 0;
  std::vector<StageBuffer> buffers;  // the calling thread's
  // CHORUS_STAGED_MAX_BYTES: the page-locked memory its calls may hold before a call waits for an
  // earlier one's stream to finish with its buffer. Below it nothing is freed before destroy
  // (cudaFreeHost may wait for the whole device); past it, buffers no stream uses are.
  size_t max_bytes = size_t(1) << 30;
};

// Writes n into the stage word unless it holds a later count already. Any thread.
void stage_signal(StageState& st, uint32_t n);
// At destroy, once no operation runs or is queued: waits (up to timeout_s, what is left of
// destroy's) for every buffer's `done` mark, then frees the buffers and marks; a buffer whose
// stream never got there is left allocated, with a warning. `graphs_live` (CUDA graphs still
// hold captured calls, graph_warn_held): nothing is freed -- cudaFreeHost may wait for the whole
// device, and a replay of theirs would wait on its stream for ever.
void stage_close(StageState& st, double timeout_s, bool graphs_live);
// A failure of the communicator (any thread): the replays' communicator is aborted, and a keeper
// writes 1 into the captured calls' words until stage_graph_close, so that no replay waits.
void stage_graph_release(StageState& st);
// At destroy: the replays' thread ends (a replay's host part queued still is skipped, its word
// written), their communicator is destroyed, the keeper stops; the destroyed graphs' page-locked
// memory is freed unless `graphs_live` (as stage_close).
void stage_graph_close(StageState& st, bool graphs_live);
// The captured calls' word of `slot`.
inline uint32_t* stage_graph_word(void* word, int slot) {
  return static_cast<uint32_t*>(word) + 1 + slot;
}

}  // namespace chorus
