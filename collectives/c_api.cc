// The C ABI (include/chorus/chorus.h): argument checks, handles, and the bridge to Comm.
// Nothing here throws; every failure is a chorusResult_t plus a message for chorusGetLastError.
#include <atomic>
#include <cstring>
#include <limits>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "chorus/chorus.h"
#include "collectives/comm.h"
#include "collectives/group.h"
#include "collectives/prims.h"
#include "collectives/job.h"
#include "collectives/tuner.h"
#include "common/env.h"
#include "common/log.h"

#define CHORUS_API extern "C" __attribute__((visibility("default")))

using chorus::Code;
using chorus::Comm;
using chorus::OpCtx;
using chorus::OpDesc;
using chorus::OpKind;
using chorus::Status;
using chorus::Algo;

namespace {
constexpr uint64_t kCommMagic = 0x636f6d6d2d6f6b21ull;
constexpr uint64_t kRequestMagic = 0x7265712d6f6b2121ull;
thread_local std::string t_last_error;
// chorusGroupStart/End nesting and the calls gathered meanwhile (per thread, as in NCCL).
thread_local int t_group_depth = 0;
struct PendingGroupItem {
  chorusComm_t comm;
  chorus::GroupItem item;
};
thread_local std::vector<PendingGroupItem> t_group;
}  // namespace

// Handles stay allocated after destroy (a few bytes each), so that a late call on a destroyed
// communicator is answered with an error instead of touching freed memory.
// Calls read `live` (one atomic load, no lock, no reference count); chorusCommAbort clears it
// but leaves the communicator allocated, so a thread still inside an operation is safe; only
// chorusCommDestroy frees it (using a communicator while destroying it is the caller's race).
struct chorusComm {
  uint64_t magic = kCommMagic;
  std::mutex mu;                      // destroy and abort
  std::shared_ptr<Comm> comm;         // owner, until chorusCommDestroy
  std::atomic<Comm*> live{nullptr};   // null once aborted or destroyed
  std::atomic<int> state{0};          // 0 usable, 1 aborted, 2 destroyed
};

struct chorusRequest {
  uint64_t magic = kRequestMagic;
  std::shared_ptr<chorus::Work> work;
};

