// Where the CUDA IPC path's flag words lie (device_ops.cc, "Flag words", and the captured calls'
// slots behind them, device_graph.h), and how the peers reach them.
//
// By default (CHORUS_IPC_WORDS=host) in host memory shared with the peers: a piece of a memfd of
// this process's (transport/shm/shared_mem.h; one memfd holds the pieces of many communicators)
// that each peer maps through /proc, page-locked and mapped for the GPU by every process that
// uses it (host_register, kernels/cuda/ipc.h; as NCCL's shared-memory transport does with its
// segments). Like device words, a rank's own piece is never given back (a peer's stream may write
// into it after this rank's destroy); a peer's registration of it ends at the peer's destroy
// (close_peer_words). The peers' streams write
// into them, this rank's streams wait on them, and the release of those waits after a failure
// (release_device_waits, the graph keeper) is a store of the host's: no GPU work, so nothing
// that a hardware queue shared by streams -- every stream of a process under
// CUDA_DEVICE_MAX_CONNECTIONS=1, as Megatron-LM sets it; any two beyond 8 streams -- could hold
// behind the very wait it must end. The staged path's words lie in host memory for the same
// reason (device_stage.h).
//
// With CHORUS_IPC_WORDS=device, or where host memory is refused (CUDA will not map it at the
// same address, or no shared memory), in device memory (flags_alloc) exported by CUDA IPC and
// released by stream writes on a release stream of their own (flags_release), which such a
// queue can hold back. Each rank's record says which kind its words are; peers take either, so
// ranks need not agree.
#pragma once

#include "common/status.h"
#include "kernels/cuda/ipc.h"

namespace chorus {

struct DeviceIpc;

// This rank's words (kFlagBytes, then the captured calls' kGraphFlagBytes), zeroed, into
// st.flags, at its first device call; st.host_words says which kind. An error says what failed.
Status alloc_words(DeviceIpc& st, int rank);
// The handle by which peers open the words at p (st.flags, or the captured calls' words behind
// them): a CUDA IPC handle, or for host words the memfd's SharedRef in its bytes and p's offset.
int export_words(const DeviceIpc& st, const void* p, kernels::cuda::IpcHandle* out);
// Where rank q's words of handle h (`host`: host words, as q's record says) are mapped here:
// its allocation mapped and registered at the first use, once per rank. Never rank q = this one.
Result<void*> open_words(DeviceIpc& st, int q, bool host, const kernels::cuda::IpcHandle& h);
// At destroy, once this rank's streams are past the communicator's calls (close_peer_mappings):
// the registrations of the peers' host words end (their memfds stay mapped: the process's, for
// all its communicators).
void close_peer_words(DeviceIpc& st);

}  // namespace chorus
