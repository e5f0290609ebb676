// chorus-perf's own parts, without a communicator: size parsing and sweeps, shapes and bus
// factors, f16/bf16 conversion, and that the output check counts exactly the wrong elements
// (against expected outputs computed here, independently of data.cc's reference).
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "perf/data.h"
#include "perf/options.h"

using namespace perf;

TEST_CASE("sizes read as nccl-tests reads them", "[perf]") {
  CHECK(parse_size("8") == size_t{8});
  CHECK(parse_size("1K") == size_t{1024});
  CHECK(parse_size("64k") == size_t{65536});
  CHECK(parse_size("128M") == size_t{134217728});
  CHECK(parse_size("1G") == size_t{1} << 30);
  CHECK(parse_size("16MB") == size_t{16} << 20);
  CHECK_FALSE(parse_size(""));
  CHECK_FALSE(parse_size("M"));
  CHECK_FALSE(parse_size("12X"));
  CHECK_FALSE(parse_size("-8"));
  CHECK_FALSE(parse_size("99999999999999999999"));
}

TEST_CASE("sweeps include both ends and step by factor or bytes", "[perf]") {
  Options o;
  o.min_bytes = 8;
  o.max_bytes = 1u << 20;
  o.factor = 8;
  CHECK(sweep_sizes(o) == std::vector<size_t>{8, 64, 512, 4096, 32768, 262144});
  o.max_bytes = 4096;
  CHECK(sweep_sizes(o).back() == 4096);
  o.factor = 1;
  o.min_bytes = 1000;
  o.max_bytes = 3000;
  o.step_bytes = 1000;
  CHECK(sweep_sizes(o) == std::vector<size_t>{1000, 2000, 3000});
}

TEST_CASE("shapes and bus factors follow nccl-tests", "[perf]") {
  Shape ag = shape_for(Coll::kAllGather, 1000 * 4, 4, 3);  // 1000 floats over 3 ranks
  CHECK(ag.send_count == 333);
  CHECK(ag.recv_count == 999);
  CHECK(ag.total_count == 999);
  Shape rs = shape_for(Coll::kReduceScatter, 1000 * 4, 4, 3);
  CHECK(rs.recv_count == 333);
  CHECK(rs.send_count == 999);
  Shape ar = shape_for(Coll::kAllReduce, 6, 4, 2);  // less than two elements: one
  CHECK(ar.count == 1);
  CHECK(bus_factor(Coll::kAllReduce, 4) == Approx(1.5));
  CHECK(bus_factor(Coll::kAllGather, 4) == Approx(0.75));
  CHECK(bus_factor(Coll::kReduceScatter, 2) == Approx(0.5));
  CHECK(bus_factor(Coll::kBroadcast, 8) == 1.0);
  CHECK(bus_factor(Coll::kSendRecv, 8) == 1.0);
  // gather, scatter, all_to_all: nccl-tests' gather_perf, scatter_perf and alltoall_perf
  Shape g = shape_for(Coll::kGather, 1000 * 4, 4, 3);
  CHECK((g.count == 333 && g.send_count == 333 && g.recv_count == 999 && g.total_count == 999));
  Shape sc = shape_for(Coll::kScatter, 1000 * 4, 4, 3);
  CHECK((sc.count == 333 && sc.send_count == 999 && sc.recv_count == 333 && sc.total_count == 999));
  Shape a2a = shape_for(Coll::kAllToAll, 1000 * 4, 4, 3);  // a block of 333 to each rank
  CHECK((a2a.count == 333 && a2a.send_count == 999 && a2a.recv_count == 999));
  for (Coll c : {Coll::kGather, Coll::kScatter, Coll::kAllToAll})
    CHECK(bus_factor(c, 4) == Approx(0.75));
  CHECK(coll_has_root(Coll::kGather));
  CHECK(coll_has_root(Coll::kScatter));
  CHECK_FALSE(coll_has_root(Coll::kAllToAll));
  CHECK(traffic_factor(Coll::kAllToAll, 3) == Approx(6.0));
  CHECK(traffic_factor(Coll::kGather, 3) == Approx(2.0));
}

