// One typed getter per kind of environment knob. Bad values are reported, never silently used.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "common/status.h"

namespace chorus {

std::optional<std::string> env_get(const char* name);
std::string env_str(const char* name, const std::string& fallback);
// Integers accept K/M/G suffixes (powers of 1024): CHORUS_CHUNK_BYTES=512K.
Result<int64_t> env_int(const char* name, int64_t fallback);
// env_int, and the value must lie in [lo, hi]; the error names the variable, its text and the
// range.
Result<int64_t> env_int_in(const char* name, int64_t fallback, int64_t lo, int64_t hi);
// Seconds, fractional allowed: CHORUS_TIMEOUT=2.5. NaN, infinities and negatives are refused.
Result<double> env_seconds(const char* name, double fallback);
// CHORUS_TIMEOUT: seconds any wait may last, more than 0; 300 when unset.
Result<double> env_timeout();
// Parses "512K", "4M", "17": the shared parser behind env_int, chorus-perf sizes and friends.
std::optional<int64_t> parse_size(const std::string& text);

}  // namespace chorus
