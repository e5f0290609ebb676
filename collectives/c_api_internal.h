// What the files of the C ABI share: the export and exception-boundary macros, the last error
// of the calling thread, handle lookup, and the one path every operation call takes. c_api.cc:
// communicators (create, split, abort, destroy); c_api_ops.cc: operations, requests and
// groups; c_api_exchange.cc: gather, scatter, all-to-all and all-to-all-v.
#pragma once

#include <fmt/format.h>

#include <functional>
#include <memory>
#include <utility>

#include "chorus/chorus.h"
#include "collectives/c_api_check.h"
#include "collectives/comm.h"
#include "common/status.h"

#define CHORUS_API extern "C" __attribute__((visibility("default")))
// Closes the try block of every exported function: no C++ exception reaches a C caller.
#define CHORUS_CATCH_ALL                     \
  catch (...) {                              \
    return ::chorus::capi::caught(__func__); \
  }

namespace chorus::capi {

chorusResult_t to_result(Code c);
// Records a failure as this thread's last error (chorusGetLastError) and returns its code.
chorusResult_t report(const Status& s);
template <typename... A>
chorusResult_t fail(Code code, fmt::format_string<A...> f, A&&... args) {
  return report(Status(code, fmt::format(f, std::forward<A>(args)...)));
}
// In the handler of an exported function's try block: the exception as a code and message.
// Never throws (a message that cannot be built is dropped).
chorusResult_t caught(const char* call) noexcept;
// In a catch handler, for a call that may have left `comm` half way (a sequence number taken,
// peers waiting for an operation that will not come): fails the communicator with the
// exception's message, so every rank learns at once instead of at its timeout. Never throws.
void abort_after_exception(CommImpl& comm, const Status& why) noexcept;
// The live communicator of a handle, or why there is none (NULL, not a handle, aborted,
// destroyed), naming `call`.
Result<CommImpl*> live(chorusComm_t h, const char* call);
// A handle of a communicator made inside the library (the replays' of captured staged calls).
chorusComm_t adopt(std::shared_ptr<CommImpl> c);
// Checks the arguments (c_api_check.h), then runs, queues or groups the operation: blocking
// calls return when it is complete here, chorusI* calls hand back *a.request (c_api_ops.cc).
chorusResult_t run_op(const Call& call, chorusComm_t h, const Args& a);

// The host part of a staged device call (device_staged.cc). While a HostStage is alive on a
// thread, run_op and chorusGroupEnd on it queue their host operation on the communicator's
// progress thread as wrap(operation) and return without waiting for it: never inline (the
// input is not on the host yet), never the chorusMemAlloc or measuring paths. One per thread.
using OpWrap = std::function<OpFn(OpFn)>;
class HostStage {
 public:
  explicit HostStage(OpWrap wrap);
  ~HostStage();
  HostStage(const HostStage&) = delete;
  HostStage& operator=(const HostStage&) = delete;

 private:
  OpWrap wrap_;
};

}  // namespace chorus::capi
