// What a communicator's device calls mapped of its peers, unmapped at destroy once this rank's
// streams are past its calls (device_ops.h's close_peer_mappings).
#include <unistd.h>

#include <utility>
#include <vector>

#include "collectives/device_ops.h"
#include "collectives/device_vmm.h"
#include "collectives/device_words.h"
#include "common/log.h"

namespace chorus {

namespace kc = kernels::cuda;

int await_mark(int device, void* mark, const Deadline& end) {
  if (mark == nullptr) return 0;
  int rc = kc::ipc().mark_done(device, mark);
  while (rc == kc::kStampNotReady && !end.expired()) {
    usleep(1000);
    rc = kc::ipc().mark_done(device, mark);
  }
  return rc;
}

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
  const Deadline end = Deadline::after_seconds(timeout_s);
  for (const auto& [stream, mark] : ends) {
    if (int rc = await_mark(st.device, mark, end);
        rc != 0) {  // a mark still pending is left too: its stream may get there yet
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