TEST_CASE("names of types, ops and collectives", "[perf]") {
  CHECK(type_from_name("f32")->dtype == chorusFloat32);
  CHECK(type_from_name("bfloat16")->dtype == chorusBfloat16);
  CHECK(type_from_name("u8")->size == 1);
  CHECK(type_from_name("float8") == nullptr);
  CHECK(op_from_name("avg")->op == chorusAvg);
  CHECK(op_from_name("mean") == nullptr);
  CHECK(coll_from_name("reduce_scatter") == Coll::kReduceScatter);
  CHECK(std::string(coll_name(Coll::kSendRecv)) == "send_recv");
  CHECK(coll_from_name("all_to_all") == Coll::kAllToAll);
  CHECK(std::string(coll_name(Coll::kScatter)) == "scatter");
}

TEST_CASE("f16 and bf16 conversions round to nearest even", "[perf]") {
  for (int v = -2048; v <= 2048; ++v) {
    CHECK(half_to_float(float_to_half(static_cast<float>(v))) == static_cast<float>(v));
  }
  for (int v = -256; v <= 256; ++v) {
    CHECK(bf16_to_float(float_to_bf16(static_cast<float>(v))) == static_cast<float>(v));
  }
  CHECK(float_to_half(1.0f) == 0x3C00);
  CHECK(float_to_half(2049.0f) == float_to_half(2048.0f));  // tie to even
  CHECK(float_to_half(65520.0f) == 0x7C00);                 // overflow to inf
  CHECK(half_to_float(0x0001) == std::ldexp(1.0f, -24));    // smallest subnormal
  CHECK(float_to_half(std::ldexp(1.0f, -24)) == 0x0001);
  CHECK(float_to_bf16(1.0f) == 0x3F80);
  CHECK(float_to_bf16(257.0f) == float_to_bf16(256.0f));  // tie to even
  CHECK(std::isnan(bf16_to_float(float_to_bf16(NAN))));
}

namespace {

CheckSpec spec(Coll c, const char* type, chorusRedOp_t op, int rank, int nranks, size_t bytes) {
  const TypeInfo* t = type_from_name(type);
  return CheckSpec{c, t, op, rank, nranks, 0, shape_for(c, bytes, t->size, nranks)};
}

// Writes value v (an exact small number) as element i of a buffer of the given type.
void put(const TypeInfo* t, std::vector<unsigned char>& buf, size_t i, double v) {
  unsigned char* p = buf.data() + i * t->size;
  switch (t->dtype) {
    case chorusFloat32: {
      float x = static_cast<float>(v);
      std::memcpy(p, &x, 4);
      break;
    }
    case chorusFloat64:
      std::memcpy(p, &v, 8);
      break;
    case chorusFloat16: {
      uint16_t x = float_to_half(static_cast<float>(v));
      std::memcpy(p, &x, 2);
      break;
    }
    case chorusBfloat16: {
      uint16_t x = float_to_bf16(static_cast<float>(v));
      std::memcpy(p, &x, 2);
      break;
    }
    case chorusInt32: {
      int32_t x = static_cast<int32_t>(v);
      std::memcpy(p, &x, 4);
      break;
    }
    case chorusInt64: {
      int64_t x = static_cast<int64_t>(v);
      std::memcpy(p, &x, 8);
      break;
    }
    case chorusUint32: {
      uint32_t x = static_cast<uint32_t>(static_cast<int64_t>(v));
      std::memcpy(p, &x, 4);
      break;
    }
    case chorusUint64: {
      uint64_t x = static_cast<uint64_t>(static_cast<int64_t>(v));
      std::memcpy(p, &x, 8);
      break;
    }
    default:  // int8, uint8
      *p = static_cast<uint8_t>(static_cast<int64_t>(v));
      break;
  }
}

// The output a correct all-reduce gives, computed directly from pattern().
std::vector<unsigned char> all_reduce_output(const CheckSpec& s) {
  std::vector<unsigned char> out(s.shape.recv_count * s.type->size);
  for (size_t i = 0; i < s.shape.recv_count; ++i) {
    int64_t acc = pattern(s, 0, i);
    for (int r = 1; r < s.nranks; ++r) {
      const int64_t v = pattern(s, r, i);
      if (s.op == chorusProd)
        acc *= v;
      else if (s.op == chorusMin)
        acc = std::min(acc, v);
      else if (s.op == chorusMax)
        acc = std::max(acc, v);
      else
        acc += v;
    }
    double want = static_cast<double>(acc);
    if (s.op == chorusAvg) {
      const chorusDataType_t d = s.type->dtype;
      const bool is_float =
          d == chorusFloat32 || d == chorusFloat64 || d == chorusFloat16 || d == chorusBfloat16;
      want = is_float ? want / s.nranks : static_cast<double>(acc / s.nranks);
    }
    if (s.type->dtype == chorusUint8) want = static_cast<uint8_t>(acc);
    if (s.type->dtype == chorusInt8) want = static_cast<int8_t>(acc);
    put(s.type, out, i, want);
  }
  return out;
}

}  // namespace