namespace {

chorusResult_t to_result(Code c) { return static_cast<chorusResult_t>(static_cast<int>(c)); }

chorusResult_t report(const Status& s) {
  if (s.is_ok()) return chorusSuccess;
  t_last_error = s.message();
  return to_result(s.code());
}

template <typename... Args>
chorusResult_t fail(Code code, fmt::format_string<Args...> f, Args&&... args) {
  return report(Status(code, fmt::format(f, std::forward<Args>(args)...)));
}

// Resolves a handle to a live communicator, or says why not.
chorus::Result<Comm*> live(chorusComm_t h, const char* call) {
  if (h == nullptr) return chorus::make_error(Code::kInvalidArgument, "{}: comm is NULL", call);
  if (h->magic != kCommMagic) return chorus::make_error(Code::kInvalidArgument, "{}: comm is not a chorus communicator", call);
  Comm* c = h->live.load(std::memory_order_acquire);
  if (c) return c;
  return chorus::make_error(Code::kInvalidUsage, "{}: communicator was {}", call,
                            h->state.load() == 1 ? "aborted (chorusCommAbort)" : "destroyed (chorusCommDestroy)");
}

// Destroyed handles, kept (see chorusComm above) and reachable: retained on purpose, not leaked.
void retire_handle(chorusComm_t h) {
  static std::mutex mu;
  static auto* retired = new std::vector<chorusComm_t>();
  std::lock_guard<std::mutex> lock(mu);
  retired->push_back(h);
}

chorusComm_t new_handle(std::shared_ptr<Comm> c) {
  auto* h = new chorusComm();
  h->live.store(c.get());
  h->comm = std::move(c);
  return h;
}

chorus::Result<size_t> byte_count(size_t count, chorusDataType_t dt, const char* call, int rank) {
  size_t es = chorus::dtype_size(dt);
  if (es == 0) return chorus::make_error(Code::kInvalidArgument, "{} on rank {}: unknown datatype {}", call, rank, static_cast<int>(dt));
  if (count > std::numeric_limits<size_t>::max() / es)
    return chorus::make_error(Code::kInvalidArgument, "{} on rank {}: count {} overflows", call, rank, count);
  return count * es;
}


// out == nullptr: a blocking call -- run inline when the communicator is idle, else queue and wait.
chorusResult_t submit(chorusComm_t h, const char* call, OpDesc d, chorus::OpFn fn, chorusRequest_t* out) {
  auto c = live(h, call);
  if (!c.is_ok()) return report(c.status());
  if (t_group_depth > 0)
    return fail(Code::kInvalidUsage, "{} on rank {}: only chorusSend and chorusRecv may be grouped", call, (*c)->rank());
  if (out == nullptr) {
    Status s;
    if ((*c)->try_run_inline(d, fn, &s)) return report(s);
    auto w = (*c)->submit(d, std::move(fn));
    if (!w.is_ok()) return report(w.status());
    (*w)->wait(-1);
    return report((*w)->status());
  }
  auto w = (*c)->submit(d, std::move(fn));
  if (!w.is_ok()) return report(w.status());
  *out = new chorusRequest{kRequestMagic, std::move(w.value())};
  return chorusSuccess;
}

chorusResult_t check_peer(Comm& c, int peer, const char* call) {
  if (peer < 0 || peer >= c.size())
    return fail(Code::kInvalidArgument, "{} on rank {}: peer {} is outside 0..{}", call, c.rank(), peer, c.size() - 1);
  if (peer == c.rank())
    return fail(Code::kInvalidUsage, "{} on rank {}: peer {} is this rank (send/recv to self is not supported)", call, c.rank(), peer);
  return chorusSuccess;
}

chorusResult_t init_comm(chorus::Result<chorus::transport::Rendezvous> rdzv, chorusComm_t* out, const char* call) {
  if (!rdzv.is_ok()) return report(rdzv.status().wrap(call));
  double timeout = chorus::env_seconds("CHORUS_TIMEOUT", 300).is_ok() ? *chorus::env_seconds("CHORUS_TIMEOUT", 300) : 300;
  auto deadline = chorus::Deadline::after_seconds(timeout);
  int rank = rdzv->rank, size = rdzv->size;
  uint64_t uid = chorus::transport::hash64(rdzv->secret.data(), rdzv->secret.size());
  auto job = chorus::Job::create(std::move(rdzv.value()), deadline);
  if (!job.is_ok()) return report(job.status().wrap(call));
  std::vector<int> ranks(size);
  for (int i = 0; i < size; ++i) ranks[i] = i;
  auto comm = Comm::create(job.value(), "r", uid, rank, ranks, deadline);
  if (!comm.is_ok()) return report(comm.status().wrap(fmt::format("{} on rank {}", call, rank)));
  *out = new_handle(std::move(comm.value()));
  return chorusSuccess;
}

}  // namespace

CHORUS_API const char* chorusGetErrorString(chorusResult_t r) {
  switch (r) {
    case chorusSuccess: return "no error";
    case chorusUnhandledCudaError: return "unhandled cuda error";
    case chorusInProgress: return "operation in progress";
    default: return chorus::code_name(static_cast<Code>(r));
  }
}

CHORUS_API const char* chorusGetLastError(chorusComm_t) { return t_last_error.c_str(); }

CHORUS_API chorusResult_t chorusGetVersion(int* version) {
  if (!version) return fail(Code::kInvalidArgument, "chorusGetVersion: version is NULL");
  *version = CHORUS_VERSION_CODE;
  return chorusSuccess;
}

CHORUS_API chorusResult_t chorusGetUniqueId(chorusUniqueId* id) {
  if (!id) return fail(Code::kInvalidArgument, "chorusGetUniqueId: id is NULL");
  auto data = chorus::transport::make_unique_id();
  if (!data.is_ok()) return report(data.status().wrap("chorusGetUniqueId"));
  std::memcpy(id->internal, &data.value(), sizeof(chorus::transport::UniqueIdData));
  return chorusSuccess;
}

