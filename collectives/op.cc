// Operation descriptions and header checks.
#include "collectives/op.h"

namespace chorus {

const char* op_name(OpKind k) {
  switch (k) {
    case OpKind::kSend:
      return "send";
    case OpKind::kRecv:
      return "recv";
    case OpKind::kBarrier:
      return "barrier";
    case OpKind::kBroadcast:
      return "broadcast";
    case OpKind::kAllReduce:
      return "all_reduce";
    case OpKind::kReduce:
      return "reduce";
    case OpKind::kAllGather:
      return "all_gather";
    case OpKind::kReduceScatter:
      return "reduce_scatter";
    case OpKind::kGather:
      return "gather";
    case OpKind::kScatter:
      return "scatter";
    case OpKind::kAllToAll:
      return "all_to_all";
    case OpKind::kAllToAllv:
      return "all_to_all_v";
  }
  return "unknown operation";
}

const char* algo_name(Algo a) {
  switch (a) {
    case Algo::kNone:
      return "none";
    case Algo::kRing:
      return "ring";
    case Algo::kTree:
      return "tree";
    case Algo::kRecursiveDoubling:
      return "rd";
    case Algo::kChain:
      return "chain";
    case Algo::kDirect:
      return "direct";
    case Algo::kFold:
      return "fold";
    case Algo::kHier:
      return "hier";
  }
  return "unknown";
}

const char* redop_name(int redop) {
  static const char* names[] = {"sum", "prod", "max", "min", "avg"};
  return redop >= 0 && redop < 5 ? names[redop] : "unknown-op";
}

const char* dtype_name(int dtype) {
  static const char* names[] = {"i8",  "u8",  "i32", "u32", "i64",
                                "u64", "f16", "f32", "f64", "bf16"};
  return dtype >= 0 && dtype < chorusNumTypes ? names[dtype] : "unknown-type";
}

std::string describe(const OpDesc& d) {
  switch (d.kind) {
    case OpKind::kBarrier:
      return fmt::format("barrier #{}", d.seq);
    case OpKind::kBroadcast:
      return fmt::format("broadcast #{} (count {} {}, root {})", d.seq, d.count,
                         dtype_name(d.dtype), d.root);
    case OpKind::kSend:
      return fmt::format("send #{} to rank {} (count {} {}, tag {})", d.seq, d.peer, d.count,
                         dtype_name(d.dtype), d.tag);
    case OpKind::kRecv:
      return fmt::format("recv #{} from rank {} (count {} {}, tag {})", d.seq, d.peer, d.count,
                         dtype_name(d.dtype), d.tag);
    case OpKind::kAllReduce:
    case OpKind::kReduceScatter:
      return fmt::format("{} #{} (count {} {}, {}, {})", op_name(d.kind), d.seq, d.count,
                         dtype_name(d.dtype), redop_name(d.redop), algo_name(d.algo));
    case OpKind::kReduce:
      return fmt::format("reduce #{} (count {} {}, {}, root {}, {})", d.seq, d.count,
                         dtype_name(d.dtype), redop_name(d.redop), d.root, algo_name(d.algo));
    case OpKind::kAllGather:
      return fmt::format("all_gather #{} (count {} {}, {})", d.seq, d.count, dtype_name(d.dtype),
                         algo_name(d.algo));
    case OpKind::kGather:
    case OpKind::kScatter:
      return fmt::format("{} #{} (count {} {}, root {})", op_name(d.kind), d.seq, d.count,
                         dtype_name(d.dtype), d.root);
    case OpKind::kAllToAll:
      return fmt::format("all_to_all #{} (count {} {})", d.seq, d.count, dtype_name(d.dtype));
    case OpKind::kAllToAllv:  // counts differ by pair: a disagreement is named by check_header
      return fmt::format("all_to_all_v #{} ({})", d.seq, dtype_name(d.dtype));
  }
  return "unknown operation";
}

OpHeader make_header(const OpDesc& d, int sender, uint64_t comm_uid) {
  OpHeader h{};
  h.magic = kOpMagic;
  h.kind = static_cast<uint8_t>(d.kind);
  h.dtype = static_cast<uint8_t>(d.dtype);
  h.seq = d.seq;
  h.count = d.count;
  h.root = d.root;
  h.redop = static_cast<int8_t>(d.redop);
  h.tag = d.tag;
  h.sender = sender;
  h.comm_uid = comm_uid;
  h.algo = static_cast<uint8_t>(d.algo);
  h.piece = d.piece;
  h.nchannels = static_cast<uint8_t>(d.nchannels);
  return h;
}

namespace {

// The fields on which two calls differ that describe() does not print for their kind, each as
// "<field> <lower rank's> vs <higher rank's>", e.g. "channels 2 vs 1 (CHORUS_NCHANNELS differs
// between ranks)". Empty when describe() already shows every difference.
std::string hidden_differences(const OpDesc& low, const OpDesc& high) {
  auto type_text = [](int t) {
    return dtype_size(t) ? std::string(dtype_name(t)) : fmt::format("{} (unknown)", t);
  };
  auto op_text = [](int op) {
    if (op == -1) return std::string("none");
    return op >= 0 && op < 5 ? std::string(redop_name(op)) : fmt::format("{} (unknown)", op);
  };
  auto algo_text = [](Algo a) {
    std::string name = algo_name(a);
    return name == "unknown" ? fmt::format("{} (unknown)", static_cast<int>(a)) : name;
  };
  std::string out;
  auto add = [&out](const std::string& part) { out += (out.empty() ? "" : ", ") + part; };
  if (low.count != high.count) add(fmt::format("count {} vs {}", low.count, high.count));
  if (low.dtype != high.dtype)
    add(fmt::format("type {} vs {}", type_text(low.dtype), type_text(high.dtype)));
  if (low.root != high.root) add(fmt::format("root {} vs {}", low.root, high.root));
  if (low.redop != high.redop)
    add(fmt::format("op {} vs {}", op_text(low.redop), op_text(high.redop)));
  if (low.tag != high.tag) add(fmt::format("tag {} vs {}", low.tag, high.tag));
  if (low.algo != high.algo)
    add(fmt::format("algorithm {} vs {} (CHORUS_ALGO differs between ranks)", algo_text(low.algo),
                    algo_text(high.algo)));
  if (low.piece != high.piece)
    add(fmt::format("piece bytes {} vs {} (CHORUS_CHUNK_BYTES differs between ranks)", low.piece,
                    high.piece));
  if (low.nchannels != high.nchannels)
    add(fmt::format("channels {} vs {} (CHORUS_NCHANNELS differs between ranks)", low.nchannels,
                    high.nchannels));
  return out;
}

}  // namespace

Status check_header(const OpHeader& got, int from, const OpDesc& mine, int me, uint64_t comm_uid) {
  if (got.magic != kOpMagic || got.comm_uid != comm_uid || got.sender != from)
    return make_error(
        Code::kRemoteError,
        "{} on rank {}: corrupt header from rank {} (magic {:#x}, sender {}, comm {:#x})",
        describe(mine), me, from, got.magic, got.sender, got.comm_uid);
  OpDesc theirs;
  theirs.kind = static_cast<OpKind>(got.kind);
  theirs.seq = got.seq;
  theirs.count = got.count;
  theirs.dtype = got.dtype;
  theirs.root = got.root;
  theirs.redop = got.redop;
  theirs.tag = got.tag;
  theirs.peer = me;
  theirs.algo = static_cast<Algo>(got.algo);
  theirs.piece = got.piece;
  theirs.nchannels = got.nchannels;
  OpKind expect = mine.kind == OpKind::kRecv ? OpKind::kSend : mine.kind;
  bool same = theirs.kind == expect && theirs.seq == mine.seq && theirs.count == mine.count &&
              theirs.dtype == mine.dtype && theirs.root == mine.root &&
              theirs.redop == mine.redop && theirs.tag == mine.tag && theirs.algo == mine.algo &&
              theirs.piece == mine.piece && theirs.nchannels == mine.nchannels;
  if (same) return Status::ok();
  // Two all-to-all-v calls: each side's count is its own view of this pair's block.
  const bool pair = mine.kind == OpKind::kAllToAllv && theirs.kind == mine.kind;
  auto pair_text = [](const OpDesc& d, const char* verb, const char* dir, int other) {
    return fmt::format("all_to_all_v #{} ({}, {} {} {} rank {})", d.seq, dtype_name(d.dtype), verb,
                       d.count, dir, other);
  };
  std::string a = fmt::format("{} on rank {}",
                              pair ? pair_text(theirs, "sends", "to", me) : describe(theirs), from);
  std::string b = fmt::format("{} on rank {}",
                              pair ? pair_text(mine, "expects", "from", from) : describe(mine), me);
  std::string both = from < me ? a + " vs " + b : b + " vs " + a;
  // Calls of matching kinds that describe() prints alike (for a send and its recv: alike but
  // for the kind and direction): name the fields that differ, lower rank's value first.
  OpDesc theirs_as_mine = theirs;
  theirs_as_mine.kind = mine.kind;
  theirs_as_mine.peer = mine.peer;
  const bool alike =
      pair ? theirs.seq == mine.seq && theirs.dtype == mine.dtype && theirs.count == mine.count
           : theirs.kind == expect && describe(theirs_as_mine) == describe(mine);
  if (alike) {
    std::string hidden =
        from < me ? hidden_differences(theirs, mine) : hidden_differences(mine, theirs);
    if (!hidden.empty()) both += " (" + hidden + ")";
  }
  return Status(Code::kMismatch, both);
}

}  // namespace chorus
