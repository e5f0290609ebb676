// Device memory that CUDA IPC cannot map -- VMM memory (cuMem: PyTorch's expandable segments) and
// stream-ordered memory (cudaMallocAsync), which have no legacy IPC handle
// (kernels::cuda::kNotLegacyIpc) -- taken through a bounce buffer of the communicator's, as NCCL
// takes buffers it has not registered through its own: the call's input is copied into its piece
// of the bounce buffer before the ready signal, peers read and write the pieces instead of the
// user's memory, and the output is copied out after the done wait, all on the call's stream.
// One copy in and one out per staged buffer: correct for any device memory, slower than mapping
// it -- which VMM memory that CUDA exports as a file descriptor is instead (device_vmm.h).
//
// The bounce buffer is this rank's, device memory that CUDA IPC maps, grown when a call needs
// more. Calls that use it on different streams are ordered by a mark (a CUDA event): the next
// one waits, on its stream, for the end of the last one, so that no copy in overwrites a piece
// peers still read. The buffers it grew out of are kept, with their last marks, until destroy,
// which frees each once the GPU is past its mark (bounce_close): a call's end on this rank's
// stream comes after its wait for every peer's signal that follows the peer's reads and writes,
// so no peer's stream uses it either. (Freed at once when grown, a buffer's cudaFree could wait
// for the whole device, in the middle of a call.) The peers close their mappings when this
// process's next records tell them of the free (device_freed.h), on whatever communicator.
#pragma once

#include <span>

#include "collectives/device_ops.h"
#include "common/status.h"
#include "kernels/cuda/ipc.h"

namespace chorus {

// One buffer of a rank's device call as its GPU work sees it.
struct LocalBuffer {
  const char* name = "";       // "sendbuff" or "recvbuff", for messages
  bool output = false;         // the call writes it (staged: copied out of its piece, else in)
  const void* user = nullptr;  // the caller's pointer
  size_t bytes = 0;            // the bytes the call touches
  bool used = false;           // the call touches it at all
  bool shared = true;          // peers map it (a receive's buffer: only this rank copies into it)
  bool staged = false;         // CUDA IPC cannot map it: it goes through the bounce buffer
  // The call's input overlaps its output other than as the rank's own block (an in-place
  // all-to-all; a gather's or scatter's root with one buffer inside the other): copied aside
  // into a piece of its own, as if staged, wherever it lives.
  bool aside = false;
  // The call writes only parts of it (all-to-all-v's blocks): staged, it is copied in too, so
  // that the rest comes out as it was.
  bool partial = false;
  void* at = nullptr;  // where the GPU work finds it: `user`, or its piece when staged
  kernels::cuda::IpcHandle* handle = nullptr;  // its record's handle (staged: of its piece)
};

// A call's two buffers.
struct CallBuffers {
  LocalBuffer send{.name = "sendbuff"};
  LocalBuffer recv{.name = "recvbuff", .output = true};
};

// Gives every staged buffer of `bufs` (one call's, or a group's) a piece of the bounce buffer --
// one piece for a sendbuff and recvbuff that are the same pointer (in place), unless one is
// copied aside -- grown first when
// too small, and exports each piece into its handle. Says at CHORUS_DEBUG=INFO, once per
// communicator, that buffers are staged and why. `call` and `rank` name the call in errors.
Status place_staged(DeviceIpc& st, std::span<LocalBuffer* const> bufs, int rank, const char* call);

// At destroy, once no call runs: frees the bounce buffers, each once the GPU is past the last call
// that used it (waiting up to timeout_s, what is left of destroy's). Left allocated, with a
// warning: one whose stream never got there, all of them after a failed call that could not mark
// its end. `rank` names the rank in the warning.
void bounce_close(DeviceIpc& st, double timeout_s, int rank);

}  // namespace chorus
