// Fuzz target: a grow id as a caller hands it in (its first 128 bytes) and the grow's record as
// the store returns it (the rest): the checks, the parser, and a round trip of what it accepts.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "collectives/grow.h"

using namespace chorus;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < sizeof(GrowId)) return 0;
  GrowId id;
  std::memcpy(&id, data, sizeof id);
  // The record is checked against the id; also against a well-formed one, so the parser runs
  // on every input and not only on the rare one that passes the id's checks.
  if (!check_grow_id(id).is_ok()) {
    id.old_size = 3;
    id.base = 8;
  }
  std::string text(reinterpret_cast<const char*>(data) + sizeof id, size - sizeof id);
  auto r = decode_grow_record(text, id);
  if (r.is_ok()) {
    if (static_cast<int>(r->job_ranks.size()) != id.old_size || r->nranks <= id.old_size ||
        r->prefix.empty())
      __builtin_trap();
    auto again = decode_grow_record(encode_grow_record(*r), id);
    if (!again.is_ok() || again->prefix != r->prefix || again->uid != r->uid ||
        again->nranks != r->nranks || again->deterministic != r->deterministic ||
        again->job_ranks != r->job_ranks)
      __builtin_trap();
  }
  return 0;
}
