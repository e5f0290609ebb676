// Fuzz target: the contents of the mpirun rendezvous file (rendezvous_file.h), which a reader
// finds on disk and must not trust: the record parser, and a round trip of what it accepts.
#include <cstddef>
#include <cstdint>
#include <string>

#include "transport/rendezvous_file.h"

using namespace chorus::transport;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  auto r = parse_rendezvous_record(text);
  if (r.is_ok()) {
    if (r->host.empty() || r->port < 1 || r->port > 65535 || r->pid < 1) __builtin_trap();
    auto again = parse_rendezvous_record(format_rendezvous_record(*r));
    if (!again.is_ok() || again->host != r->host || again->port != r->port ||
        again->pid != r->pid || again->job != r->job || again->start_ns != r->start_ns)
      __builtin_trap();
  }
  return 0;
}
