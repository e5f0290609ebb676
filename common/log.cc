// stderr logger; one mutex so lines from several threads never interleave.
#include "common/log.h"

#include <atomic>
#include <cstdio>
#include <mutex>

#include "common/env.h"

namespace chorus {
namespace {
std::atomic<int> g_rank{-1};
std::mutex g_mu;

LogLevel parse_level() {
  std::string v = env_str("CHORUS_DEBUG", "WARN");
  for (auto& c : v) c = static_cast<char>(toupper(c));
  if (v == "TRACE") return LogLevel::kTrace;
  if (v == "INFO") return LogLevel::kInfo;
  if (v == "ERROR") return LogLevel::kError;
  if (v == "NONE") return LogLevel::kNone;
  return LogLevel::kWarn;
}
}  // namespace

LogLevel log_level() {
  static const LogLevel level = parse_level();
  return level;
}

void set_log_rank(int rank) { g_rank.store(rank); }

void log(LogLevel level, const std::string& message) {
  static const char* names[] = {"TRACE", "INFO", "WARN", "ERROR", ""};
  std::lock_guard<std::mutex> lock(g_mu);
  int rank = g_rank.load();
  if (rank >= 0)
    std::fprintf(stderr, "chorus rank %d %s: %s\n", rank, names[static_cast<int>(level)], message.c_str());
  else
    std::fprintf(stderr, "chorus %s: %s\n", names[static_cast<int>(level)], message.c_str());
  std::fflush(stderr);
}

}  // namespace chorus
