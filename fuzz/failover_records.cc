// Fuzz target: what the store's failover reads back from the store -- a rank's standby port
// ("host port" or "-") and the new store's generation -- and a round trip of an accepted port.
#include <cstddef>
#include <cstdint>
#include <string>

#include "collectives/failover.h"

using namespace chorus;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const SockAddr a = decode_standby(text);
  if (!a.host.empty()) {
    if (a.port <= 0 || a.port > 65535) __builtin_trap();
    const SockAddr again = decode_standby(encode_standby(a));
    if (again.host != a.host || again.port != a.port) __builtin_trap();
  }
  auto g = decode_generation(text);
  if (g.is_ok() && *g <= 0) __builtin_trap();
  return 0;
}
