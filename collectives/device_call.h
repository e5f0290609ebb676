// One rank's side of one device call over CUDA IPC (device_ops.cc's collectives, device_p2p.cc's
// sends and receives; the design is device_ops.cc's): the record each rank sends the others,
// the description of its own buffers, the peers' buffers mapped, and the GPU work enqueued in
// order (Enqueuer). Internal to collectives/.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "collectives/c_api_internal.h"
#include "collectives/comm.h"
#include "collectives/device_bounce.h"
#include "collectives/device_freed.h"
#include "collectives/device_ops.h"
#include "collectives/device_timing.h"
#include "collectives/device_vmm.h"
#include "collectives/device_words.h"
#include "kernels/cuda/ipc.h"

namespace chorus {

// The blocks of a rank's flag words (device_ops.cc, "Flag words"), kMaxDeviceRanks words each.
enum FlagBlock : int { kReady = 0, kDone = 1, kTxReady = 2, kRxReady = 3, kRxDone = 4 };
constexpr size_t kFlagBytes = 5 * kMaxDeviceRanks * sizeof(uint32_t);

}  // namespace chorus

namespace chorus::capi::devcall {

namespace kc = kernels::cuda;

// What each rank tells the others, as raw bytes through the host.
struct Record {
  uint64_t count;
  int32_t kind;
  int32_t datatype;
  int32_t op;
  int32_t root;  // collectives; send/recv: the peer
  int32_t ok;    // 0: `why` says what this rank could not do
  char why[180];
  char gpu[48];         // the UUID of this rank's GPU ("" if unknown)
  int32_t pid;          // for the descriptor sockets of VMM memory (device_vmm.h)
  int32_t graph;        // captured into a CUDA graph: >= 0 (send/recv: its slot); -1: not captured
  uint64_t graph_free;  // captured: the slots free on this rank (GraphSlots) for the call
  kc::IpcHandle flags, send, recv, graph_flags;
  int32_t host_words;  // flags and graph_flags: host words (device_words.h), else CUDA IPC's
  uint64_t owner;      // this rank's process token (IpcHandle::owner)
  uint32_t nfreed;     // allocations of this process exported before and freed since, named in
  uint32_t nvmm_gone;  // `freed` (device_freed.h); VMM allocations of this rank that left its
  uint64_t freed[kMaxAnnounced];  // registry, in `vmm_gone` (device_vmm.h)
  uint64_t vmm_gone[kMaxAnnounced];
};

// Marks `r` as not taking part, saying why.
void set_why(Record& r, const std::string& why);
// Why `p` (the call's buffer `name`) cannot be a device call's buffer: "" when it is device memory
// of `dev`, the current device.
std::string not_device_memory(const char* name, const void* p, int dev);
// The IPC backend's words for its error code rc.
std::string ipc_error(int rc);

// This rank's part of the record: the buffers it uses device memory of the current device,
// exported (memory that CUDA IPC cannot map: VMM allocations by file descriptor, device_vmm.h,
// the rest staged, device_bounce.h); its flag words allocated (at its first device call) and
// exported. `bufs` says where the GPU work finds each buffer.
void describe_self(DeviceIpc& st, CallBuffers& bufs, Record& me, int rank);

// Whether `stream` is being captured into a CUDA graph; when it is, this rank's words of captured
// calls exported into me.graph_flags. When asking or exporting fails: false, and `me` says why.
bool capturing(DeviceIpc& st, void* stream, Record& me);

// Before the record `me` goes to ranks `to`: the frees of this process's exported allocations
// that they have not been told of on this communicator, into me.freed (device_freed.h).
void announce(DeviceIpc& st, Record& me, std::span<const int> to);
// After rank q's record came: what it announced freed is closed or unmapped here -- with what
// earlier captured calls held back -- or, when this rank's call is captured (rec's reader's
// `captured`), held back until the next call that is not.
void take_news(DeviceIpc& st, int q, const Record& rec, bool captured);

// Where rank q's buffer of handle h is mapped here: by CUDA IPC, or its VMM allocation mapped by
// descriptor (device_vmm.h). A CUDA IPC allocation of q's process that h's overlaps was freed: it
// is closed first.
// `captured`: the call is being captured, and the closes wait (close_overlapped's `later`).
Result<void*> open_peer(DeviceIpc& st, int q, const kc::IpcHandle& h, bool captured);

// VMM buffers go to the ranks of the call that lack them, before the GPU work.
Status pass_vmm(CommImpl& comm, DeviceIpc& st, std::vector<VmmTransfer> moves,
                std::vector<int32_t> pids);

// Rank q's record as it arrived, before anything else reads it: its strings end inside their
// arrays, its call's kind, type, op and root (send/recv: peer) are ones there are among p ranks,
// its counts of freed allocations fit their arrays, its slot is one there is. An error names
// the field (a rank of another chorus build, or damage on the way); the other functions here
// take only records that passed it.
Status check_record(const Record& rec, int q, int r, int p, const char* call);
// A collective's record in words ("all_reduce of count 64 of f32 by sum"), for mismatches.
std::string describe_call(const Record& x);
// Tests: the next record this process sends is spoiled -- kKind: call kind 99, seen as corrupt
// by its peers; kWordsPid: its host words' owner pid 1, whose /proc entry is not its memfd, as
// for ranks in different pid namespaces. maybe_corrupt_for_test spoils `me` then, returning what
// it was (put back once sent).
enum class Spoil { kNone, kKind, kWordsPid };
void corrupt_next_record_for_test(Spoil how = Spoil::kKind);
std::optional<Record> maybe_corrupt_for_test(Record& me);
// Checks a record after the exchange: a rank that could not take part fails every rank.
Status check_ok(const Record& rec, int q, int r, const char* call);

// The end of a call whose work is enqueued: a failure of the communicator meanwhile (a peer died
// during the call, whose waits were released) voids it.
chorusResult_t finish(CommImpl& comm, const char* call);

// Rank q's word in `block` of a rank's flag words.
inline uint32_t* word(uint32_t* flags, FlagBlock block, int q) {
  return flags + block * kMaxDeviceRanks + q;
}

// This communicator's per-rank state, sized at its first device call.
void size_state(DeviceIpc& st, int p);

// Whether CUDA IPC cannot join the communicator's ranks -- several hosts, more ranks than the
// flag words have room for, or two GPUs of the host that cannot reach each other peer to peer
// (CommImpl::gpus_unreachable) -- and the call goes through host memory (device_staged.cc). The
// same answer on every rank; said once per communicator at CHORUS_DEBUG=INFO. staged_why: why
// (empty: CUDA IPC joins them, and their device collectives may be captured into a CUDA graph).
bool staged(CommImpl& comm, const char* call);
std::string staged_why(CommImpl& comm);

// The GPU-side work of one call on this rank, enqueued in order; failures after the exchange
// still write every signal (release()).
class Enqueuer {
 public:
  // `call`: what the call is, for CHORUS_DEVICE_TIMING's report (made only when it is on; never
  // for a captured call, whose stamps would be the graph's).
  Enqueuer(CommImpl& comm, DeviceIpc& st, int rank, void* stream, const std::string& call,
           bool timed = true)
      : comm_(comm),
        st_(st),
        r_(rank),
        stream_(stream),
        timer_(timed ? timing(comm, st) : nullptr, call, stream) {}