TEST_CASE("the check counts exactly the wrong elements of an all-reduce", "[perf]") {
  const char* types[] = {"float", "double", "half",   "bfloat16", "int8",
                         "uint8", "int32",  "uint32", "int64",    "uint64"};
  const chorusRedOp_t ops[] = {chorusSum, chorusProd, chorusMin, chorusMax};
  for (const char* type : types) {
    for (chorusRedOp_t op : ops) {
      for (int nranks : {1, 2, 3, 7, 16}) {
        CheckSpec s = spec(Coll::kAllReduce, type, op, nranks - 1, nranks, 4096);
        auto out = all_reduce_output(s);
        INFO(type << " op " << op << " nranks " << nranks);
        CHECK(count_wrong(s, out.data()) == 0);
        fill_sentinel(out.data() + 5 * s.type->size, 3 * s.type->size);  // 3 elements unwritten
        out[s.shape.recv_count / 2 * s.type->size] ^= 0x40;              // 1 element off
        CHECK(count_wrong(s, out.data()) == 4);
      }
    }
  }
}

TEST_CASE("avg: exact on integers (truncating), a few ulp on floating types", "[perf]") {
  CheckSpec s = spec(Coll::kAllReduce, "int32", chorusAvg, 0, 3, 400);
  auto out = all_reduce_output(s);
  CHECK(count_wrong(s, out.data()) == 0);
  out[0] ^= 1;
  CHECK(count_wrong(s, out.data()) == 1);

  CheckSpec f = spec(Coll::kAllReduce, "float", chorusAvg, 0, 3, 400);
  auto fout = all_reduce_output(f);
  CHECK(count_wrong(f, fout.data()) == 0);
  fout[0] ^= 1;  // one ulp off element 0: within tolerance
  CHECK(count_wrong(f, fout.data()) == 0);
  fout[3] ^= 0x40;  // element 0 far off
  CHECK(count_wrong(f, fout.data()) == 1);
}

TEST_CASE("pattern sums stay exact in bf16 and u8 for up to 120 ranks", "[perf]") {
  for (int nranks : {2, 5, 33, 120}) {
    CheckSpec s = spec(Coll::kAllReduce, "bf16", chorusSum, 0, nranks, 2 * 200);
    for (size_t i = 0; i < 200; ++i) {
      int64_t sum = 0;
      for (int r = 0; r < nranks; ++r) sum += pattern(s, r, i);
      CHECK(std::llabs(sum) <= 256);
    }
    CheckSpec u = spec(Coll::kAllReduce, "u8", chorusAvg, 0, nranks, 200);
    for (size_t i = 0; i < 200; ++i) {
      int64_t sum = 0;
      for (int r = 0; r < nranks; ++r) sum += pattern(u, r, i);
      CHECK(sum < 256);  // no wrap before the division
    }
  }
}