CHORUS_API chorusResult_t chorusCommInitRank(chorusComm_t* comm, int nranks, chorusUniqueId id, int rank) {
  if (!comm) return fail(Code::kInvalidArgument, "chorusCommInitRank: comm is NULL");
  chorus::transport::UniqueIdData data;
  std::memcpy(&data, id.internal, sizeof data);
  return init_comm(chorus::transport::rendezvous_from_id(data, rank, nranks), comm, "chorusCommInitRank");
}

CHORUS_API chorusResult_t chorusCommInitFromEnv(chorusComm_t* comm) {
  if (!comm) return fail(Code::kInvalidArgument, "chorusCommInitFromEnv: comm is NULL");
  double timeout = chorus::env_seconds("CHORUS_TIMEOUT", 300).is_ok() ? *chorus::env_seconds("CHORUS_TIMEOUT", 300) : 300;
  return init_comm(chorus::transport::rendezvous_from_env(chorus::Deadline::after_seconds(timeout)), comm,
                   "chorusCommInitFromEnv");
}

CHORUS_API chorusResult_t chorusCommDestroy(chorusComm_t h) {
  if (h == nullptr || h->magic != kCommMagic) return fail(Code::kInvalidArgument, "chorusCommDestroy: not a chorus communicator");
  std::shared_ptr<Comm> c;
  {
    std::lock_guard<std::mutex> lock(h->mu);
    if (!h->comm) return fail(Code::kInvalidUsage, "chorusCommDestroy: communicator was destroyed (chorusCommDestroy)");
    c = std::move(h->comm);
    h->live.store(nullptr);
    h->state.store(2);
  }
  retire_handle(h);
  return report(c->destroy());  // frees when c goes out of scope
}

// Fails the current and every later operation, here and (through the watch channel) on every
// peer. Call chorusCommDestroy afterwards to free the communicator.
CHORUS_API chorusResult_t chorusCommAbort(chorusComm_t h) {
  auto c = live(h, "chorusCommAbort");
  if (!c.is_ok()) return report(c.status());
  std::lock_guard<std::mutex> lock(h->mu);
  h->state.store(1);
  h->live.store(nullptr);
  (*c)->abort(fmt::format("rank {} aborted the communicator (chorusCommAbort)", (*c)->rank()));
  return chorusSuccess;
}

CHORUS_API chorusResult_t chorusCommGetAsyncError(chorusComm_t h, chorusResult_t* err) {
  if (!err) return fail(Code::kInvalidArgument, "chorusCommGetAsyncError: async_error is NULL");
  auto c = live(h, "chorusCommGetAsyncError");
  if (!c.is_ok()) return report(c.status());
  Status s = (*c)->error();
  *err = to_result(s.code());
  if (!s.is_ok()) t_last_error = s.message();
  return chorusSuccess;
}

CHORUS_API chorusResult_t chorusCommCount(const chorusComm_t h, int* count) {
  if (!count) return fail(Code::kInvalidArgument, "chorusCommCount: count is NULL");
  auto c = live(h, "chorusCommCount");
  if (!c.is_ok()) return report(c.status());
  *count = (*c)->size();
  return chorusSuccess;
}

CHORUS_API chorusResult_t chorusCommUserRank(const chorusComm_t h, int* rank) {
  if (!rank) return fail(Code::kInvalidArgument, "chorusCommUserRank: rank is NULL");
  auto c = live(h, "chorusCommUserRank");
  if (!c.is_ok()) return report(c.status());
  *rank = (*c)->rank();
  return chorusSuccess;
}

CHORUS_API chorusResult_t chorusCommSplit(chorusComm_t h, int color, int key, chorusComm_t* newcomm) {
  if (!newcomm) return fail(Code::kInvalidArgument, "chorusCommSplit: newcomm is NULL");
  auto c = live(h, "chorusCommSplit");
  if (!c.is_ok()) return report(c.status());
  if (color < 0 && color != CHORUS_SPLIT_NOCOLOR)
    return fail(Code::kInvalidArgument, "chorusCommSplit on rank {}: color {} (use >= 0 or CHORUS_SPLIT_NOCOLOR)", (*c)->rank(), color);
  auto n = (*c)->split(color, key);
  if (!n.is_ok()) return report(n.status().wrap(fmt::format("chorusCommSplit on rank {}", (*c)->rank())));
  *newcomm = nullptr;
  if (n.value()) *newcomm = new_handle(std::move(n.value()));
  return chorusSuccess;
}

