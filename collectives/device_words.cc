// The CUDA IPC path's flag words in shared host memory or device memory (device_words.h).
#include "collectives/device_words.h"

#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <utility>

#include "collectives/device_call.h"
#include "collectives/device_ops.h"
#include "common/log.h"
#include "transport/shm/shared_mem.h"

namespace chorus {

namespace kc = kernels::cuda;

namespace {

constexpr size_t kIpcWordBytes = kFlagBytes + kGraphFlagBytes;
// A peer maps the whole of it, populated (transport/shm/shared_mem.h): small.
constexpr size_t kArenaBytes = size_t(2) << 20;

// The process's host words: one memfd of kArenaBytes cut into page-aligned pieces, one a
// communicator, never given back (device words never were either: a peer's stream may still
// write into them); another memfd when one is full. One descriptor for about 56 communicators,
// not one each.
struct Arena {
  std::mutex mu;
  char* base = nullptr;
  size_t used = 0;
};

size_t piece_bytes() {
  const size_t page = size_t(sysconf(_SC_PAGESIZE));
  return (kIpcWordBytes + page - 1) / page * page;
}

// A piece of the arena: its address, and its arena's SharedRef with the piece's offset.
Result<std::pair<char*, transport::SharedRef>> take_piece() {
  static Arena* arena = new Arena;  // never destroyed: peers may map it until this process ends
  std::lock_guard<std::mutex> lock(arena->mu);
  if (arena->base == nullptr || arena->used + piece_bytes() > kArenaBytes) {
    CHORUS_ASSIGN_OR_RETURN(void* p, transport::shared_alloc(kArenaBytes));
    arena->base = static_cast<char*>(p);
    arena->used = 0;
  }
  char* piece = arena->base + arena->used;
  arena->used += piece_bytes();
  return std::make_pair(piece, *transport::find_shared(piece, piece_bytes()));
}

// The file a descriptor is: what a peer checks it reached through /proc (device, inode).
struct FileId {
  uint64_t dev = 0, ino = 0;
};

// A piece of shared host memory, registered with CUDA; why not when refused (the piece is then
// left unused).
std::string shared_host_words(DeviceIpc& st) {
  auto piece = take_piece();
  if (!piece.is_ok()) return "shared host memory refused: " + piece.status().message();
  struct stat file {};
  if (fstat(piece->second.fd, &file) != 0)
    return fmt::format("shared host memory refused: fstat failed: {}", std::strerror(errno));
  if (int rc = kc::ipc().host_register(piece->first, piece_bytes()); rc != 0)
    return "CUDA refused to map host memory: " + kc::ipc().error_string(rc);
  st.words_ref = piece->second;
  st.words_file = {uint64_t(file.st_dev), uint64_t(file.st_ino)};
  st.flags = piece->first;
  st.host_words = true;
  return {};
}

}  // namespace

Status alloc_words(DeviceIpc& st, int rank) {
  std::string why = "CHORUS_IPC_WORDS=device";
  if (st.want_host_words) {
    why = shared_host_words(st);
    if (why.empty()) {
      log_info(
          "rank {}: device calls over CUDA IPC signal through flag words in host memory shared "
          "with the peers and mapped for the GPU (a failure releases their waits by a store: no "
          "stream behind the wait it ends)",
          rank);
      return Status::ok();
    }
  }
  if (int rc = kc::ipc().flags_alloc(kIpcWordBytes, &st.flags); rc != 0)
    return make_error(Code::kSystemError, "allocating its flag words failed: {}",
                      kc::ipc().error_string(rc));
  log_info(
      "rank {}: device calls over CUDA IPC signal through flag words in device memory, released "
      "after a failure by stream writes on a stream of their own ({})",
      rank, why);
  return Status::ok();
}

int export_words(const DeviceIpc& st, const void* p, kc::IpcHandle* out) {
  if (!st.host_words) return kc::ipc().export_buffer(p, out);
  // The arena's SharedRef (offset 0) and its file in the bytes; where the piece lies in it, its
  // size, and p's offset in it.
  *out = {};
  transport::SharedRef ref = st.words_ref;
  ref.offset = 0;
  const FileId file{st.words_file[0], st.words_file[1]};
  static_assert(sizeof ref + sizeof file <= sizeof out->bytes);
  std::memcpy(out->bytes, &ref, sizeof ref);
  std::memcpy(out->bytes + sizeof ref, &file, sizeof file);
  out->base = st.words_ref.offset;
  out->size = piece_bytes();
  out->offset = uint64_t(static_cast<const char*>(p) - static_cast<const char*>(st.flags));
  return 0;
}

Result<void*> open_words(DeviceIpc& st, int q, bool host, const kc::IpcHandle& h) {
  if (!host) {
    void* f = nullptr;
    if (int rc = kc::ipc().open(h, &f); rc != 0)
      return make_error(Code::kSystemError, "{}", kc::ipc().error_string(rc));
    return f;
  }
  transport::SharedRef ref;
  std::memcpy(&ref, h.bytes, sizeof ref);
  if (h.size < kIpcWordBytes || h.base > ref.size || h.size > ref.size - h.base ||
      h.offset > h.size - sizeof(uint32_t))
    return make_error(Code::kRemoteError,
                      "its record says its flag words are {} bytes at {} of {}, with a piece at "
                      "{}, not {} bytes of flag words inside their memory: corrupt",
                      h.size, h.base, ref.size, h.offset, kIpcWordBytes);
  if (st.peer_words.size() <= size_t(q)) st.peer_words.resize(q + 1, nullptr);
  if (st.peer_words[q] == nullptr) {
    // The file reached through /proc must be rank q's memfd: in another pid namespace its pid
    // here is another process's, or none.
    FileId file;
    std::memcpy(&file, h.bytes + sizeof ref, sizeof file);
    const std::string path = fmt::format("/proc/{}/fd/{}", ref.pid, ref.fd);
    struct stat seen {};
    if (stat(path.c_str(), &seen) != 0 || uint64_t(seen.st_dev) != file.dev ||
        uint64_t(seen.st_ino) != file.ino)
      return make_error(Code::kSystemError,
                        "its flag words lie in host memory that this process cannot reach as "
                        "its: {} is not its memory (ranks in different pid namespaces?); "
                        "CHORUS_IPC_WORDS=device on every rank keeps the words in device "
                        "memory, which CUDA IPC maps",
                        path);
    Result<char*> arena = transport::map_shared(ref, ref.size);  // once a process: held for good
    if (!arena.is_ok())
      return make_error(Code::kSystemError,
                        "{} (its flag words lie in host memory; CHORUS_IPC_WORDS=device on every "
                        "rank keeps them in device memory, which CUDA IPC maps)",
                        arena.status().message());
    char* piece = *arena + h.base;
    if (int rc = kc::ipc().host_register(piece, h.size); rc != 0)
      return make_error(Code::kSystemError,
                        "mapping its flag words (host memory) for the GPU failed: {}",
                        kc::ipc().error_string(rc));
    st.peer_words[q] = piece;
  }
  return st.peer_words[q] + h.offset;
}

void close_peer_words(DeviceIpc& st) {
  for (char*& piece : st.peer_words)
    if (piece != nullptr) kc::ipc().host_unregister(std::exchange(piece, nullptr));
  std::fill(st.peer_flags.begin(), st.peer_flags.end(), nullptr);
  std::fill(st.graph.peer.begin(), st.graph.peer.end(), nullptr);
}

}  // namespace chorus
