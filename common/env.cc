// Environment knobs.
#include "common/env.h"

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
  long long v = std::strtoll(text.c_str(), &end, 10);
  if (end == text.c_str()) return std::nullopt;
  std::string suffix(end);
  int64_t mult = 1;
  if (suffix == "" ) mult = 1;
  else if (suffix == "K" || suffix == "k" || suffix == "KiB" || suffix == "KB") mult = 1LL << 10;
  else if (suffix == "M" || suffix == "m" || suffix == "MiB" || suffix == "MB") mult = 1LL << 20;
  else if (suffix == "G" || suffix == "g" || suffix == "GiB" || suffix == "GB") mult = 1LL << 30;
  else return std::nullopt;
  return static_cast<int64_t>(v) * mult;
}

Result<int64_t> env_int(const char* name, int64_t fallback) {
  auto v = env_get(name);
  if (!v) return fallback;
  auto parsed = parse_size(*v);
  if (!parsed) return make_error(Code::kInvalidArgument, "env {}='{}' is not an integer (e.g. 17, 512K, 4M)", name, *v);
  return *parsed;
}

Result<double> env_seconds(const char* name, double fallback) {
  auto v = env_get(name);
  if (!v) return fallback;
  char* end = nullptr;
  double d = std::strtod(v->c_str(), &end);
  if (end == v->c_str() || *end != '\0' || d < 0)
    return make_error(Code::kInvalidArgument, "env {}='{}' is not a number of seconds", name, *v);
  return d;
}

}  // namespace chorus
