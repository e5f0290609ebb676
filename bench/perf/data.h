// chorus-perf data: the collectives it runs, element types and reduce ops by name, the
// rank- and index-dependent input pattern, and the serial reference every output is checked
// against. Pattern values are small integers, exact in every type (bf16 included), so a
// correct reduction matches the reference exactly in any order of accumulation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "chorus/chorus.h"

namespace perf {

enum class Coll {
  kAllReduce,
  kBroadcast,
  kReduce,
  kAllGather,
  kReduceScatter,
  kSendRecv,
  kGather,
  kScatter,
  kAllToAll
};

const std::vector<std::string>& coll_names();  // in Coll order, as --coll spells them
Coll coll_from_name(const std::string& name);
const char* coll_name(Coll c);
bool coll_reduces(Coll c);   // takes a reduce op
bool coll_has_root(Coll c);  // broadcast, reduce, gather, scatter
// nccl-tests' bus bandwidth factor: busbw = algbw * factor.
double bus_factor(Coll c, int nranks);
// --device cuda: bytes of memory traffic per byte of the row's size for every rank's GPU
// together, at the least -- each input read once, each output written once: all_reduce and
// send_recv 2p, the others p + 1 (../shared/notes/gpu-collectives.md). The efficiency column is
// that traffic per second over the local copy traffic rate: for ranks that share one GPU.
double traffic_factor(Coll c, int nranks);

struct TypeInfo {
  chorusDataType_t dtype;
  const char* name;  // nccl-tests' spelling: float, double, half, bfloat16, int8, uint8, int32,
                     // uint32, int64, uint64
  size_t size;
};
// Accepts nccl-tests' names and the short ones (f32, f64, f16, bf16, i8, u8, i32, u32, i64, u64).
const TypeInfo* type_from_name(const std::string& name);
const std::vector<TypeInfo>& all_types();

struct OpInfo {
  chorusRedOp_t op;
  const char* name;  // sum, prod, min, max, avg
};
const OpInfo* op_from_name(const std::string& name);
const std::vector<OpInfo>& all_ops();

// How the ranks' buffers are laid out for one collective at one size.
struct Shape {
  size_t send_count = 0;   // elements each rank passes as input
  size_t recv_count = 0;   // elements each rank receives
  size_t count = 0;        // the count argument of the call
  size_t total_count = 0;  // what nccl-tests prints as "count" (the total for gather/scatter)
};
Shape shape_for(Coll c, size_t bytes, size_t type_size, int nranks);

// What one rank checks after one call. `op` is ignored for collectives that do not reduce.
struct CheckSpec {
  Coll coll;
  const TypeInfo* type;
  chorusRedOp_t op;
  int rank;
  int nranks;
  int root;
  Shape shape;
};

// Value of input element `index` on `rank` (small integer, exact in the type).
int64_t pattern(const CheckSpec& s, int rank, size_t index);

// Fills `count` elements of `buf` with this rank's pattern starting at element `first`.
void fill_pattern(const CheckSpec& s, void* buf, size_t first, size_t count);
// Bytes 0xF7: a value no pattern or reduction of patterns produces, so an element the call
// failed to write is counted wrong.
void fill_sentinel(void* buf, size_t bytes);

// Number of elements of this rank's output (`out`, shape.recv_count elements, or on root the
// reduce result) that differ from the serial reference. Ranks with no output return 0.
size_t count_wrong(const CheckSpec& s, const void* out);

// f16 / bf16 conversions (round to nearest even), exposed for the tests of this file.
uint16_t float_to_half(float f);
float half_to_float(uint16_t h);
uint16_t float_to_bf16(float f);
float bf16_to_float(uint16_t b);

}  // namespace perf
