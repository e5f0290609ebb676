// The C ABI (include/chorus/chorus.h), operations: send/recv, the collectives, their chorusI*
// forms, requests and groups. Every operation goes through run_op: the table-driven argument
// check (c_api_check.h), then a description and a body handed to the communicator. Nothing
// here throws (see CHORUS_CATCH_ALL in c_api_internal.h).
#include <algorithm>
#include <cctype>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "chorus/chorus.h"
#include "collectives/c_api_check.h"
#include "collectives/c_api_internal.h"
#include "collectives/comm.h"
#include "collectives/device_ops.h"
#include "collectives/group.h"
#include "collectives/prims.h"
#include "collectives/shared_allreduce.h"
#include "collectives/tune_measure.h"
#include "collectives/tuner.h"

using chorus::Algo;
using chorus::Code;
using chorus::CommImpl;
using chorus::OpCtx;
using chorus::OpDesc;
using chorus::OpKind;
using chorus::Status;
using chorus::capi::Args;
using chorus::capi::Call;
using chorus::capi::fail;
using chorus::capi::kAsync;
using chorus::capi::kBlocking;
using chorus::capi::live;
using chorus::capi::report;
using chorus::capi::run_op;

namespace {
constexpr uint64_t kRequestMagic = 0x7265712d6f6b2121ull;
// chorusGroupStart/End nesting and the calls gathered meanwhile (per thread, as in NCCL).
thread_local int t_group_depth = 0;
struct PendingGroupItem {
  chorusComm_t comm;
  chorus::GroupItem item;
};
thread_local std::vector<PendingGroupItem> t_group;
// The group's send/recv calls on device buffers (device_ops.h), run after its host calls.
struct PendingDeviceItem {
  chorusComm_t comm;
  chorus::capi::DeviceP2p item;
};
thread_local std::vector<PendingDeviceItem> t_device_group;
// The group's collectives (host or device buffers), checked when called and run at End in call
// order, before its sends and receives: on each communicator every rank's collectives come in
// one order, as outside a group. All-to-all-v's arrays are copied (the caller may free them).
struct PendingCollective {
  chorusComm_t comm;
  chorus::capi::Call call;
  chorus::capi::Args args;
  std::shared_ptr<std::vector<size_t>> per_rank;
};
thread_local std::vector<PendingCollective> t_group_collectives;
// The HostStage alive on this thread (c_api_internal.h), if any.
thread_local const chorus::capi::OpWrap* t_host_stage = nullptr;
}  // namespace

namespace chorus::capi {
HostStage::HostStage(OpWrap wrap) : wrap_(std::move(wrap)) {
  t_host_stage = &wrap_;
}
HostStage::~HostStage() {
  t_host_stage = nullptr;
}
}  // namespace chorus::capi

struct chorusRequest {
  uint64_t magic = kRequestMagic;
  std::shared_ptr<chorus::Request> work;
};

