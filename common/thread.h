// Starting threads without exceptions. std::thread throws when the system cannot make a thread
// (EAGAIN under a small `ulimit -u` or `ulimit -v`); start_thread returns that as an error
// instead. The body runs inside a catch-all, so nothing ever escapes a thread (an escaping
// exception would terminate the process): what is caught is logged and handed to on_exception.
#pragma once

#include <exception>
#include <functional>
#include <string>
#include <system_error>
#include <thread>

#include "common/log.h"
#include "common/status.h"

namespace chorus {

inline Result<std::thread> start_thread(std::string what, std::function<void()> body,
                                        std::function<void(const std::string&)> on_exception = {}) {
  auto run = [what, body = std::move(body), on_exception = std::move(on_exception)] {
    std::string error;
    try {
      body();
      return;
    } catch (const std::exception& e) {
      error = e.what();
    } catch (...) {
      error = "unknown exception";
    }
    log_error("{}: the thread ended with an exception: {}", what, error);
    if (on_exception) on_exception(error);
  };
  try {
    return std::thread(std::move(run));
  } catch (const std::exception& e) {
    return make_error(Code::kSystemError, "cannot start a thread for {}: {}", what, e.what());
  }
}

}  // namespace chorus
