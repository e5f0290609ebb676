// chorus-perf data: names, shapes, the input pattern and the serial reference (see data.h).
#include "perf/data.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

namespace perf {

// ---------------------------------------------------------------- names

const std::vector<std::string>& coll_names() {
  static const std::vector<std::string> names = {"all_reduce", "broadcast",      "reduce",
                                                 "all_gather", "reduce_scatter", "send_recv",
                                                 "gather",     "scatter",        "all_to_all"};
  return names;
}

Coll coll_from_name(const std::string& name) {
  const auto& names = coll_names();
  auto it = std::find(names.begin(), names.end(), name);
  if (it == names.end()) throw std::invalid_argument("unknown collective '" + name + "'");
  return static_cast<Coll>(it - names.begin());
}

const char* coll_name(Coll c) {
  return coll_names()[static_cast<size_t>(c)].c_str();
}

bool coll_reduces(Coll c) {
  return c == Coll::kAllReduce || c == Coll::kReduce || c == Coll::kReduceScatter;
}

bool coll_has_root(Coll c) {
  return c == Coll::kBroadcast || c == Coll::kReduce || c == Coll::kGather || c == Coll::kScatter;
}

double bus_factor(Coll c, int nranks) {
  const double n = nranks;
  switch (c) {
    case Coll::kAllReduce:
      return 2.0 * (n - 1) / n;
    case Coll::kAllGather:
    case Coll::kReduceScatter:
    case Coll::kGather:
    case Coll::kScatter:
    case Coll::kAllToAll:
      return (n - 1) / n;
    default:
      return 1.0;
  }
}

double traffic_factor(Coll c, int nranks) {
  const double n = nranks;
  switch (c) {
    case Coll::kAllReduce:
    case Coll::kSendRecv:
    case Coll::kAllToAll:  // every rank's N read and written
      return 2.0 * n;
    case Coll::kGather:  // the total read once, written once
    case Coll::kScatter:
      return 2.0;
    default:
      return n + 1.0;
  }
}

const std::vector<TypeInfo>& all_types() {
  static const std::vector<TypeInfo> types = {
      {chorusFloat32, "float", 4},     {chorusFloat64, "double", 8}, {chorusFloat16, "half", 2},
      {chorusBfloat16, "bfloat16", 2}, {chorusInt8, "int8", 1},      {chorusUint8, "uint8", 1},
      {chorusInt32, "int32", 4},       {chorusUint32, "uint32", 4},  {chorusInt64, "int64", 8},
      {chorusUint64, "uint64", 8}};
  return types;
}

const TypeInfo* type_from_name(const std::string& name) {
  static const std::pair<const char*, const char*> aliases[] = {
      {"f32", "float"}, {"float32", "float"}, {"f64", "double"},    {"float64", "double"},
      {"f16", "half"},  {"float16", "half"},  {"bf16", "bfloat16"}, {"i32", "int32"},
      {"i64", "int64"}, {"u8", "uint8"},      {"i8", "int8"},       {"u32", "uint32"},
      {"u64", "uint64"}};
  std::string canonical = name;
  for (const auto& [alias, full] : aliases) {
    if (name == alias) canonical = full;
  }
  for (const auto& t : all_types()) {
    if (canonical == t.name) return &t;
  }
  return nullptr;
}

const std::vector<OpInfo>& all_ops() {
  static const std::vector<OpInfo> ops = {{chorusSum, "sum"},
                                          {chorusProd, "prod"},
                                          {chorusMin, "min"},
                                          {chorusMax, "max"},
                                          {chorusAvg, "avg"}};
  return ops;
}

const OpInfo* op_from_name(const std::string& name) {
  for (const auto& o : all_ops()) {
    if (name == o.name) return &o;
  }
  return nullptr;
}

// nccl-tests' sizing: gather/scatter split the total evenly and round down.
Shape shape_for(Coll c, size_t bytes, size_t type_size, int nranks) {
  const size_t elems = bytes / type_size;
  const size_t n = static_cast<size_t>(nranks);
  Shape s;
  switch (c) {
    case Coll::kAllGather:
    case Coll::kGather:
      s.count = s.send_count = elems / n;
      s.recv_count = s.total_count = s.send_count * n;
      break;
    case Coll::kReduceScatter:
    case Coll::kScatter:
      s.count = s.recv_count = elems / n;
      s.send_count = s.total_count = s.recv_count * n;
      break;
    case Coll::kAllToAll:  // a block to each rank
      s.count = elems / n;
      s.send_count = s.recv_count = s.total_count = s.count * n;
      break;
    default:
      s.count = s.send_count = s.recv_count = s.total_count = elems;
  }
  return s;
}

// ---------------------------------------------------------------- f16 / bf16

uint16_t float_to_half(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t mant = x & 0x7FFFFFu;
  const int exp = static_cast<int>((x >> 23) & 0xFFu);
  if (exp == 255) return static_cast<uint16_t>(sign | 0x7C00u | (mant ? 0x200u : 0u));
  const int e = exp - 127 + 15;
  if (e >= 31) return static_cast<uint16_t>(sign | 0x7C00u);
  if (e <= 0) {  // subnormal half (or zero)
    if (e < -10) return static_cast<uint16_t>(sign);
    mant |= 0x800000u;
    const int shift = 14 - e;
    uint32_t h = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (h & 1u))) h++;
    return static_cast<uint16_t>(sign | h);
  }
  uint32_t h = sign | (static_cast<uint32_t>(e) << 10) | (mant >> 13);
  const uint32_t rem = mant & 0x1FFFu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;  // a carry rounds up the exponent
  return static_cast<uint16_t>(h);
}

