// Operation descriptions and header checks.
#include "collectives/op.h"

namespace chorus {

const char* op_name(OpKind k) {
  switch (k) {
    case OpKind::kSend: return "send";
    case OpKind::kRecv: return "recv";
    case OpKind::kBarrier: return "barrier";
    case OpKind::kBroadcast: return "broadcast";
  }
  return "unknown operation";
}

const char* dtype_name(int dtype) {
  static const char* names[] = {"i8", "u8", "i32", "u32", "i64", "u64", "f16", "f32", "f64", "bf16"};
  return dtype >= 0 && dtype < chorusNumTypes ? names[dtype] : "unknown-type";
}

size_t dtype_size(int dtype) {
  static const size_t sizes[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2};
  return dtype >= 0 && dtype < chorusNumTypes ? sizes[dtype] : 0;
}

std::string describe(const OpDesc& d) {
  switch (d.kind) {
    case OpKind::kBarrier:
      return fmt::format("barrier #{}", d.seq);
    case OpKind::kBroadcast:
      return fmt::format("broadcast #{} (count {} {}, root {})", d.seq, d.count, dtype_name(d.dtype), d.root);
    case OpKind::kSend:
      return fmt::format("send #{} to rank {} (count {} {}, tag {})", d.seq, d.peer, d.count, dtype_name(d.dtype), d.tag);
    case OpKind::kRecv:
      return fmt::format("recv #{} from rank {} (count {} {}, tag {})", d.seq, d.peer, d.count, dtype_name(d.dtype), d.tag);
  }
  return "unknown operation";
}

OpHeader make_header(const OpDesc& d, int sender, uint64_t comm_uid) {
  OpHeader h{};
  h.magic = kOpMagic;
  h.kind = static_cast<uint16_t>(d.kind);
  h.dtype = static_cast<uint16_t>(d.dtype);
  h.seq = d.seq;
  h.count = d.count;
  h.root = d.root;
  h.redop = d.redop;
  h.tag = d.tag;
  h.sender = sender;
  h.comm_uid = comm_uid;
  return h;
}

Status check_header(const OpHeader& got, int from, const OpDesc& mine, int me, uint64_t comm_uid) {
  if (got.magic != kOpMagic || got.comm_uid != comm_uid || got.sender != from)
    return make_error(Code::kRemoteError, "{} on rank {}: corrupt header from rank {} (magic {:#x}, sender {}, comm {:#x})",
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
  OpKind expect = mine.kind == OpKind::kRecv ? OpKind::kSend : mine.kind;
  bool same = theirs.kind == expect && theirs.seq == mine.seq && theirs.count == mine.count &&
              theirs.dtype == mine.dtype && theirs.root == mine.root && theirs.redop == mine.redop &&
              theirs.tag == mine.tag;
  if (same) return Status::ok();
  std::string a = fmt::format("{} on rank {}", describe(theirs), from);
  std::string b = fmt::format("{} on rank {}", describe(mine), me);
  return Status(Code::kMismatch, from < me ? a + " vs " + b : b + " vs " + a);
}

}  // namespace chorus
