// The handshake every chorus connection starts with, and the bounds on what is read from the wire.
//
// Both sides prove that they know the per-job secret without sending it (challenge-response):
//
//   client -> server  Hello      magic, protocol version, kind, who is calling, client nonce
//   server -> client  Challenge  a refusal with its reason, or: server nonce and the server's
//                                proof mac(secret, "server", hello || server nonce)
//   client -> server  Proof      mac(secret, "client", hello || server nonce), sent only after
//                                the server's proof checked out (an impostor learns nothing)
//   server -> client  Verdict    ok (with who serves: "pid\nhost id", told only to a client
//                                that proved itself), or why not (wrong secret, rank outside
//                                the world, ...)
//
// Proofs are compared in constant time. The accepting side checks each field before it
// allocates or trusts anything and logs refusals clearly: a stranger, a port scanner or an
// old job is turned away, never served. Both sides are state machines over bytes
// (ServerHandshake, ClientHandshake), so the acceptor runs many handshakes on one thread and
// the fuzzers feed them arbitrary input. Multi-byte fields are little-endian (the host order
// of every platform chorus builds for).
//
// What the secret does not do: encrypt or sign the traffic after the handshake. Someone who
// can read or rewrite packets between two ranks sees and changes everything (see README).
#pragma once

#include <cstdint>
#include <string>

#include "common/clock.h"
#include "common/socket.h"
#include "common/status.h"
#include "transport/auth.h"

namespace chorus::transport {

constexpr uint32_t kMagic = 0x43485253;  // "CHRS"
constexpr uint16_t kProtocolVersion = 2;
constexpr size_t kMaxKeyBytes = 1024;
constexpr size_t kMaxValueBytes = 64u << 20;
constexpr size_t kMaxTextBytes = 64u << 10;
constexpr double kHandshakeSeconds = 5.0;

enum class ConnKind : uint16_t { kStore = 1, kWatch = 2, kLink = 3 };
inline unsigned kind_bit(ConnKind k) {
  return 1u << static_cast<unsigned>(k);
}

struct Hello {
  uint32_t magic = kMagic;
  uint16_t version = kProtocolVersion;
  uint16_t kind = 0;
  Nonce nonce{};          // the client's challenge to the server
  int32_t rank = -1;      // caller's rank in the job (store/watch) or in the comm (link)
  int32_t world = 0;      // caller's view of the job or comm size
  uint64_t comm_uid = 0;  // links: which communicator
  int32_t channel = 0;    // links: which socket of the pair
  int32_t pid = 0;
};
static_assert(sizeof(Hello) == 48, "Hello is a fixed wire format");

struct Challenge {
  uint32_t magic = kMagic;
  int32_t code = 0;       // 0: go on; else a refusal, the reason in the text
  uint32_t text_len = 0;  // followed by text: the reason of a refusal (empty otherwise)
  int32_t reserved = 0;
  Nonce nonce{};  // the server's challenge to the client
  Tag proof{};    // mac(secret, "server", hello || nonce)
};
static_assert(sizeof(Challenge) == 48, "Challenge is a fixed wire format");

struct Proof {
  uint32_t magic = kMagic;
  uint32_t mismatch = 0;  // 1: the client could not verify the server (its proof is zero)
  Tag proof{};            // mac(secret, "client", hello || server nonce)
};
static_assert(sizeof(Proof) == 24, "Proof is a fixed wire format");

struct Verdict {
  uint32_t magic = kMagic;
  int32_t code = 0;       // 0 = accepted, else a chorus::Code
  uint32_t text_len = 0;  // followed by text_len bytes of reason (bounded by kMaxTextBytes)
};
static_assert(sizeof(Verdict) == 12, "Verdict is a fixed wire format");

// A hello from this process (pid and a fresh nonce filled in).
Hello make_hello(ConnKind kind, int rank, int world, uint64_t comm_uid = 0, int channel = 0);

std::string secret_hex(const Secret& s);
bool parse_secret_hex(const std::string& hex, Secret* out);
// Derives a secret from a string both sides know (a job id). Public text gives a public
// secret: it keeps stray jobs apart, not attackers out (rendezvous.cc says so at INFO).
Secret secret_from_string(const std::string& text);
// Not cryptographic: FNV-1a, mixed. For ids of things that are not secret.
uint64_t hash64(const void* data, size_t n, uint64_t seed = 1469598103934665603ull);

Tag server_proof(const Secret& secret, const Hello& hello, const Nonce& server_nonce);
Tag client_proof(const Secret& secret, const Hello& hello, const Nonce& server_nonce);

// Wire codes are checked before they become a Code: unknown values read as a remote error.
Code code_from_wire(int32_t v);

// ---- pure parsers of bytes from a peer (also the fuzzers' entry points) ----
// Each takes exactly the struct's size and checks magic, version, kind and lengths.
Result<Hello> parse_hello(const void* p, size_t n, unsigned allowed_kinds);
Result<Challenge> parse_challenge(const void* p, size_t n);
Result<Proof> parse_proof(const void* p, size_t n);
Result<Verdict> parse_verdict(const void* p, size_t n);

// The accepting side of one handshake, fed whatever bytes arrive.
class ServerHandshake {
 public:
  enum class State { kReadHello, kReadProof, kAuthenticated, kFailed };
  ServerHandshake(const Secret& secret, unsigned allowed_kinds, const Nonce& nonce);
  // Bytes to read before the next step (never more: what follows the handshake is not ours).
  size_t want() const;
  // Takes up to want() bytes.
  void feed(const void* p, size_t n);
  // Bytes to send to the client now (a challenge, or a refusal); empties the buffer.
  std::string take_output();
  State state() const { return state_; }
  const Hello& hello() const { return hello_; }
  const Status& error() const { return error_; }  // why it failed
  size_t received() const { return received_; }

