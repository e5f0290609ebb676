// Environment knobs.
#include "common/env.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>

namespace chorus {

std::optional<std::string> env_get(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

std::string env_str(const char* name, const std::string& fallback) {
  return env_get(name).value_or(fallback);
}

std::optional<int64_t> parse_size(const std::string& text) {
  if (text.empty()) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(text.c_str(), &end, 10);
  if (end == text.c_str() || errno == ERANGE) return std::nullopt;
  std::string suffix(end);
  int64_t mult = 1;
  if (suffix == "")
    mult = 1;
  else if (suffix == "K" || suffix == "k" || suffix == "KiB" || suffix == "KB")
    mult = 1LL << 10;
  else if (suffix == "M" || suffix == "m" || suffix == "MiB" || suffix == "MB")
    mult = 1LL << 20;
  else if (suffix == "G" || suffix == "g" || suffix == "GiB" || suffix == "GB")
    mult = 1LL << 30;
  else
    return std::nullopt;
  int64_t out = 0;
  if (__builtin_mul_overflow(static_cast<int64_t>(v), mult, &out)) return std::nullopt;
  return out;
}

Result<int64_t> env_int(const char* name, int64_t fallback) {
  auto v = env_get(name);
  if (!v) return fallback;
  auto parsed = parse_size(*v);
  if (!parsed)
    return make_error(Code::kInvalidArgument,
                      "env {}='{}' is not a 64-bit integer (e.g. 17, 512K, 4M)", name, *v);
  return *parsed;
}

Result<int64_t> env_int_in(const char* name, int64_t fallback, int64_t lo, int64_t hi) {
  CHORUS_ASSIGN_OR_RETURN(int64_t v, env_int(name, fallback));
  if (v < lo || v > hi)
    return make_error(Code::kInvalidArgument, "env {}='{}' is out of range: expected {}..{}", name,
                      env_str(name, ""), lo, hi);
  return v;
}

Result<double> env_seconds(const char* name, double fallback) {
  auto v = env_get(name);
  if (!v) return fallback;
  char* end = nullptr;
  errno = 0;
  double d = std::strtod(v->c_str(), &end);
  if (end == v->c_str() || *end != '\0' || errno == ERANGE || !std::isfinite(d) || d < 0)
    return make_error(Code::kInvalidArgument, "env {}='{}' is not a finite number >= 0", name, *v);
  return d;
}

Result<double> env_timeout() {
  CHORUS_ASSIGN_OR_RETURN(double t, env_seconds("CHORUS_TIMEOUT", 300));
  if (!(t > 0))
    return make_error(Code::kInvalidArgument,
                      "env CHORUS_TIMEOUT='{}' must be more than 0 seconds (every wait would fail)",
                      env_str("CHORUS_TIMEOUT", ""));
  return t;
}

}  // namespace chorus
