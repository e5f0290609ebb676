// The CUDA IPC path's flag words in shared host memory or device memory (device_words.h).
#include "collectives/device_words.h"

#include <cstring>

#include "collectives/device_call.h"
#include "collectives/device_ops.h"
#include "common/log.h"
#include "transport/shm/shared_mem.h"

namespace chorus {

namespace kc = kernels::cuda;

namespace {

constexpr size_t kIpcWordBytes = kFlagBytes + kGraphFlagBytes;

// Shared host memory registered with CUDA; empty and why not when refused.
std::string shared_host_words(DeviceIpc& st) {
  Result<void*> p = transport::shared_alloc(kIpcWordBytes);
  if (!p.is_ok()) return "shared host memory refused: " + p.status().message();
  if (int rc = kc::ipc().host_register(*p, kIpcWordBytes); rc != 0) {
    (void)transport::shared_free(*p);
    return "CUDA refused to map host memory: " + kc::ipc().error_string(rc);
  }
  st.words_ref = *transport::find_shared(*p, kIpcWordBytes);
  st.flags = *p;
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
  *out = {};
  transport::SharedRef ref = st.words_ref;
  ref.offset = 0;
  static_assert(sizeof ref <= sizeof out->bytes);
  std::memcpy(out->bytes, &ref, sizeof ref);
  out->offset = uint64_t(static_cast<const char*>(p) - static_cast<const char*>(st.flags));
  out->size = ref.size;
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
  if (ref.size < kIpcWordBytes || h.offset > ref.size - sizeof(uint32_t))
    return make_error(Code::kRemoteError,
                      "its record says its words are {} bytes with a piece at {}, not the {} "
                      "bytes of flag words: corrupt",
                      ref.size, h.offset, kIpcWordBytes);
  if (st.peer_words.size() <= size_t(q)) st.peer_words.resize(q + 1, nullptr);
  if (st.peer_words[q] == nullptr) {
    Result<char*> base = transport::map_shared(ref, ref.size);
    if (!base.is_ok())
      return make_error(Code::kSystemError,
                        "{} (its flag words lie in host memory; CHORUS_IPC_WORDS=device on every "
                        "rank keeps them in device memory, which CUDA IPC maps)",
                        base.status().message());
    if (int rc = kc::ipc().host_register(*base, ref.size); rc != 0) {
      transport::release_shared(ref);
      return make_error(Code::kSystemError,
                        "mapping its flag words (host memory) for the GPU failed: {}",
                        kc::ipc().error_string(rc));
    }
    st.peer_words[q] = *base;
  }
  return st.peer_words[q] + h.offset;
}

}  // namespace chorus
