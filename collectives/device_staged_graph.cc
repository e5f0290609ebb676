// Staged device collectives captured into CUDA graphs (device_stage.h, "Captured into a CUDA
// graph"). At the capture the ranks check that each captures the same call and agree on a slot
// (one all-gather on the communicator); the first capture splits off the replays' communicator
// and starts their thread. The stream's part, captured: copy the input into the call's page-locked
// memory; a host node that hands the call to the replays' thread; wait until the call's word is 1,
// reset it; copy the result back. The replays' thread runs each host part on the replays'
// communicator, in the order the host nodes ran, then writes the word -- also when the host part
// failed (the communicator is aborted then, and its error says why).
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "collectives/c_api_internal.h"
#include "collectives/comm.h"
#include "collectives/device_ops.h"
#include "collectives/op.h"
#include "common/log.h"
#include "kernels/cuda/ipc.h"

namespace chorus {

namespace kc = kernels::cuda;

struct CapturedStage;

struct Pinned {
  void* p = nullptr;
  size_t bytes = 0;
};

// The replays' thread and communicator of one communicator.
struct StagedReplays {
  chorusComm_t comm = nullptr;  // split off at the first staged capture
  CommImpl* parent = nullptr;   // alive until stage_graph_close, which joins the thread
  int device = -1;
  void* word = nullptr;  // StageState::word: the captured calls' words follow it
  std::mutex mu;
  std::condition_variable cv;
  std::deque<CapturedStage*> queue;  // host nodes that ran, in order
  bool closing = false;
  // Page-locked memory of destroyed graphs' calls: taken again by later captures, freed at the
  // next eager staged call or at destroy -- never during a capture (a free synchronises, which
  // CUDA refuses there, and a capture is where graphs are made and destroyed in a loop).
  std::vector<Pinned> unpinned;
  std::thread thread;
};

// One captured staged call: what each replay's host part runs.
struct CapturedStage {
  std::shared_ptr<StagedReplays> replays;
  std::shared_ptr<GraphSlots> slots;
  capi::Call call;
  capi::Args host;             // on `pinned`, no stream
  std::vector<size_t> arrays;  // all-to-all-v's counts and displacements, copied
  Pinned pinned;
  int slot = -1;
};

namespace {

void signal_word(const StagedReplays& r, int slot) {
  const uint32_t one = 1;
  if (int rc = kc::ipc().flags_release(r.device, stage_graph_word(r.word, slot), &one, 1); rc)
    log_warn("signalling a captured staged call's end failed: {}", kc::ipc().error_string(rc));
}

// The host node (a thread of CUDA's, no CUDA calls here): the replay's host part is due.
void on_replay(void* p) {
  auto* c = static_cast<CapturedStage*>(p);
  StagedReplays& r = *c->replays;
  std::lock_guard<std::mutex> lock(r.mu);
  if (r.closing) return;  // a replay after destroy: nothing runs it
  r.queue.push_back(c);
  r.cv.notify_one();
}

void run_replays(std::shared_ptr<StagedReplays> r) {
  for (;;) {
    CapturedStage* c = nullptr;
    bool closing = false;
    {
      std::unique_lock<std::mutex> lock(r->mu);
      r->cv.wait(lock, [&] { return r->closing || !r->queue.empty(); });
      if (r->queue.empty()) return;
      c = r->queue.front();
      r->queue.pop_front();
      closing = r->closing;
    }
    // A failure the communicator does not know of yet: it fails, saying why (one it knows of
    // already aborted the replays' communicator: its own error says why).
    if (!closing && capi::run_op(c->call, r->comm, c->host) != chorusSuccess &&
        r->parent->error().is_ok()) {
      const Status why(Code::kRemoteError,
                       fmt::format("{} on rank {}: a replay of it, captured in a CUDA graph, "
                                   "failed: {}",
                                   c->call.name, r->parent->rank(), chorusGetLastError(r->comm)));
      log_error("{}", why.message());
      capi::abort_after_exception(*r->parent, why);
    }
    signal_word(*r, c->slot);  // also when it failed or was skipped: its stream goes on
  }
}

// CUDA's destructor of the graph's user object (no CUDA calls here): the slot comes back, the
// page-locked memory is freed later, on a thread of ours.
void release_captured(void* p) {
  auto* c = static_cast<CapturedStage*>(p);
  c->slots->calls.fetch_or(uint64_t(1) << c->slot);
  if (c->pinned.p != nullptr) {
    std::lock_guard<std::mutex> lock(c->replays->mu);
    c->replays->unpinned.push_back(c->pinned);
  }
  delete c;
}

void free_unpinned(StagedReplays& r) {
  std::vector<Pinned> gone;
  {
    std::lock_guard<std::mutex> lock(r.mu);
    gone.swap(r.unpinned);
  }
  for (const Pinned& m : gone) kc::ipc().pinned_free(m.p);
}

// A capture's page-locked memory of at least `bytes`: the smallest destroyed graph's block that
// holds it, or a new one (nothing when 0).
int take_pinned(StagedReplays& r, size_t bytes, Pinned* out) {
  *out = {};
  if (bytes == 0) return 0;
  {
    std::lock_guard<std::mutex> lock(r.mu);
    auto best = r.unpinned.end();
    for (auto it = r.unpinned.begin(); it != r.unpinned.end(); ++it)
      if (it->bytes >= bytes && (best == r.unpinned.end() || it->bytes < best->bytes)) best = it;
    if (best != r.unpinned.end()) {
      *out = *best;
      r.unpinned.erase(best);
      return 0;
    }
  }
  out->bytes = bytes;
  return kc::ipc().pinned_alloc(bytes, &out->p);
}

// A block back to the pool (a capture that failed after taking it).
void give_pinned(StagedReplays& r, const Pinned& m) {
  if (m.p == nullptr) return;
  std::lock_guard<std::mutex> lock(r.mu);
  r.unpinned.push_back(m);
}

}  // namespace

void stage_graph_collect(StageState& st) {
  std::shared_ptr<StagedReplays> r;
  {
    std::lock_guard<std::mutex> lock(st.mu);
    r = st.replays;
  }
  if (r) free_unpinned(*r);
}

void stage_graph_release(StageState& st) {
  std::shared_ptr<StagedReplays> r;
  {
    std::lock_guard<std::mutex> lock(st.mu);
    r = st.replays;
  }
  if (r) chorusCommAbort(r->comm);
  void* word = st.word.load();
  const int live = st.graph_live.load();
  if (word != nullptr && live > 0)
    start_keeper(st.keeper, st.device, {{stage_graph_word(word, 0), size_t(live)}});
}

void stage_graph_close(StageState& st) {
  stop_keeper(st.keeper);
  std::shared_ptr<StagedReplays> r;
  {
    std::lock_guard<std::mutex> lock(st.mu);
    r.swap(st.replays);
  }
  if (!r) return;
  {
    std::lock_guard<std::mutex> lock(r->mu);
    r->closing = true;
  }
  r->cv.notify_all();
  r->thread.join();  // it ends its host part (bounded by the timeout), then skips the rest
  chorusCommDestroy(r->comm);
  free_unpinned(*r);
}

}  // namespace chorus

