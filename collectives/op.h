// What an operation is (kind, sequence number, count, type, root, ...), how it is described in
// messages, and the header every operation sends ahead of its data so peers can check it.
#pragma once

#include <cstdint>
#include <string>

#include <optional>

#include "chorus/chorus.h"
#include "common/status.h"
#include "kernels/cpu/reduce.h"

namespace chorus {

enum class OpKind : uint16_t {
  kSend = 1,
  kRecv,
  kBarrier,
  kBroadcast,
  kAllReduce,
  kReduce,
  kAllGather,
  kReduceScatter,
  kGather,
  kScatter,
  kAllToAll,
  kAllToAllv
};

// Algorithms the tuner picks from (and CHORUS_ALGO names).
// kDirect and kFold are the ordered algorithms of the deterministic mode (ordered.cc).
enum class Algo : int32_t {
  kNone = 0,
  kRing,
  kTree,
  kRecursiveDoubling,
  kChain,
  kDirect,
  kFold,
  kHier
};
const char* algo_name(Algo a);

struct OpDesc {
  OpKind kind = OpKind::kBarrier;
  uint64_t seq = 0;    // collectives: per communicator; send/recv: per (pair, direction)
  uint64_t count = 0;  // all-to-all-v: 0 for the call; in a pair's header, what one sends the other
  int dtype = chorusUint8;
  int root = -1;            // broadcast, reduce, gather, scatter
  int redop = -1;           // reductions (later)
  int peer = -1;            // send/recv: the other rank
  int tag = 0;              // send/recv
  Algo algo = Algo::kNone;  // reductions and gathers: every rank must run the same algorithm
  uint32_t piece = 0;       // ... with the same piece size (it shapes the stream)
  int nchannels = 1;        // ... cut into this many parts, part k on channel k
};

const char* op_name(OpKind k);
const char* redop_name(int redop);
// C API enums -> kernel enums (all ten types); nullopt for values outside the enums.
std::optional<kernels::DType> kernel_dtype(int c_dtype);
std::optional<kernels::RedOp> kernel_redop(int c_redop);
const char* dtype_name(int dtype);
size_t dtype_size(int dtype);  // 0 for an unknown type
// "broadcast #12 (count 1000 f32, root 0)", "barrier #3", "send #2 to rank 1 (count 5 u8, tag 7)"
std::string describe(const OpDesc& d);

// The first bytes of every operation between two ranks. 48 bytes, so that with a slot's
// 8-byte sequence word and 8 bytes of data an eager message fills exactly one cache line.
struct OpHeader {
  uint16_t magic;
  uint8_t kind;
  uint8_t dtype;
  uint8_t algo;
  int8_t redop;
  uint8_t nchannels;
  uint8_t reserved;
  uint64_t seq;
  uint64_t count;
  int32_t root;
  int32_t tag;
  int32_t sender;
  uint32_t piece;
  uint64_t comm_uid;
};
static_assert(sizeof(OpHeader) == 48);
constexpr uint16_t kOpMagic = 0x4f48;  // "OH"

OpHeader make_header(const OpDesc& d, int sender, uint64_t comm_uid);
// Checks a received header against what this rank is doing. The error (kMismatch) names both
// ranks and both calls, lower rank first: "barrier #12 on rank 0 vs broadcast #12 (...) on rank 1".
// All-to-all-v: `mine.count` is what this rank expects from `from`, the header's count what
// `from` sends it; the error names both views, "all_to_all_v #3 (i32, sends 5 to rank 1) on
// rank 0 vs all_to_all_v #3 (i32, expects 4 from rank 0) on rank 1".
Status check_header(const OpHeader& got, int from, const OpDesc& mine, int me, uint64_t comm_uid);

}  // namespace chorus