static chorusResult_t do_Isend(const void* buf, size_t count, chorusDataType_t dt, int peer, int tag,
                                      chorusComm_t h, chorusRequest_t* req) {
  auto c = live(h, "chorusIsend");
  if (!c.is_ok()) return report(c.status());
  if (auto rc = check_peer(**c, peer, "chorusIsend")) return rc;
  auto bytes = byte_count(count, dt, "chorusIsend", (*c)->rank());
  if (!bytes.is_ok()) return report(bytes.status());
  if (!buf && count > 0) return fail(Code::kInvalidArgument, "chorusIsend on rank {}: sendbuff is NULL with count {}", (*c)->rank(), count);
  OpDesc d{OpKind::kSend, (*c)->next_p2p_seq(peer, true), count, dt, -1, -1, peer, tag};
  size_t n = *bytes;
  if (t_group_depth > 0) {
    if (req) return fail(Code::kInvalidUsage, "chorusIsend on rank {}: inside a group use chorusSend", (*c)->rank());
    t_group.push_back({h, {d, buf, nullptr, n}});
    return chorusSuccess;
  }
  return submit(h, "chorusIsend", d, [buf, n](OpCtx& ctx) { return chorus::run_send(ctx, buf, n); }, req);
}

static chorusResult_t do_Irecv(void* buf, size_t count, chorusDataType_t dt, int peer, int tag,
                                      chorusComm_t h, chorusRequest_t* req) {
  auto c = live(h, "chorusIrecv");
  if (!c.is_ok()) return report(c.status());
  if (auto rc = check_peer(**c, peer, "chorusIrecv")) return rc;
  auto bytes = byte_count(count, dt, "chorusIrecv", (*c)->rank());
  if (!bytes.is_ok()) return report(bytes.status());
  if (!buf && count > 0) return fail(Code::kInvalidArgument, "chorusIrecv on rank {}: recvbuff is NULL with count {}", (*c)->rank(), count);
  OpDesc d{OpKind::kRecv, (*c)->next_p2p_seq(peer, false), count, dt, -1, -1, peer, tag};
  size_t n = *bytes;
  if (t_group_depth > 0) {
    if (req) return fail(Code::kInvalidUsage, "chorusIrecv on rank {}: inside a group use chorusRecv", (*c)->rank());
    t_group.push_back({h, {d, nullptr, buf, n}});
    return chorusSuccess;
  }
  return submit(h, "chorusIrecv", d, [buf, n](OpCtx& ctx) { return chorus::run_recv(ctx, buf, n); }, req);
}

static chorusResult_t do_Ibroadcast(const void* send, void* recv, size_t count, chorusDataType_t dt,
                                           int root, chorusComm_t h, chorusRequest_t* req) {
  auto c = live(h, "chorusIbroadcast");
  if (!c.is_ok()) return report(c.status());
  int rank = (*c)->rank();
  if (root < 0 || root >= (*c)->size())
    return fail(Code::kInvalidArgument, "chorusBroadcast on rank {}: root {} is outside 0..{}", rank, root, (*c)->size() - 1);
  auto bytes = byte_count(count, dt, "chorusBroadcast", rank);
  if (!bytes.is_ok()) return report(bytes.status());
  if (count > 0 && (!recv || (rank == root && !send)))
    return fail(Code::kInvalidArgument, "chorusBroadcast on rank {}: {} is NULL with count {}", rank, recv ? "sendbuff" : "recvbuff", count);
  auto t = (*c)->tune(OpKind::kBroadcast, *bytes);
  OpDesc d{OpKind::kBroadcast, (*c)->next_collective_seq(), count, dt, root, -1, -1, 0, t.algo, t.piece, t.nchannels};
  size_t es = chorus::dtype_size(dt), cb = t.piece;
  return submit(h, "chorusBroadcast", d,
                [send, recv, es, cb](OpCtx& ctx) {
                  return chorus::run_parts(ctx, [&](OpCtx& part, uint64_t b, uint64_t n) {
                    const char* sp = send ? static_cast<const char*>(send) + b * es : nullptr;
                    return chorus::run_broadcast(part, sp, static_cast<char*>(recv) + b * es, n * es, cb);
                  });
                }, req);
}