 private:
  void on_hello();
  void on_proof();
  void fail(Status s, bool verdict);
  Secret secret_;
  unsigned allowed_;
  Nonce nonce_;
  State state_ = State::kReadHello;
  std::string buf_;
  std::string out_;
  size_t received_ = 0;
  Hello hello_;
  Status error_;
};

// The connecting side: sends hello, checks the server's proof, sends its own, reads the verdict.
struct ServerInfo {
  int pid = 0;       // 0 when the server did not say (links)
  std::string host;  // the server's host identity (topology.h host_id)
};
// The text of an ok verdict that says who serves, and its parser.
std::string server_info_text(int pid, const std::string& host);
ServerInfo parse_server_info(const std::string& text);

class ClientHandshake {
 public:
  enum class State {
    kReadChallenge,
    kReadChallengeText,
    kReadVerdict,
    kReadVerdictText,
    kDone,
    kFailed
  };
  ClientHandshake(const Secret& secret, const Hello& hello, std::string peer);
  size_t want() const;
  void feed(const void* p, size_t n);
  std::string take_output();
  State state() const { return state_; }
  const Status& error() const { return error_; }
  const ServerInfo& server() const { return server_; }
  // True when the server closed the connection before it said anything: worth a retry.
  bool unanswered() const { return state_ == State::kReadChallenge && buf_.empty(); }

 private:
  void on_challenge();
  void on_challenge_text();
  void on_verdict();
  void on_verdict_text();
  Secret secret_;
  Hello hello_;
  std::string peer_;
  State state_ = State::kReadChallenge;
  std::string buf_;
  std::string out_;
  Challenge challenge_;
  Verdict verdict_;
  ServerInfo server_;
  Status error_;
};

// Blocking client handshake on a connected socket. A refusal comes back with its reason.
Result<ServerInfo> client_handshake(int fd, const Secret& secret, const Hello& hello,
                                    const std::string& peer, Deadline deadline);
// Connects and handshakes, retrying while the server closes connections unanswered (it drops
// the oldest unauthenticated connections under a flood). Refusals are not retried.
Result<Fd> dial(const SockAddr& to, const Secret& secret, const Hello& hello,
                const std::string& peer, Deadline deadline, ServerInfo* info = nullptr);
// One connection and handshake, no retry (a refused connection fails at once; *error_number is
// connect's errno then, 0 when the connection was made).
Result<Fd> dial_once(const SockAddr& to, const Secret& secret, const Hello& hello,
                     const std::string& peer, Deadline deadline, ServerInfo* info,
                     int* error_number);
// Sends the final verdict (after the server's own checks of rank, world, comm).
Status send_verdict(int fd, Code code, const std::string& text);

}  // namespace chorus::transport
