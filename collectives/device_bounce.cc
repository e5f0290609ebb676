// The bounce buffer for device memory that CUDA IPC cannot map (device_bounce.h).
#include "collectives/device_bounce.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "common/log.h"

namespace chorus {
namespace {

namespace kc = kernels::cuda;

// Pieces start on 256-byte boundaries (the kernels' 16-byte loads need 16).
constexpr size_t kPieceAlign = 256;
// The smallest bounce buffer: calls of a few bytes should not grow it one by one.
constexpr size_t kMinBounce = size_t(1) << 20;

size_t round_up(size_t n) {
  return (n + kPieceAlign - 1) / kPieceAlign * kPieceAlign;
}

}  // namespace

Status place_staged(DeviceIpc& st, std::span<LocalBuffer* const> bufs, int rank, const char* call) {
  // Each staged buffer's piece: its offset, shared with an earlier buffer at the same pointer.
  std::vector<LocalBuffer*> staged;
  std::vector<size_t> piece_of, piece_size;
  for (LocalBuffer* b : bufs) {
    if (!b->staged) continue;
    size_t piece = piece_size.size();
    for (size_t i = 0; i < staged.size(); ++i)
      if (staged[i]->user == b->user && !staged[i]->aside && !b->aside) piece = piece_of[i];
    if (piece == piece_size.size()) piece_size.push_back(0);
    piece_size[piece] = std::max(piece_size[piece], round_up(b->bytes));
    staged.push_back(b);
    piece_of.push_back(piece);
  }
  if (staged.empty()) return Status::ok();
  std::vector<size_t> offset(piece_size.size());
  size_t need = 0;
  for (size_t i = 0; i < piece_size.size(); ++i) {
    offset[i] = need;
    need += piece_size[i];
  }
  const kc::IpcBackend& ipc = kc::ipc();
  if (need > st.bounce_bytes) {
    // The old one stays allocated until destroy, with its last mark (device_bounce.h); the new
    // one's calls need not wait for it.
    if (st.bounce != nullptr)
      st.bounce_old.emplace_back(st.bounce, std::exchange(st.bounce_mark, nullptr));
    const size_t bytes = std::max({need, 2 * st.bounce_bytes, kMinBounce});
    void* p = nullptr;
    if (int rc = ipc.flags_alloc(bytes, &p); rc != 0)
      return make_error(Code::kSystemError,
                        "{} on rank {}: allocating a bounce buffer of {} bytes for memory that "
                        "CUDA IPC cannot map failed: {}",
                        call, rank, bytes, ipc.error_string(rc));
    st.bounce = p;
    st.bounce_bytes = bytes;
  }
  for (size_t i = 0; i < staged.size(); ++i) {
    LocalBuffer& b = *staged[i];
    b.at = static_cast<char*>(st.bounce) + offset[piece_of[i]];
    if (int rc = export_for_peers(b.at, b.handle); rc != 0)
      return make_error(Code::kSystemError, "{} on rank {}: exporting the bounce buffer failed: {}",
                        call, rank, ipc.error_string(rc));
  }
  const auto unmapped =
      std::find_if(staged.begin(), staged.end(), [](const LocalBuffer* b) { return !b->aside; });
  if (!st.bounce_said && unmapped != staged.end()) {
    st.bounce_said = true;
    log_info(
        "rank {}: {}: {} {} is device memory that CUDA IPC cannot map (VMM or "
        "cudaMallocAsync memory); it goes through a bounce buffer of this "
        "communicator, one copy in and one out per call (this line once per communicator)",
        rank, call, (*unmapped)->name, (*unmapped)->user);
  }
  return Status::ok();
}

void bounce_close(DeviceIpc& st, double timeout_s, int rank) {
  const kc::IpcBackend& ipc = kc::ipc();
  std::vector<std::pair<void*, void*>> all = std::exchange(st.bounce_old, {});
  if (st.bounce != nullptr) all.emplace_back(st.bounce, st.bounce_mark);
  st.bounce = st.bounce_mark = nullptr;
  st.bounce_bytes = 0;
  if (all.empty()) return;
  if (st.bounce_unmarked) {
    log_warn(
        "rank {}: the bounce buffers of its device calls ({}) are left allocated: a call that "
        "failed could not mark its end, and its stream may still use them",
        rank, all.size());
    return;
  }
  const Deadline end = Deadline::after_seconds(timeout_s);
  for (auto [buffer, mark] : all) {
    // No mark: no call got to its GPU work (one that did and failed marked its end).
    if (int rc = await_mark(st.device, mark, end); rc != 0) {
      log_warn(
          "rank {}: a bounce buffer of its device calls is left allocated: its stream {}", rank,
          rc == kc::kStampNotReady ? "has not got past it" : "failed: " + ipc.error_string(rc));
      continue;
    }
    ipc.flags_free(buffer);
    ipc.mark_free(mark);
  }
}

}  // namespace chorus