static chorusResult_t do_Ibarrier(chorusComm_t h, chorusRequest_t* req) {
  auto c = live(h, "chorusIbarrier");
  if (!c.is_ok()) return report(c.status());
  OpDesc d{OpKind::kBarrier, (*c)->next_collective_seq(), 0, chorusUint8, -1, -1, -1, 0};
  return submit(h, "chorusBarrier", d, [](OpCtx& ctx) { return chorus::run_barrier(ctx); }, req);
}

CHORUS_API chorusResult_t chorusWait(chorusRequest_t req, double timeout_seconds) {
  if (!req || req->magic != kRequestMagic) return fail(Code::kInvalidArgument, "chorusWait: not a chorus request");
  if (!req->work->wait(timeout_seconds)) return chorusInProgress;
  return report(req->work->status());
}

CHORUS_API chorusResult_t chorusTest(chorusRequest_t req, int* done) {
  if (!req || req->magic != kRequestMagic || !done) return fail(Code::kInvalidArgument, "chorusTest: bad request or NULL done");
  *done = req->work->test() ? 1 : 0;
  return *done ? report(req->work->status()) : chorusSuccess;
}

CHORUS_API chorusResult_t chorusRequestFree(chorusRequest_t req) {
  if (!req || req->magic != kRequestMagic) return fail(Code::kInvalidArgument, "chorusRequestFree: not a chorus request");
  req->magic = 0;
  delete req;
  return chorusSuccess;
}

CHORUS_API chorusResult_t chorusSend(const void* buf, size_t count, chorusDataType_t dt, int peer, chorusComm_t h,
                                     chorusStream_t stream) {
  if (stream) return fail(Code::kInvalidArgument, "chorusSend: stream must be NULL for CPU buffers");
  return do_Isend(buf, count, dt, peer, 0, h, nullptr);
}

CHORUS_API chorusResult_t chorusRecv(void* buf, size_t count, chorusDataType_t dt, int peer, chorusComm_t h,
                                     chorusStream_t stream) {
  if (stream) return fail(Code::kInvalidArgument, "chorusRecv: stream must be NULL for CPU buffers");
  return do_Irecv(buf, count, dt, peer, 0, h, nullptr);
}

CHORUS_API chorusResult_t chorusBroadcast(const void* send, void* recv, size_t count, chorusDataType_t dt, int root,
                                          chorusComm_t h, chorusStream_t stream) {
  if (stream) return fail(Code::kInvalidArgument, "chorusBroadcast: stream must be NULL for CPU buffers");
  return do_Ibroadcast(send, recv, count, dt, root, h, nullptr);
}

CHORUS_API chorusResult_t chorusBarrier(chorusComm_t h, chorusStream_t stream) {
  if (stream) return fail(Code::kInvalidArgument, "chorusBarrier: stream must be NULL for CPU buffers");
  return do_Ibarrier(h, nullptr);
}

CHORUS_API chorusResult_t chorusIsend(const void* buf, size_t count, chorusDataType_t dt, int peer, int tag,
                                      chorusComm_t h, chorusRequest_t* req) {
  if (!req) return fail(Code::kInvalidArgument, "chorusIsend: request is NULL");
  return do_Isend(buf, count, dt, peer, tag, h, req);
}

CHORUS_API chorusResult_t chorusIrecv(void* buf, size_t count, chorusDataType_t dt, int peer, int tag,
                                      chorusComm_t h, chorusRequest_t* req) {
  if (!req) return fail(Code::kInvalidArgument, "chorusIrecv: request is NULL");
  return do_Irecv(buf, count, dt, peer, tag, h, req);
}

CHORUS_API chorusResult_t chorusIbroadcast(const void* send, void* recv, size_t count, chorusDataType_t dt,
                                           int root, chorusComm_t h, chorusRequest_t* req) {
  if (!req) return fail(Code::kInvalidArgument, "chorusIbroadcast: request is NULL");
  return do_Ibroadcast(send, recv, count, dt, root, h, req);
}

