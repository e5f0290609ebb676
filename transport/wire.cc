// Handshake encoding and checks.
#include "transport/wire.h"

#include <unistd.h>

#include <cstring>

#include "common/log.h"
#include "common/socket.h"

namespace chorus::transport {

uint64_t hash64(const void* data, size_t n, uint64_t seed) {
  uint64_t h = seed;
  auto p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  h ^= h >> 29;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 32;
  return h;
}

Hello make_hello(ConnKind kind, const Secret& secret, int rank, int world, uint64_t comm_uid, int channel) {
  Hello h;
  h.kind = static_cast<uint16_t>(kind);
  h.secret = secret;
  h.rank = rank;
  h.world = world;
  h.comm_uid = comm_uid;
  h.channel = channel;
  h.pid = getpid();
  return h;
}

Secret secret_from_string(const std::string& text) {
  Secret s{};
  uint64_t a = hash64(text.data(), text.size(), 0x6368'6f72'7573'0001ull);
  uint64_t b = hash64(text.data(), text.size(), 0x6368'6f72'7573'0002ull);
  std::memcpy(s.data(), &a, 8);
  std::memcpy(s.data() + 8, &b, 8);
  return s;
}

std::string secret_hex(const Secret& s) {
  std::string out;
  for (uint8_t b : s) out += fmt::format("{:02x}", b);
  return out;
}

bool parse_secret_hex(const std::string& hex, Secret* out) {
  if (hex.size() != 32) return false;
  for (size_t i = 0; i < 16; ++i) {
    unsigned v = 0;
    if (sscanf(hex.c_str() + 2 * i, "%2x", &v) != 1) return false;
    (*out)[i] = static_cast<uint8_t>(v);
  }
  return true;
}

Status send_verdict(int fd, Code code, const std::string& text) {
  Verdict v;
  v.code = static_cast<int32_t>(code);
  v.text_len = static_cast<uint32_t>(std::min(text.size(), kMaxTextBytes));
  auto d = Deadline::after_seconds(kHandshakeSeconds);
  CHORUS_TRY(send_all(fd, &v, sizeof v, d, "peer"));
  return send_all(fd, text.data(), v.text_len, d, "peer");
}

Status client_handshake(int fd, const Hello& hello, const std::string& peer, Deadline deadline) {
  CHORUS_TRY(send_all(fd, &hello, sizeof hello, deadline, peer).wrap("handshake"));
  Verdict v;
  CHORUS_TRY(recv_all(fd, &v, sizeof v, deadline, peer).wrap("handshake: no answer"));
  if (v.magic != kMagic)
    return make_error(Code::kRemoteError, "handshake: {} is not a chorus peer (bad magic {:#x})", peer, v.magic);
  if (v.text_len > kMaxTextBytes)
    return make_error(Code::kRemoteError, "handshake: {} sent a {} byte reason (limit {})", peer, v.text_len, kMaxTextBytes);
  std::string text(v.text_len, '\0');
  CHORUS_TRY(recv_all(fd, text.data(), v.text_len, deadline, peer));
  if (v.code == 0) return Status::ok();
  // The code comes from the peer: only an error code of ours passes through (a stranger must
  // not make a caller see "in progress" or a code outside the C API's enum).
  bool known = v.code >= static_cast<int32_t>(Code::kSystemError) &&
               v.code <= static_cast<int32_t>(Code::kMismatch);
  if (!known)
    return make_error(Code::kRemoteError, "refused by {} with unknown code {}: {}", peer, v.code, text);
  return make_error(static_cast<Code>(v.code), "refused by {}: {}", peer, text);
}

namespace {
std::string printable_prefix(const void* p, size_t n) {
  std::string hex, ascii;
  auto b = static_cast<const uint8_t*>(p);
  for (size_t i = 0; i < std::min<size_t>(n, 8); ++i) {
    hex += fmt::format("{:02x} ", b[i]);
    ascii += (b[i] >= 32 && b[i] < 127) ? static_cast<char>(b[i]) : '.';
  }
  return fmt::format("{}'{}'", hex, ascii);
}
}  // namespace

Result<Hello> server_handshake(int fd, const Secret& secret, unsigned allowed_kinds,
                               const std::string& peer) {
  Hello h;
  auto d = Deadline::after_seconds(kHandshakeSeconds);
  Status s = recv_all(fd, &h, sizeof h, d, peer);
  if (!s.is_ok()) {
    auto e = make_error(Code::kRemoteError, "refused connection from {}: incomplete handshake ({})", peer, s.message());
    log_warn("{}", e.message());
    return e;
  }
  Status bad;
  if (h.magic != kMagic)
    bad = make_error(Code::kRemoteError, "not a chorus peer: first bytes {}", printable_prefix(&h, sizeof h));
  else if (h.version != kProtocolVersion)
    bad = make_error(Code::kRemoteError, "protocol version {} (this side speaks {})", h.version, kProtocolVersion);
  else if (h.secret != secret)
    bad = make_error(Code::kRemoteError, "wrong job secret: the caller (rank {}, pid {}) belongs to another job", h.rank, h.pid);
  else if (h.kind >= 32 || !(allowed_kinds & (1u << h.kind)))
    bad = make_error(Code::kRemoteError, "unexpected connection kind {} on this port", h.kind);
  if (!bad.is_ok()) {
    log_warn("refused connection from {}: {}", peer, bad.message());
    (void)send_verdict(fd, Code::kRemoteError, bad.message());
    return bad.wrap("refused connection from " + peer);
  }
  return h;
}

}  // namespace chorus::transport