namespace {

// request == nullptr: a blocking call -- run inline when the communicator is idle, else queue
// and wait. Otherwise queue it and hand back a request. `Body` becomes a std::function (a heap
// allocation) only when queued: the inline path of a small call is mostly such costs.
// `stage`: this thread's HostStage's wrap (t_host_stage), read once by the caller.
template <typename Body>
chorusResult_t submit(CommImpl& c, const OpDesc& d, const Body& body, chorusRequest_t* request,
                      const chorus::capi::OpWrap* stage) {
  if (stage != nullptr) {  // a staged device call's: queued, not waited for
    auto w = c.submit(d, (*stage)(chorus::OpFn(body)));
    return w.is_ok() ? chorusSuccess : report(w.status());
  }
  if (request == nullptr) {
    Status s;
    if (c.try_run_inline(d, body, &s)) return report(s);
    auto w = c.submit(d, chorus::OpFn(body));
    if (!w.is_ok()) return report(w.status());
    (*w)->wait(-1);
    return report((*w)->status());
  }
  auto req = std::make_unique<chorusRequest>();  // first: nothing to undo if it cannot be had
  auto w = c.submit(d, chorus::OpFn(body));
  if (!w.is_ok()) return report(w.status());
  req->work = std::move(w.value());
  *request = req.release();
  return chorusSuccess;
}

bool ordered(Algo a) {
  return a == Algo::kDirect || a == Algo::kFold;
}

bool is_p2p(OpKind k) {
  return k == OpKind::kSend || k == OpKind::kRecv;
}

// The description every rank checks against its peers': sequence number, then what the call is
// and how the tuner runs it. Takes a sequence number, so only for calls that will run.
OpDesc describe_call(CommImpl& c, OpKind kind, const Args& a, const chorus::capi::Checked& k) {
  const chorus::capi::OpRule& rule = chorus::capi::rule_for(kind);
  OpDesc d{.kind = kind, .count = a.count, .dtype = a.datatype};
  if (rule.root) d.root = a.root;
  if (rule.reduction) d.redop = a.op;
  if (rule.peer) {
    d.peer = a.peer;
    d.tag = a.tag;
    d.seq = c.next_p2p_seq(a.peer, kind == OpKind::kSend);
    return d;
  }
  d.seq = c.next_collective_seq();
  // Gathers, scatters and all-to-all move each block once, straight to its rank: nothing to
  // tune. All-to-all-v's count is per pair (set in each pair's header).
  if (kind == OpKind::kAllToAllv) d.count = 0;
  if (kind == OpKind::kBarrier || kind == OpKind::kGather || kind == OpKind::kScatter ||
      kind == OpKind::kAllToAll || kind == OpKind::kAllToAllv)
    return d;
  const chorus::Tuned t = c.tune(kind, k.total_bytes);
  d.algo = t.algo;
  d.piece = t.piece;
  // Gathers and scatters run on channel 0 only; the others are cut into per-channel parts.
  if (kind != OpKind::kAllGather && kind != OpKind::kReduceScatter) d.nchannels = t.nchannels;
  return d;
}

// What runs an operation once it reaches the front of the communicator's queue (on the
// caller's thread or the progress thread). An exception inside becomes the operation's error.
struct OpBody {
  OpKind kind;
  const char* send;
  char* recv;
  size_t es;       // element size
  size_t bytes;    // send/recv
  uint32_t piece;  // broadcast
  const char* call;
  // All-to-all-v: sendcounts, sdispls, recvcounts, rdispls (nranks each), copied at call time.
  std::shared_ptr<const std::vector<size_t>> per_rank;

  Status operator()(OpCtx& ctx) const {
    try {
      return run(ctx);
    } catch (...) {
      return chorus::capi::status_from_exception(call);
    }
  }

  chorus::ExchangeLayout layout_v(int n) const {
    const size_t* v = per_rank->data();
    return {
        .send_counts = v, .send_displs = v + n, .recv_counts = v + 2 * n, .recv_displs = v + 3 * n};
  }

