// One rank's side of one device call (device_call.h).
#include "collectives/device_call.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <utility>
#include <vector>

#include "common/log.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/memory.h"

namespace chorus::capi::devcall {
namespace {

std::string where(const void* p) {
  kc::PointerInfo i = kc::classify_pointer(p);
  if (i.space == kc::MemSpace::kHost) return "host memory";
  return fmt::format("{} memory of CUDA device {}", kc::mem_space_name(i.space), i.device);
}

}  // namespace

std::string not_device_memory(const char* name, const void* p, int dev) {
  const kc::PointerInfo i = kc::classify_pointer(p);
  if (i.space == kc::MemSpace::kDevice && i.device == dev) return {};
  return fmt::format("{} {} is {}, {}: the buffers must be memory of the current device", name, p,
                     where(p),
                     dev < 0 ? std::string("and this process uses no CUDA device")
                             : fmt::format("the current device is {}", dev));
}

void set_why(Record& r, const std::string& why) {
  r.ok = 0;
  std::snprintf(r.why, sizeof r.why, "%s", why.c_str());
}

std::string ipc_error(int rc) {
  return kc::ipc().error_string(rc);
}

bool capturing(DeviceIpc& st, void* stream, Record& me) {
  int on = 0;
  const kc::IpcBackend& ipc = kc::ipc();
  if (int rc = ipc.capturing(stream, &on); rc != 0) {
    set_why(me, fmt::format("asking whether stream {} is being captured failed: {}", stream,
                            ipc_error(rc)));
    return false;
  }
  if (!on) return false;
  if (int rc = export_words(st, st.graph.flags, &me.graph_flags); rc != 0) {
    set_why(me, "exporting the flag words of captured calls failed: " + ipc_error(rc));
    return false;
  }
  return true;
}

// This rank's part of the record: the buffers it uses device memory of the current device,
// exported (memory that CUDA IPC cannot map: VMM allocations by file descriptor, device_vmm.h,
// the rest staged, device_bounce.h); its flag words allocated (at its first device call) and
// exported. `bufs` says where the GPU work finds each buffer.
void describe_self(DeviceIpc& st, CallBuffers& bufs, Record& me, int rank) {
  const kc::IpcBackend& ipc = kc::ipc();
  const int dev = ipc.current_device();
  me.ok = 1;
  me.pid = int32_t(getpid());
  me.owner = process_token();
  for (const LocalBuffer* b : {&bufs.send, &bufs.recv}) {
    if (!b->used) continue;
    if (std::string why = not_device_memory(b->name, b->user, dev); !why.empty())
      return set_why(me, why);
  }
  if (st.flags == nullptr) {
    // With the slots of captured calls behind them (device_graph.h): nothing is allocated while a
    // stream is being captured, where CUDA may not allow it, once an eager call has run.
    if (Status s = alloc_words(st, rank); !s.is_ok()) return set_why(me, s.message());
    st.graph.flags = static_cast<char*>(st.flags) + kFlagBytes;
    st.graph.host = st.host_words;
    st.graph.live_device.store(dev);
    st.graph.live.store(st.graph.flags);
    st.device = dev;
    st.live_device.store(dev);
    st.live_flags.store(st.flags);
    Result<std::optional<kc::GpuIdentity>> g = kc::current_gpu();
    if (g.is_ok() && g.value()) st.gpu = g.value()->uuid;
  }
  if (st.device != dev)
    return set_why(me, fmt::format("the current device is {}, but this communicator's device "
                                   "calls ran on device {}",
                                   dev, st.device));
  std::snprintf(me.gpu, sizeof me.gpu, "%s", st.gpu.c_str());
  if (int rc = export_words(st, st.flags, &me.flags); rc != 0)
    return set_why(me, "exporting its flag words failed: " + ipc_error(rc));
  me.host_words = st.host_words;
  for (auto [b, h] : {std::pair{&bufs.send, &me.send}, {&bufs.recv, &me.recv}}) {
    b->at = const_cast<void*>(b->user);
    if (!b->used || !b->shared) continue;
    const int rc = export_for_peers(b->user, h);
    if (rc == kc::kNotLegacyIpc && !vmm_describe(st, *b, h, rank)) {
      b->staged = true;
      b->handle = h;
    } else if (rc != 0 && rc != kc::kNotLegacyIpc) {
      return set_why(me, fmt::format("{} {} cannot be shared with other processes ({})", b->name,
                                     b->user, ipc_error(rc)));
    }
  }
}

// Where rank q's buffer of handle h is mapped here: by CUDA IPC, or its VMM allocation mapped by
// descriptor (device_vmm.h).
Result<void*> open_peer(DeviceIpc& st, int q, const kc::IpcHandle& h, bool captured) {
  if (is_vmm_handle(h)) return vmm_open(st, q, h);
  close_overlapped(h, captured ? &st.closes_later : nullptr);
  void* p = nullptr;
  if (int rc = kc::ipc().open(h, &p); rc != 0)
    return make_error(Code::kSystemError, "{}", ipc_error(rc));
  return p;
}

void announce(DeviceIpc& st, Record& me, std::span<const int> to) {
  me.nfreed = uint32_t(announce_frees(st.freed_told, to, me.freed));
  me.nvmm_gone = uint32_t(vmm_announce(st, to, me.vmm_gone));
}

void take_news(DeviceIpc& st, int q, const Record& rec, bool captured) {
  const auto freed = std::span(rec.freed).first(std::min<size_t>(rec.nfreed, kMaxAnnounced));
  const auto gone = std::span(rec.vmm_gone).first(std::min<size_t>(rec.nvmm_gone, kMaxAnnounced));
  if (captured) {
    if (!freed.empty() || !gone.empty())
      st.news_later.push_back(
          {q, rec.owner, {freed.begin(), freed.end()}, {gone.begin(), gone.end()}});
    return;
  }
  close_held_back(st);
  close_announced(rec.owner, freed);
  vmm_unmap_dropped(st, q, gone);
}

// VMM buffers go to the ranks of the call that lack them, before the GPU work.
Status pass_vmm(CommImpl& comm, DeviceIpc& st, std::vector<VmmTransfer> moves,
                std::vector<int32_t> pids) {
  if (moves.empty()) return Status::ok();
  return vmm_pass(comm, st, moves, pids, Deadline::after_seconds(comm.timeout_seconds()));
}

namespace {
std::atomic<Spoil> g_spoil_next{Spoil::kNone};
}  // namespace

void corrupt_next_record_for_test(Spoil how) {
  g_spoil_next.store(how);
}

std::optional<Record> maybe_corrupt_for_test(Record& me) {
  const Spoil how = g_spoil_next.exchange(Spoil::kNone);
  if (how == Spoil::kNone) return std::nullopt;
  const Record was = me;
  if (how == Spoil::kKind) me.kind = 99;
  if (how == Spoil::kWordsPid) {
    int32_t pid = 1;  // transport::SharedRef's first field
    std::memcpy(me.flags.bytes, &pid, sizeof pid);
  }
  return was;
}

Status check_record(const Record& rec, int q, int r, int p, const char* call) {
  auto ends = [](const char* s, size_t n) { return std::memchr(s, 0, n) != nullptr; };
  const int kind = rec.kind;
  std::string bad;
  if (rec.ok != 0 && rec.ok != 1)
    bad = fmt::format("ok is {}", rec.ok);
  else if (!ends(rec.why, sizeof rec.why) || !ends(rec.gpu, sizeof rec.gpu))
    bad = "a text runs past its field";
  else if (kind < int(OpKind::kSend) || kind > int(OpKind::kAllToAllv))
    bad = fmt::format("call kind {}", kind);
  else if (rec.datatype < 0 || rec.datatype >= chorusNumTypes)
    bad = fmt::format("data type {}", rec.datatype);
  else if (rec.op < -1 || rec.op > chorusAvg)
    bad = fmt::format("reduction op {}", rec.op);
  else if (rec.root < -1 || rec.root >= p)
    bad = fmt::format("root or peer {} of {} ranks", rec.root, p);
  else if (rec.graph < -1 || rec.graph >= std::max(kGraphSlots, kGraphPairSlots))
    bad = fmt::format("graph slot {}", rec.graph);
  else if (rec.nfreed > kMaxAnnounced || rec.nvmm_gone > kMaxAnnounced)
    bad = fmt::format("{} and {} freed allocations named, at most {} fit", rec.nfreed,
                      rec.nvmm_gone, kMaxAnnounced);
  else if (rec.host_words != 0 && rec.host_words != 1)
    bad = fmt::format("host_words is {}", rec.host_words);
  if (bad.empty()) return Status::ok();
  return make_error(Code::kRemoteError,
                    "{} on rank {}: rank {}'s record of the device call is corrupt: {} (a rank of "
                    "another chorus build, or damage on the way)",
                    call, r, q, bad);
}

std::string describe_call(const Record& x) {
  const OpKind k = static_cast<OpKind>(x.kind);
  std::string s = op_name(k);
  if (k == OpKind::kBarrier) return s;
  if (k == OpKind::kAllToAllv) return s + " of " + dtype_name(x.datatype);
  s += fmt::format(" of count {} of {}", x.count, dtype_name(x.datatype));
  if (k == OpKind::kAllReduce || k == OpKind::kReduce || k == OpKind::kReduceScatter)
    s += fmt::format(" by {}", redop_name(x.op));
  if (rule_for(k).root) s += fmt::format(" with root {}", x.root);
  return s;
}

// Checks a record after the exchange: a rank that could not take part fails every rank.
Status check_ok(const Record& rec, int q, int r, const char* call) {
  if (rec.ok) return Status::ok();
  return make_error(q == r ? Code::kInvalidArgument : Code::kRemoteError, "{} on rank {}: {}{}",
                    call, r, q == r ? "" : fmt::format("rank {}: ", q), rec.why);
}

// The end of a call whose work is enqueued: a failure of the communicator meanwhile (a peer died
// during the call, whose waits were released) voids it.
chorusResult_t finish(CommImpl& comm, const char* call) {
  Status e = comm.error();
  if (e.is_ok()) return chorusSuccess;
  return report(Status(e.code(), fmt::format("{} on rank {}: the communicator failed during the "
                                             "call, its results are void: {}",
                                             call, comm.rank(), e.message())));
}

// This communicator's per-rank state, sized at its first device call.
void size_state(DeviceIpc& st, int p) {
  if (!st.peer_flags.empty()) return;
  st.peer_flags.assign(p, nullptr);
  st.graph.live_ranks.store(p);
}

std::string staged_why(CommImpl& comm) {
  const int hosts = comm.hosts().nhosts();
  if (hosts != 1) return fmt::format("{} hosts; CUDA IPC maps memory of one host", hosts);
  if (std::string s = comm.ranks_sharing_a_process(); !s.empty())
    return s + "; CUDA IPC maps the memory of other processes only";
  if (comm.size() > kMaxDeviceRanks)
    return fmt::format("{} ranks; CUDA IPC here takes at most {}", comm.size(), kMaxDeviceRanks);
  return comm.gpus_unreachable();
}

bool staged(CommImpl& comm, const char* call) {
  const std::string why = staged_why(comm);
  if (why.empty()) return false;
  DeviceIpc& st = comm.device_ipc();
  if (!st.staged_said) {
    st.staged_said = true;
    log_info("rank {}: {} on device buffers: staged through host memory ({})", comm.rank(), call,
             why);
  }
  return true;
}

}  // namespace chorus::capi::devcall

namespace chorus {

int export_for_peers(const void* p, kernels::cuda::IpcHandle* out) {
  const int rc = kernels::cuda::ipc().export_buffer(p, out);
  if (rc != 0) return rc;
  out->owner = capi::devcall::process_token();
  capi::devcall::note_export(*out);
  return 0;
}

void close_held_back(DeviceIpc& st) {
  capi::devcall::close_later(st.closes_later);
  for (const DeviceIpc::PeerNews& n : std::exchange(st.news_later, {})) {
    capi::devcall::close_announced(n.owner, n.freed);
    vmm_unmap_dropped(st, n.rank, n.vmm_gone);
  }
}

}  // namespace chorus