float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  const uint32_t mant = h & 0x3FFu;
  uint32_t x;
  if (exp == 0) {
    const float v = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -v : v;
  }
  if (exp == 31) {
    x = sign | 0x7F800000u | (mant << 13);
  } else {
    x = sign | ((exp + 112) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

uint16_t float_to_bf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // NaN
  x += 0x7FFFu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

float bf16_to_float(uint16_t b) {
  const uint32_t x = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

// ---------------------------------------------------------------- typed access

namespace {

// Encode an exact small integer into the element type, decode an element to double.
template <class T>
struct Plain {
  using Elem = T;
  static Elem enc(int64_t v) { return static_cast<T>(v); }
  static double dec(Elem x) { return static_cast<double>(x); }
};
struct Half {
  using Elem = uint16_t;
  static Elem enc(int64_t v) { return float_to_half(static_cast<float>(v)); }
  static double dec(Elem x) { return half_to_float(x); }
};
struct Bf16 {
  using Elem = uint16_t;
  static Elem enc(int64_t v) { return float_to_bf16(static_cast<float>(v)); }
  static double dec(Elem x) { return bf16_to_float(x); }
};

template <class F>
void with_codec(chorusDataType_t d, F&& f) {
  switch (d) {
    case chorusFloat32:
      return f(Plain<float>{});
    case chorusFloat64:
      return f(Plain<double>{});
    case chorusFloat16:
      return f(Half{});
    case chorusBfloat16:
      return f(Bf16{});
    case chorusInt32:
      return f(Plain<int32_t>{});
    case chorusInt64:
      return f(Plain<int64_t>{});
    case chorusUint8:
      return f(Plain<uint8_t>{});
    case chorusInt8:
      return f(Plain<int8_t>{});
    case chorusUint32:
      return f(Plain<uint32_t>{});
    case chorusUint64:
      return f(Plain<uint64_t>{});
    default:
      throw std::invalid_argument("chorus-perf: unsupported data type");
  }
}

bool is_float(chorusDataType_t d) {
  return d == chorusFloat32 || d == chorusFloat64 || d == chorusFloat16 || d == chorusBfloat16;
}

// Relative tolerance for avg on floating types (the division by n may round either way).
double avg_tolerance(chorusDataType_t d) {
  switch (d) {
    case chorusFloat64:
      return 4 * 2.3e-16;
    case chorusFloat32:
      return 4 * 1.2e-7;
    case chorusFloat16:
      return 4 * 9.8e-4;
    default:
      return 4 * 7.9e-3;  // bf16
  }
}

// Expected value of a reduction over every rank's pattern at `index`, in the element type
// (integers wrap as the type does; avg on integers truncates).
double reference(const CheckSpec& s, size_t index) {
  int64_t acc = pattern(s, 0, index);
  for (int r = 1; r < s.nranks; ++r) {
    const int64_t v = pattern(s, r, index);
    switch (s.op) {
      case chorusProd:
        acc *= v;
        break;
      case chorusMin:
        acc = std::min(acc, v);
        break;
      case chorusMax:
        acc = std::max(acc, v);
        break;
      default:
        acc += v;  // sum, avg
    }
  }
  const chorusDataType_t d = s.type->dtype;
  if (s.op == chorusAvg) {
    if (is_float(d)) return static_cast<double>(acc) / s.nranks;
    acc /= s.nranks;
  }
  switch (d) {
    case chorusInt8:
      return static_cast<int8_t>(acc);
    case chorusUint8:
      return static_cast<uint8_t>(acc);
    case chorusInt32:
      return static_cast<int32_t>(acc);
    case chorusUint32:
      return static_cast<uint32_t>(acc);
    case chorusUint64:
      return static_cast<double>(static_cast<uint64_t>(acc));
    default:
      return static_cast<double>(acc);
  }
}

}  // namespace

// ---------------------------------------------------------------- pattern and check

int64_t pattern(const CheckSpec& s, int rank, size_t index) {
  const bool is_unsigned = s.type->dtype == chorusUint8 || s.type->dtype == chorusUint32 ||
                           s.type->dtype == chorusUint64;
  const int64_t r = rank;
  if (!coll_reduces(s.coll)) {  // |v| <= 120: exact even in bf16
    const int64_t v = (r * 31 + static_cast<int64_t>(index % 241) * 7) % 241;
    return is_unsigned ? v : v - 120;
  }
  switch (s.op) {
    case chorusProd: {  // at most ten 2s and some -1s: |product| <= 1024
      if (r < 10 && (index + r) % 3 == 0) return 2;
      if (!is_unsigned && (index + 2 * r) % 5 == 0) return -1;
      return 1;
    }
    case chorusMin:
    case chorusMax: {
      const int64_t v = (r * 7 + static_cast<int64_t>(index % 17) * 13) % 17;
      return is_unsigned ? v : v - 8;
    }
    default: {  // sum, avg: |sum over ranks| <= 120 for up to 120 ranks (exact in bf16)
      const int64_t a = std::clamp<int64_t>(120 / s.nranks, 1, 4);
      const bool non_negative = is_unsigned || (s.op == chorusAvg && !is_float(s.type->dtype));
      const int64_t m = non_negative ? a + 1 : 2 * a + 1;
      const int64_t v = (r * 3 + static_cast<int64_t>(index % m) * 5 + 1) % m;
      return non_negative ? v : v - a;
    }
  }
}

void fill_pattern(const CheckSpec& s, void* buf, size_t first, size_t count) {
  with_codec(s.type->dtype, [&](auto codec) {
    using C = decltype(codec);
    auto* p = static_cast<typename C::Elem*>(buf);
    for (size_t i = 0; i < count; ++i) p[i] = C::enc(pattern(s, s.rank, first + i));
  });
}

void fill_sentinel(void* buf, size_t bytes) {
  std::memset(buf, 0xF7, bytes);
}

size_t count_wrong(const CheckSpec& s, const void* out) {
  const size_t n = s.shape.recv_count;
  const int prev = (s.rank - 1 + s.nranks) % s.nranks;
  const size_t per = s.shape.count;  // all_gather: per-rank block; reduce_scatter: this rank's
  const bool tolerant = s.op == chorusAvg && coll_reduces(s.coll) && is_float(s.type->dtype);
  const double tol = avg_tolerance(s.type->dtype);
  if ((s.coll == Coll::kReduce || s.coll == Coll::kGather) && s.rank != s.root) return 0;
  size_t wrong = 0;
  with_codec(s.type->dtype, [&](auto codec) {
    using C = decltype(codec);
    const auto* p = static_cast<const typename C::Elem*>(out);
    for (size_t i = 0; i < n; ++i) {
      double want;
      switch (s.coll) {
        case Coll::kAllReduce:
        case Coll::kReduce:
          want = reference(s, i);
          break;
        case Coll::kReduceScatter:
          want = reference(s, s.rank * per + i);
          break;
        case Coll::kBroadcast:
          want = static_cast<double>(pattern(s, s.root, i));
          break;
        case Coll::kAllGather:
        case Coll::kGather:
          want = static_cast<double>(pattern(s, static_cast<int>(i / per), i % per));
          break;
        case Coll::kScatter:
          want = static_cast<double>(pattern(s, s.root, s.rank * per + i));
          break;
        case Coll::kAllToAll:
          want = static_cast<double>(pattern(s, static_cast<int>(i / per), s.rank * per + i % per));
          break;
        default:
          want = static_cast<double>(pattern(s, prev, i));  // send_recv
      }
      const double got = C::dec(p[i]);
      if (tolerant) {
        wrong += !(std::fabs(got - want) <= tol * std::max(1.0, std::fabs(want)));
      } else {
        wrong += !(got == want);
      }
    }
  });
  return wrong;
}

}  // namespace perf
