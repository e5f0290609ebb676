// Collectives and send/recv on device buffers between ranks of one host, over CUDA IPC (issue
// 19): design and ordering rules at the top of device_ops.cc; who does what in device_plan.h.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "chorus/chorus.h"
#include "collectives/c_api_check.h"
#include "collectives/device_graph.h"
#include "collectives/device_stage.h"
#include "common/clock.h"
#include "kernels/cuda/ipc.h"
#include "transport/shm/shared_mem.h"

namespace chorus {

class CommImpl;

// The most ranks of one host whose device calls go GPU to GPU (more go through host memory).
constexpr int kMaxDeviceRanks = 32;

// A communicator's state for device operations, made at its first device call.
struct VmmState;      // device_vmm.cc: VMM allocations shared by file descriptor
struct DeviceTiming;  // device_timing.h: CHORUS_DEVICE_TIMING's stamps

struct DeviceIpc {
  int device = -1;
  std::string gpu;                    // its UUID, when the driver says
  void* flags = nullptr;              // this rank's flag words (device_ops.cc, "Flag words")
  std::vector<uint32_t*> peer_flags;  // every rank's, mapped here when first needed
  // Where the words lie (device_words.h): host memory shared with the peers (CHORUS_IPC_WORDS,
  // want_host_words; host_words once allocated, set before live_flags, words_ref its memfd), or
  // device memory; the peers' host words mapped here, by rank.
  bool want_host_words = true;
  bool host_words = false;
  transport::SharedRef words_ref;
  std::array<uint64_t, 2> words_file{};  // its memfd's device and inode, for the peers' check
  std::vector<char*> peer_words;
  // Device collectives so far, and device sends to / receives from each rank so far: the values
  // that signals carry. Atomic: release_device_waits reads them on another thread.
  std::atomic<uint32_t> seq{0};
  std::array<std::atomic<uint32_t>, kMaxDeviceRanks> tx_seq{};
  std::array<std::atomic<uint32_t>, kMaxDeviceRanks> rx_seq{};
  // The flag words again, for release_device_waits on another thread: set once they exist.
  std::atomic<void*> live_flags{nullptr};
  std::atomic<int> live_device{-1};
  bool staged_said = false;  // the INFO line of the staged path, once
  // The bounce buffer for memory that CUDA IPC cannot map (device_bounce.h), its size, the mark
  // after the last call that used it, and its INFO line, once.
  void* bounce = nullptr;
  size_t bounce_bytes = 0;
  void* bounce_mark = nullptr;
  bool bounce_said = false;
  // The bounce buffers it grew out of, each with the mark after the last call that used it, and
  // whether a failed call could not mark its end (then none is freed): all freed at destroy
  // (bounce_close).
  std::vector<std::pair<void*, void*>> bounce_old;
  bool bounce_unmarked = false;
  // The mark after this rank's last eager call on each stream it used (stream, mark), and
  // whether one could not be recorded: destroy waits for them before it unmaps what this rank
  // mapped of its peers (close_peer_mappings).
  std::vector<std::pair<void*, void*>> ends;
  bool ends_unmarked = false;
  // VMM memory mapped by file descriptor (device_vmm.h): this rank's registry, its peers'
  // allocations mapped here, the descriptor sockets.
  std::shared_ptr<VmmState> vmm;
  // CHORUS_DEVICE_TIMING's stamps (device_timing.h), made at the first device call when it is on.
  std::shared_ptr<DeviceTiming> timing;
  // The staged path's flag word and host buffers (device_stage.h).
  StageState stage;
  // Captured calls' flag words (device_graph.h).
  GraphWords graph;
  // release_device_waits's keeper: the release values again every 20 ms until destroy, since a
  // peer's stream still running earlier calls may write a lower count over them.
  std::shared_ptr<GraphKeeper> keeper;
  DeviceIpc() = default;
  DeviceIpc(const DeviceIpc&) = delete;
  DeviceIpc& operator=(const DeviceIpc&) = delete;
  ~DeviceIpc() { stop_keeper(keeper); }
  // By rank: how many of this process's frees found it was told of on this communicator
  // (device_freed.h).
  std::vector<uint64_t> freed_told;
  // Peers' news of frees that came with a captured call (take_news): closing a mapping may
  // synchronise, which a capture under way forbids, so it waits for the next call not captured.
  struct PeerNews {
    int rank;
    uint64_t owner;
    std::vector<uint64_t> freed, vmm_gone;
  };
  std::vector<PeerNews> news_later;
  // Peers' allocations that a captured call's buffers overlapped (their owners freed them): closed
  // at the next call not captured, as news_later is (device_freed.h's close_overlapped).
  std::vector<kernels::cuda::IpcHandle> closes_later;
};

// When the communicator fails (a peer died or failed, a revoke, a timeout): every flag word of
// this rank is set -- a store into host words, a write on a stream of its own into device words
// (device_words.h) -- to a value that every wait on it already enqueued or
// still to come in the call takes as reached, so that no stream of this rank waits for ever on a
// peer that will not signal (the work after the wait then runs on whatever the buffers hold; the
// communicator's error says the results are void). Any thread.
void release_device_waits(DeviceIpc& st);
// What it writes, word by word (the blocks of device_ops.cc's "Flag words", kMaxDeviceRanks words
// each): each word's awaited count plus 2^30, since a stream wait's "word >= awaited" is cyclic.
std::array<uint32_t, 5 * kMaxDeviceRanks> device_release_values(const DeviceIpc& st);

// The backend's export_buffer of p into *out, with this process's token as the owner
// (IpcHandle::owner: random, never 0; not the pid, which processes in two pid namespaces of one
// host may share). Every buffer that peers open through devcall::open_peer is exported so.
int export_for_peers(const void* p, kernels::cuda::IpcHandle* out);

// What captured calls held back (DeviceIpc::news_later, closes_later): closed or unmapped now.
// At the next call not captured (devcall::take_news), and at destroy once no call runs -- else
// a communicator destroyed before its next eager call would keep its peers' freed memory open
// for good.
void close_held_back(DeviceIpc& st);

// At destroy, once no call runs and no CUDA graph holds a captured call: waits (up to timeout_s,
// what is left of destroy's) until each stream this rank used is past its last eager call here
// (DeviceIpc::ends), then unmaps what the communicator mapped of its peers -- their VMM
// allocations (device_vmm.h) and their host flag words (device_words.h) -- so that it does not
// hold their memory for the process's life. Left mapped, with a warning naming `rank`, where a
// stream never gets there or an end could not be marked. (The CUDA IPC mappings of the peers'
// cudaMalloc buffers are the process's, shared by its communicators: closed when the owner says
// it freed them, device_freed.h.)
void close_peer_mappings(DeviceIpc& st, double timeout_s, int rank);

// At destroy: whether the GPU is past `mark` (on `device`), polled every millisecond until `end`
// (one deadline for all of a teardown's marks): 0, kernels::cuda::kStampNotReady when it never
// got there, or the error. nullptr: 0 (nothing was marked, so nothing to wait for).
int await_mark(int device, void* mark, const Deadline& end);

// Whether a call's buffers are (at least partly) device memory and take the device path.
bool device_buffers(const void* sendbuff, const void* recvbuff);

// `s`, a failure with a peer's resources (mapping its memory or flag words, its descriptor
// socket), with the communicator's own error added: when the peer died or failed, the watch
// channel or its abort usually says so within milliseconds, and says more than a mapping error
// does; it is waited for up to 2 s (never past the communicator's failure).
Status with_peer_news(CommImpl& comm, const Status& s);

}  // namespace chorus