TEST_CASE("gather, scatter, broadcast and send_recv outputs are checked per block", "[perf]") {
  const int n = 3;
  // all_gather: block j of the output is rank j's input.
  CheckSpec ag = spec(Coll::kAllGather, "int32", chorusSum, 1, n, 3 * 10 * 4);
  std::vector<unsigned char> out(ag.shape.recv_count * 4);
  for (int j = 0; j < n; ++j) {
    CheckSpec from = ag;
    from.rank = j;
    fill_pattern(from, out.data() + j * 10 * 4, 0, 10);
  }
  CHECK(count_wrong(ag, out.data()) == 0);
  std::swap(out[0], out[10 * 4]);  // blocks 0 and 1 start differently
  CHECK(count_wrong(ag, out.data()) == 2);

  // reduce_scatter: rank 2 gets the reduction of block 2.
  CheckSpec rs = spec(Coll::kReduceScatter, "float", chorusMax, 2, n, 3 * 10 * 4);
  CheckSpec full = spec(Coll::kAllReduce, "float", chorusMax, 2, n, 3 * 10 * 4);
  auto all = all_reduce_output(full);
  CHECK(count_wrong(rs, all.data() + 2 * 10 * 4) == 0);
  CHECK(count_wrong(rs, all.data()) > 0);

  // broadcast from root 1; send_recv from the previous rank.
  CheckSpec bc = spec(Coll::kBroadcast, "u8", chorusSum, 0, n, 50);
  bc.root = 1;
  CheckSpec root = bc;
  root.rank = 1;
  std::vector<unsigned char> b(50);
  fill_pattern(root, b.data(), 0, 50);
  CHECK(count_wrong(bc, b.data()) == 0);
  CheckSpec sr = spec(Coll::kSendRecv, "half", chorusSum, 0, n, 100);
  CheckSpec prev = sr;
  prev.rank = n - 1;
  std::vector<unsigned char> r(100);
  fill_pattern(prev, r.data(), 0, 50);
  CHECK(count_wrong(sr, r.data()) == 0);
  fill_pattern(sr, r.data(), 0, 50);  // its own data instead of its neighbour's
  CHECK(count_wrong(sr, r.data()) > 0);

  // gather to root 2: block j is rank j's input; off the root nothing is checked.
  CheckSpec ga = spec(Coll::kGather, "int32", chorusSum, 2, n, 3 * 10 * 4);
  ga.root = 2;
  std::vector<unsigned char> gout(ga.shape.recv_count * 4);
  for (int j = 0; j < n; ++j) {
    CheckSpec from = ga;
    from.rank = j;
    fill_pattern(from, gout.data() + j * 10 * 4, 0, 10);
  }
  CHECK(count_wrong(ga, gout.data()) == 0);
  gout[10 * 4] ^= 1;
  CHECK(count_wrong(ga, gout.data()) == 1);
  ga.rank = 0;
  CHECK(count_wrong(ga, gout.data()) == 0);

  // scatter from root 0: rank 1 gets block 1 of the root's input.
  CheckSpec sc = spec(Coll::kScatter, "float", chorusSum, 1, n, 3 * 10 * 4);
  sc.root = 0;
  CheckSpec sroot = sc;
  sroot.rank = 0;
  std::vector<unsigned char> sin(sc.shape.send_count * 4);
  fill_pattern(sroot, sin.data(), 0, sc.shape.send_count);
  CHECK(count_wrong(sc, sin.data() + 10 * 4) == 0);
  CHECK(count_wrong(sc, sin.data()) > 0);  // block 0 is rank 0's

  // all_to_all: rank 1's block j is block 1 of rank j's input.
  CheckSpec aa = spec(Coll::kAllToAll, "int32", chorusSum, 1, n, 3 * 10 * 4);
  std::vector<unsigned char> aout(aa.shape.recv_count * 4);
  for (int j = 0; j < n; ++j) {
    CheckSpec from = aa;
    from.rank = j;
    std::vector<unsigned char> in(aa.shape.send_count * 4);
    fill_pattern(from, in.data(), 0, aa.shape.send_count);
    std::copy_n(in.begin() + 10 * 4, 10 * 4, aout.begin() + j * 10 * 4);
  }
  CHECK(count_wrong(aa, aout.data()) == 0);
  aa.rank = 2;  // another rank's view: its blocks are block 2 of each input
  CHECK(count_wrong(aa, aout.data()) > 0);
}
