// Fuzz target: a peer's record of a device call over CUDA IPC, as it arrives (its first
// sizeof(Record) bytes; the next byte picks how many ranks the communicator has): the check
// every record passes before anything reads it, and for one it accepts what the readers do with
// it -- the call in words, the refusal text, the freed lists' bounds.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "collectives/device_call.h"

using namespace chorus;
using capi::devcall::Record;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < sizeof(Record)) return 0;
  Record rec;
  std::memcpy(&rec, data, sizeof rec);
  const int p = size > sizeof rec ? 2 + data[sizeof rec] % 31 : 3;
  Status s = capi::devcall::check_record(rec, 1, 0, p, "fuzz");
  if (!s.is_ok()) {
    if (s.message().find("rank 1's record of the device call is corrupt") == std::string::npos)
      __builtin_trap();
    return 0;
  }
  if (capi::devcall::describe_call(rec).empty()) __builtin_trap();
  Status ok = capi::devcall::check_ok(rec, 1, 0, "fuzz");
  if (ok.is_ok() != (rec.ok == 1)) __builtin_trap();
  if (rec.nfreed > capi::devcall::kMaxAnnounced || rec.nvmm_gone > capi::devcall::kMaxAnnounced)
    __builtin_trap();
  return 0;
}
