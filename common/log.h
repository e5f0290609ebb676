// Logging to stderr, filtered by CHORUS_DEBUG (WARN by default; INFO, TRACE; or NONE).
// Every line is prefixed "chorus rank R: " once the process knows its rank.
#pragma once

#include <string>

#include <fmt/format.h>

#include "common/status.h"

namespace chorus {

enum class LogLevel { kTrace = 0, kInfo = 1, kWarn = 2, kError = 3, kNone = 4 };

LogLevel log_level();
void set_log_rank(int rank);
void log(LogLevel level, const std::string& message);
// A CHORUS_DEBUG that names no level is an error (communicator creation returns it).
Status check_log_level_env();

template <typename... Args>
void log_info(fmt::format_string<Args...> f, Args&&... args) {
  if (log_level() <= LogLevel::kInfo)
    log(LogLevel::kInfo, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void log_warn(fmt::format_string<Args...> f, Args&&... args) {
  if (log_level() <= LogLevel::kWarn)
    log(LogLevel::kWarn, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void log_error(fmt::format_string<Args...> f, Args&&... args) {
  if (log_level() <= LogLevel::kError)
    log(LogLevel::kError, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace chorus