namespace chorus::capi {

namespace {

// What each rank tells the others at a staged capture.
struct CaptureHello {
  int32_t kind, datatype, op, root;
  uint64_t count;
  uint64_t free;  // its free slots
};

}  // namespace

chorusResult_t staged_capture(chorusComm_t h, CommImpl& comm, const Call& call, const Args& a,
                              const StagedBytes& bytes) {
  const int r = comm.rank(), p = comm.size();
  const kc::IpcBackend& ipc = kc::ipc();
  StageState& st = comm.device_ipc().stage;
  const bool v = call.kind == OpKind::kAllToAllv;
  // Every rank captures this call (a rank that does not runs its host collective instead, and
  // the two meet as a mismatch), and the slot: the lowest free on every rank.
  CaptureHello me{int32_t(call.kind),          a.datatype, a.op, a.root, v ? 0 : uint64_t(a.count),
                  st.graph_slots->calls.load()};
  std::vector<CaptureHello> all(p);
  if (chorusResult_t rc = run_op(
          {call.name, OpKind::kAllGather, false}, h,
          {.sendbuff = &me, .recvbuff = all.data(), .count = sizeof me, .datatype = chorusUint8});
      rc != chorusSuccess) {
    const Status s(Code::kInvalidUsage,
                   fmt::format("{} on rank {}: its stream is being captured into a CUDA graph, "
                               "and every rank must capture the call (one that does not runs its "
                               "host collective, which meets this capture's exchange as a "
                               "mismatch): {}",
                               call.name, r, chorusGetLastError(h)));
    abort_after_exception(comm, s);
    return report(s);
  }
  uint64_t common = ~uint64_t(0);
  for (int q = 0; q < p; ++q) {
    const CaptureHello& x = all[q];
    if (x.kind != me.kind || x.datatype != me.datatype || x.op != me.op || x.root != me.root ||
        x.count != me.count) {
      // Failed on every rank (the communicator too: a rank that did not capture may have taken
      // the exchange for its own all-gather, whose results are then void).
      const Status s(Code::kInvalidUsage,
                     fmt::format("{} on rank {}: ranks disagree on a call captured into a CUDA "
                                 "graph: rank {} captures {} count {}, rank {} {} count {}",
                                 call.name, r, r, op_name(static_cast<OpKind>(me.kind)), me.count,
                                 q, op_name(static_cast<OpKind>(x.kind)), x.count));
      abort_after_exception(comm, s);
      return report(s);
    }
    common &= x.free;
  }
  const int slot = nth_free(common, 0);
  if (slot < 0)
    return fail(Code::kInvalidUsage, "{}",
                no_free_slot(fmt::format("{} on rank {}", call.name, r), "staged device call",
                             "every rank"));
  // The replays' communicator and thread, at the first capture.
  std::shared_ptr<StagedReplays> replays;
  {
    std::lock_guard<std::mutex> lock(st.mu);
    replays = st.replays;
  }
  if (!replays) {
    chorusComm_t g = nullptr;
    if (chorusResult_t rc = chorusCommSplit(h, 0, r, &g); rc != chorusSuccess) {
      abort_after_exception(
          comm, Status(Code::kSystemError, fmt::format("{} on rank {}: splitting off the "
                                                       "communicator of captured calls' replays "
                                                       "failed: {}",
                                                       call.name, r, chorusGetLastError(h))));
      return rc;
    }
    replays = std::make_shared<StagedReplays>();
    replays->comm = g;
    replays->parent = &comm;
    replays->device = st.device;
    replays->word = st.word.load();
    replays->thread = std::thread(run_replays, replays);
    std::lock_guard<std::mutex> lock(st.mu);
    st.replays = replays;
  }
  auto broken = [&](const char* what, int rc) {
    const Status s(Code::kSystemError, fmt::format("{} on rank {}: capturing a staged call: {} "
                                                   "failed: {}",
                                                   call.name, r, what, ipc.error_string(rc)));
    abort_after_exception(comm, s);  // the peers captured theirs: they would wait for this one
    return report(s);
  };
  // Its page-locked memory, and what each replay's host part runs.
  auto c = std::make_unique<CapturedStage>();
  c->replays = replays;
  c->slots = st.graph_slots;
  c->call = {call.name, call.kind, false};
  c->slot = slot;
  if (int rc = take_pinned(*replays, bytes.out_at + bytes.out, &c->pinned); rc != 0)
    return broken("allocating page-locked memory", rc);
  char* base = static_cast<char*>(c->pinned.p);
  c->host = a;
  c->host.stream = nullptr;
  c->host.request = nullptr;
  c->host.sendbuff = bytes.uses_send ? base + bytes.in_at : nullptr;
  c->host.recvbuff = bytes.uses_recv ? base + bytes.out_at : nullptr;
  if (v) {
    for (const size_t* arr : {a.sendcounts, a.sdispls, a.recvcounts, a.rdispls})
      c->arrays.insert(c->arrays.end(), arr, arr + p);
    c->host.sendcounts = c->arrays.data();
    c->host.sdispls = c->arrays.data() + p;
    c->host.recvcounts = c->arrays.data() + 2 * p;
    c->host.rdispls = c->arrays.data() + 3 * p;
  }
  // The graph holds it: its slot and memory come back when CUDA destroys the graph.
  CapturedStage* held = c.get();
  if (int rc = ipc.graph_destructor(a.stream, release_captured, held); rc != 0) {
    give_pinned(*replays, c->pinned);
    return broken("attaching the call to the CUDA graph", rc);
  }
  c.release();  // the graph's now
  st.graph_slots->calls.fetch_and(~(uint64_t(1) << slot));
  st.graph_live.store(std::max(st.graph_live.load(), slot + 1));
  // The stream's part.
  uint32_t* word = stage_graph_word(st.word.load(), slot);
  if (int rc = ipc.to_host_async(base + bytes.in_at, a.sendbuff, bytes.in, a.stream); rc != 0)
    return broken("copying sendbuff to host memory", rc);
  if (int rc = ipc.host_func(a.stream, on_replay, held); rc != 0)
    return broken("handing the host part to the replays' thread", rc);
  if (int rc = ipc.wait_u32_geq(a.stream, word, 1); rc != 0)
    return broken("waiting for the host part", rc);
  if (int rc = ipc.write_u32(a.stream, word, 0); rc != 0)
    return broken("resetting the host part's word", rc);
  for (int q = 0; q < (v ? p : 1) && bytes.out > 0; ++q) {
    const size_t at = v ? a.rdispls[q] * bytes.elem_size : 0,
                 n = v ? a.recvcounts[q] * bytes.elem_size : bytes.out;
    if (n == 0) continue;
    if (int rc = ipc.to_device(static_cast<char*>(a.recvbuff) + at, base + bytes.out_at + at, n,
                               a.stream);
        rc != 0)
      return broken("copying the result to recvbuff", rc);
  }
  return chorusSuccess;
}

}  // namespace chorus::capi
