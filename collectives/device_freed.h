// The lifetime of device allocations that processes of one host open from each other over CUDA
// IPC for user buffers (device_call.h's open_peer). CUDA keeps an allocation that a peer opened --
// and, after its owner frees it, its memory -- until the peer closes it, so a rank that frees and
// allocates buffers around its calls would pile them up in its peers. Every exported allocation
// carries its identity in its owner's process (CU_POINTER_ATTRIBUTE_BUFFER_ID: no later
// allocation of the process has it, also one made where a freed one lay), and a peer closes an
// allocation when it learns that the owner freed it, in one of two ways:
//   - a later buffer of the owner lies where the allocation lay (two live allocations of one
//     process never overlap), or has the same handle but another identity: close_overlapped,
//     before the peer opens the new one;
//   - the owner finds it freed (its address lies in no allocation, or in one of another
//     identity) and names it in the records of its next calls, whoever they go to
//     (announce_frees); the peers close what they hold of it (close_announced).
// Closing is safe once the owner freed the allocation: its free waited for its calls that used
// it, and each of those waited, on its stream, for every peer's signal that came after the peer's
// reads and writes of it.
#pragma once

#include <cstdint>
#include <deque>
#include <span>
#include <utility>
#include <vector>

#include "kernels/cuda/ipc.h"

namespace chorus::capi::devcall {

// The most freed allocations one record names; more go in the records of the calls after it.
constexpr int kMaxAnnounced = 8;

// This process's token, never 0 (IpcHandle::owner).
uint64_t process_token();

// How many frees a process (device_freed.cc), or a communicator for its VMM allocations
// (device_vmm.cc), remembers for ranks not yet told: a rank that takes part in no call of the owner
// through more frees than that is never told of the older ones (their mappings stay in it).
constexpr size_t kFreesRemembered = size_t(1) << 16;

// Frees found, by identity, for the ranks of each communicator to be told once: numbered from 1
// in the order added, the last `keep` of them remembered. A call's tell costs what it tells, not
// what is remembered.
class FreeNews {
 public:
  explicit FreeNews(size_t keep) : keep_(keep) {}
  void add(uint64_t id);
  // Into `out`, oldest first, the ids that ranks `to` have not all been told of (`told`: a
  // communicator's, by rank, sized here); marks them told; returns how many.
  int tell(std::vector<uint64_t>& told, std::span<const int> to, std::span<uint64_t> out) const;

 private:
  size_t keep_;
  std::deque<uint64_t> ids_;  // numbers count_ - ids_.size() + 1 .. count_
  uint64_t count_ = 0;
};

// Owner side, for an allocation being exported to peers (h: export_buffer's, owner set): sets
// h.id, its identity, and watches it, so that its free is found; an allocation watched before that
// h's overlaps, or that lay at its address with another identity, was freed. h.id stays 0 where
// CUDA does not say (then it is not watched).
void note_export(kernels::cuda::IpcHandle& h);

// Owner side, as a call's record is made for ranks `to` of a communicator: checks a few watched
// allocations whether they were freed, then writes into `out` the identities of the freed ones
// that ranks `to` have not yet been told of on this communicator, oldest first; returns how
// many. `told`: the communicator's, by rank (sized here), what each rank was told so far.
int announce_frees(std::vector<uint64_t>& told, std::span<const int> to,
                   std::span<uint64_t, kMaxAnnounced> out);

// Peer side: closes the allocations of `owner` open here whose identities `freed` names.
void close_announced(uint64_t owner, std::span<const uint64_t> freed);

// Peer side, before h's allocation is opened: closes the open allocations of h's owner that h's
// overlaps or that have h's handle with another identity, and notes h's as open (nothing when
// it is open already). With `later` (a capture is under way, which a close may break: it may
// synchronise), the overlapped ones are moved there instead, for the next call not captured to
// close (close_later); one with h's very handle is closed at once, since opening h would give
// its mapping back (CUDA gives a new allocation a handle of its own, so on a GPU it does not
// arise).
void close_overlapped(const kernels::cuda::IpcHandle& h,
                      std::vector<kernels::cuda::IpcHandle>* later = nullptr);
// Closes what close_overlapped moved into `later`.
void close_later(std::vector<kernels::cuda::IpcHandle>& later);

}  // namespace chorus::capi::devcall
