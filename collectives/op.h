// What an operation is (kind, sequence number, count, type, root, ...), how it is described in
// messages, and the header every operation sends ahead of its data so peers can check it.
#pragma once

#include <cstdint>
#include <cstring>
#include <iterator>
#include <string>
#include <type_traits>

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
// C API enums -> kernel enums (all ten types); nullopt for values outside the enums. Inline:
// every call asks them, a few times.
inline std::optional<kernels::DType> kernel_dtype(int c_dtype) {
  using kernels::DType;
  static constexpr DType kOf[] = {DType::kI8,  DType::kU8,  DType::kI32, DType::kU32, DType::kI64,
                                  DType::kU64, DType::kF16, DType::kF32, DType::kF64, DType::kBF16};
  static_assert(chorusInt8 == 0 && chorusUint8 == 1 && chorusInt32 == 2 && chorusUint32 == 3 &&
                chorusInt64 == 4 && chorusUint64 == 5 && chorusFloat16 == 6 && chorusFloat32 == 7 &&
                chorusFloat64 == 8 && chorusBfloat16 == 9 && std::size(kOf) == chorusNumTypes);
  if (c_dtype < 0 || c_dtype >= chorusNumTypes) return std::nullopt;
  return kOf[c_dtype];
}
inline std::optional<kernels::RedOp> kernel_redop(int c_redop) {
  using kernels::RedOp;
  static constexpr RedOp kOf[] = {RedOp::kSum, RedOp::kProd, RedOp::kMax, RedOp::kMin, RedOp::kAvg};
  static_assert(chorusSum == 0 && chorusProd == 1 && chorusMax == 2 && chorusMin == 3 &&
                chorusAvg == 4 && std::size(kOf) == 5);
  if (c_redop < 0 || c_redop >= static_cast<int>(std::size(kOf))) return std::nullopt;
  return kOf[c_redop];
}
const char* dtype_name(int dtype);
inline size_t dtype_size(int dtype) {  // 0 for an unknown type
  static constexpr size_t kSizes[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2};
  return dtype >= 0 && dtype < chorusNumTypes ? kSizes[dtype] : 0;
}
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
static_assert(std::has_unique_object_representations_v<OpHeader>);  // no padding: memcmp is exact
constexpr uint16_t kOpMagic = 0x4f48;                               // "OH"

OpHeader make_header(const OpDesc& d, int sender, uint64_t comm_uid);
// Whether `got` is `mine` but for its sender, which is `from` (the header has no padding).
inline bool same_but_sender(const OpHeader& got, const OpHeader& mine, int from) {
  OpHeader expect = mine;
  expect.sender = from;
  return std::memcmp(&got, &expect, sizeof(OpHeader)) == 0;
}
// Checks a received header against what this rank is doing. The error (kMismatch) names both
// ranks and both calls, lower rank first: "barrier #12 on rank 0 vs broadcast #12 (...) on rank 1".
// All-to-all-v: `mine.count` is what this rank expects from `from`, the header's count what
// `from` sends it; the error names both views, "all_to_all_v #3 (i32, sends 5 to rank 1) on
// rank 0 vs all_to_all_v #3 (i32, expects 4 from rank 0) on rank 1".
Status check_header(const OpHeader& got, int from, const OpDesc& mine, int me, uint64_t comm_uid);

}  // namespace chorus
