// VMM memory by file descriptor (device_vmm.h).
#include "collectives/device_vmm.h"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>

#include "collectives/comm.h"
#include "collectives/device_freed.h"
#include "collectives/device_ops.h"
#include "common/log.h"
#include "common/socket.h"
#include "transport/fd_pass.h"

namespace chorus {

namespace kc = kernels::cuda;

struct VmmState {
  struct Exported {
    kc::VmmAllocation alloc;  // retained
    uint64_t id;
    std::vector<bool> sent;  // to each rank
  };
  struct Imported {
    void* at;
    uint64_t size;
  };
  std::vector<Exported> exported;
  std::map<std::pair<int, uint64_t>, Imported> imported;  // (rank, id) -> mapped here
  std::map<int, Fd> sockets;                              // by peer
  uint64_t ids = 0;                                       // given so far
  // The ids of allocations dropped from `exported` (their memory freed by the user), and what
  // each rank was told of them (vmm_announce).
  capi::devcall::FreeNews dropped{capi::devcall::kFreesRemembered};
  std::vector<uint64_t> told;
  bool full_said = false, used_said = false;
};

namespace {

constexpr char kMagic[8] = {'c', 'h', 'o', 'r', 'u', 's', 'V', 'M'};

struct VmmRecord {  // in an IpcHandle's bytes
  char magic[8];
  uint64_t id;
  uint64_t size;  // of the allocation
};
static_assert(sizeof(VmmRecord) <= sizeof(kc::IpcHandle::bytes));

VmmRecord record_of(const kc::IpcHandle& h) {
  VmmRecord v;
  std::memcpy(&v, h.bytes, sizeof v);
  return v;
}

// An entry leaves the registry: its retain ends, and its peers are told to unmap it.
void drop(VmmState& v, const VmmState::Exported& e) {
  kc::ipc().vmm_release(e.alloc.identity);
  v.dropped.add(e.id);
}

VmmState& state(DeviceIpc& st) {
  if (!st.vmm) st.vmm = std::make_shared<VmmState>();
  return *st.vmm;
}

// This rank's registry entry for the allocation now at `a`'s address: the same allocation (the
// same handle: the registry's retain keeps it from being another's), or a new entry; nullptr when
// the registry is full. Takes over a's retain when it keeps it, else ends it.
VmmState::Exported* registered(VmmState& v, const kc::VmmAllocation& a, int rank) {
  const kc::IpcBackend& ipc = kc::ipc();
  for (VmmState::Exported& e : v.exported)
    if (e.alloc.base == a.base && e.alloc.identity == a.identity && e.alloc.size == a.size) {
      ipc.vmm_release(a.identity);  // the registry holds one already
      return &e;
    }
  // An entry at the same address with another handle: that allocation was freed (only our
  // retain kept it): drop it.
  for (size_t i = 0; i < v.exported.size(); ++i)
    if (v.exported[i].alloc.base == a.base) {
      drop(v, v.exported[i]);
      v.exported.erase(v.exported.begin() + long(i));
      break;
    }
  if (v.exported.size() >= size_t(kMaxVmmLive)) {
    // Full: drop the entries whose allocation is gone from its address (freed by the user; only
    // the registry's retain keeps it).
    std::erase_if(v.exported, [&](const VmmState::Exported& e) {
      kc::VmmAllocation now;
      const int rc = ipc.vmm_identify(reinterpret_cast<const void*>(e.alloc.base), 1, &now);
      if (rc == 0) ipc.vmm_release(now.identity);
      if (rc == 0 && now.identity == e.alloc.identity) return false;
      drop(v, e);
      return true;
    });
  }
  if (v.exported.size() >= size_t(kMaxVmmLive)) {
    ipc.vmm_release(a.identity);
    if (!v.full_said) {
      v.full_said = true;
      log_info(
          "rank {}: more VMM allocations alive in device calls than this communicator maps by "
          "file descriptor at once ({}): the rest go through the bounce buffer",
          rank, kMaxVmmLive);
    }
    return nullptr;
  }
  v.exported.push_back({a, ++v.ids, {}});
  return &v.exported.back();
}

// A failure with peer q. Its socket may have ended because q failed, or died: the news of why
// (the watch channel's, or q's abort) usually follows within milliseconds and says more than a
// reset connection, so it is waited for a little and added.
Status fail(CommImpl& comm, int q, const std::string& what, const Status& s) {
  return with_peer_news(comm, Status(s.code() == Code::kOk ? Code::kSystemError : s.code(),
                                     fmt::format("rank {}: {} rank {} failed: {}", comm.rank(),
                                                 what, q, s.message())));
}

// fn(slice) with slices of at most 100 ms until it succeeds, fails otherwise than by a timeout,
// `deadline` passes, or the communicator fails (a peer that died is named by the watch channel
// within its deadline; its socket would only be given up at the communicator's timeout).
template <class T, class Fn>
Result<T> until(CommImpl& comm, Deadline deadline, Fn fn) {
  while (true) {
    Result<T> r = fn(Deadline::after_seconds(std::min(0.1, std::max(0.0, deadline.remaining()))));
    if (r.is_ok() || r.status().code() != Code::kTimeout || deadline.expired()) return r;
    if (Status e = comm.error(); !e.is_ok())
      return make_error(e.code(), "the communicator failed meanwhile: {}", e.message());
  }
}

// The pair's socket, set up at its first use: the lower rank listens, the higher connects.
Status pair_socket(CommImpl& comm, VmmState& v, int q, const std::vector<int32_t>& pids,
                   std::map<int, Fd>* listening, Deadline deadline) {
  const int r = comm.rank();
  if (v.sockets.count(q)) return Status::ok();
  const int lo = std::min(r, q), hi = std::max(r, q);
  const std::string name = fmt::format("v{:x}-{}-{}", comm.uid(), pids[lo], pids[hi]);
  if (r == lo) {
    Result<Fd> l = transport::fd_listen(name);
    if (!l.is_ok()) return fail(comm, q, "listening for descriptors of", l.status());
    (*listening)[q] = std::move(*l);
    return Status::ok();
  }
  Result<Fd> s =
      until<Fd>(comm, deadline, [&](Deadline d) { return transport::fd_connect(name, d); });
  if (!s.is_ok()) return fail(comm, q, "connecting to pass descriptors with", s.status());
  v.sockets[q] = std::move(*s);
  return Status::ok();
}

}  // namespace

bool is_vmm_handle(const kc::IpcHandle& h) {
  return std::memcmp(h.bytes, kMagic, sizeof kMagic) == 0;
}

bool vmm_describe(DeviceIpc& st, LocalBuffer& b, kc::IpcHandle* h, int rank) {
  const kc::IpcBackend& ipc = kc::ipc();
  if (ipc.vmm_identify == nullptr) return false;
  kc::VmmAllocation a;
  if (ipc.vmm_identify(b.user, b.bytes, &a) != 0) return false;
  VmmState& v = state(st);
  VmmState::Exported* e = registered(v, a, rank);
  if (e == nullptr) return false;
  VmmRecord rec{};
  std::memcpy(rec.magic, kMagic, sizeof kMagic);
  rec.id = e->id;
  rec.size = a.size;
  *h = {};
  std::memcpy(h->bytes, &rec, sizeof rec);
  h->offset = uint64_t(static_cast<const char*>(b.user) - reinterpret_cast<const char*>(a.base));
  b.at = const_cast<void*>(b.user);
  if (!v.used_said) {
    v.used_said = true;
    log_info(
        "rank {}: {} {} is VMM memory: its peers map it through its file descriptor (this "
        "line once per communicator)",
        rank, b.name, b.user);
  }
  return true;
}

namespace {

Status pass(CommImpl& comm, VmmState& v, const std::vector<VmmTransfer>& transfers,
            const std::vector<int32_t>& pids, Deadline deadline) {
  const int r = comm.rank();
  const kc::IpcBackend& ipc = kc::ipc();
  // What moves in this call, in list order: the first time a (peer, id) appears, if new.
  std::vector<std::pair<int, VmmState::Exported*>> sends;  // (to, entry)
  std::vector<std::pair<int, VmmRecord>> maps;             // (from, record)
  std::set<std::tuple<int, int, uint64_t>> seen;           // (from, to, id)
  for (const VmmTransfer& t : transfers) {
    if (t.from == t.to || (t.from != r && t.to != r)) continue;
    const VmmRecord rec = record_of(*t.handle);
    if (!seen.insert({t.from, t.to, rec.id}).second) continue;
    if (t.from == r) {
      for (VmmState::Exported& e : v.exported)
        if (e.id == rec.id) {
          e.sent.resize(size_t(comm.size()), false);
          if (!e.sent[size_t(t.to)]) sends.push_back({t.to, &e});
        }
    } else if (!v.imported.count({t.from, rec.id})) {
      maps.push_back({t.from, rec});
    }
  }
  if (sends.empty() && maps.empty()) return Status::ok();
  // Sockets: every listener first, then the connections, then the accepts (no pair waits on
  // another).
  std::map<int, Fd> listening;
  std::map<int, bool> peers;
  for (const auto& [q, e] : sends) peers[q] = true;
  for (const auto& [q, rec] : maps) peers[q] = true;
  for (const auto& [q, x] : peers)
    if (q > r)
      if (Status s = pair_socket(comm, v, q, pids, &listening, deadline); !s.is_ok()) return s;
  for (const auto& [q, x] : peers)
    if (q < r)
      if (Status s = pair_socket(comm, v, q, pids, &listening, deadline); !s.is_ok()) return s;
  for (auto& [peer, l] : listening) {
    const int q = peer, lfd = l.get();  // (a lambda of clang 14 takes no structured binding)
    Result<Fd> s = until<Fd>(
        comm, deadline, [&](Deadline d) { return transport::fd_accept(lfd, pids[size_t(q)], d); });
    if (!s.is_ok()) return fail(comm, q, "accepting the descriptor socket of", s.status());
    v.sockets[q] = std::move(*s);
  }
  // Every send before any receive: the messages are small, the socket buffers hold them.
  for (const auto& [q, e] : sends) {
    int fd = -1;
    if (int rc = ipc.vmm_export_fd(e->alloc.identity, &fd); rc != 0)
      return make_error(Code::kSystemError,
                        "rank {}: exporting a VMM allocation as a file descriptor failed: {}", r,
                        ipc.error_string(rc));
    Fd owned(fd);
    const int one[] = {fd};
    if (Status s = transport::send_fds(v.sockets[q].get(), e->id, one, deadline); !s.is_ok())
      return fail(comm, q, "passing a VMM allocation's descriptor to", s);
    e->sent[size_t(q)] = true;
  }
  for (const auto& [peer, rec] : maps) {
    const int q = peer, sock = v.sockets[q].get();
    Result<bool> readable = until<bool>(comm, deadline, [&](Deadline d) -> Result<bool> {
      Result<bool> w = poll_fd(sock, POLLIN, int(d.remaining() * 1000));
      if (w.is_ok() && !*w) return make_error(Code::kTimeout, "no descriptor from rank {}", q);
      return w;
    });
    if (!readable.is_ok())
      return fail(comm, q, "receiving a VMM allocation's descriptor from", readable.status());
    Result<transport::PassedFds> got = transport::recv_fds(sock, deadline);
    if (!got.is_ok())
      return fail(comm, q, "receiving a VMM allocation's descriptor from", got.status());
    if (got->tag != rec.id || got->fds.size() != 1)
      return make_error(Code::kRemoteError,
                        "rank {}: rank {} passed {} descriptor(s) of VMM allocation {}, expected "
                        "one of allocation {}",
                        r, q, got->fds.size(), got->tag, rec.id);
    void* at = nullptr;
    if (int rc = ipc.vmm_map(got->fds[0].get(), rec.size, &at); rc != 0)
      return make_error(Code::kSystemError,
                        "rank {}: mapping rank {}'s VMM allocation ({} bytes) failed: {}", r, q,
                        rec.size, ipc.error_string(rc));
    v.imported[{q, rec.id}] = {at, rec.size};
  }
  return Status::ok();
}

}  // namespace

Status vmm_pass(CommImpl& comm, DeviceIpc& st, const std::vector<VmmTransfer>& transfers,
                const std::vector<int32_t>& pids, Deadline deadline) {
  VmmState& v = state(st);
  Status s = pass(comm, v, transfers, pids, deadline);
  if (!s.is_ok()) v.sockets.clear();  // a peer waiting on this rank hears of it at once
  return s;
}

Result<void*> vmm_open(DeviceIpc& st, int q, const kc::IpcHandle& h) {
  const VmmRecord rec = record_of(h);
  VmmState& v = state(st);
  auto it = v.imported.find({q, rec.id});
  if (it == v.imported.end())
    return make_error(Code::kInternalError, "rank {}'s VMM allocation {} is not mapped here", q,
                      rec.id);
  return static_cast<char*>(it->second.at) + h.offset;
}

int vmm_announce(DeviceIpc& st, std::span<const int> to, std::span<uint64_t> out) {
  if (!st.vmm) return 0;
  return st.vmm->dropped.tell(st.vmm->told, to, out);
}

void vmm_unmap_dropped(DeviceIpc& st, int q, std::span<const uint64_t> ids) {
  if (!st.vmm || ids.empty()) return;
  for (uint64_t id : ids) {
    auto it = st.vmm->imported.find({q, id});
    if (it == st.vmm->imported.end()) continue;
    if (int rc = kc::ipc().vmm_unmap(it->second.at, it->second.size); rc != 0)
      log_warn(
          "unmapping rank {}'s freed VMM allocation at {} failed ({}): its memory stays "
          "held here",
          q, it->second.at, kc::ipc().error_string(rc));
    st.vmm->imported.erase(it);
  }
}

void vmm_unmap_imported(DeviceIpc& st, int rank) {
  if (!st.vmm) return;
  for (const auto& [key, m] : std::exchange(st.vmm->imported, {}))
    if (int rc = kc::ipc().vmm_unmap(m.at, m.size); rc != 0)
      log_warn(
          "rank {}: unmapping rank {}'s VMM allocation at {} failed ({}): its memory stays "
          "held here",
          rank, key.first, m.at, kc::ipc().error_string(rc));
}

void vmm_close(DeviceIpc& st) {
  if (!st.vmm) return;
  for (const VmmState::Exported& e : st.vmm->exported) kc::ipc().vmm_release(e.alloc.identity);
  st.vmm->exported.clear();
}

}  // namespace chorus