  Status run(OpCtx& ctx) const {
    const char* s = send;
    char* r = recv;
    switch (kind) {
      case OpKind::kSend:
        return chorus::run_send(ctx, s, bytes);
      case OpKind::kRecv:
        return chorus::run_recv(ctx, r, bytes);
      case OpKind::kBarrier:
        return chorus::run_barrier(ctx);
      case OpKind::kAllGather:
        return chorus::run_ring_allgather(ctx, s, r);
      case OpKind::kReduceScatter:
        if (ctx.desc().algo == Algo::kDirect) return chorus::run_ordered_reduce_scatter(ctx, s, r);
        return chorus::run_ring_reduce_scatter(ctx, s, r);
      case OpKind::kGather:
        return chorus::run_gather(ctx, s, r);
      case OpKind::kScatter:
        return chorus::run_scatter(ctx, s, r);
      case OpKind::kAllToAll:
        return chorus::run_pairwise_alltoall(ctx, s, r, {.count = ctx.desc().count});
      case OpKind::kAllToAllv:
        return chorus::run_pairwise_alltoall(ctx, s, r, layout_v(ctx.size()));
      default:
        break;
    }
    if (kind == OpKind::kAllReduce && ctx.comm().test_slow(ctx.desc().algo))
      std::this_thread::sleep_for(std::chrono::milliseconds(250));  // CHORUS_TEST_SLOW_ALGO
    // The rest are cut into per-channel parts; part b starts at element b.
    return chorus::run_parts(ctx, [&](OpCtx& part, uint64_t b, uint64_t n) {
      const char* sp = s ? s + b * es : nullptr;
      char* rp = r ? r + b * es : nullptr;
      switch (kind) {
        case OpKind::kBroadcast:
          return chorus::run_broadcast(part, sp, rp, n * es, piece);
        case OpKind::kReduce:
          if (ordered(part.desc().algo)) return chorus::run_ordered_reduce(part, sp, rp);
          return chorus::run_chain_reduce(part, sp, rp);
        default:
          break;
      }
      switch (part.desc().algo) {
        case Algo::kRing:
          return chorus::run_ring_allreduce(part, sp, rp);
        case Algo::kTree:
          return chorus::run_tree_allreduce(part, sp, rp);
        case Algo::kHier:
          return chorus::run_hier_allreduce(part, sp, rp);
        case Algo::kDirect:
        case Algo::kFold:
          return chorus::run_ordered_allreduce(part, sp, rp);
        default:
          return chorus::run_rd_allreduce(part, sp, rp);
      }
    });
  }
};

// A collective called inside a group: queued for chorusGroupEnd (its arguments already checked).
// Its I-form is refused: the group's End is what completes it.
chorusResult_t queue_collective(const Call& call, chorusComm_t h, const Args& a, int rank,
                                int nranks) {
  if (call.async) {
    std::string blocking = std::string(call.name).substr(7);  // "chorusIbroadcast" -> "broadcast"
    blocking[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(blocking[0])));
    return fail(Code::kInvalidUsage,
                "{} on rank {}: inside a group use chorus{} (chorusGroupEnd completes it)",
                call.name, rank, blocking);
  }
  PendingCollective p{h, call, a, nullptr};
  if (chorus::capi::rule_for(call.kind).per_rank) {
    p.per_rank = std::make_shared<std::vector<size_t>>();
    for (const size_t* arr : {a.sendcounts, a.sdispls, a.recvcounts, a.rdispls})
      p.per_rank->insert(p.per_rank->end(), arr, arr + nranks);
    const size_t* v = p.per_rank->data();
    const auto n = static_cast<size_t>(nranks);
    p.args.sendcounts = v;
    p.args.sdispls = v + n;
    p.args.recvcounts = v + 2 * n;
    p.args.rdispls = v + 3 * n;
  }
  t_group_collectives.push_back(std::move(p));
  return chorusSuccess;
}

// An exception inside a fused group operation becomes its error too.
chorus::OpFn guarded(chorus::OpFn fn, const char* call) {
  return [fn = std::move(fn), call](OpCtx& ctx) -> Status {
    try {
      return fn(ctx);
    } catch (...) {
      return chorus::capi::status_from_exception(call);
    }
  };
}

// All-to-all-v's four arrays in one block, so that an I-call's caller may free them at once.
std::shared_ptr<const std::vector<size_t>> copy_per_rank(const Args& a, int n) {
  auto v = std::make_shared<std::vector<size_t>>();
  v->reserve(4 * static_cast<size_t>(n));
  for (const size_t* arr : {a.sendcounts, a.sdispls, a.recvcounts, a.rdispls})
    v->insert(v->end(), arr, arr + n);
  return v;
}

