// The handshake every chorus connection starts with, and the bounds on what is read from the wire.
//
// A connection opens with a fixed-size Hello from the connecting side: magic, protocol version,
// the per-job secret, the connection's kind and who is calling. The accepting side checks each
// field before it allocates or trusts anything, answers with a Verdict (ok, or why not), and
// logs refusals clearly: a stranger, a port scanner or an old job is turned away, never served.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "common/clock.h"
#include "common/status.h"

namespace chorus::transport {

constexpr uint32_t kMagic = 0x43485253;  // "CHRS"
constexpr uint16_t kProtocolVersion = 1;
constexpr size_t kMaxKeyBytes = 1024;
constexpr size_t kMaxValueBytes = 64u << 20;
constexpr size_t kMaxTextBytes = 64u << 10;
constexpr double kHandshakeSeconds = 5.0;

using Secret = std::array<uint8_t, 16>;

enum class ConnKind : uint16_t { kStore = 1, kWatch = 2, kLink = 3 };

struct Hello {
  uint32_t magic = kMagic;
  uint16_t version = kProtocolVersion;
  uint16_t kind = 0;
  Secret secret{};
  int32_t rank = -1;        // caller's rank in the job (store/watch) or in the comm (link)
  int32_t world = 0;        // caller's view of the job or comm size
  uint64_t comm_uid = 0;    // links: which communicator
  int32_t channel = 0;      // links: which socket of the pair
  int32_t pid = 0;
};
static_assert(sizeof(Hello) == 48, "Hello is a fixed wire format");

struct Verdict {
  uint32_t magic = kMagic;
  int32_t code = 0;        // 0 = accepted, else a chorus::Code
  uint32_t text_len = 0;   // followed by text_len bytes of reason (bounded by kMaxTextBytes)
};

// A hello from this process (pid filled in).
Hello make_hello(ConnKind kind, const Secret& secret, int rank, int world, uint64_t comm_uid = 0, int channel = 0);

std::string secret_hex(const Secret& s);
bool parse_secret_hex(const std::string& hex, Secret* out);
// Derives a secret from a string both sides know (a job id): FNV-1a based, not cryptographic.
Secret secret_from_string(const std::string& text);
uint64_t hash64(const void* data, size_t n, uint64_t seed = 1469598103934665603ull);

// Client side: sends hello, reads the verdict. A refusal comes back as an error with its reason.
Status client_handshake(int fd, const Hello& hello, const std::string& peer, Deadline deadline);
// Server side: reads a hello within kHandshakeSeconds and checks magic, version and secret.
// On success returns the hello; on failure answers the caller with the reason and returns it.
// allowed_kinds is a bit mask of (1 << ConnKind).
Result<Hello> server_handshake(int fd, const Secret& secret, unsigned allowed_kinds,
                               const std::string& peer);
inline unsigned kind_bit(ConnKind k) { return 1u << static_cast<unsigned>(k); }
// Sends the accept verdict (after the server's own checks of rank, world, comm).
Status send_verdict(int fd, Code code, const std::string& text);

}  // namespace chorus::transport