CHORUS_API chorusResult_t chorusIbarrier(chorusComm_t h, chorusRequest_t* req) {
  if (!req) return fail(Code::kInvalidArgument, "chorusIbarrier: request is NULL");
  return do_Ibarrier(h, req);
}

namespace {

// Checks shared by the reductions: a reducible type, a known op, buffers present.
chorus::Result<Comm*> check_reduction(chorusComm_t h, const char* call, const void* send,
                                                      const void* recv, size_t count, chorusDataType_t dt,
                                                      int op, bool need_recv) {
  auto c = live(h, call);
  if (!c.is_ok()) return c.status();
  int rank = (*c)->rank();
  if (!chorus::kernel_dtype(dt))
    return chorus::make_error(Code::kInvalidArgument, "{} on rank {}: datatype {} cannot be reduced (use f32, f64, f16, bf16, i32, i64 or u8)",
                              call, rank, chorus::dtype_name(dt));
  if (op >= 0 && !chorus::kernel_redop(op))
    return chorus::make_error(Code::kInvalidArgument, "{} on rank {}: unknown reduction op {}", call, rank, op);
  if (count > 0 && (!send || (need_recv && !recv)))
    return chorus::make_error(Code::kInvalidArgument, "{} on rank {}: {} is NULL with count {}", call, rank,
                              send ? "recvbuff" : "sendbuff", count);
  return c;
}

chorus::Result<chorus::Tuned> tune_for(Comm& c, OpKind kind, size_t bytes) { return c.tune(kind, bytes); }

}  // namespace

static chorusResult_t do_IallReduce(const void* send, void* recv, size_t count, chorusDataType_t dt,
                                    chorusRedOp_t op, chorusComm_t h, chorusRequest_t* req) {
  const char* call = "chorusAllReduce";
  auto c = check_reduction(h, call, send, recv, count, dt, op, true);
  if (!c.is_ok()) return report(c.status());
  auto t = tune_for(**c, OpKind::kAllReduce, count * chorus::dtype_size(dt));
  if (!t.is_ok()) return report(t.status().wrap(call));
  OpDesc d{OpKind::kAllReduce, (*c)->next_collective_seq(), count, dt, -1, op, -1, 0, t->algo, t->piece, t->nchannels};
  auto s = static_cast<const char*>(send);
  auto r = static_cast<char*>(recv);
  const size_t es = chorus::dtype_size(dt);
  return submit(h, call, d, [s, r, es](OpCtx& ctx) {
    return chorus::run_parts(ctx, [&](OpCtx& part, uint64_t b, uint64_t) {
      switch (part.desc().algo) {
        case Algo::kRing: return chorus::run_ring_allreduce(part, s + b * es, r + b * es);
        case Algo::kTree: return chorus::run_tree_allreduce(part, s + b * es, r + b * es);
        default: return chorus::run_rd_allreduce(part, s + b * es, r + b * es);
      }
    });
  }, req);
}

static chorusResult_t do_Ireduce(const void* send, void* recv, size_t count, chorusDataType_t dt, chorusRedOp_t op,
                                 int root, chorusComm_t h, chorusRequest_t* req) {
  const char* call = "chorusReduce";
  auto c0 = live(h, call);
  if (!c0.is_ok()) return report(c0.status());
  if (root < 0 || root >= (*c0)->size())
    return fail(Code::kInvalidArgument, "{} on rank {}: root {} is outside 0..{}", call, (*c0)->rank(), root, (*c0)->size() - 1);
  auto c = check_reduction(h, call, send, recv, count, dt, op, (*c0)->rank() == root);
  if (!c.is_ok()) return report(c.status());
  auto t = tune_for(**c, OpKind::kReduce, count * chorus::dtype_size(dt));
  if (!t.is_ok()) return report(t.status().wrap(call));
  OpDesc d{OpKind::kReduce, (*c)->next_collective_seq(), count, dt, root, op, -1, 0, t->algo, t->piece, t->nchannels};
  const size_t es = chorus::dtype_size(dt);
  auto s = static_cast<const char*>(send);
  auto r = static_cast<char*>(recv);
  return submit(h, call, d, [s, r, es](OpCtx& ctx) {
    return chorus::run_parts(ctx, [&](OpCtx& part, uint64_t b, uint64_t) {
      return chorus::run_chain_reduce(part, s + b * es, r ? r + b * es : nullptr);
    });
  }, req);
}