// Device buffers (or a barrier with a stream): over CUDA IPC (device_ops.cc). chorusI*
// collectives run as the blocking ones on the legacy default stream and hand back a request that
// is already complete: what completes on the host is the enqueueing, as in NCCL (synchronize
// the stream to wait for the GPU). The point-to-point chorusI* calls are refused: two ranks
// that both Isend first would meet as a mismatch; device sends and receives go in a group.
chorusResult_t run_device_op(const Call& call, chorusComm_t h, const Args& a) {
  if (Status s = chorus::capi::check_form(call, a); !s.is_ok()) return report(s);
  auto c = live(h, call.name);
  if (!c.is_ok()) return report(c.status());
  CommImpl& comm = **c;
  if (is_p2p(call.kind)) {
    if (call.async)
      return fail(Code::kInvalidArgument,
                  "{} on rank {}: device buffers are sent by {} (between chorusGroupStart/End to "
                  "exchange both ways), as in NCCL; {} takes host memory",
                  call.name, comm.rank(), call.kind == OpKind::kSend ? "chorusSend" : "chorusRecv",
                  call.name);
    if (t_group_depth > 0) {
      auto k = chorus::capi::check_args(call, a, comm.rank(), comm.size(), true);
      if (!k.is_ok()) return report(k.status());
      t_device_group.push_back({h, {call, a}});
      return chorusSuccess;
    }
    return chorus::capi::device_p2p(h, comm, {{call, a}});
  }
  if (t_group_depth > 0) {
    auto k = chorus::capi::check_args(call, a, comm.rank(), comm.size(), true);
    if (!k.is_ok()) return report(k.status());
    return queue_collective(call, h, a, comm.rank(), comm.size());
  }
  auto req = call.async ? std::make_unique<chorusRequest>() : nullptr;
  chorusResult_t rc = chorus::capi::device_collective(h, comm, call, a);
  if (rc != chorusSuccess || !call.async) return rc;
  req->work = std::make_shared<chorus::Request>(OpDesc{.kind = call.kind});
  req->work->finish(Status::ok());
  *a.request = req.release();
  return chorusSuccess;
}

}  // namespace

namespace chorus::capi {

chorusResult_t run_op(const Call& call, chorusComm_t h, const Args& a) {
  if (chorus::capi::takes_device_path(call, a)) return run_device_op(call, h, a);
  if (Status s = chorus::capi::check_form(call, a); !s.is_ok()) return report(s);
  auto c = live(h, call.name);
  if (!c.is_ok()) return report(c.status());
  CommImpl& comm = **c;
  // Where the buffers live is known: takes_device_path() found no device memory among them.
  auto k = chorus::capi::check_args(call, a, comm.rank(), comm.size(), /*spaces_known=*/true);
  if (!k.is_ok()) return report(k.status());
  const bool in_group = t_group_depth > 0;
  if (in_group && !is_p2p(call.kind)) return queue_collective(call, h, a, comm.rank(), comm.size());
  if (in_group && call.async)
    return fail(Code::kInvalidUsage, "{} on rank {}: inside a group use {}", call.name, comm.rank(),
                call.kind == OpKind::kSend ? "chorusSend" : "chorusRecv");
  try {
    // chorusMemAlloc buffers on every rank: each byte moves once (shared_allreduce.cc).
    chorusResult_t shared = chorusSuccess;
    const chorus::capi::OpWrap* stage = t_host_stage;
    const bool plain = stage == nullptr;
    // (Each size test is also the callee's first: here it spares small calls the call.)
    if (plain && call.kind == OpKind::kAllReduce && !call.async &&
        k->block_bytes >= chorus::capi::kSharedMinBytes &&
        shared_all_reduce(h, comm, call, a, *k, &shared))
      return shared;
    if (plain && call.kind == OpKind::kAllReduce &&  // the first large one on shm: ring or direct?
        k->total_bytes >= chorus::kLargeInPlaceBytes)
      if (chorusResult_t m = measure_large_in_place(h, comm, k->total_bytes); m != chorusSuccess)
        return m;
    std::shared_ptr<const std::vector<size_t>> per_rank;
    if (rule_for(call.kind).per_rank) per_rank = copy_per_rank(a, comm.size());
    OpDesc d = describe_call(comm, call.kind, a, *k);
    if (in_group) {
      t_group.push_back({h, {d, a.sendbuff, a.recvbuff, k->block_bytes}});
      return chorusSuccess;
    }
    const OpBody body{call.kind,
                      static_cast<const char*>(a.sendbuff),
                      static_cast<char*>(a.recvbuff),
                      k->elem_size,
                      k->block_bytes,
                      d.piece,
                      call.name,
                      std::move(per_rank)};
    return submit(comm, d, body, call.async ? a.request : nullptr, stage);
  } catch (...) {
    // Half set up, perhaps (its sequence number taken): the communicator cannot go on.
    const Status s = status_from_exception(call.name);
    abort_after_exception(comm, s);
    return report(s);
  }
}

}  // namespace chorus::capi

