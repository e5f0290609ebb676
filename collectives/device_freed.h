// The lifetime of device allocations that processes of one host open from each other over CUDA
// IPC for user buffers (device_call.h's open_peer). CUDA keeps an allocation that a peer opened --
// and, after its owner frees it, its memory -- until the peer closes it, so a rank that frees and
// allocates buffers around its calls would pile them up in its peers. A peer closes an allocation
// when it learns that the owner freed it, in one of two ways:
//   - a later buffer of the owner lies where the allocation lay (two live allocations of one
//     process never overlap): close_overlapped, when the peer opens the new one;
//   - the owner finds it freed (CUDA gives every allocation of a process an identity that no later
//     one has: buffer_id) and says so in the records of its next calls (announce_frees), whoever
//     they go to; the peers close what they hold of it (close_announced).
// Closing is safe once the owner freed the allocation: its free waited for its calls that used
// it, and each of those waited, on its stream, for every peer's signal that came after the peer's
// reads and writes of it.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kernels/cuda/ipc.h"

namespace chorus::capi::devcall {

// The most freed allocations one record names; more go in the records of the calls after it.
constexpr int kMaxAnnounced = 8;

// This process's token, never 0 (IpcHandle::owner).
uint64_t process_token();

// Owner side: notes an allocation exported to peers (h: export_for_peers's) so that its free is
// found; an allocation noted before that h's overlaps was freed.
void note_export(const kernels::cuda::IpcHandle& h);

// Owner side, as a call's record is made for ranks `to` of a communicator: checks a few noted
// allocations whether they were freed, then writes into `out` the freed ones -- each as the hash
// of its handle (handle_hash) -- that ranks `to` have not yet been told of on this communicator,
// oldest first; returns how many. `told`: the communicator's, by rank (sized here), what each
// rank was told so far.
int announce_frees(std::vector<uint64_t>& told, std::span<const int> to,
                   std::span<uint64_t, kMaxAnnounced> out);

// Peer side: closes the allocations of `owner` open here that `freed` names.
void close_announced(uint64_t owner, std::span<const uint64_t> freed);

// Peer side, before h's allocation is opened: closes the open allocations of h's owner that h's
// overlaps, and notes h's as open (nothing when it is open already).
void close_overlapped(const kernels::cuda::IpcHandle& h);

// An allocation's name in records: a hash of its handle's bytes (FNV-1a).
uint64_t handle_hash(const kernels::cuda::IpcHandle& h);

}  // namespace chorus::capi::devcall