  // Rank q's flag words, mapped at first use from its record's handle (device_words.h).
  Status map_flags(int q, const Record& rec) {
    if (st_.peer_flags[q] != nullptr) return Status::ok();
    void* f = st_.flags;
    if (q != r_) {
      Result<void*> at = open_words(st_, q, rec.host_words != 0, rec.flags);
      if (!at.is_ok()) return mapping_failed(fmt::format("rank {}'s flag words", q), at.status());
      f = *at;
    }
    st_.peer_flags[q] = static_cast<uint32_t*>(f);
    return Status::ok();
  }

  // A captured collective (device_graph.h): its signals and waits go to `slot`'s words, mapped
  // here (rank q's from its exported handle), with values 0 and 1.
  Status capture_into(int slot, const std::vector<Record>& peers) {
    graph_slot_ = slot;
    for (size_t q = 0; q < peers.size(); ++q)
      if (Status s = map_graph(int(q), peers[q]); !s.is_ok()) return s;
    return Status::ok();
  }
  // Rank q's words of captured calls, mapped at first use from its record's handle.
  Status map_graph(int q, const Record& rec) {
    GraphWords& g = st_.graph;
    if (g.peer.empty()) g.peer.assign(st_.peer_flags.size(), nullptr);
    if (g.peer[q] != nullptr) return Status::ok();
    void* f = g.flags;
    if (q != r_) {
      Result<void*> at = open_words(st_, q, rec.host_words != 0, rec.graph_flags);
      if (!at.is_ok())
        return mapping_failed(fmt::format("rank {}'s flag words of captured calls", q),
                              at.status());
      f = *at;
    }
    g.peer[q] = static_cast<uint32_t*>(f);
    return Status::ok();
  }
  // A captured send or receive with peer q (device_graph.h): 1 into q's word for this rank in
  // the pair's `slot`; and the wait for q's word here (>= 1), then its reset.
  Status signal_pair(int q, PairWord w, int slot, const char* name) {
    return put(pair_word(st_.graph.peer[q], r_, w, slot), 1u, q, name);
  }
  Status wait_pair(int q, PairWord w, int slot, const char* name) {
    return await(pair_word(st_.graph.flags, q, w, slot), 1u, true, q, name);
  }