namespace chorus::capi {

// All-reduce, reduce, broadcast, all-gather, reduce-scatter, gather, scatter, all-to-all(-v) on
// device buffers, or a barrier with a stream: enqueued on `a.stream` (NULL: the legacy default
// stream) after the work already there; the host returns once the ranks have exchanged their
// buffers' handles, without waiting for the GPU. `h` is the handle the call came with (the exchange
// runs through it). The arguments are checked here. Reports its error as every C API call does.
chorusResult_t device_collective(chorusComm_t h, CommImpl& comm, const Call& call, const Args& a);

// One chorusSend or chorusRecv on device buffers, alone or one of a group's.
struct DeviceP2p {
  Call call;
  Args args;
};

// Send/recv on device buffers, one call or a group's (all on `h`, one stream): every item
// signals its peer before any waits, so a group that sends and receives both ways cannot
// deadlock (ungrouped, two ranks that both send first are named as a mismatch).
chorusResult_t device_p2p(chorusComm_t h, CommImpl& comm, const std::vector<DeviceP2p>& items);

// The same calls where CUDA IPC cannot join the ranks (several hosts, more than 32 ranks):
// through host memory (device_staged.cc, device_stage.h). The host call returns once the call is
// enqueued: the communicator's progress thread runs the host part when the stream's earlier
// work is done, and the stream waits for it.
chorusResult_t staged_collective(chorusComm_t h, CommImpl& comm, const Call& call, const Args& a,
                                 size_t elem_size);
chorusResult_t staged_p2p(chorusComm_t h, CommImpl& comm, const std::vector<DeviceP2p>& items);
// A staged collective on a stream being captured (device_staged_graph.cc): its page-locked
// layout, as staged_collective worked it out.
struct StagedBytes {
  size_t in, out, in_at, out_at, elem_size;
  bool uses_send, uses_recv;
};
chorusResult_t staged_capture(chorusComm_t h, CommImpl& comm, const Call& call, const Args& a,
                              const StagedBytes& bytes);
// Staged sends and receives (one, or a group's) on a stream being captured: item i's bytes at
// at[i] of `total` page-locked bytes. Both ranks of each pair must capture matching calls; their
// replays run on the pair's own communicator.
chorusResult_t staged_p2p_capture(chorusComm_t h, CommImpl& comm,
                                  const std::vector<DeviceP2p>& items,
                                  const std::vector<size_t>& at, size_t total);

}  // namespace chorus::capi
