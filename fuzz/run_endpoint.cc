// libFuzzer target: chorus-run's rendezvous endpoint, as a user or a batch script writes it
// (tools/run/options.cc: split_endpoint on "--rdzv-endpoint HOST:PORT" / "[v6addr]:PORT").
//
// chorus-run's multi-node rendezvous is static: launchers exchange no bytes with each other
// (the workers meet at the store), so this text is what the launcher parses of the rendezvous.
// Checked contract: an accepted endpoint has a host and a port in 0..65535, a host holding ':'
// came in brackets (else "fe80::1" would be host "fe80:" port 1), and printing the result
// back in canonical form parses to the same host and port.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "tools/run/options.h"

namespace {

void fail(const char* what, const std::string& endpoint, const std::string& host, int port) {
  std::fprintf(stderr, "run_endpoint: %s\nendpoint '%s' -> host '%s' port %d\n", what,
               endpoint.c_str(), host.c_str(), port);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string endpoint(reinterpret_cast<const char*>(data), size);
  std::string host;
  int port = -1;
  if (!chorus::run::split_endpoint(endpoint, host, port)) return 0;
  if (host.empty()) fail("accepted without a host", endpoint, host, port);
  if (port < 0 || port > 65535) fail("accepted a port out of range", endpoint, host, port);
  bool bracketed = endpoint[0] == '[';
  if (host.find(':') != std::string::npos && !bracketed)
    fail("an IPv6 address without brackets was split at its last ':'", endpoint, host, port);
  std::string again = bracketed ? "[" + host + "]" : host;
  if (port) again += ":" + std::to_string(port);
  std::string host2;
  int port2 = -1;
  if (!chorus::run::split_endpoint(again, host2, port2) || host2 != host || port2 != port)
    fail("the canonical form does not parse back", again, host2, port2);
  return 0;
}
