// libFuzzer target: the connection handshake (transport/wire.cc) as each side reads it.
//
// Input byte 0 picks the side. Even: the rest is what a caller sent, read by server_handshake
// (a hello: magic, version, secret, kind, rank...). Odd: the rest is what a server answered,
// read by client_handshake (a verdict and its reason text). The bytes go through a real socket
// pair, closed behind them, as a connection from a stranger would. Besides crashes and leaks it
// checks the contract: the server accepts only a hello that passes every check, and every
// refusal carries a message and a code the C API defines.
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "common/socket.h"
#include "transport/wire.h"

namespace {

using namespace chorus;
using namespace chorus::transport;

const Secret kSecret = secret_from_string("fuzz job");
const unsigned kAllowed = kind_bit(ConnKind::kStore) | kind_bit(ConnKind::kWatch);

void fail(const char* what, const std::string& message) {
  std::fprintf(stderr, "handshake: %s\nmessage: %s\n", what, message.c_str());
  std::abort();
}

void check_refusal(const Status& s) {
  if (s.message().empty()) fail("a refusal without a message", "");
  if (std::string(code_name(s.code())) == "unknown" || s.code() == Code::kOk)
    fail("a refusal with a code the C API does not define", s.to_string());
}

void as_server(int fd) {
  Result<Hello> r = server_handshake(fd, kSecret, kAllowed, "fuzz peer");
  if (!r.is_ok()) return check_refusal(r.status());
  const Hello& h = *r;
  if (h.magic != kMagic || h.version != kProtocolVersion || h.secret != kSecret || h.kind >= 32 ||
      !(kAllowed & (1u << h.kind)))
    fail("a hello that fails a check was accepted", "");
}

void as_client(int fd) {
  Hello hello = make_hello(ConnKind::kStore, kSecret, 1, 2);
  Status s = client_handshake(fd, hello, "fuzz server", Deadline::after_seconds(5));
  if (!s.is_ok()) check_refusal(s);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  setenv("CHORUS_DEBUG", "NONE", 1);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  // Bounded so that the whole input fits in the socket buffer before anyone reads.
  size_t n = std::min<size_t>(size - 1, sizeof(Verdict) + kMaxTextBytes);
  int fds[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, fds) != 0) std::abort();
  int buf = 4 << 20;
  setsockopt(fds[1], SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
  Status sent = send_all(fds[1], data + 1, n, Deadline::after_seconds(5), "fuzz input");
  if (!sent.is_ok()) fail("could not write the input to the socket", sent.message());
  shutdown(fds[1], SHUT_WR);  // the peer sends nothing more: a short input is a truncated one
  if (data[0] % 2 == 0)
    as_server(fds[0]);
  else
    as_client(fds[0]);
  close(fds[0]);
  close(fds[1]);
  return 0;
}
