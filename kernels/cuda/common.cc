// What every build shares of kernels/cuda/memory.h and device.h: the test hooks and the names.
// What the driver says comes from driver.cu (CUDA builds) or driver_none.cc (none).
#include "kernels/cuda/memory.h"

#include <atomic>
#include <cstdlib>

#include "kernels/cuda/device.h"
#include "kernels/cuda/ipc.h"
#include "kernels/cuda/reduce.h"

namespace chorus::kernels::cuda {
namespace {

std::atomic<PointerClassifier> g_test_classifier{nullptr};

const IpcBackend kDriverIpc{.export_buffer = ipc_export,
                            .open = ipc_open,
                            .close = ipc_close,
                            .buffer_id = buffer_id,
                            .flags_alloc = flags_alloc,
                            .flags_free = flags_free,
                            .host_words_alloc = host_words_alloc,
                            .host_register = host_register,
                            .host_unregister = host_unregister,
                            .flags_release = flags_release,
                            .write_u32 = stream_write_u32,
                            .wait_u32_geq = stream_wait_u32_geq,
                            .mark_record = mark_record,
                            .mark_wait = mark_wait,
                            .stamp_record = stamp_record,
                            .stamp_ms = stamp_ms,
                            .stamp_free = stamp_free,
                            .fold = reduce_fold_to,
                            .to_device = copy_to_device,
                            .pinned_alloc = pinned_alloc,
                            .pinned_free = pinned_free,
                            .to_host_async = copy_to_host_async,
                            .capturing = stream_capturing,
                            .graph_destructor = graph_destructor,
                            .host_func = host_func,
                            .mark_done = event_query_on,
                            .mark_free = event_free,
                            .current_device = current_device,
                            .error_string = ipc_error_string,
                            .vmm_identify = vmm_identify,
                            .vmm_release = vmm_release,
                            .vmm_export_fd = vmm_export_fd,
                            .vmm_map = vmm_map,
                            .vmm_unmap = vmm_unmap};
std::atomic<const IpcBackend*> g_test_ipc{nullptr};

}  // namespace

PointerInfo classify_pointer(const void* p) {
  if (PointerClassifier fn = g_test_classifier.load()) return fn(p);
  return driver_classify_pointer(p);
}

void set_pointer_classifier_for_test(PointerClassifier fn) {
  g_test_classifier.store(fn);
}

const IpcBackend& ipc() {
  const IpcBackend* t = g_test_ipc.load();
  return t ? *t : kDriverIpc;
}

void set_ipc_backend_for_test(const IpcBackend* backend) {
  g_test_ipc.store(backend);
}

const char* compute_mode_name(int mode) {
  switch (mode) {
    case 0:
      return "default";
    case 1:
      return "exclusive-thread";
    case 2:
      return "prohibited";
    case 3:
      return "exclusive-process";
  }
  return "unknown";
}

Result<std::optional<GpuIdentity>> test_gpu_from_env() {
  const char* v = std::getenv("CHORUS_TEST_GPU_UUID");
  if (v == nullptr) return std::optional<GpuIdentity>();
  std::string uuid = v, bus = "0000:00:00.0", peers;
  if (size_t at = uuid.find('@'); at != std::string::npos) {  // UUID@BUS: a PCI address too
    bus = uuid.substr(at + 1);
    uuid.resize(at);
    if (size_t p = bus.find('@'); p != std::string::npos) {  // UUID@BUS@PEERS: and its peers
      peers = bus.substr(p + 1);
      bus.resize(p);
    }
  }
  if (uuid.empty() || uuid.size() > 64 || uuid.find_first_of(" \t\n") != std::string::npos ||
      bus.empty() || bus.size() > 32 || bus.find_first_of(" \t\n@") != std::string::npos ||
      peers.size() > 1000 || peers.find_first_of(" \t\n@") != std::string::npos)
    return make_error(Code::kInvalidArgument,
                      "CHORUS_TEST_GPU_UUID '{}': expected UUID[@PCI-BUS[@PEER-BUS,...]], 1..64 "
                      "characters without spaces",
                      v);
  return std::optional<GpuIdentity>(GpuIdentity{uuid, 0, bus, 0, peers});
}

Result<std::optional<GpuIdentity>> current_gpu() {
  CHORUS_ASSIGN_OR_RETURN(std::optional<GpuIdentity> fake, test_gpu_from_env());
  if (fake) return fake;
  GpuIdentity g;
  int rc = driver_current_gpu(&g);
  if (rc < 0)
    return make_error(Code::kSystemError,
                      "CUDA: reading the identity of the current device failed (CUresult {})", -rc);
  return rc == 0 ? std::optional<GpuIdentity>() : std::optional<GpuIdentity>(g);
}

const char* mem_space_name(MemSpace s) {
  switch (s) {
    case MemSpace::kHost:
      return "host";
    case MemSpace::kDevice:
      return "device";
    case MemSpace::kManaged:
      return "managed";
  }
  return "?";
}

}  // namespace chorus::kernels::cuda
