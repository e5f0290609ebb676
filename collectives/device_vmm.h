// VMM (cuMem) memory in the device collectives, mapped by the peers through its file descriptors
// (issue 19 item 4), instead of a copy in and out of the bounce buffer (device_bounce.h):
//
//   exporter: a buffer without a legacy IPC handle that lies inside one cuMem allocation CUDA
//             exports as a POSIX fd (PyTorch's expandable segments) gets an id in this
//             communicator's registry, which keeps the allocation retained (so no later
//             allocation can have its handle: a freed and reused address is a new id), and its
//             record carries (id, allocation size, offset) instead of a legacy handle;
//   pass:     after the record exchange, each allocation a peer has not mapped yet goes to it
//             once, as a descriptor over a Unix socket between the pair (transport/fd_pass.h,
//             set up at the pair's first descriptor; the listener accepts only the peer's pid);
//   importer: maps it (vmm_map) and keeps it by (rank, id) for the communicator's life.
//
//   dropped:  an entry whose allocation the user freed (found when another allocation comes to
//             its address, or when the registry is full) leaves the registry, and its id goes in
//             the records of the exporter's next calls on the communicator, to each rank once
//             (vmm_announce); the peers unmap it (vmm_unmap_dropped). The exporter's calls that
//             used it waited for the peers' signals after their reads and writes of it.
//
// Bounded: at most kMaxVmmLive allocations retained at once; past that, buffers go through the
// bounce buffer, said once at CHORUS_DEBUG=INFO. The retains end at destroy, and each rank unmaps
// its peers' allocations once its streams are past the communicator's calls (close_peer_mappings,
// device_ops.h).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "collectives/device_bounce.h"
#include "common/clock.h"
#include "common/status.h"
#include "kernels/cuda/ipc.h"

namespace chorus {

class CommImpl;

inline constexpr int kMaxVmmLive = 16;

// Whether a record's handle is a VMM one (vmm_describe's), not a legacy IPC handle.
bool is_vmm_handle(const kernels::cuda::IpcHandle& h);

// For a buffer CUDA IPC cannot map: whether its allocation goes by descriptor; then *h is its
// VMM handle and b.at the user's pointer. false: the bounce buffer takes it (b.staged).
bool vmm_describe(DeviceIpc& st, LocalBuffer& b, kernels::cuda::IpcHandle* h, int rank);

// One allocation that goes from rank `from` to rank `to` in this call, as `from`'s record says.
struct VmmTransfer {
  int from, to;
  const kernels::cuda::IpcHandle* handle;
};
// After the exchange, on every rank of the call, with the same list (in the same order for each
// pair): this rank sends the descriptors of its allocations that their peer has not been sent,
// then maps what it has not mapped. pids: each rank's process. Fails naming the peer; a rank
// that fails aborts the communicator (its peers' waits are released).
Status vmm_pass(CommImpl& comm, DeviceIpc& st, const std::vector<VmmTransfer>& transfers,
                const std::vector<int32_t>& pids, Deadline deadline);

// Where rank q's VMM buffer is mapped here (after vmm_pass).
Result<void*> vmm_open(DeviceIpc& st, int q, const kernels::cuda::IpcHandle& h);

// Before a call's record goes to ranks `to`: the ids of this rank's dropped allocations that
// they have not been told of, oldest first, into `out`; how many.
int vmm_announce(DeviceIpc& st, std::span<const int> to, std::span<uint64_t> out);
// After rank q's record came: its allocations of ids `ids`, dropped there, are unmapped here.
void vmm_unmap_dropped(DeviceIpc& st, int q, std::span<const uint64_t> ids);

// At destroy: the registry's retains end.
void vmm_close(DeviceIpc& st);
// At destroy, once this rank's streams are past the communicator's calls (close_peer_mappings):
// the peers' allocations mapped here are unmapped.
void vmm_unmap_imported(DeviceIpc& st, int rank);

}  // namespace chorus
