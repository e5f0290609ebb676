// stderr logger; one mutex so lines from several threads never interleave.
#include "common/log.h"

#include <atomic>
#include <cstdio>
#include <mutex>
#include <optional>
#include <string>

#include "common/env.h"

namespace chorus {
namespace {
std::atomic<int> g_rank{-1};
std::mutex g_mu;

std::optional<LogLevel> parse_level(std::string v) {
  for (auto& c : v) c = static_cast<char>(toupper(static_cast<unsigned char>(c)));
  if (v == "TRACE") return LogLevel::kTrace;
  if (v == "INFO") return LogLevel::kInfo;
  if (v == "WARN") return LogLevel::kWarn;
  if (v == "ERROR") return LogLevel::kError;
  if (v == "NONE") return LogLevel::kNone;
  return std::nullopt;
}
}  // namespace

LogLevel log_level() {
  // A bad value logs at WARN here; communicator creation refuses it (check_log_level_env).
  static const LogLevel level =
      parse_level(env_str("CHORUS_DEBUG", "WARN")).value_or(LogLevel::kWarn);
  return level;
}

Status check_log_level_env() {
  auto v = env_get("CHORUS_DEBUG");
  if (v && !parse_level(*v))
    return make_error(Code::kInvalidArgument,
                      "env CHORUS_DEBUG='{}': expected TRACE, INFO, WARN, ERROR or NONE", *v);
  return Status::ok();
}

void set_log_rank(int rank) {
  g_rank.store(rank);
}

void log(LogLevel level, const std::string& message) {
  static const char* names[] = {"TRACE", "INFO", "WARN", "ERROR", ""};
  std::lock_guard<std::mutex> lock(g_mu);
  int rank = g_rank.load();
  if (rank >= 0)
    std::fprintf(stderr, "chorus rank %d %s: %s\n", rank, names[static_cast<int>(level)],
                 message.c_str());
  else
    std::fprintf(stderr, "chorus %s: %s\n", names[static_cast<int>(level)], message.c_str());
  std::fflush(stderr);
}

}  // namespace chorus