namespace {

chorus::Result<chorusRequest_t> request_of(chorusRequest_t req, const char* call) {
  if (req == nullptr)
    return chorus::make_error(Code::kInvalidArgument, "{}: request is NULL", call);
  if (req->magic != kRequestMagic)
    return chorus::make_error(Code::kInvalidArgument,
                              "{}: request {} is not a chorus request (freed already?)", call,
                              static_cast<const void*>(req));
  return req;
}

}  // namespace

CHORUS_API chorusResult_t chorusSend(const void* sendbuff, size_t count, chorusDataType_t datatype,
                                     int peer, chorusComm_t comm, chorusStream_t stream) try {
  return run_op(
      {"chorusSend", OpKind::kSend, kBlocking}, comm,
      {.sendbuff = sendbuff, .count = count, .datatype = datatype, .peer = peer, .stream = stream});
}
CHORUS_CATCH_ALL

CHORUS_API chorusResult_t chorusRecv(void* recvbuff, size_t count, chorusDataType_t datatype,
                                     int peer, chorusComm_t comm, chorusStream_t stream) try {
  return run_op(
      {"chorusRecv", OpKind::kRecv, kBlocking}, comm,
      {.recvbuff = recvbuff, .count = count, .datatype = datatype, .peer = peer, .stream = stream});
}
CHORUS_CATCH_ALL

CHORUS_API chorusResult_t chorusBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                                          chorusDataType_t datatype, int root, chorusComm_t comm,
                                          chorusStream_t stream) try {
  return run_op({"chorusBroadcast", OpKind::kBroadcast, kBlocking}, comm,
                {.sendbuff = sendbuff,
                 .recvbuff = recvbuff,
                 .count = count,
                 .datatype = datatype,
                 .root = root,
                 .stream = stream});
}
CHORUS_CATCH_ALL

CHORUS_API chorusResult_t chorusBarrier(chorusComm_t comm, chorusStream_t stream) try {
  return run_op({"chorusBarrier", OpKind::kBarrier, kBlocking}, comm, {.stream = stream});
}
CHORUS_CATCH_ALL

CHORUS_API chorusResult_t chorusAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                                          chorusDataType_t datatype, chorusRedOp_t op,
                                          chorusComm_t comm, chorusStream_t stream) try {
  return run_op({"chorusAllReduce", OpKind::kAllReduce, kBlocking}, comm,
                {.sendbuff = sendbuff,
                 .recvbuff = recvbuff,
                 .count = count,
                 .datatype = datatype,
                 .op = op,
                 .stream = stream});
}
CHORUS_CATCH_ALL

CHORUS_API chorusResult_t chorusReduce(const void* sendbuff, void* recvbuff, size_t count,
                                       chorusDataType_t datatype, chorusRedOp_t op, int root,
                                       chorusComm_t comm, chorusStream_t stream) try {
  return run_op({"chorusReduce", OpKind::kReduce, kBlocking}, comm,
                {.sendbuff = sendbuff,
                 .recvbuff = recvbuff,
                 .count = count,
                 .datatype = datatype,
                 .op = op,
                 .root = root,
                 .stream = stream});
}
CHORUS_CATCH_ALL

