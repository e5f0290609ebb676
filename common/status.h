// Status and Result<T>: how every fallible function below the public header reports failure.
// Errors are copyable values (they cross threads and get stored); CHORUS_TRY propagates them.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include <fmt/format.h>

namespace chorus {

// Matches chorusResult_t in include/chorus/chorus.h value for value.
enum class Code : int {
  kOk = 0,
  kSystemError = 2,
  kInternalError = 3,
  kInvalidArgument = 4,
  kInvalidUsage = 5,
  kRemoteError = 6,
  kTimeout = 7,
  kAborted = 8,
  kMismatch = 9,
  kRevoked = 11,  // 10 is the C API's chorusInProgress
};

const char* code_name(Code c);

// An ok Status is one null pointer: making, moving and dropping one costs what a pointer does,
// which the hot paths (a Result<bool> per poll of a link) rely on. An error holds its code and
// message behind that pointer; copying one copies them.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Code code, std::string message)
      : rep_(code == Code::kOk && message.empty()
                 ? nullptr
                 : std::make_unique<Rep>(code, std::move(message))) {}
  Status(const Status& o) : rep_(o.rep_ ? std::make_unique<Rep>(*o.rep_) : nullptr) {}
  Status& operator=(const Status& o) {
    if (this != &o) rep_ = o.rep_ ? std::make_unique<Rep>(*o.rep_) : nullptr;
    return *this;
  }
  Status(Status&&) noexcept = default;
  Status& operator=(Status&&) noexcept = default;
  static Status ok() { return {}; }

  bool is_ok() const { return rep_ == nullptr || rep_->code == Code::kOk; }
  explicit operator bool() const { return is_ok(); }
  Code code() const { return rep_ ? rep_->code : Code::kOk; }
  const std::string& message() const { return rep_ ? rep_->message : empty_message(); }
  // "timeout: broadcast #3: ..." -- the code's name, then the message.
  std::string to_string() const;
  // Prefixes context: Status(...).wrap("bootstrap") -> "bootstrap: <message>".
  Status wrap(const std::string& context) const {
    return is_ok() ? *this : Status(code(), context + ": " + message());
  }

 private:
  struct Rep {
    Rep(Code c, std::string m) : code(c), message(std::move(m)) {}
    Code code;
    std::string message;
  };
  static const std::string& empty_message();
  std::unique_ptr<Rep> rep_;
};

template <typename... Args>
Status make_error(Code code, fmt::format_string<Args...> f, Args&&... args) {
  return Status(code, fmt::format(f, std::forward<Args>(args)...));
}

// Result<T>: a value, or the Status saying why there is none.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}         // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) {  // NOLINT
    if (status_.is_ok()) status_ = Status(Code::kInternalError, "result built from ok status");
  }
  bool is_ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }
  T& value() & { return *value_; }
  T&& value() && { return std::move(*value_); }
  T* operator->() { return &*value_; }
  T& operator*() { return *value_; }

 private:
  std::optional<T> value_;
  Status status_;
};

namespace detail {
void trace_hop(const char* file, int line, const Status& s);
bool trace_enabled();
inline const Status& as_status(const Status& s) {
  return s;
}
template <typename T>
const Status& as_status(const Result<T>& r) {
  return r.status();
}
}  // namespace detail

}  // namespace chorus

// Returns early with the error of a Status or Result; logs file:line when CHORUS_DEBUG=TRACE.
#define CHORUS_TRY(expr)                                                                  \
  do {                                                                                    \
    auto&& chorus_try_v_ = (expr);                                                        \
    if (!chorus_try_v_.is_ok()) {                                                         \
      const ::chorus::Status& chorus_try_s_ = ::chorus::detail::as_status(chorus_try_v_); \
      if (::chorus::detail::trace_enabled())                                              \
        ::chorus::detail::trace_hop(__FILE__, __LINE__, chorus_try_s_);                   \
      return chorus_try_s_;                                                               \
    }                                                                                     \
  } while (0)

#define CHORUS_CONCAT_INNER_(a, b) a##b
#define CHORUS_CONCAT_(a, b) CHORUS_CONCAT_INNER_(a, b)
// CHORUS_ASSIGN_OR_RETURN(auto x, f()): declares x from f()'s value or returns its error.
#define CHORUS_ASSIGN_OR_RETURN(decl, expr)          \
  auto CHORUS_CONCAT_(chorus_r_, __LINE__) = (expr); \
  CHORUS_TRY(CHORUS_CONCAT_(chorus_r_, __LINE__));   \
  decl = std::move(CHORUS_CONCAT_(chorus_r_, __LINE__)).value()

// A broken internal invariant is a bug: print where, and abort.
#define CHORUS_ASSERT(cond)                                                                     \
  do {                                                                                          \
    if (!(cond)) {                                                                              \
      std::fprintf(stderr, "chorus: internal error: %s at %s:%d\n", #cond, __FILE__, __LINE__); \
      std::abort();                                                                             \
    }                                                                                           \
  } while (0)