static chorusResult_t do_IallGather(const void* send, void* recv, size_t count, chorusDataType_t dt, chorusComm_t h,
                                    chorusRequest_t* req) {
  const char* call = "chorusAllGather";
  auto c = live(h, call);
  if (!c.is_ok()) return report(c.status());
  auto bytes = byte_count(count, dt, call, (*c)->rank());
  if (!bytes.is_ok()) return report(bytes.status());
  if (count > 0 && (!send || !recv))
    return fail(Code::kInvalidArgument, "{} on rank {}: {} is NULL with count {}", call, (*c)->rank(), send ? "recvbuff" : "sendbuff", count);
  auto t = tune_for(**c, OpKind::kAllGather, *bytes * (*c)->size());
  if (!t.is_ok()) return report(t.status().wrap(call));
  OpDesc d{OpKind::kAllGather, (*c)->next_collective_seq(), count, dt, -1, -1, -1, 0, t->algo, t->piece};
  auto s = static_cast<const char*>(send);
  auto r = static_cast<char*>(recv);
  return submit(h, call, d, [s, r](OpCtx& ctx) { return chorus::run_ring_allgather(ctx, s, r); }, req);
}

static chorusResult_t do_IreduceScatter(const void* send, void* recv, size_t count, chorusDataType_t dt,
                                        chorusRedOp_t op, chorusComm_t h, chorusRequest_t* req) {
  const char* call = "chorusReduceScatter";
  auto c = check_reduction(h, call, send, recv, count, dt, op, true);
  if (!c.is_ok()) return report(c.status());
  auto t = tune_for(**c, OpKind::kReduceScatter, count * chorus::dtype_size(dt) * (*c)->size());
  if (!t.is_ok()) return report(t.status().wrap(call));
  OpDesc d{OpKind::kReduceScatter, (*c)->next_collective_seq(), count, dt, -1, op, -1, 0, t->algo, t->piece};
  auto s = static_cast<const char*>(send);
  auto r = static_cast<char*>(recv);
  return submit(h, call, d, [s, r](OpCtx& ctx) { return chorus::run_ring_reduce_scatter(ctx, s, r); }, req);
}

#define CHORUS_CPU_STREAM(call) \
  if (stream) return fail(Code::kInvalidArgument, "{}: stream must be NULL for CPU buffers", call)
#define CHORUS_NEED_REQ(call) \
  if (!req) return fail(Code::kInvalidArgument, "{}: request is NULL", call)

CHORUS_API chorusResult_t chorusAllReduce(const void* send, void* recv, size_t count, chorusDataType_t dt,
                                          chorusRedOp_t op, chorusComm_t h, chorusStream_t stream) {
  CHORUS_CPU_STREAM("chorusAllReduce");
  return do_IallReduce(send, recv, count, dt, op, h, nullptr);
}
CHORUS_API chorusResult_t chorusIallReduce(const void* send, void* recv, size_t count, chorusDataType_t dt,
                                           chorusRedOp_t op, chorusComm_t h, chorusRequest_t* req) {
  CHORUS_NEED_REQ("chorusIallReduce");
  return do_IallReduce(send, recv, count, dt, op, h, req);
}
CHORUS_API chorusResult_t chorusReduce(const void* send, void* recv, size_t count, chorusDataType_t dt,
                                       chorusRedOp_t op, int root, chorusComm_t h, chorusStream_t stream) {
  CHORUS_CPU_STREAM("chorusReduce");
  return do_Ireduce(send, recv, count, dt, op, root, h, nullptr);
}
CHORUS_API chorusResult_t chorusIreduce(const void* send, void* recv, size_t count, chorusDataType_t dt,
                                        chorusRedOp_t op, int root, chorusComm_t h, chorusRequest_t* req) {
  CHORUS_NEED_REQ("chorusIreduce");
  return do_Ireduce(send, recv, count, dt, op, root, h, req);
}
CHORUS_API chorusResult_t chorusAllGather(const void* send, void* recv, size_t count, chorusDataType_t dt,
                                          chorusComm_t h, chorusStream_t stream) {
  CHORUS_CPU_STREAM("chorusAllGather");
  return do_IallGather(send, recv, count, dt, h, nullptr);
}
CHORUS_API chorusResult_t chorusIallGather(const void* send, void* recv, size_t count, chorusDataType_t dt,
                                           chorusComm_t h, chorusRequest_t* req) {
  CHORUS_NEED_REQ("chorusIallGather");
  return do_IallGather(send, recv, count, dt, h, req);
}
CHORUS_API chorusResult_t chorusReduceScatter(const void* send, void* recv, size_t count, chorusDataType_t dt,
                                              chorusRedOp_t op, chorusComm_t h, chorusStream_t stream) {
  CHORUS_CPU_STREAM("chorusReduceScatter");
  return do_IreduceScatter(send, recv, count, dt, op, h, nullptr);
}
CHORUS_API chorusResult_t chorusIreduceScatter(const void* send, void* recv, size_t count, chorusDataType_t dt,
                                               chorusRedOp_t op, chorusComm_t h, chorusRequest_t* req) {
  CHORUS_NEED_REQ("chorusIreduceScatter");
  return do_IreduceScatter(send, recv, count, dt, op, h, req);
}

