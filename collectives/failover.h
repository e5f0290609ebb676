// What the store's failover (failover.cc) reads back from the store: each rank's standby port
// and the new store's generation. Store bytes, so parsed strictly and fuzzed
// (fuzz/failover_records.cc).
#pragma once

#include <string>

#include "common/socket.h"
#include "common/status.h"

namespace chorus {

// "host port", or "-" for a rank without a standby port (the store's host; failover off).
std::string encode_standby(const SockAddr& a);
// The address, or one with an empty host: none, or not an address (that rank is passed over).
SockAddr decode_standby(const std::string& v);
// A generation is a count of failovers, 1 or more.
Result<int> decode_generation(const std::string& v);

}  // namespace chorus
