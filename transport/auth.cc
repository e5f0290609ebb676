// SipHash-2-4-128, constant-time comparison, random bytes (see auth.h).
#include "transport/auth.h"

#include <errno.h>
#include <string.h>
#include <sys/random.h>

#include <cstring>
#include <vector>

namespace chorus::transport {
namespace {

inline uint64_t rotl(uint64_t x, int b) {
  return (x << b) | (x >> (64 - b));
}

inline uint64_t load64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);  // little-endian hosts only (x86-64, aarch64), as is the wire format
  return v;
}

struct SipState {
  uint64_t v0, v1, v2, v3;
  void round() {
    v0 += v1;
    v1 = rotl(v1, 13);
    v1 ^= v0;
    v0 = rotl(v0, 32);
    v2 += v3;
    v3 = rotl(v3, 16);
    v3 ^= v2;
    v0 += v3;
    v3 = rotl(v3, 21);
    v3 ^= v0;
    v2 += v1;
    v1 = rotl(v1, 17);
    v1 ^= v2;
    v2 = rotl(v2, 32);
  }
  void compress(uint64_t m) {
    v3 ^= m;
    round();
    round();
    v0 ^= m;
  }
};

}  // namespace

Tag siphash128(const Secret& key, const void* data, size_t n) {
  const uint64_t k0 = load64(key.data()), k1 = load64(key.data() + 8);
  SipState s{k0 ^ 0x736f6d6570736575ull, k1 ^ 0x646f72616e646f6dull, k0 ^ 0x6c7967656e657261ull,
             k1 ^ 0x7465646279746573ull};
  s.v1 ^= 0xee;  // the 128-bit output variant
  auto p = static_cast<const uint8_t*>(data);
  const size_t whole = n - n % 8;
  for (size_t i = 0; i < whole; i += 8) s.compress(load64(p + i));
  uint64_t last = static_cast<uint64_t>(n) << 56;
  for (size_t i = 0; i < n % 8; ++i) last |= static_cast<uint64_t>(p[whole + i]) << (8 * i);
  s.compress(last);
  s.v2 ^= 0xee;
  for (int i = 0; i < 4; ++i) s.round();
  uint64_t a = s.v0 ^ s.v1 ^ s.v2 ^ s.v3;
  s.v1 ^= 0xdd;
  for (int i = 0; i < 4; ++i) s.round();
  uint64_t b = s.v0 ^ s.v1 ^ s.v2 ^ s.v3;
  Tag out;
  std::memcpy(out.data(), &a, 8);
  std::memcpy(out.data() + 8, &b, 8);
  return out;
}

Tag mac(const Secret& key, const std::string& label, const void* data, size_t n) {
  std::vector<uint8_t> msg(label.size() + 1 + n);
  std::memcpy(msg.data(), label.data(), label.size());
  msg[label.size()] = 0;
  if (n) std::memcpy(msg.data() + label.size() + 1, data, n);
  return siphash128(key, msg.data(), msg.size());
}

bool equal_constant_time(const void* a, const void* b, size_t n) {
  auto x = static_cast<const volatile uint8_t*>(a);
  auto y = static_cast<const volatile uint8_t*>(b);
  uint8_t diff = 0;
  for (size_t i = 0; i < n; ++i) diff |= x[i] ^ y[i];
  return diff == 0;
}

Status random_bytes(void* out, size_t n) {
  auto p = static_cast<uint8_t*>(out);
  size_t got = 0;
  while (got < n) {
    ssize_t r = getrandom(p + got, n - got, 0);
    if (r > 0) {
      got += static_cast<size_t>(r);
    } else if (errno != EINTR) {
      return make_error(Code::kSystemError, "getrandom: {}", strerror(errno));
    }
  }
  return Status::ok();
}

uint64_t derive_id(const Secret& key, const std::string& label) {
  Tag t = mac(key, label, nullptr, 0);
  uint64_t v;
  std::memcpy(&v, t.data(), 8);
  return v;
}

}  // namespace chorus::transport
