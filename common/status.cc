// Status names and the TRACE hop log.
#include "common/status.h"

#include "common/log.h"

namespace chorus {

const char* code_name(Code c) {
  switch (c) {
    case Code::kOk:
      return "ok";
    case Code::kSystemError:
      return "system error";
    case Code::kInternalError:
      return "internal error";
    case Code::kInvalidArgument:
      return "invalid argument";
    case Code::kInvalidUsage:
      return "invalid usage";
    case Code::kRemoteError:
      return "remote error";
    case Code::kTimeout:
      return "timeout";
    case Code::kAborted:
      return "aborted";
    case Code::kMismatch:
      return "mismatch";
    case Code::kRevoked:
      return "revoked";
  }
  return "unknown";
}

std::string Status::to_string() const {
  if (is_ok()) return "ok";
  return fmt::format("{}: {}", code_name(code()), message());
}

const std::string& Status::empty_message() {
  static const std::string empty;
  return empty;
}

namespace detail {
bool trace_enabled() {
  return log_level() <= LogLevel::kTrace;
}
void trace_hop(const char* file, int line, const Status& s) {
  log(LogLevel::kTrace, fmt::format("{}:{}: {}", file, line, s.to_string()));
}
}  // namespace detail

}  // namespace chorus