CHORUS_API chorusResult_t chorusAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                                          chorusDataType_t datatype, chorusComm_t comm,
                                          chorusStream_t stream) try {
  return run_op({"chorusAllGather", OpKind::kAllGather, kBlocking}, comm,
                {.sendbuff = sendbuff,
                 .recvbuff = recvbuff,
                 .count = sendcount,
                 .datatype = datatype,
                 .stream = stream});
}
CHORUS_CATCH_ALL

CHORUS_API chorusResult_t chorusReduceScatter(const void* sendbuff, void* recvbuff,
                                              size_t recvcount, chorusDataType_t datatype,
                                              chorusRedOp_t op, chorusComm_t comm,
                                              chorusStream_t stream) try {
  return run_op({"chorusReduceScatter", OpKind::kReduceScatter, kBlocking}, comm,
                {.sendbuff = sendbuff,
                 .recvbuff = recvbuff,
                 .count = recvcount,
                 .datatype = datatype,
                 .op = op,
                 .stream = stream});
}
CHORUS_CATCH_ALL

CHORUS_API chorusResult_t chorusIsend(const void* sendbuff, size_t count, chorusDataType_t datatype,
                                      int peer, int tag, chorusComm_t comm,
                                      chorusRequest_t* request) try {
  return run_op({"chorusIsend", OpKind::kSend, kAsync}, comm,
                {.sendbuff = sendbuff,
                 .count = count,
                 .datatype = datatype,
                 .peer = peer,
                 .tag = tag,
                 .request = request});
}
CHORUS_CATCH_ALL

CHORUS_API chorusResult_t chorusIrecv(void* recvbuff, size_t count, chorusDataType_t datatype,
                                      int peer, int tag, chorusComm_t comm,
                                      chorusRequest_t* request) try {
  return run_op({"chorusIrecv", OpKind::kRecv, kAsync}, comm,
                {.recvbuff = recvbuff,
                 .count = count,
                 .datatype = datatype,
                 .peer = peer,
                 .tag = tag,
                 .request = request});
}
CHORUS_CATCH_ALL

CHORUS_API chorusResult_t chorusIbroadcast(const void* sendbuff, void* recvbuff, size_t count,
                                           chorusDataType_t datatype, int root, chorusComm_t comm,
                                           chorusRequest_t* request) try {
  return run_op({"chorusIbroadcast", OpKind::kBroadcast, kAsync}, comm,
                {.sendbuff = sendbuff,
                 .recvbuff = recvbuff,
                 .count = count,
                 .datatype = datatype,
                 .root = root,
                 .request = request});
}
CHORUS_CATCH_ALL

CHORUS_API chorusResult_t chorusIbarrier(chorusComm_t comm, chorusRequest_t* request) try {
  return run_op({"chorusIbarrier", OpKind::kBarrier, kAsync}, comm, {.request = request});
}
CHORUS_CATCH_ALL

CHORUS_API chorusResult_t chorusIallReduce(const void* sendbuff, void* recvbuff, size_t count,
                                           chorusDataType_t datatype, chorusRedOp_t op,
                                           chorusComm_t comm, chorusRequest_t* request) try {
  return run_op({"chorusIallReduce", OpKind::kAllReduce, kAsync}, comm,
                {.sendbuff = sendbuff,
                 .recvbuff = recvbuff,
                 .count = count,
                 .datatype = datatype,
                 .op = op,
                 .request = request});
}
CHORUS_CATCH_ALL

CHORUS_API chorusResult_t chorusIreduce(const void* sendbuff, void* recvbuff, size_t count,
                                        chorusDataType_t datatype, chorusRedOp_t op, int root,
                                        chorusComm_t comm, chorusRequest_t* request) try {
  return run_op({"chorusIreduce", OpKind::kReduce, kAsync}, comm,
                {.sendbuff = sendbuff,
                 .recvbuff = recvbuff,
                 .count = count,
                 .datatype = datatype,
                 .op = op,
                 .root = root,
                 .request = request});
}
CHORUS_CATCH_ALL

