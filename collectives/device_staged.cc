// Device buffers where CUDA IPC cannot join the ranks (several hosts, or more ranks than its flag
// words hold): each rank copies its input to host memory after the stream's earlier work, the
// host collective runs (shm within a host, tcp or verbs across), and the result goes back to
// the device on the stream. Correct, and as fast as the host path plus two PCIe copies; the host
// call waits for the stream and for the peers (NCCL's network path does not, nor will a later
// device-side proxy here). In place or not, the host side runs out of place.
#include <vector>

#include "collectives/c_api_internal.h"
#include "collectives/comm.h"
#include "collectives/device_ops.h"
#include "collectives/device_plan.h"
#include "kernels/cuda/ipc.h"

namespace chorus::capi {
namespace {

namespace kc = kernels::cuda;

Status copy_failed(const char* call, int rank, const char* what, int rc) {
  return make_error(Code::kSystemError, "{} on rank {}: staging: {} failed: {}", call, rank, what,
                    kc::ipc().error_string(rc));
}

}  // namespace

chorusResult_t staged_collective(chorusComm_t h, CommImpl& comm, const Call& call, const Args& a,
                                 size_t elem_size) {
  const int r = comm.rank(), p = comm.size();
  const kc::IpcBackend& ipc = kc::ipc();
  if (call.kind == OpKind::kBarrier) {  // the stream's work first, then every rank
    if (int rc = ipc.to_host(nullptr, nullptr, 0, a.stream); rc != 0)
      return report(copy_failed(call.name, r, "waiting for the stream", rc));
    return run_op({call.name, OpKind::kBarrier, false}, h, {});
  }
  const bool v = call.kind == OpKind::kAllToAllv;  // each side to its furthest block's end
  const bool uses_send = v || device_uses_send(call.kind, r, a.root);
  const bool uses_recv = v || device_uses_recv(call.kind, r, a.root);
  std::vector<char> in(!uses_send ? 0
                       : v        ? device_extent(a.sendcounts, a.sdispls, p) * elem_size
                                  : device_send_count(call.kind, a.count, p) * elem_size);
  std::vector<char> out(!uses_recv ? 0
                        : v        ? device_extent(a.recvcounts, a.rdispls, p) * elem_size
                                   : device_recv_count(call.kind, a.count, p) * elem_size);
  // Also when there is nothing to copy: the stream's earlier work may still write recvbuff.
  if (int rc = ipc.to_host(in.data(), a.sendbuff, in.size(), a.stream); rc != 0)
    return report(copy_failed(call.name, r, "copying sendbuff to host memory", rc));
  Args host = a;
  host.sendbuff = uses_send ? in.data() : nullptr;
  host.recvbuff = uses_recv ? out.data() : nullptr;
  host.stream = nullptr;
  if (chorusResult_t rc = run_op({call.name, call.kind, false}, h, host); rc != chorusSuccess)
    return rc;
  // All-to-all-v: its blocks only, the gaps between them as they were.
  for (int q = 0; q < (v ? p : 1) && !out.empty(); ++q) {
    const size_t at = v ? a.rdispls[q] * elem_size : 0,
                 bytes = v ? a.recvcounts[q] * elem_size : out.size();
    if (bytes == 0) continue;
    if (int rc =
            ipc.to_device(static_cast<char*>(a.recvbuff) + at, out.data() + at, bytes, a.stream);
        rc != 0)
      return report(copy_failed(call.name, r, "copying the result to recvbuff", rc));
  }
  return chorusSuccess;
}

chorusResult_t staged_p2p(chorusComm_t h, CommImpl& comm, const std::vector<DeviceP2p>& items) {
  const int r = comm.rank();
  const char* name = items.size() == 1 ? items[0].call.name : "chorusGroupEnd";
  const kc::IpcBackend& ipc = kc::ipc();
  void* stream = items[0].args.stream;
  std::vector<std::vector<char>> bufs(items.size());
  if (int rc = ipc.to_host(nullptr, nullptr, 0, stream); rc != 0)
    return report(copy_failed(name, r, "waiting for the stream", rc));
  for (size_t i = 0; i < items.size(); ++i) {
    const Args& a = items[i].args;
    bufs[i].resize(a.count * dtype_size(a.datatype));
    if (items[i].call.kind == OpKind::kSend)
      if (int rc = ipc.to_host(bufs[i].data(), a.sendbuff, bufs[i].size(), stream); rc != 0)
        return report(copy_failed(name, r, "copying sendbuff to host memory", rc));
  }
  chorusGroupStart();
  chorusResult_t rc = chorusSuccess;
  for (size_t i = 0; i < items.size() && rc == chorusSuccess; ++i) {
    Args host = items[i].args;
    host.stream = nullptr;
    if (items[i].call.kind == OpKind::kSend) {
      host.sendbuff = bufs[i].data();
    } else {
      host.recvbuff = bufs[i].data();
    }
    rc = run_op({name, items[i].call.kind, false}, h, host);
  }
  const chorusResult_t end = chorusGroupEnd();
  if (rc != chorusSuccess) return rc;
  if (end != chorusSuccess) return end;
  for (size_t i = 0; i < items.size(); ++i)
    if (items[i].call.kind == OpKind::kRecv && !bufs[i].empty())
      if (int e = ipc.to_device(items[i].args.recvbuff, bufs[i].data(), bufs[i].size(), stream);
          e != 0)
        return report(copy_failed(name, r, "copying into recvbuff", e));
  return chorusSuccess;
}

}  // namespace chorus::capi