  // Writes v into peer q's word for this rank in `block` (captured: 1 into its slot's word).
  Status signal(int q, FlagBlock block, uint32_t v, const char* name) {
    if (graph_slot_ >= 0)
      return put(graph_word(st_.graph.peer[q], graph_slot_, block, r_), 1u, q, name);
    if (Status s = put(word(st_.peer_flags[q], block, r_), v, q, name); !s.is_ok()) return s;
    if (timer_.on()) timer_.stamp(fmt::format("signal {} to rank {}", name, q));
    return Status::ok();
  }
  // Waits until q's word here in `block` is >= v (captured: its slot's word >= 1, then reset).
  Status wait(int q, FlagBlock block, uint32_t v, const char* name) {
    if (graph_slot_ >= 0)
      return await(graph_word(st_.graph.flags, graph_slot_, block, q), 1u, true, q, name);
    Status s = await(word(static_cast<uint32_t*>(st_.flags), block, q), v, false, q, name);
    if (s.is_ok() && timer_.on()) timer_.stamp(fmt::format("wait for rank {}'s {}", q, name));
    return s;
  }
  // One kernel: the fold of `in` into every one of `out` (a copy: one input, op sum, and no
  // output that is the input itself).
  Status fold(kernels::DType dt, kernels::RedOp op, const std::vector<const void*>& in,
              std::vector<void*> out, size_t n, int avg_n, const std::string& what) {
    if (in.size() == 1) std::erase(out, const_cast<void*>(in[0]));
    if (out.empty()) return Status::ok();
    if (int rc = kc::ipc().fold(dt, op, in.data(), int(in.size()), out.data(), int(out.size()), n,
                                avg_n, stream_);
        rc != 0)
      return failed(what, rc);
    if (timer_.on())  // "launching the reduction kernel" -> "reduction kernel"
      timer_.stamp(fmt::format("{} ({} bytes)",
                               what.starts_with("launching the ") ? what.substr(14) : what,
                               n * kernels::dtype_size(dt)));
    return Status::ok();
  }

  // The bounce buffer (device_bounce.h): before a call's first work, wait for the end of the last
  // call that used it (on whatever stream), then copy the staged input into its piece; after the
  // call's last wait, copy the staged output out of its piece and mark the end.
  Status bounce_in(const std::vector<const LocalBuffer*>& bufs) {
    if (!any_staged(bufs)) return Status::ok();
    if (int rc = kc::ipc().mark_wait(stream_, st_.bounce_mark); rc != 0)
      return failed("ordering after the last call through the bounce buffer", rc);
    for (const LocalBuffer* b : bufs)
      if (b->staged && (!b->output || b->partial))
        if (Status s = copy(b->user, b->at, b->bytes, "copying {} into the bounce buffer", b);
            !s.is_ok())
          return s;
    return Status::ok();
  }
  Status bounce_out(const std::vector<const LocalBuffer*>& bufs) {
    if (!any_staged(bufs)) return Status::ok();
    for (const LocalBuffer* b : bufs)
      if (b->staged && b->output)
        if (Status s = copy(b->at, b->user, b->bytes, "copying {} out of the bounce buffer", b);
            !s.is_ok())
          return s;
    if (int rc = kc::ipc().mark_record(stream_, &st_.bounce_mark); rc != 0)
      return failed("marking the end of a call through the bounce buffer", rc);
    return Status::ok();
  }

