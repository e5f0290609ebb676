// Fuzz target: the connection handshake (wire.h). Feeds arbitrary bytes, in chunks whose sizes
// come from the input, to the accepting side (ServerHandshake: what a stranger sends to any
// chorus port) and to the connecting side (ClientHandshake: what a server answers), and to the
// single-message parsers. Nothing may crash, read out of bounds, or loop.
#include <cstddef>
#include <cstdint>
#include <string>

#include "transport/wire.h"

using namespace chorus::transport;

namespace {

// Feeds `data` to a state machine in chunks of 1..16 bytes chosen by the bytes themselves.
template <typename Machine>
void feed_chunks(Machine& m, const uint8_t* data, size_t size) {
  size_t at = 0;
  while (at < size && m.want() > 0) {
    size_t n = 1 + data[at] % 16;
    if (n > size - at) n = size - at;
    m.feed(data + at, n);
    (void)m.take_output();
    at += n;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Secret secret{};
  for (size_t i = 0; i < secret.size(); ++i) secret[i] = static_cast<uint8_t>(i * 7 + 1);
  Nonce nonce{};
  ServerHandshake server(
      secret, kind_bit(ConnKind::kStore) | kind_bit(ConnKind::kWatch) | kind_bit(ConnKind::kLink),
      nonce);
  feed_chunks(server, data, size);
  (void)server.error().message();

  Hello hello;  // a fixed hello (make_hello would draw a random nonce)
  hello.kind = static_cast<uint16_t>(ConnKind::kStore);
  hello.rank = 1;
  hello.world = 2;
  ClientHandshake client(secret, hello, "fuzz peer");
  (void)client.take_output();
  feed_chunks(client, data, size);
  (void)client.error().message();

  (void)parse_hello(data, size, kind_bit(ConnKind::kLink));
  (void)parse_challenge(data, size);
  (void)parse_proof(data, size);
  (void)parse_verdict(data, size);
  if (size >= 4)
    (void)code_from_wire(
        static_cast<int32_t>(data[0] | data[1] << 8 | data[2] << 16 | data[3] << 24));
  std::string hex(reinterpret_cast<const char*>(data), size);
  (void)parse_server_info(hex);
  Secret parsed{};
  (void)parse_secret_hex(hex, &parsed);
  return 0;
}
