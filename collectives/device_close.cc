// What a communicator's device calls mapped of its peers, unmapped at destroy once this rank's
// streams are past its calls (device_ops.h's close_peer_mappings).
#include <unistd.h>

#include <chrono>
#include <utility>
#include <vector>

#include "collectives/device_ops.h"
#include "collectives/device_vmm.h"
#include "collectives/device_words.h"
#include "common/log.h"

namespace chorus {

namespace kc = kernels::cuda;

void close_peer_mappings(DeviceIpc& st, double timeout_s, int rank) {
  const kc::IpcBackend& ipc = kc::ipc();
  const std::vector<std::pair<void*, void*>> ends = std::exchange(st.ends, {});
  if (st.ends_unmarked) {
    log_warn(
        "rank {}: the peers' memory its device calls mapped stays mapped: the end of a call "
        "could not be marked, and its stream may still use it",
        rank);
    return;
  }
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  for (const auto& [stream, mark] : ends) {
    int rc = ipc.mark_done(st.device, mark);
    while (rc == kc::kStampNotReady && std::chrono::steady_clock::now() < end) {
      usleep(1000);
      rc = ipc.mark_done(st.device, mark);
    }
    if (rc != 0) {  // a mark still pending is left too: its stream may get there yet
      log_warn("rank {}: the peers' memory its device calls mapped stays mapped: stream {} {}",
               rank, stream,
               rc == kc::kStampNotReady ? "has not got past its last call"
                                        : "failed: " + ipc.error_string(rc));
      return;
    }
  }
  for (const auto& [stream, mark] : ends) ipc.mark_free(mark);
  vmm_unmap_imported(st, rank);
  close_peer_words(st);
}

}  // namespace chorus