  // After the call's last work on its stream (after release() when it failed): its end marked for
  // destroy (DeviceIpc::ends), one mark a stream. Not for a captured call: its work runs at the
  // replays, which destroy does not wait for (it unmaps nothing while graphs hold calls). Marks
  // of streams past their end are pruned as streams come and go.
  void mark_end(bool captured) {
    if (captured) return;
    std::vector<std::pair<void*, void*>>& ends = st_.ends;
    auto it =
        std::find_if(ends.begin(), ends.end(), [&](const auto& e) { return e.first == stream_; });
    if (it == ends.end()) {
      if (ends.size() >= kPruneEnds)
        std::erase_if(ends, [&](const std::pair<void*, void*>& e) {
          if (kc::ipc().mark_done(st_.device, e.second) != 0) return false;
          kc::ipc().mark_free(e.second);
          return true;
        });
      it = ends.insert(ends.end(), {stream_, nullptr});
    }
    if (kc::ipc().mark_record(stream_, &it->second) != 0) st_.ends_unmarked = true;
  }
  static constexpr size_t kPruneEnds = 16;

  // After a failure: the signals not yet written, so that no peer's stream waits for ever; then,
  // for a call through the bounce buffer, the end of what it enqueued marked, as bounce_out
  // does, so that destroy frees the buffer only once the stream is past it (bounce_close).
  void release(const std::vector<std::pair<uint32_t*, uint32_t>>& owed,
               const std::vector<const LocalBuffer*>& bufs) {
    for (const auto& [word, v] : owed)
      if (word != nullptr) (void)kc::ipc().write_u32(stream_, word, v);
    if (any_staged(bufs) && kc::ipc().mark_record(stream_, &st_.bounce_mark) != 0)
      st_.bounce_unmarked = true;
  }

 private:
  static DeviceTiming* timing(CommImpl& comm, DeviceIpc& st) {
    if (comm.device_timing_calls() == 0) return nullptr;
    if (!st.timing) {
      st.timing = std::make_shared<DeviceTiming>();
      st.timing->left = comm.device_timing_calls();
    }
    return st.timing.get();
  }
  int graph_slot_ = -1;  // capture_into's
  static bool any_staged(const std::vector<const LocalBuffer*>& bufs) {
    return std::any_of(bufs.begin(), bufs.end(), [](const LocalBuffer* b) { return b->staged; });
  }
  Status copy(const void* from, const void* to, size_t bytes, const char* what,
              const LocalBuffer* b) {
    return fold(kernels::DType::kU8, kernels::RedOp::kSum, {from}, {const_cast<void*>(to)}, bytes,
                0, fmt::format(fmt::runtime(what), b->name));
  }
  // A signal to rank q: v into its word `w`.
  Status put(uint32_t* w, uint32_t v, int q, const char* name) {
    if (int rc = kc::ipc().write_u32(stream_, w, v); rc != 0)
      return failed(fmt::format("signalling {} to rank {}", name, q), rc);
    return Status::ok();
  }
  // A wait for rank q's word `w` here to reach v, and its reset to 0 (captured calls' words).
  Status await(uint32_t* w, uint32_t v, bool reset, int q, const char* name) {
    if (int rc = kc::ipc().wait_u32_geq(stream_, w, v); rc != 0)
      return failed(fmt::format("waiting for rank {}'s {}", q, name), rc);
    if (reset)
      if (int rc = kc::ipc().write_u32(stream_, w, 0); rc != 0)
        return failed(fmt::format("resetting rank {}'s {}", q, name), rc);
    return Status::ok();
  }
  Status mapping_failed(const std::string& what, const Status& why) {
    return with_peer_news(
        comm_, make_error(Code::kSystemError, "mapping {} failed: {}", what, why.message()));
  }
  Status failed(const std::string& what, int rc) {
    return make_error(Code::kSystemError, "{} failed: {}", what, ipc_error(rc));
  }

  CommImpl& comm_;
  DeviceIpc& st_;
  const int r_;
  void* const stream_;
  CallTimer timer_;
};

}  // namespace chorus::capi::devcall
