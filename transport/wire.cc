// Handshake encoding, the two state machines, and the blocking client on top of them.
#include "transport/wire.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "common/bytes.h"
#include "common/log.h"

namespace chorus::transport {
namespace {

const char* const kServerLabel = "chorus/v2/server";
const char* const kClientLabel = "chorus/v2/client";

std::string printable_prefix(const void* p, size_t n) {
  std::string hex, ascii;
  auto b = static_cast<const uint8_t*>(p);
  for (size_t i = 0; i < std::min<size_t>(n, 8); ++i) {
    hex += fmt::format("{:02x} ", b[i]);
    ascii += (b[i] >= 32 && b[i] < 127) ? static_cast<char>(b[i]) : '.';
  }
  return fmt::format("{}'{}'", hex, ascii);
}

Tag transcript_mac(const Secret& secret, const char* label, const Hello& hello,
                   const Nonce& nonce) {
  uint8_t t[sizeof(Hello) + sizeof(Nonce)];
  std::memcpy(t, &hello, sizeof hello);
  std::memcpy(t + sizeof hello, nonce.data(), nonce.size());
  return mac(secret, label, t, sizeof t);
}

}  // namespace

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

Hello make_hello(ConnKind kind, int rank, int world, uint64_t comm_uid, int channel) {
  Hello h;
  h.kind = static_cast<uint16_t>(kind);
  h.rank = rank;
  h.world = world;
  h.comm_uid = comm_uid;
  h.channel = channel;
  h.pid = getpid();
  CHORUS_ASSERT(random_bytes(h.nonce.data(), h.nonce.size()).is_ok());
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
  Secret s{};
  for (size_t i = 0; i < 32; ++i) {
    char c = hex[i];
    int v = c >= '0' && c <= '9'   ? c - '0'
            : c >= 'a' && c <= 'f' ? c - 'a' + 10
            : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                   : -1;
    if (v < 0) return false;
    s[i / 2] = static_cast<uint8_t>(s[i / 2] << 4 | v);
  }
  *out = s;
  return true;
}

Tag server_proof(const Secret& secret, const Hello& hello, const Nonce& server_nonce) {
  return transcript_mac(secret, kServerLabel, hello, server_nonce);
}

Tag client_proof(const Secret& secret, const Hello& hello, const Nonce& server_nonce) {
  return transcript_mac(secret, kClientLabel, hello, server_nonce);
}

std::string server_info_text(int pid, const std::string& host) {
  return fmt::format("{}\n{}", pid, host);
}

ServerInfo parse_server_info(const std::string& text) {
  ServerInfo info;
  auto nl = text.find('\n');
  if (nl == std::string::npos || nl == 0 || nl > 10 || text.find_first_not_of("0123456789") != nl)
    return info;
  info.pid = static_cast<int>(std::strtol(text.c_str(), nullptr, 10));
  info.host = text.substr(nl + 1);
  return info;
}

Code code_from_wire(int32_t v) {
  switch (static_cast<Code>(v)) {
    case Code::kOk:
    case Code::kSystemError:
    case Code::kInternalError:
    case Code::kInvalidArgument:
    case Code::kInvalidUsage:
    case Code::kRemoteError:
    case Code::kTimeout:
    case Code::kAborted:
    case Code::kMismatch:
    case Code::kRevoked:
      return static_cast<Code>(v);
  }
  return Code::kRemoteError;
}

// ---- parsers ----

Result<Hello> parse_hello(const void* p, size_t n, unsigned allowed_kinds) {
  Hello h;
  if (n != sizeof h)
    return make_error(Code::kRemoteError, "incomplete handshake: {} of {} bytes", n, sizeof h);
  std::memcpy(&h, p, sizeof h);
  if (h.magic != kMagic)
    return make_error(Code::kRemoteError, "not a chorus peer: first bytes {}",
                      printable_prefix(p, n));
  if (h.version != kProtocolVersion)
    return make_error(Code::kRemoteError, "protocol version {} (this side speaks {})", h.version,
                      kProtocolVersion);
  if (h.kind >= 32 || !(allowed_kinds & (1u << h.kind)))
    return make_error(Code::kRemoteError, "unexpected connection kind {} on this port", h.kind);
  return h;
}

Result<Challenge> parse_challenge(const void* p, size_t n) {
  Challenge c;
  if (n != sizeof c)
    return make_error(Code::kRemoteError, "short challenge: {} of {} bytes", n, sizeof c);
  std::memcpy(&c, p, sizeof c);
  if (c.magic != kMagic)
    return make_error(Code::kRemoteError, "not a chorus peer (bad magic {:#x})", c.magic);
  if (c.text_len > kMaxTextBytes)
    return make_error(Code::kRemoteError, "a {} byte text (limit {})", c.text_len, kMaxTextBytes);
  return c;
}

Result<Proof> parse_proof(const void* p, size_t n) {
  Proof pr;
  if (n != sizeof pr)
    return make_error(Code::kRemoteError, "short proof: {} of {} bytes", n, sizeof pr);
  std::memcpy(&pr, p, sizeof pr);
  if (pr.magic != kMagic)
    return make_error(Code::kRemoteError, "not a chorus peer: proof starts {}",
                      printable_prefix(p, n));
  return pr;
}

Result<Verdict> parse_verdict(const void* p, size_t n) {
  Verdict v;
  if (n != sizeof v)
    return make_error(Code::kRemoteError, "short verdict: {} of {} bytes", n, sizeof v);
  std::memcpy(&v, p, sizeof v);
  if (v.magic != kMagic)
    return make_error(Code::kRemoteError, "not a chorus peer (bad magic {:#x})", v.magic);
  if (v.text_len > kMaxTextBytes)
    return make_error(Code::kRemoteError, "a {} byte reason (limit {})", v.text_len, kMaxTextBytes);
  return v;
}

// ---- ServerHandshake ----

ServerHandshake::ServerHandshake(const Secret& secret, unsigned allowed_kinds, const Nonce& nonce)
    : secret_(secret), allowed_(allowed_kinds), nonce_(nonce) {}

size_t ServerHandshake::want() const {
  switch (state_) {
    case State::kReadHello:
      return sizeof(Hello) - buf_.size();
    case State::kReadProof:
      return sizeof(Proof) - buf_.size();
    default:
      return 0;
  }
}

void ServerHandshake::feed(const void* p, size_t n) {
  auto b = static_cast<const char*>(p);
  while (n > 0 && want() > 0) {
    size_t k = std::min(n, want());
    buf_.append(b, k);
    received_ += k;
    b += k;
    n -= k;
    if (want() > 0) break;
    if (state_ == State::kReadHello)
      on_hello();
    else if (state_ == State::kReadProof)
      on_proof();
  }
}

std::string ServerHandshake::take_output() {
  return std::exchange(out_, std::string());
}

void ServerHandshake::fail(Status s, bool verdict) {
  std::string text = s.message();
  if (text.size() > kMaxTextBytes) text.resize(kMaxTextBytes);
  if (verdict) {
    Verdict v;
    v.code = static_cast<int32_t>(s.code());
    v.text_len = static_cast<uint32_t>(text.size());
    out_ += bytes_of(v) + text;
  } else {
    Challenge c;
    c.code = static_cast<int32_t>(s.code());
    c.text_len = static_cast<uint32_t>(text.size());
    out_ += bytes_of(c) + text;
  }
  error_ = std::move(s);
  state_ = State::kFailed;
}

void ServerHandshake::on_hello() {
  auto h = parse_hello(buf_.data(), buf_.size(), allowed_);
  buf_.clear();
  if (!h.is_ok()) return fail(h.status(), false);
  hello_ = *h;
  Challenge c;
  c.nonce = nonce_;
  c.proof = server_proof(secret_, hello_, nonce_);
  out_ += bytes_of(c);
  state_ = State::kReadProof;
}

void ServerHandshake::on_proof() {
  auto p = parse_proof(buf_.data(), buf_.size());
  buf_.clear();
  if (!p.is_ok()) return fail(p.status(), true);
  Tag want = client_proof(secret_, hello_, nonce_);
  bool match = equal_constant_time(p->proof.data(), want.data(), want.size());
  if (p->mismatch != 0 || !match)
    return fail(make_error(Code::kRemoteError,
                           "wrong job secret: the caller (rank {}, pid {}) belongs to another job",
                           hello_.rank, hello_.pid),
                true);
  state_ = State::kAuthenticated;
}

// ---- ClientHandshake ----

ClientHandshake::ClientHandshake(const Secret& secret, const Hello& hello, std::string peer)
    : secret_(secret), hello_(hello), peer_(std::move(peer)) {
  out_ = bytes_of(hello_);
}

size_t ClientHandshake::want() const {
  switch (state_) {
    case State::kReadChallenge:
      return sizeof(Challenge) - buf_.size();
    case State::kReadChallengeText:
      return challenge_.text_len - buf_.size();
    case State::kReadVerdict:
      return sizeof(Verdict) - buf_.size();
    case State::kReadVerdictText:
      return verdict_.text_len - buf_.size();
    default:
      return 0;
  }
}

void ClientHandshake::feed(const void* p, size_t n) {
  auto b = static_cast<const char*>(p);
  while (state_ != State::kDone && state_ != State::kFailed) {
    size_t k = std::min(n, want());
    buf_.append(b, k);
    b += k;
    n -= k;
    if (want() > 0) break;  // a step completes once it has all its bytes (a text may be empty)
    switch (state_) {
      case State::kReadChallenge:
        on_challenge();
        break;
      case State::kReadChallengeText:
        on_challenge_text();
        break;
      case State::kReadVerdict:
        on_verdict();
        break;
      case State::kReadVerdictText:
        on_verdict_text();
        break;
      default:
        break;
    }
  }
}

std::string ClientHandshake::take_output() {
  return std::exchange(out_, std::string());
}

void ClientHandshake::on_challenge() {
  auto c = parse_challenge(buf_.data(), buf_.size());
  buf_.clear();
  if (!c.is_ok()) {
    error_ = c.status().wrap("handshake: " + peer_);
    state_ = State::kFailed;
    return;
  }
  challenge_ = *c;
  state_ = State::kReadChallengeText;
}

void ClientHandshake::on_challenge_text() {
  std::string text = std::exchange(buf_, std::string());
  if (challenge_.code != 0) {
    error_ = Status(code_from_wire(challenge_.code), fmt::format("refused by {}: {}", peer_, text));
    state_ = State::kFailed;
    return;
  }
  Tag expect = server_proof(secret_, hello_, challenge_.nonce);
  Proof p;
  if (!equal_constant_time(expect.data(), challenge_.proof.data(), expect.size())) {
    // Say so (with no proof), so the server can log a clear refusal too; then give up.
    p.mismatch = 1;
    out_ += bytes_of(p);
    error_ = make_error(Code::kRemoteError,
                        "wrong job secret: {} belongs to another job (or this process has the "
                        "wrong CHORUS_JOB_SECRET); "
                        "nothing secret was sent to it",
                        peer_);
    state_ = State::kFailed;
    return;
  }
  p.proof = client_proof(secret_, hello_, challenge_.nonce);
  out_ += bytes_of(p);
  state_ = State::kReadVerdict;
}

void ClientHandshake::on_verdict() {
  auto v = parse_verdict(buf_.data(), buf_.size());
  buf_.clear();
  if (!v.is_ok()) {
    error_ = v.status().wrap("handshake: " + peer_);
    state_ = State::kFailed;
    return;
  }
  verdict_ = *v;
  state_ = State::kReadVerdictText;
}

void ClientHandshake::on_verdict_text() {
  std::string text = std::exchange(buf_, std::string());
  if (verdict_.code != 0) {
    error_ = Status(code_from_wire(verdict_.code), fmt::format("refused by {}: {}", peer_, text));
    state_ = State::kFailed;
    return;
  }
  server_ = parse_server_info(text);
  state_ = State::kDone;
}

// ---- blocking use ----

Result<ServerInfo> client_handshake(int fd, const Secret& secret, const Hello& hello,
                                    const std::string& peer, Deadline deadline) {
  ClientHandshake hs(secret, hello, peer);
  char buf[4096];
  while (true) {
    std::string out = hs.take_output();
    if (!out.empty())
      CHORUS_TRY(send_all(fd, out.data(), out.size(), deadline, peer).wrap("handshake"));
    if (hs.state() == ClientHandshake::State::kDone) return hs.server();
    if (hs.state() == ClientHandshake::State::kFailed) return hs.error();
    size_t n = std::min(hs.want(), sizeof buf);
    Status s = recv_all(fd, buf, n, deadline, peer);
    if (!s.is_ok()) return s.wrap(hs.unanswered() ? "handshake: no answer" : "handshake");
    hs.feed(buf, n);
  }
}

Result<Fd> dial(const SockAddr& to, const Secret& secret, const Hello& hello,
                const std::string& peer, Deadline deadline, ServerInfo* info) {
  constexpr int kAttempts = 8;
  for (int attempt = 1;; ++attempt) {
    CHORUS_ASSIGN_OR_RETURN(Fd fd, tcp_connect(to, deadline));
    // A fresh nonce per attempt: a transcript is never reused.
    Hello h = hello;
    CHORUS_TRY(random_bytes(h.nonce.data(), h.nonce.size()));
    auto r = client_handshake(fd.get(), secret, h, peer, deadline);
    if (r.is_ok()) {
      if (info) *info = *r;
      return fd;
    }
    bool unanswered = r.status().message().find("handshake: no answer") != std::string::npos;
    if (!unanswered || attempt == kAttempts || deadline.remaining() < 0.1) return r.status();
    log_warn(
        "handshake with {} closed unanswered (the peer may be shedding a flood of connections); "
        "retrying, attempt {} of {}",
        peer, attempt + 1, kAttempts);
    usleep(static_cast<useconds_t>(std::min(50000.0 * attempt, deadline.remaining() * 5e5)));
  }
}

Result<Fd> dial_once(const SockAddr& to, const Secret& secret, const Hello& hello,
                     const std::string& peer, Deadline deadline, ServerInfo* info,
                     int* error_number) {
  CHORUS_ASSIGN_OR_RETURN(Fd fd, tcp_connect_once(to, deadline, error_number));
  Hello h = hello;
  CHORUS_TRY(random_bytes(h.nonce.data(), h.nonce.size()));
  CHORUS_ASSIGN_OR_RETURN(ServerInfo got, client_handshake(fd.get(), secret, h, peer, deadline));
  if (info) *info = got;
  return fd;
}

Status send_verdict(int fd, Code code, const std::string& text) {
  Verdict v;
  v.code = static_cast<int32_t>(code);
  v.text_len = static_cast<uint32_t>(std::min(text.size(), kMaxTextBytes));
  std::string out = bytes_of(v) + text.substr(0, v.text_len);
  return send_all(fd, out.data(), out.size(), Deadline::after_seconds(kHandshakeSeconds), "peer");
}

}  // namespace chorus::transport
