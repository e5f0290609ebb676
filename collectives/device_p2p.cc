// Send/recv on device buffers over CUDA IPC, alone or a group's (device_ops.h; the protocol is in
// device_ops.cc's opening comment).
#include <algorithm>
#include <array>
#include <map>
#include <string>
#include <vector>

#include "collectives/device_call.h"
#include "collectives/op.h"

namespace chorus::capi {

namespace {

// A send/recv item's record: what it moves and to or from whom. Only a send's buffer is shared
// (the receiver copies from it into its own).
// `me` stays where it is: a staged buffer's handle is exported into it later (place_staged).
void p2p_record(DeviceIpc& st, const DeviceP2p& it, CallBuffers& bufs, devcall::Record& me,
                int rank) {
  const bool send = it.call.kind == OpKind::kSend;
  me = devcall::Record{};
  me.graph = -1;
  me.count = it.args.count;
  me.kind = int32_t(it.call.kind);
  me.datatype = it.args.datatype;
  me.op = -1;
  me.root = it.args.peer;
  LocalBuffer& b = send ? bufs.send : bufs.recv;
  b.user = send ? it.args.sendbuff : it.args.recvbuff;
  b.used = me.count > 0;
  b.shared = send;
  b.bytes = me.count * dtype_size(me.datatype);
  describe_self(st, bufs, me, rank);
}

// This rank's mask of the pair's slots for the item: its sends to the peer, or its receives.
std::atomic<uint64_t>& pair_mask(DeviceIpc& st, const DeviceP2p& it) {
  GraphSlots& slots = *st.graph.slots;
  return (it.call.kind == OpKind::kSend ? slots.sends : slots.recvs)[it.args.peer];
}

// Captured into a CUDA graph (device_graph.h): the slots this rank has free for the item's pair
// and direction; the slot is chosen after the exchange.
void describe_pair_capture(DeviceIpc& st, const DeviceP2p& it, devcall::Record& me) {
  if (!me.ok || !devcall::capturing(st, it.args.stream, me)) return;
  me.graph_free = settled_free(pair_mask(st, it));
  if (me.graph_free == 0)
    return devcall::set_why(
        me,
        fmt::format("{} captured device {} rank {} are held by CUDA graphs that live still, "
                    "the most a communicator holds (destroy the graphs no longer replayed)",
                    kGraphPairSlots, it.call.kind == OpKind::kSend ? "sends to" : "receives from",
                    it.args.peer));
  me.graph = 0;
}

std::string describe_pair_graph(const devcall::Record& x) {
  return x.graph < 0 ? "not captured" : "captured into a CUDA graph";
}

std::string describe_p2p(const devcall::Record& x, int owner) {
  const bool send = static_cast<OpKind>(x.kind) == OpKind::kSend;
  return fmt::format("rank {} {} count {} of {} {} rank {}", owner, send ? "sends" : "receives",
                     x.count, dtype_name(x.datatype), send ? "to" : "from", x.root);
}

}  // namespace

chorusResult_t device_p2p(chorusComm_t h, CommImpl& comm, const std::vector<DeviceP2p>& items) {
  using namespace devcall;  // in the function: the unity build shares a namespace's using
  const int r = comm.rank(), p = comm.size();
  if (items.empty()) return chorusSuccess;
  const char* name = items.size() == 1 ? items[0].call.name : "chorusGroupEnd";
  for (const DeviceP2p& it : items) {
    auto k = check_args(it.call, it.args, r, p, /*spaces_known=*/true);
    if (!k.is_ok()) return report(k.status());
    if (it.args.stream != items[0].args.stream)
      return fail(Code::kInvalidUsage,
                  "{} on rank {}: the device sends and receives of one group must use one stream "
                  "(got {} and {})",
                  name, r, static_cast<void*>(items[0].args.stream),
                  static_cast<void*>(it.args.stream));
  }
  if (staged(comm, name)) return staged_p2p(h, comm, items);
  DeviceIpc& st = comm.device_ipc();
  const size_t n = items.size();
  std::vector<Record> mine(n), theirs(n);
  std::vector<CallBuffers> bufs(n);
  std::vector<LocalBuffer*> sends;
  for (size_t i = 0; i < n; ++i) {
    p2p_record(st, items[i], bufs[i], mine[i], r);
    describe_pair_capture(st, items[i], mine[i]);
    sends.push_back(&bufs[i].send);
  }
  // The group's staged sends share the bounce buffer, a piece each.
  if (std::all_of(mine.begin(), mine.end(), [](const devcall::Record& x) { return x.ok != 0; }))
    if (Status s = place_staged(st, sends, r, name); !s.is_ok())
      for (size_t i = 0; i < n; ++i)
        if (bufs[i].send.staged) set_why(mine[i], s.message());
  for (size_t i = 0; i < n; ++i)
    if (mine[i].ok && mine[i].graph >= 0 && bufs[i].send.staged)
      set_why(mine[i],
              "a send captured into a CUDA graph needs memory that CUDA IPC maps (cudaMalloc, or "
              "VMM memory exported by descriptor): not the bounce buffer");
  for (size_t i = 0; i < n; ++i) announce(st, mine[i], std::array{items[i].args.peer});
  const std::optional<Record> unspoilt = maybe_corrupt_for_test(mine[0]);
  // The exchange: one record each way per item, all posted at once (a host group).
  chorusGroupStart();
  chorusResult_t rc = chorusSuccess;
  for (size_t i = 0; i < n && rc == chorusSuccess; ++i) {
    const int q = items[i].args.peer;
    rc =
        run_op({name, OpKind::kSend, false}, h,
               {.sendbuff = &mine[i], .count = sizeof(Record), .datatype = chorusUint8, .peer = q});
    if (rc == chorusSuccess)
      rc = run_op(
          {name, OpKind::kRecv, false}, h,
          {.recvbuff = &theirs[i], .count = sizeof(Record), .datatype = chorusUint8, .peer = q});
  }
  const chorusResult_t end = chorusGroupEnd();
  if (unspoilt) mine[0] = *unspoilt;  // a test's spoiling is of what the peer got
  if (rc != chorusSuccess) return rc;
  if (end != chorusSuccess) return end;
  for (size_t i = 0; i < n; ++i)  // the peer sees none of it: the abort tells it, ends its waits
    if (Status s = check_record(theirs[i], items[i].args.peer, r, p, name); !s.is_ok()) {
      comm.abort(s.message());
      return report(s);
    }
  for (size_t i = 0; i < n; ++i) take_news(st, items[i].args.peer, theirs[i], mine[i].graph >= 0);

  // Pairing, per peer: its sends meet this rank's receives in call order, and the other way.
  std::map<int, std::vector<const Record*>> peer_sends, peer_recvs;
  for (size_t i = 0; i < n; ++i) {
    const int q = items[i].args.peer;
    if (Status s = check_ok(mine[i], r, r, name); !s.is_ok()) return report(s);
    if (Status s = check_ok(theirs[i], q, r, name); !s.is_ok()) return report(s);
    (static_cast<OpKind>(theirs[i].kind) == OpKind::kSend ? peer_sends : peer_recvs)[q].push_back(
        &theirs[i]);
  }
  std::vector<const Record*> match(n);
  std::map<int, size_t> used_sends, used_recvs;
  for (size_t i = 0; i < n; ++i) {
    const int q = items[i].args.peer;
    const bool send = items[i].call.kind == OpKind::kSend;
    auto& list = send ? peer_recvs[q] : peer_sends[q];
    size_t& next = send ? used_recvs[q] : used_sends[q];
    if (next >= list.size()) {
      const Record* other = (send ? peer_sends[q] : peer_recvs[q]).empty()
                                ? nullptr
                                : (send ? peer_sends[q] : peer_recvs[q]).front();
      return fail(Code::kInvalidUsage, "{} on rank {}: {}, but rank {} has no matching {}{}{}",
                  name, r, describe_p2p(mine[i], r), q, send ? "receive" : "send",
                  other ? fmt::format(" ({}; ", describe_p2p(*other, q)) : std::string(),
                  other ? "to exchange both ways, group the calls with chorusGroupStart/End)" : "");
    }
    match[i] = list[next++];
    if (match[i]->count != mine[i].count || match[i]->datatype != mine[i].datatype)
      return fail(Code::kInvalidUsage, "{} on rank {}: {}, but {}", name, r,
                  describe_p2p(mine[i], r), describe_p2p(*match[i], q));
    if ((match[i]->graph >= 0) != (mine[i].graph >= 0))
      return fail(Code::kInvalidUsage,
                  "{} on rank {}: {}, {}; {}, {}: both ranks capture a send and its receive "
                  "into CUDA graphs, or neither does",
                  name, r, describe_p2p(mine[i], r), describe_pair_graph(mine[i]),
                  describe_p2p(*match[i], q), describe_pair_graph(*match[i]));
  }
  // One stream: every item is captured, or none. A captured item's slot: the pair's j-th lowest
  // free on both sides, for the group's j-th item of that pair and direction (both sides count
  // the same items: they match in call order).
  const bool captured = mine[0].graph >= 0;
  std::vector<int> slot(n, -1);
  std::map<std::atomic<uint64_t>*, uint64_t> taken;  // this rank's masks: the bits the call takes
  if (captured) {
    std::map<std::pair<int, bool>, int> before;
    for (size_t i = 0; i < n; ++i) {
      const int q = items[i].args.peer;
      const bool send = items[i].call.kind == OpKind::kSend;
      slot[i] = nth_free(mine[i].graph_free & match[i]->graph_free, before[{q, send}]++);
      if (slot[i] < 0)
        return fail(
            Code::kInvalidUsage, "{}",
            no_free_slot(fmt::format("{} on rank {}: {}", name, r, describe_p2p(mine[i], r)),
                         send ? "send" : "receive", "both ranks of the pair"));
      taken[&pair_mask(st, items[i])] |= uint64_t(1) << slot[i];
    }
  }

  size_state(st, p);
  std::string what;  // for CHORUS_DEVICE_TIMING only: not made on every call
  if (comm.device_timing_calls())
    for (size_t i = 0; i < n; ++i) what += (i ? "; " : ": ") + describe_p2p(mine[i], r);
  Enqueuer gpu(comm, st, r, items[0].args.stream, name + what, /*timed=*/!captured);
  Status s;
  if (captured)  // the slots, until CUDA destroys the graph
    if (int rc = graph_hold(st.graph, items[0].args.stream, {taken.begin(), taken.end()}); rc != 0)
      s = make_error(Code::kSystemError,
                     "attaching the captured calls' slots to the CUDA graph failed: {}",
                     ipc_error(rc));
  std::vector<uint32_t> seq(n);
  std::vector<std::pair<uint32_t*, uint32_t>> owed;
  for (size_t i = 0; i < n && s.is_ok(); ++i) {
    if (mine[i].count == 0) continue;
    const int q = items[i].args.peer;
    s = gpu.map_flags(q, *match[i]);
    if (s.is_ok() && captured) s = gpu.map_graph(q, *match[i]);
    if (!s.is_ok() || captured) continue;  // (a captured item's signals, owed, would not help)
    if (items[i].call.kind == OpKind::kSend) {
      seq[i] = ++st.tx_seq[q];
      owed.push_back({word(st.peer_flags[q], kTxReady, r), seq[i]});
    } else {
      seq[i] = ++st.rx_seq[q];
      owed.push_back({word(st.peer_flags[q], kRxReady, r), seq[i]});
      owed.push_back({word(st.peer_flags[q], kRxDone, r), seq[i]});
    }
  }
  if (s.is_ok()) {  // the VMM sendbuffs to their receivers
    std::vector<VmmTransfer> moves;
    std::vector<int32_t> pids(p, 0);
    pids[r] = mine[0].pid;
    for (size_t i = 0; i < n; ++i) {
      const int q = items[i].args.peer;
      pids[q] = match[i]->pid;
      if (mine[i].count == 0) continue;
      if (items[i].call.kind == OpKind::kSend && is_vmm_handle(mine[i].send))
        moves.push_back({r, q, &mine[i].send});
      if (items[i].call.kind == OpKind::kRecv && is_vmm_handle(match[i]->send))
        moves.push_back({q, r, &match[i]->send});
    }
    s = pass_vmm(comm, st, std::move(moves), std::move(pids));
  }
  auto each = [&](bool sends, auto&& fn) {
    for (size_t i = 0; i < n && s.is_ok(); ++i)
      if (mine[i].count > 0 && (items[i].call.kind == OpKind::kSend) == sends)
        s = fn(i, items[i].args.peer);
  };
  std::vector<const LocalBuffer*> staged;
  for (size_t i = 0; i < n; ++i) staged.push_back(&bufs[i].send);
  if (s.is_ok()) s = gpu.bounce_in(staged);
  // Every signal of the group before any wait. Captured: the pair's words, no "buffer free".
  if (!captured) {
    each(true, [&](size_t i, int q) { return gpu.signal(q, kTxReady, seq[i], "data ready"); });
    each(false, [&](size_t i, int q) { return gpu.signal(q, kRxReady, seq[i], "buffer free"); });
    each(true, [&](size_t i, int q) { return gpu.wait(q, kRxReady, seq[i], "buffer free"); });
    each(false, [&](size_t i, int q) { return gpu.wait(q, kTxReady, seq[i], "data ready"); });
  } else {
    each(true,
         [&](size_t i, int q) { return gpu.signal_pair(q, kPairData, slot[i], "data ready"); });
    each(false,
         [&](size_t i, int q) { return gpu.wait_pair(q, kPairData, slot[i], "data ready"); });
  }
  each(false, [&](size_t i, int q) -> Status {
    Result<void*> src = open_peer(st, q, match[i]->send, captured);
    if (!src.is_ok())
      return with_peer_news(
          comm, Status(Code::kSystemError, fmt::format("mapping rank {}'s sendbuff failed: {}", q,
                                                       src.status().message())));
    const void* in = *src;
    return gpu.fold(kernels::DType::kU8, kernels::RedOp::kSum, {in}, {items[i].args.recvbuff},
                    mine[i].count * dtype_size(mine[i].datatype), 0,
                    fmt::format("copying from rank {}", q));
  });
  if (!captured) {
    each(false, [&](size_t i, int q) { return gpu.signal(q, kRxDone, seq[i], "copied"); });
    each(true, [&](size_t i, int q) { return gpu.wait(q, kRxDone, seq[i], "copied"); });
  } else {
    each(false,
         [&](size_t i, int q) { return gpu.signal_pair(q, kPairCopied, slot[i], "copied"); });
    each(true, [&](size_t i, int q) { return gpu.wait_pair(q, kPairCopied, slot[i], "copied"); });
  }
  if (s.is_ok()) s = gpu.bounce_out(staged);
  if (s.is_ok() && captured) {  // for the keeper
    int top = st.graph.live_pair_slots.load();
    for (size_t i = 0; i < n; ++i) top = std::max(top, slot[i] + 1);
    st.graph.live_pair_slots.store(top);
  }
  if (s.is_ok()) {
    gpu.mark_end(captured);
    return finish(comm, name);
  }
  gpu.release(owed, staged);
  gpu.mark_end(captured);
  const Status why(Code::kSystemError, fmt::format("{} on rank {}: {}", name, r, s.message()));
  comm.abort(why.message());
  return report(why);
}

}  // namespace chorus::capi
