// Staged device calls captured into CUDA graphs (device_stage.h, "Captured into a CUDA graph").
// The first capture starts the replays' thread. At a collective's capture the ranks check that
// each captures the same call and agree on a slot (one all-gather on the communicator); the first
// such capture splits off the collectives' replays communicator. At the capture of sends and
// receives (one, or a group's) each pair checks that both sides capture matching calls (a message
// each way on the communicator); the first such capture of a pair starts making the pair's
// replays communicator, of the two ranks alone, on a thread of its own.
// The stream's part, captured: copy the inputs into the call's page-locked memory; a host node
// that hands the call to the replays' thread; wait until the call's word is 1, reset it; copy the
// results back. The replays' thread runs each host part on its communicator of replays (a group's
// sends and receives as a group), in the order the host nodes ran, then writes the word -- also
// when the host part failed (the communicator is aborted then, and its error says why).
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

#include "collectives/c_api_internal.h"
#include "collectives/comm.h"
#include "collectives/device_ops.h"
#include "collectives/op.h"
#include "common/clock.h"
#include "common/log.h"
#include "kernels/cuda/ipc.h"

namespace chorus {

namespace kc = kernels::cuda;

struct CapturedStage;

struct Pinned {
  void* p = nullptr;
  size_t bytes = 0;
};

// A peer's communicator of replays (CommImpl::pair), made by a thread of its own from the first
// capture of calls with that peer on: the peer makes its side when its capture of the matching
// calls gets there, and neither capture waits for the other (one that did could wait for a peer
// whose earlier capture waits, in its pair exchange, for a later one of this rank).
struct PairReplays {
  chorusComm_t comm = nullptr;
  std::string error;  // why making it failed
  bool made = false;  // comm or error set
  std::thread maker;
};

// The replays' thread and communicators of one communicator.
struct StagedReplays {
  CommImpl* parent = nullptr;  // alive until stage_graph_close, which joins the threads
  int device = -1;
  void* word = nullptr;    // StageState::word: the captured calls' words follow it
  bool host_word = false;  // StageState::host_word
  std::mutex mu;
  std::condition_variable cv;
  // Under mu:
  chorusComm_t comm = nullptr;       // collectives': split off at the first one's capture
  std::map<int, PairReplays> pairs;  // sends' and receives', by peer
  std::deque<std::shared_ptr<CapturedStage>> queue;  // host nodes that ran, in order
  bool closing = false;
  bool released = false;      // the communicator failed: no host part runs any more
  bool in_host_part = false;  // the thread runs one: the keeper starts once it has left
  // Page-locked memory of destroyed graphs' calls: taken again by later captures, freed at
  // destroy -- never during a capture or a call (a free may wait for the whole device, whose
  // streams may wait for this communicator's host parts; CUDA refuses it during a global-mode
  // capture; and a capture is where graphs are made and destroyed in a loop).
  std::vector<Pinned> unpinned;
  std::thread thread;
};

// One captured staged call -- a collective, or a send, a receive or a group of them: what each
// replay's host part runs. Held by the graph (a user object: release_captured) and by each queued
// replay: after a failure the keeper ends the stream's wait, so the graph may finish and be
// destroyed while the replays' thread still holds a replay of it. Its page-locked memory goes
// back to the pool with the last holder.
struct CapturedStage {
  std::shared_ptr<StagedReplays> replays;
  std::shared_ptr<GraphSlots> slots;
  const char* name = nullptr;
  std::vector<capi::DeviceP2p> ops;  // on `pinned`, no stream; sends and receives in a group
  bool p2p = false;
  std::vector<int> peers;      // of the sends and receives (their args.peer: the pair's numbering)
  std::vector<size_t> arrays;  // all-to-all-v's counts and displacements, copied
  Pinned pinned;
  int slot = -1;
  CapturedStage() = default;
  CapturedStage(const CapturedStage&) = delete;
  CapturedStage& operator=(const CapturedStage&) = delete;
  ~CapturedStage();
};
using HeldStage = std::shared_ptr<CapturedStage>;  // the graph's hold: its user object's payload

namespace {

void signal_word(const StagedReplays& r, int slot) {
  const uint32_t one = 1;
  if (int rc = write_words(r.host_word, r.device, stage_graph_word(r.word, slot), &one, 1); rc)
    log_warn("signalling a captured staged call's end failed: {}", kc::ipc().error_string(rc));
}

// The host node (a thread of CUDA's, no CUDA calls here): the replay's host part is due. `p`:
// the graph's HeldStage, alive while the graph is.
void on_replay(void* p) {
  const HeldStage& c = *static_cast<HeldStage*>(p);
  StagedReplays& r = *c->replays;
  std::lock_guard<std::mutex> lock(r.mu);
  if (r.closing) return;  // a replay after destroy: nothing runs it
  r.queue.push_back(c);
  r.cv.notify_all();
}

// The communicators a replay's host part runs on: the collectives', or each send's and
// receive's pair communicator once made (bounded: making one ends by the timeout).
chorusResult_t replays_comms(const CapturedStage& c, StagedReplays& r,
                             std::vector<chorusComm_t>* out) {
  std::unique_lock<std::mutex> lock(r.mu);
  if (!c.p2p) {
    out->push_back(r.comm);
    return chorusSuccess;
  }
  const double limit = r.parent->timeout_seconds() + 10;
  auto made = [&] {
    return std::all_of(c.peers.begin(), c.peers.end(), [&](int q) {
      auto it = r.pairs.find(q);
      return it != r.pairs.end() && it->second.made;
    });
  };
  if (!r.cv.wait_for(lock, std::chrono::duration<double>(limit),
                     [&] { return r.closing || r.released || made(); }))
    return capi::fail(Code::kTimeout,
                      "the communicators of replays with its peers were not made within {} s",
                      limit);
  for (int q : c.peers) {
    auto it = r.pairs.find(q);
    if (it == r.pairs.end() || !it->second.made)
      return capi::fail(Code::kAborted, "the communicator is failing or destroyed");
    const PairReplays& x = it->second;
    if (!x.error.empty())
      return capi::fail(Code::kRemoteError,
                        "making the communicator of replays with rank {} "
                        "failed: {}",
                        q, x.error);
    out->push_back(x.comm);
  }
  return chorusSuccess;
}

// One replay's host part, on the replays' communicators (a group's sends and receives as a
// group).
chorusResult_t run_host_part(const CapturedStage& c, StagedReplays& r) {
  std::vector<chorusComm_t> comms;
  if (chorusResult_t rc = replays_comms(c, r, &comms); rc != chorusSuccess) return rc;
  if (!c.p2p) return capi::run_op(c.ops[0].call, comms[0], c.ops[0].args);
  chorusGroupStart();
  chorusResult_t rc = chorusSuccess;
  for (size_t i = 0; i < c.ops.size() && rc == chorusSuccess; ++i)
    rc = capi::run_op(c.ops[i].call, comms[i], c.ops[i].args);
  const chorusResult_t end = chorusGroupEnd();
  return rc != chorusSuccess ? rc : end;
}

// After a failure, every used word of the captured calls to 1 until destroy (the keeper), so
// that their replays' streams go on, on void results.
void keep_words(StageState& st) {
  void* word = st.word.load();
  const int live = st.graph_live.load();
  if (word != nullptr && live > 0)
    start_keeper(st.keeper, st.device, {{stage_graph_word(word, 0), size_t(live), st.host_word}});
}

// The host part under way has left: nothing of this thread's touches page-locked memory any
// more. A failure meanwhile (stage_graph_release) left the keeper's start to this moment: a
// stream released before it could copy out of, or into, memory the aborted host part still used.
void host_part_left(StagedReplays& r) {
  std::lock_guard<std::mutex> lock(r.mu);
  r.in_host_part = false;
  if (r.released && !r.closing) keep_words(r.parent->device_ipc().stage);
}

// CHORUS_TEST_HOST_PART_LINGER_MS: a failed host part that is slow to leave, and writes the
// call's page-locked memory last, as a receive that ends late would.
void linger_for_test(const CapturedStage& c, const StagedReplays& r) {
  const int ms = r.parent->host_part_linger_ms_for_test();
  if (ms <= 0) return;
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  if (c.pinned.p != nullptr) std::memset(c.pinned.p, 0x7f, c.pinned.bytes);
}

void run_replays(std::shared_ptr<StagedReplays> r) {
  for (;;) {
    HeldStage c;  // let go outside the lock: the last holder takes it (~CapturedStage)
    bool skip = false;
    {
      std::unique_lock<std::mutex> lock(r->mu);
      r->cv.wait(lock, [&] { return r->closing || !r->queue.empty(); });
      if (r->queue.empty()) return;
      c = r->queue.front();
      r->queue.pop_front();
      skip = r->closing || r->released;
      r->in_host_part = !skip;
    }
    if (int lag = r->parent->replay_lag_ms_for_test(); lag > 0)  // CHORUS_TEST_REPLAY_LAG_MS
      std::this_thread::sleep_for(std::chrono::milliseconds(lag));
    const bool failed = !skip && run_host_part(*c, *r) != chorusSuccess;
    if (failed) linger_for_test(*c, *r);
    if (!skip) host_part_left(*r);
    // A failure the communicator does not know of yet: it fails, saying why (after one it knows
    // of, the host parts are skipped: its own error says why). Often it is a peer's abort of the
    // replays' communicator after that peer heard of the cause (a rank's death), which this
    // communicator then hears of within moments: that news wins if it comes within 2 s (as a
    // failed link waits for the news, engine.cc).
    if (failed) {
      std::unique_lock<std::mutex> lock(r->mu);
      r->cv.wait_for(lock, std::chrono::seconds(2), [&] { return r->released || r->closing; });
    }
    if (failed && r->parent->error().is_ok()) {
      const Status why(Code::kRemoteError,
                       fmt::format("{} on rank {}: a replay of it, captured in a CUDA graph, "
                                   "failed: {}",
                                   c->name, r->parent->rank(), chorusGetLastError(nullptr)));
      log_error("{}", why.message());
      capi::abort_after_exception(*r->parent, why);
    }
    signal_word(*r, c->slot);  // also when it failed or was skipped: its stream goes on
  }
}

// CUDA's destructor of the graph's user object (no CUDA calls here): the slot comes back; the
// call goes with its last holder.
void release_captured(void* p) {
  auto* held = static_cast<HeldStage*>(p);
  (*held)->slots->calls.fetch_or(uint64_t(1) << (*held)->slot);
  delete held;
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

}  // namespace

// Its page-locked memory back to the pool, for a later capture or destroy (no CUDA here: the
// last holder may be a thread of CUDA's).
CapturedStage::~CapturedStage() {
  if (pinned.p == nullptr || !replays) return;
  std::lock_guard<std::mutex> lock(replays->mu);
  replays->unpinned.push_back(pinned);
}

void stage_graph_release(StageState& st) {
  std::shared_ptr<StagedReplays> r;
  {
    std::lock_guard<std::mutex> lock(st.mu);
    r = st.replays;
  }
  bool running = false;
  if (r) {
    std::vector<chorusComm_t> comms;
    {
      std::lock_guard<std::mutex> lock(r->mu);
      r->released = true;
      running = r->in_host_part;
      comms.push_back(r->comm);
      for (auto& [q, x] : r->pairs) comms.push_back(x.comm);
    }
    r->cv.notify_all();
    for (chorusComm_t h : comms)
      if (h != nullptr) chorusCommAbort(h);  // the host part under way ends
  }
  if (!running) keep_words(st);  // else once it has left (host_part_left)
}

void stage_graph_close(StageState& st, bool graphs_live) {
  std::shared_ptr<StagedReplays> r;
  {
    std::lock_guard<std::mutex> lock(st.mu);
    r.swap(st.replays);
  }
  if (r) {
    std::lock_guard<std::mutex> lock(r->mu);
    r->closing = true;  // first: the replays' thread starts no keeper after the stop below
  }
  stop_keeper(st.keeper);
  if (!r) return;
  r->cv.notify_all();
  r->thread.join();  // it ends its host part (bounded by the timeout), then skips the rest
  // Pair communicators still being made: this rank stops, and so do the peers.
  std::vector<int> unmade;
  {
    std::lock_guard<std::mutex> lock(r->mu);
    for (auto& [q, x] : r->pairs)
      if (!x.made) unmade.push_back(q);
  }
  for (int q : unmade)
    r->parent->pair_failed(q, Status(Code::kInvalidUsage, "its communicator was destroyed"));
  for (auto& [q, x] : r->pairs)
    if (x.maker.joinable()) x.maker.join();
  for (auto& [q, x] : r->pairs)
    if (x.comm != nullptr) chorusCommDestroy(x.comm);
  if (r->comm != nullptr) chorusCommDestroy(r->comm);
  if (!graphs_live) free_unpinned(*r);
}

}  // namespace chorus

namespace chorus::capi {

namespace {

// What each rank tells the others at a staged collective's capture.
struct CaptureHello {
  int32_t kind, datatype, op, root;
  uint64_t count;
  uint64_t free;  // its free slots
};

// What a rank tells a peer at the capture of sends and receives: what it sends to the peer and
// receives from it (how many, their bytes, a fingerprint of each one's count and type in order),
// and whether it has a slot free.
struct PairHello {
  uint64_t sends = 0, send_bytes = 0, send_print = 0;
  uint64_t recvs = 0, recv_bytes = 0, recv_print = 0;
  uint64_t has_slot = 0;
};

uint64_t mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  return h * 0xff51afd7ed558ccdull;
}

// The replays' thread, started at the communicator's first staged capture.
std::shared_ptr<StagedReplays> replays_of(CommImpl& comm) {
  StageState& st = comm.device_ipc().stage;
  std::lock_guard<std::mutex> lock(st.mu);
  if (!st.replays) {
    auto r = std::make_shared<StagedReplays>();
    r->parent = &comm;
    r->device = st.device;
    r->word = st.word.load();
    r->host_word = st.host_word;
    r->thread = std::thread(run_replays, r);
    st.replays = r;
  }
  return st.replays;
}

// The collectives' replays communicator, split off at the first collective's capture (every
// rank is there).
chorusResult_t split_replays(chorusComm_t h, CommImpl& comm, const char* name, StagedReplays& r) {
  {
    std::lock_guard<std::mutex> lock(r.mu);
    if (r.comm != nullptr) return chorusSuccess;
  }
  chorusComm_t g = nullptr;
  if (chorusResult_t rc = chorusCommSplit(h, 0, comm.rank(), &g); rc != chorusSuccess) {
    abort_after_exception(
        comm, Status(Code::kSystemError, fmt::format("{} on rank {}: splitting off the "
                                                     "communicator of captured calls' replays "
                                                     "failed: {}",
                                                     name, comm.rank(), chorusGetLastError(h))));
    return rc;
  }
  std::lock_guard<std::mutex> lock(r.mu);
  r.comm = g;
  return chorusSuccess;
}

// A pair's replays communicator, made on a thread of its own.
void make_pair(std::shared_ptr<StagedReplays> r, int peer) {
  chorusComm_t h = nullptr;
  std::string error;
  const double start = now_seconds();
  try {
    Result<std::shared_ptr<CommImpl>> made = r->parent->pair(peer);
    if (made.is_ok()) h = capi::adopt(std::move(made.value()));
    if (!made.is_ok()) error = made.status().message();
  } catch (const std::exception& e) {
    error = e.what();
  }
  if (h != nullptr)
    log_info(
        "rank {}: the communicator of replays with rank {} (sends and receives across hosts "
        "captured into CUDA graphs; its ranks 0 and 1 are ranks {} and {}): made in {:.1f} ms",
        r->parent->rank(), peer, std::min(r->parent->rank(), peer),
        std::max(r->parent->rank(), peer), (now_seconds() - start) * 1e3);
  std::lock_guard<std::mutex> lock(r->mu);
  PairReplays& x = r->pairs.at(peer);
  x.comm = h;
  x.error = h == nullptr && error.empty() ? "unknown failure" : error;
  x.made = true;
  r->cv.notify_all();
}

// After this rank's capture of calls with `peers` succeeded: the making of each new pair's
// replays communicator starts (where the peer's capture failed, the communicator fails, and
// destroy stops the making).
void start_pairs(const std::shared_ptr<StagedReplays>& r, const std::vector<int>& peers) {
  std::lock_guard<std::mutex> lock(r->mu);
  for (int q : peers) {
    if (r->pairs.count(q) != 0) continue;
    PairReplays& x = r->pairs[q];
    try {
      x.maker = std::thread(make_pair, r, q);
    } catch (const std::system_error& e) {  // its replays fail, naming this
      x.error = fmt::format("starting the thread that makes it failed: {}", e.what());
      x.made = true;
    }
  }
}

// Where each op's host buffers lie in the call's page-locked memory (kNone: it has none), and
// the copies between it and the stream's buffers.
constexpr size_t kNone = ~size_t(0);
struct Place {
  size_t send_at = kNone, recv_at = kNone;
};
struct StageCopy {
  const void* device;  // into recvbuff for the copies out
  size_t at, bytes;
};

// After the ranks agreed: the call's memory and host part, the graph's hold of them (its slot
// taken until CUDA destroys the graph), and the stream's part -- the copies in, the host node,
// the wait for the call's word and its reset, the copies out.
chorusResult_t capture_stage(CommImpl& comm, std::unique_ptr<CapturedStage> c, void* stream,
                             size_t total, const std::vector<Place>& places,
                             const std::vector<StageCopy>& in, const std::vector<StageCopy>& out) {
  const kc::IpcBackend& ipc = kc::ipc();
  StageState& st = comm.device_ipc().stage;
  const char* name = c->name;
  auto broken = [&](const char* what, int rc) {
    const Status s(Code::kSystemError, fmt::format("{} on rank {}: capturing a staged call: {} "
                                                   "failed: {}",
                                                   name, comm.rank(), what, ipc.error_string(rc)));
    abort_after_exception(comm, s);  // the peers captured theirs: they would wait for this one
    return report(s);
  };
  if (int rc = take_pinned(*c->replays, total, &c->pinned); rc != 0)
    return broken("allocating page-locked memory", rc);
  char* base = static_cast<char*>(c->pinned.p);
  for (size_t i = 0; i < c->ops.size(); ++i) {
    Args& host = c->ops[i].args;
    host.stream = nullptr;
    host.request = nullptr;
    host.sendbuff = places[i].send_at == kNone ? nullptr : base + places[i].send_at;
    host.recvbuff = places[i].recv_at == kNone ? nullptr : base + places[i].recv_at;
  }
  // The graph holds it: its slot comes back when CUDA destroys the graph, its memory with the
  // last replay that holds it.
  const int slot = c->slot;
  auto* held = new HeldStage(std::move(c));
  if (int rc = ipc.graph_destructor(stream, release_captured, held); rc != 0) {
    delete held;  // its memory back to the pool
    return broken("attaching the call to the CUDA graph", rc);
  }
  st.graph_slots->calls.fetch_and(~(uint64_t(1) << slot));
  st.graph_live.store(std::max(st.graph_live.load(), slot + 1));
  uint32_t* word = stage_graph_word(st.word.load(), slot);
  for (const StageCopy& x : in)
    if (int rc = ipc.to_host_async(base + x.at, x.device, x.bytes, stream); rc != 0)
      return broken("copying sendbuff to host memory", rc);
  if (int rc = ipc.host_func(stream, on_replay, held); rc != 0)
    return broken("handing the host part to the replays' thread", rc);
  if (int rc = ipc.wait_u32_geq(stream, word, 1); rc != 0)
    return broken("waiting for the host part", rc);
  if (int rc = ipc.write_u32(stream, word, 0); rc != 0)
    return broken("resetting the host part's word", rc);
  for (const StageCopy& x : out)
    if (x.bytes > 0)
      if (int rc = ipc.to_device(const_cast<void*>(x.device), base + x.at, x.bytes, stream);
          rc != 0)
        return broken("copying the result to recvbuff", rc);
  return chorusSuccess;
}

}  // namespace

chorusResult_t staged_capture(chorusComm_t h, CommImpl& comm, const Call& call, const Args& a,
                              const StagedBytes& bytes) {
  const int r = comm.rank(), p = comm.size();
  StageState& st = comm.device_ipc().stage;
  const bool v = call.kind == OpKind::kAllToAllv;
  // Every rank captures this call (a rank that does not runs its host collective instead, and
  // the two meet as a mismatch), and the slot: the lowest free on every rank.
  CaptureHello me{int32_t(call.kind),
                  a.datatype,
                  a.op,
                  a.root,
                  v ? 0 : uint64_t(a.count),
                  settled_free(st.graph_slots->calls)};
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
  auto c = std::make_unique<CapturedStage>();
  c->replays = replays_of(comm);
  if (chorusResult_t rc = split_replays(h, comm, call.name, *c->replays); rc != chorusSuccess)
    return rc;
  c->slots = st.graph_slots;
  c->name = call.name;
  c->ops.push_back({{call.name, call.kind, false}, a});
  c->slot = slot;
  if (v) {
    for (const size_t* arr : {a.sendcounts, a.sdispls, a.recvcounts, a.rdispls})
      c->arrays.insert(c->arrays.end(), arr, arr + p);
    Args& host = c->ops[0].args;
    host.sendcounts = c->arrays.data();
    host.sdispls = c->arrays.data() + p;
    host.recvcounts = c->arrays.data() + 2 * p;
    host.rdispls = c->arrays.data() + 3 * p;
  }
  std::vector<StageCopy> out;
  for (int q = 0; q < (v ? p : 1) && bytes.out > 0; ++q) {
    const size_t at = v ? a.rdispls[q] * bytes.elem_size : 0,
                 n = v ? a.recvcounts[q] * bytes.elem_size : bytes.out;
    out.push_back({static_cast<char*>(a.recvbuff) + at, bytes.out_at + at, n});
  }
  std::vector<StageCopy> in;
  if (bytes.in > 0) in.push_back({a.sendbuff, bytes.in_at, bytes.in});
  return capture_stage(
      comm, std::move(c), a.stream, bytes.out_at + bytes.out,
      {{bytes.uses_send ? bytes.in_at : kNone, bytes.uses_recv ? bytes.out_at : kNone}}, in, out);
}

chorusResult_t staged_p2p_capture(chorusComm_t h, CommImpl& comm,
                                  const std::vector<DeviceP2p>& items,
                                  const std::vector<size_t>& at, size_t total) {
  const int r = comm.rank();
  const char* name = items.size() == 1 ? items[0].call.name : "chorusGroupEnd";
  StageState& st = comm.device_ipc().stage;
  auto c = std::make_unique<CapturedStage>();
  c->replays = replays_of(comm);
  // Each peer and this rank capture matching sends and receives (a peer that does not runs its
  // host transfer instead, and the two meet as a mismatch).
  std::vector<int> peers;
  std::vector<PairHello> mine, theirs;
  const int slot = nth_free(settled_free(st.graph_slots->calls), 0);
  for (const DeviceP2p& it : items) {
    const Args& a = it.args;
    size_t k = std::find(peers.begin(), peers.end(), a.peer) - peers.begin();
    if (k == peers.size()) {
      peers.push_back(a.peer);
      mine.push_back({.has_slot = slot >= 0});
    }
    PairHello& x = mine[k];
    const uint64_t n = a.count * dtype_size(a.datatype);
    const uint64_t print = mix(a.count, uint64_t(a.datatype));
    if (it.call.kind == OpKind::kSend) {
      x.sends++, x.send_bytes += n, x.send_print = mix(x.send_print, print);
    } else {
      x.recvs++, x.recv_bytes += n, x.recv_print = mix(x.recv_print, print);
    }
  }
  theirs.resize(peers.size());
  chorusGroupStart();
  chorusResult_t rc = chorusSuccess;
  for (size_t k = 0; k < peers.size() && rc == chorusSuccess; ++k) {
    rc = run_op({name, OpKind::kSend, false}, h,
                {.sendbuff = &mine[k],
                 .count = sizeof(PairHello),
                 .datatype = chorusUint8,
                 .peer = peers[k]});
    if (rc == chorusSuccess)
      rc = run_op({name, OpKind::kRecv, false}, h,
                  {.recvbuff = &theirs[k],
                   .count = sizeof(PairHello),
                   .datatype = chorusUint8,
                   .peer = peers[k]});
  }
  const chorusResult_t end = chorusGroupEnd();
  if (rc != chorusSuccess || end != chorusSuccess) {
    const Status s(Code::kInvalidUsage,
                   fmt::format("{} on rank {}: its stream is being captured into a CUDA graph, "
                               "and both ranks of each pair must capture their sends and "
                               "receives (one that does not runs its host transfer, which meets "
                               "this capture's exchange as a mismatch): {}",
                               name, r, chorusGetLastError(h)));
    abort_after_exception(comm, s);
    return report(s);
  }
  bool slots = slot >= 0;
  for (size_t k = 0; k < peers.size(); ++k) {
    const PairHello &x = mine[k], &y = theirs[k];
    const bool sends_match =
        x.sends == y.recvs && x.send_bytes == y.recv_bytes && x.send_print == y.recv_print;
    const bool recvs_match =
        x.recvs == y.sends && x.recv_bytes == y.send_bytes && x.recv_print == y.send_print;
    if (!sends_match || !recvs_match) {  // failed on both ranks of the pair
      const std::string what =
          !sends_match ? fmt::format(
                             "{} send(s) of {} bytes to rank {}, which captures {} "
                             "receive(s) of {} bytes from it",
                             x.sends, x.send_bytes, peers[k], y.recvs, y.recv_bytes)
                       : fmt::format(
                             "{} receive(s) of {} bytes from rank {}, which captures {} "
                             "send(s) of {} bytes to it",
                             x.recvs, x.recv_bytes, peers[k], y.sends, y.send_bytes);
      const Status s(Code::kInvalidUsage,
                     fmt::format("{} on rank {}: ranks disagree on sends and receives captured "
                                 "into a CUDA graph: rank {} captures {}{}",
                                 name, r, r, what,
                                 sends_match || recvs_match ? "" : " (their receives differ too)"));
      abort_after_exception(comm, s);
      return report(s);
    }
    slots = slots && y.has_slot;
  }
  if (!slots)  // on both ranks of the pair
    return fail(Code::kInvalidUsage, "{}",
                no_free_slot(fmt::format("{} on rank {}", name, r), "staged device call",
                             "both ranks of each pair"));
  c->slots = st.graph_slots;
  c->name = name;
  c->p2p = true;
  c->slot = slot;
  std::vector<Place> places(items.size());
  std::vector<StageCopy> in, out;
  for (size_t i = 0; i < items.size(); ++i) {
    const Args& a = items[i].args;
    const size_t n = a.count * dtype_size(a.datatype);
    c->ops.push_back({{name, items[i].call.kind, false}, a});
    c->ops.back().args.peer = a.peer < r ? 0 : 1;  // the pair communicator's numbering
    c->peers.push_back(a.peer);
    if (items[i].call.kind == OpKind::kSend) {
      places[i].send_at = at[i];
      in.push_back({a.sendbuff, at[i], n});
    } else {
      places[i].recv_at = at[i];
      out.push_back({a.recvbuff, at[i], n});
    }
  }
  std::shared_ptr<StagedReplays> replays = c->replays;
  const chorusResult_t captured =
      capture_stage(comm, std::move(c), items[0].args.stream, total, places, in, out);
  if (captured == chorusSuccess) start_pairs(replays, peers);
  return captured;
}

}  // namespace chorus::capi