CHORUS_API chorusResult_t chorusIallGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                                           chorusDataType_t datatype, chorusComm_t comm,
                                           chorusRequest_t* request) try {
  return run_op({"chorusIallGather", OpKind::kAllGather, kAsync}, comm,
                {.sendbuff = sendbuff,
                 .recvbuff = recvbuff,
                 .count = sendcount,
                 .datatype = datatype,
                 .request = request});
}
CHORUS_CATCH_ALL

CHORUS_API chorusResult_t chorusIreduceScatter(const void* sendbuff, void* recvbuff,
                                               size_t recvcount, chorusDataType_t datatype,
                                               chorusRedOp_t op, chorusComm_t comm,
                                               chorusRequest_t* request) try {
  return run_op({"chorusIreduceScatter", OpKind::kReduceScatter, kAsync}, comm,
                {.sendbuff = sendbuff,
                 .recvbuff = recvbuff,
                 .count = recvcount,
                 .datatype = datatype,
                 .op = op,
                 .request = request});
}
CHORUS_CATCH_ALL

// ---- requests ----------------------------------------------------------------------------

CHORUS_API chorusResult_t chorusWait(chorusRequest_t request, double timeout_seconds) try {
  auto req = request_of(request, "chorusWait");
  if (!req.is_ok()) return report(req.status());
  auto seconds = chorus::capi::check_wait_timeout(timeout_seconds);
  if (!seconds.is_ok()) return report(seconds.status());
  if (!(*req)->work->wait(*seconds)) return chorusInProgress;
  return report((*req)->work->status());
}
CHORUS_CATCH_ALL

CHORUS_API chorusResult_t chorusTest(chorusRequest_t request, int* done) try {
  auto req = request_of(request, "chorusTest");
  if (!req.is_ok()) return report(req.status());
  if (!done) return fail(Code::kInvalidArgument, "chorusTest: done is NULL");
  *done = (*req)->work->test() ? 1 : 0;
  return *done ? report((*req)->work->status()) : chorusSuccess;
}
CHORUS_CATCH_ALL

CHORUS_API chorusResult_t chorusRequestFree(chorusRequest_t request) try {
  auto req = request_of(request, "chorusRequestFree");
  if (!req.is_ok()) return report(req.status());
  (*req)->magic = 0;
  delete *req;
  return chorusSuccess;
}
CHORUS_CATCH_ALL

// ---- groups ------------------------------------------------------------------------------

CHORUS_API chorusResult_t chorusGroupStart(void) try {
  ++t_group_depth;
  return chorusSuccess;
}
CHORUS_CATCH_ALL

