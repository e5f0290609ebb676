// ProcessGroupChorus: set-up, teardown and the operations on one tensor (process_group.h).
// The operations on lists of tensors are in process_group_lists.cc.
#include "process_group.h"

#include <c10/util/Exception.h>

#include <cstring>

namespace chorus_torch {

// module.cc: runs fn with Python's GIL released when this thread holds it.
void run_without_gil(const std::function<void()>& fn);

namespace {

[[noreturn]] void throw_chorus(const std::string& what, chorusResult_t rc) {
  TORCH_CHECK(false, "chorus: ", what, ": ", chorusGetErrorString(rc), ": ",
              chorusGetLastError(nullptr));
}

// Rank 0's unique id, through the group's store. The key counts creations over this store (each
// rank adds 1 once per creation), so a group re-created on the same store, or a store file left
// from an earlier job, never hands out an old id.
chorusUniqueId exchange_id(c10d::Store& store, int rank, int size) {
  const int64_t joined = store.add("chorus/joined", 1);
  const std::string key = "chorus/unique_id/" + std::to_string((joined - 1) / size);
  chorusUniqueId id;
  if (rank == 0) {
    if (chorusResult_t rc = chorusGetUniqueId(&id); rc != chorusSuccess)
      throw_chorus("init_process_group on rank 0", rc);
    const auto* b = reinterpret_cast<const uint8_t*>(&id);
    store.set(key, std::vector<uint8_t>(b, b + sizeof id));
  } else {
    const std::vector<uint8_t> v = store.get(key);
    TORCH_CHECK(v.size() == sizeof id, "chorus: init_process_group on rank ", rank, ": store key '",
                key, "' holds ", v.size(), " bytes, expected a chorus unique id of ", sizeof id);
    std::memcpy(&id, v.data(), sizeof id);
  }
  return id;
}

}  // namespace

ProcessGroupChorus::ProcessGroupChorus(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                       int size, std::chrono::milliseconds timeout)
    : PgBase(rank, size) {
  TORCH_CHECK(store, "chorus: init_process_group: no store");
  const chorusUniqueId id = exchange_id(*store, rank, size);
  chorusConfig_t config = CHORUS_CONFIG_INITIALIZER;
  config.timeout_seconds = std::chrono::duration<double>(timeout).count();
  if (chorusResult_t rc = chorusCommInitRankConfig(&comm_, size, id, rank, &config);
      rc != chorusSuccess)
    throw_chorus(what("init_process_group"), rc);
  completer_ = std::make_unique<Completer>();
#if !CHORUS_TORCH_2
  init();
#endif
}

namespace {

int comm_rank(chorusComm_t comm) {
  int r = -1;
  chorusCommUserRank(comm, &r);
  return r;
}

int comm_size(chorusComm_t comm) {
  int n = 0;
  chorusCommCount(comm, &n);
  return n;
}

}  // namespace

ProcessGroupChorus::ProcessGroupChorus(chorusComm_t comm)
    : PgBase(comm_rank(comm), comm_size(comm)), comm_(comm) {
  completer_ = std::make_unique<Completer>();
#if !CHORUS_TORCH_2
  init();
#endif
}

void ProcessGroupChorus::revoke() {
  if (chorusResult_t rc = chorusCommRevoke(comm_); rc != chorusSuccess)
    throw_chorus(what("revoke"), rc);
}

c10::intrusive_ptr<ProcessGroupChorus> ProcessGroupChorus::shrink(const std::vector<int>& exclude,
                                                                  bool agree) {
  chorusComm_t small = nullptr;
  const chorusResult_t rc = chorusCommShrink(comm_, exclude.empty() ? nullptr : exclude.data(),
                                             static_cast<int>(exclude.size()), &small, nullptr,
                                             agree ? CHORUS_SHRINK_AGREE : CHORUS_SHRINK_DEFAULT);
  if (rc != chorusSuccess) throw_chorus(what("shrink"), rc);
  return c10::make_intrusive<ProcessGroupChorus>(small);
}

ProcessGroupChorus::~ProcessGroupChorus() {
  // Completing queued Works may run Python callbacks (comm hooks), which take the GIL.
  run_without_gil([this] {
    completer_.reset();
    chorusCommDestroy(comm_);
  });
}

std::string ProcessGroupChorus::what(const char* call) const {
  return std::string(call) + " on rank " + std::to_string(getRank()) + " of " +
         std::to_string(getSize());
}

c10::intrusive_ptr<WorkChorus> ProcessGroupChorus::launch(
    const char* call, c10d::OpType type, Tensors outputs, Tensors keep,
    const std::function<chorusResult_t(chorusRequest_t*)>& submit, std::function<void()> after) {
  auto w = c10::make_intrusive<WorkChorus>(getRank(), type, what(call), std::move(outputs),
                                           std::move(keep));
  chorusRequest_t req = nullptr;
  if (chorusResult_t rc = submit(&req); rc != chorusSuccess) throw_chorus(w->what(), rc);
  w->add_request(req);
  w->set_after(std::move(after));
  completer_->push(w);
  return w;
}

ProcessGroupChorus::WorkPtr ProcessGroupChorus::broadcast(Tensors& tensors,
                                                          const c10d::BroadcastOptions& opts) {
  at::Tensor& t = single(tensors, "broadcast", "");
  TORCH_CHECK(opts.rootTensor == 0, "chorus: broadcast: rootTensor ", opts.rootTensor,
              " (one tensor per process)");
  const int root = static_cast<int>(opts.rootRank);
  Output out(t);
  if (getRank() == root && !out.buffer.is_same(t)) out.buffer.copy_(t);
  const Reduction m = moved_as(t);
  void* p = out.buffer.data_ptr();
  const size_t n = out.buffer.numel() * m.per_element;
  return launch(
      "broadcast", c10d::OpType::BROADCAST, {t}, {out.buffer},
      [&](chorusRequest_t* r) { return chorusIbroadcast(p, p, n, m.dtype, root, comm_, r); },
      [out] { out.finish(); });
}

ProcessGroupChorus::WorkPtr ProcessGroupChorus::allreduce(Tensors& tensors,
                                                          const c10d::AllreduceOptions& opts) {
  at::Tensor& t = single(tensors, "all_reduce", "");
  const Reduction red = reduction_for(t, opts.reduceOp, "all_reduce");
  Output out(t);
  if (!out.buffer.is_same(t)) out.buffer.copy_(t);
  void* p = out.buffer.data_ptr();
  const size_t n = out.buffer.numel() * red.per_element;
  return launch(
      "all_reduce", c10d::OpType::ALLREDUCE, {t}, {out.buffer},
      [&](chorusRequest_t* r) { return chorusIallReduce(p, p, n, red.dtype, red.op, comm_, r); },
      [out] { out.finish(); });
}

ProcessGroupChorus::WorkPtr ProcessGroupChorus::allreduce_coalesced(
    Tensors& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  TORCH_CHECK(!tensors.empty(), "chorus: all_reduce_coalesced: no tensors");
  check_tensor(tensors[0], "all_reduce_coalesced");
  const Reduction red = reduction_for(tensors[0], opts.reduceOp, "all_reduce_coalesced");
  for (size_t i = 0; i < tensors.size(); ++i) {
    check_tensor(tensors[i], "all_reduce_coalesced");
    TORCH_CHECK(tensors[i].scalar_type() == tensors[0].scalar_type(),
                "chorus: all_reduce_coalesced: tensor ", i, " has dtype ", tensors[i].scalar_type(),
                ", tensor 0 ", tensors[0].scalar_type(), " (one dtype per call)");
  }
  at::Tensor flat = flatten(tensors);
  void* p = flat.data_ptr();
  const size_t n = flat.numel() * red.per_element;
  Tensors outputs = tensors;
  return launch(
      "all_reduce_coalesced", c10d::OpType::ALLREDUCE_COALESCED, tensors, {flat},
      [&](chorusRequest_t* r) { return chorusIallReduce(p, p, n, red.dtype, red.op, comm_, r); },
      [flat, outputs] { unflatten(flat, outputs); });
}

ProcessGroupChorus::WorkPtr ProcessGroupChorus::reduce(Tensors& tensors,
                                                       const c10d::ReduceOptions& opts) {
  at::Tensor& t = single(tensors, "reduce", "");
  TORCH_CHECK(opts.rootTensor == 0, "chorus: reduce: rootTensor ", opts.rootTensor,
              " (one tensor per process)");
  const Reduction red = reduction_for(t, opts.reduceOp, "reduce");
  const int root = static_cast<int>(opts.rootRank);
  // Off the root the tensor is only read, as Gloo leaves it.
  Output out(t);
  if (!out.buffer.is_same(t)) out.buffer.copy_(t);
  void* p = out.buffer.data_ptr();
  void* recv = getRank() == root ? p : nullptr;
  const size_t n = out.buffer.numel() * red.per_element;
  return launch(
      "reduce", c10d::OpType::REDUCE, {t}, {out.buffer},
      [&](chorusRequest_t* r) {
        return chorusIreduce(p, recv, n, red.dtype, red.op, root, comm_, r);
      },
      [out, recv] {
        if (recv) out.finish();
      });
}

ProcessGroupChorus::WorkPtr ProcessGroupChorus::send(Tensors& tensors, int dst, int tag) {
  at::Tensor t = single(tensors, "send", "").contiguous();
  const Reduction m = moved_as(t);
  const void* p = t.data_ptr();
  const size_t n = t.numel() * m.per_element;
  return launch("send", c10d::OpType::SEND, {}, {t},
                [&](chorusRequest_t* r) { return chorusIsend(p, n, m.dtype, dst, tag, comm_, r); });
}

ProcessGroupChorus::WorkPtr ProcessGroupChorus::recv(Tensors& tensors, int src, int tag) {
  at::Tensor& t = single(tensors, "recv", "");
  Output out(t);
  const Reduction m = moved_as(t);
  void* p = out.buffer.data_ptr();
  const size_t n = t.numel() * m.per_element;
  return launch(
      "recv", c10d::OpType::RECV, {t}, {out.buffer},
      [&](chorusRequest_t* r) { return chorusIrecv(p, n, m.dtype, src, tag, comm_, r); },
      [out] { out.finish(); });
}

ProcessGroupChorus::WorkPtr ProcessGroupChorus::recvAnysource(Tensors&, int) {
  TORCH_CHECK(false, "chorus: ", what("recv"),
              ": receiving from any source is not supported (chorus matches messages by sender "
              "and order); pass src=");
}

ProcessGroupChorus::WorkPtr ProcessGroupChorus::barrier(const c10d::BarrierOptions&) {
  return launch("barrier", c10d::OpType::BARRIER, {}, {},
                [&](chorusRequest_t* r) { return chorusIbarrier(comm_, r); });
}

c10::intrusive_ptr<PgBase> create_process_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                int rank, int size,
                                                std::chrono::milliseconds timeout) {
  return c10::make_intrusive<ProcessGroupChorus>(store, rank, size, timeout);
}

}  // namespace chorus_torch