CHORUS_API chorusResult_t chorusGroupStart(void) {
  ++t_group_depth;
  return chorusSuccess;
}

// Runs the gathered calls: one fused operation per communicator, then waits for all of them.
CHORUS_API chorusResult_t chorusGroupEnd(void) {
  if (t_group_depth == 0) return fail(Code::kInvalidUsage, "chorusGroupEnd without chorusGroupStart");
  if (--t_group_depth > 0) return chorusSuccess;
  std::vector<PendingGroupItem> items;
  items.swap(t_group);
  std::vector<std::shared_ptr<chorus::Work>> works;
  chorusResult_t first = chorusSuccess;
  while (!items.empty()) {
    chorusComm_t h = items.front().comm;
    std::vector<chorus::GroupItem> mine;
    std::vector<PendingGroupItem> rest;
    for (auto& p : items) (p.comm == h ? mine.push_back(p.item) : rest.push_back(p));
    items.swap(rest);
    auto c = live(h, "chorusGroupEnd");
    if (!c.is_ok()) {
      if (first == chorusSuccess) first = report(c.status());
      continue;
    }
    uint64_t uid = (*c)->uid();
    auto w = (*c)->submit(mine.front().desc, [mine, uid](OpCtx& ctx) { return chorus::run_group(ctx, mine, uid); });
    if (!w.is_ok()) {
      if (first == chorusSuccess) first = report(w.status());
      continue;
    }
    works.push_back(w.value());
  }
  for (auto& w : works) {
    w->wait(-1);
    if (first == chorusSuccess && !w->status().is_ok()) first = report(w->status());
  }
  return first;
}

CHORUS_API chorusResult_t chorusCommInitAll(chorusComm_t* comms, int ndev, const int* devlist) {
  (void)devlist;  // CPU communicators have no device
  if (!comms) return fail(Code::kInvalidArgument, "chorusCommInitAll: comms is NULL");
  if (ndev < 1) return fail(Code::kInvalidArgument, "chorusCommInitAll: ndev {} (need at least 1)", ndev);
  chorusUniqueId id;
  if (chorusResult_t rc = chorusGetUniqueId(&id)) return rc;
  std::vector<chorusResult_t> rcs(ndev, chorusSuccess);
  std::vector<std::string> errors(ndev);
  std::vector<std::thread> threads;
  for (int r = 0; r < ndev; ++r)
    threads.emplace_back([&, r] {
      rcs[r] = chorusCommInitRank(&comms[r], ndev, id, r);
      if (rcs[r] != chorusSuccess) errors[r] = t_last_error;
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < ndev; ++r)
    if (rcs[r] != chorusSuccess) {
      for (int q = 0; q < ndev; ++q)
        if (rcs[q] == chorusSuccess) chorusCommDestroy(comms[q]);
      t_last_error = errors[r];
      return rcs[r];
    }
  return chorusSuccess;
}