namespace {

// One fused operation per communicator of the gathered calls, then waits for all of them.
chorusResult_t run_grouped(const std::vector<PendingGroupItem>& items) {
  std::vector<chorusComm_t> comms;  // distinct, in first-call order
  for (const auto& p : items)
    if (std::find(comms.begin(), comms.end(), p.comm) == comms.end()) comms.push_back(p.comm);
  std::vector<std::shared_ptr<chorus::Request>> works;
  chorusResult_t first = chorusSuccess;
  for (chorusComm_t h : comms) {
    std::vector<chorus::GroupItem> mine;
    for (const auto& p : items)
      if (p.comm == h) mine.push_back(p.item);
    auto c = live(h, "chorusGroupEnd");
    if (!c.is_ok()) {
      if (first == chorusSuccess) first = report(c.status());
      continue;
    }
    const uint64_t uid = (*c)->uid();
    chorus::OpFn fn = guarded([mine, uid](OpCtx& ctx) { return chorus::run_group(ctx, mine, uid); },
                              "chorusGroupEnd");
    if (t_host_stage != nullptr) fn = (*t_host_stage)(std::move(fn));  // not waited for
    auto w = (*c)->submit(mine.front().desc, std::move(fn));
    if (!w.is_ok()) {
      if (first == chorusSuccess) first = report(w.status());
      continue;
    }
    if (t_host_stage == nullptr) works.push_back(w.value());
  }
  for (auto& w : works) {
    w->wait(-1);
    if (first == chorusSuccess && !w->status().is_ok()) first = report(w->status());
  }
  return first;
}

// The group's collectives in call order: those on host buffers queued on their communicators as
// their I-forms (a thread that drives several communicators, as with chorusCommInitAll, queues
// a call on each before it waits for any), those on device buffers enqueued on their streams
// (the host exchange of each in turn); then the wait for the host ones. Every call runs even
// after one failed (its peers would wait for it otherwise; a failure that aborted the
// communicator fails the rest at once); the first error is the group's.
chorusResult_t run_group_collectives(const std::vector<PendingCollective>& calls) {
  chorusResult_t first = chorusSuccess;
  std::vector<chorusRequest_t> requests;
  for (const PendingCollective& p : calls) {
    chorusResult_t rc;
    if (chorus::capi::takes_device_path(p.call, p.args)) {
      rc = chorus::capi::run_op(p.call, p.comm, p.args);
    } else {
      chorusRequest_t req = nullptr;
      Args a = p.args;
      a.request = &req;
      rc = chorus::capi::run_op({p.call.name, p.call.kind, kAsync}, p.comm, a);
      if (rc == chorusSuccess) requests.push_back(req);
    }
    if (first == chorusSuccess) first = rc;
  }
  for (chorusRequest_t req : requests) {
    req->work->wait(-1);  // each operation is bounded by its communicator's timeout
    if (first == chorusSuccess && !req->work->status().is_ok()) first = report(req->work->status());
    req->magic = 0;
    delete req;
  }
  return first;
}

// The group's device sends and receives, one device_p2p per communicator.
chorusResult_t run_device_grouped(const std::vector<PendingDeviceItem>& items) {
  std::vector<chorusComm_t> comms;
  for (const auto& p : items)
    if (std::find(comms.begin(), comms.end(), p.comm) == comms.end()) comms.push_back(p.comm);
  chorusResult_t first = chorusSuccess;
  for (chorusComm_t h : comms) {
    std::vector<chorus::capi::DeviceP2p> mine;
    for (const auto& p : items)
      if (p.comm == h) mine.push_back(p.item);
    auto c = live(h, "chorusGroupEnd");
    chorusResult_t rc = c.is_ok() ? chorus::capi::device_p2p(h, **c, mine) : report(c.status());
    if (first == chorusSuccess) first = rc;
  }
  return first;
}

}  // namespace

CHORUS_API chorusResult_t chorusGroupEnd(void) try {
  if (t_group_depth == 0)
    return fail(Code::kInvalidUsage, "chorusGroupEnd without chorusGroupStart");
  if (--t_group_depth > 0) return chorusSuccess;
  std::vector<PendingGroupItem> items;
  items.swap(t_group);
  std::vector<PendingDeviceItem> device_items;
  device_items.swap(t_device_group);
  std::vector<PendingCollective> collectives;
  collectives.swap(t_group_collectives);
  try {
    chorusResult_t first = run_group_collectives(collectives);
    if (!items.empty()) {
      const chorusResult_t rc = run_grouped(items);
      if (first == chorusSuccess) first = rc;
    }
    if (first != chorusSuccess || device_items.empty()) return first;
    return run_device_grouped(device_items);
  } catch (...) {
    // Some calls may be queued and some not: every communicator of the group is aborted, so
    // its peers fail at once instead of waiting for the missing calls.
    const Status s = chorus::capi::status_from_exception("chorusGroupEnd");
    for (const auto& p : items)
      if (auto c = live(p.comm, "chorusGroupEnd"); c.is_ok())
        chorus::capi::abort_after_exception(**c, s);
    for (const auto& p : collectives)
      if (auto c = live(p.comm, "chorusGroupEnd"); c.is_ok())
        chorus::capi::abort_after_exception(**c, s);
    return report(s);
  }
}
CHORUS_CATCH_ALL
