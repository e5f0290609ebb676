// The C ABI (include/chorus/chorus.h), communicators: create, split, query, abort, destroy,
// and the last error. Operations are in c_api_ops.cc. Nothing here throws: every exported
// function is a function-try-block ending in CHORUS_CATCH_ALL, and every failure is a
// chorusResult_t plus a message for chorusGetLastError.
#include <atomic>
#include <cstddef>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "chorus/chorus.h"
#include "collectives/c_api_check.h"
#include "collectives/c_api_internal.h"
#include "collectives/comm.h"
#include "collectives/device_call.h"
#include "collectives/grow.h"
#include "collectives/job.h"
#include "collectives/tuner.h"
#include "common/env.h"
#include "common/log.h"
#include "transport/shm/shared_mem.h"

using chorus::Code;
using chorus::CommImpl;
using chorus::Status;
using chorus::capi::caught;
using chorus::capi::fail;
using chorus::capi::live;
using chorus::capi::report;
using chorus::capi::to_result;

namespace {
constexpr uint64_t kCommMagic = 0x636f6d6d2d6f6b21ull;
thread_local std::string t_last_error;
}  // namespace

// Handles stay allocated after destroy (kept in a registry, so leak checkers see them), and so
// does the communicator object behind them (chorusCommDestroy releases its links, threads and
// buffers; about a kilobyte remains): a late call on a destroyed communicator, even one racing
// with chorusCommDestroy on another thread, is answered with an error instead of touching freed
// memory. Calls read `live` (one atomic load, no lock, no reference count).
struct chorusComm {
  uint64_t magic = kCommMagic;
  std::mutex mu;                         // destroy and abort
  std::shared_ptr<CommImpl> comm;        // owner; never reset
  std::atomic<CommImpl*> live{nullptr};  // null once aborted or destroyed
  std::atomic<int> state{0};             // 0 usable, 1 aborted, 2 destroyed
};

namespace chorus::capi {

chorusResult_t to_result(Code c) {
  return static_cast<chorusResult_t>(static_cast<int>(c));
}

chorusResult_t report(const Status& s) {
  if (s.is_ok()) return chorusSuccess;
  t_last_error = s.message();
  return to_result(s.code());
}

chorusResult_t caught(const char* call) noexcept {
  const Status s = status_from_exception(call);
  try {
    t_last_error = s.message();
  } catch (...) {
    t_last_error.clear();
  }
  return to_result(s.code());
}

void abort_after_exception(CommImpl& comm, const Status& why) noexcept {
  try {
    comm.abort(fmt::format("rank {}: {}", comm.rank(), why.message()));
  } catch (...) {
    try {
      comm.abort(why.message());
    } catch (...) {
      // Not even that much memory: the peers will fail at their timeout instead.
    }
  }
}

Result<CommImpl*> live(chorusComm_t h, const char* call) {
  if (h == nullptr) return make_error(Code::kInvalidArgument, "{}: comm is NULL", call);
  if (h->magic != kCommMagic)
    return make_error(Code::kInvalidArgument, "{}: comm is not a chorus communicator", call);
  CommImpl* c = h->live.load(std::memory_order_acquire);
  if (c) return c;
  return make_error(
      Code::kInvalidUsage, "{}: communicator was {}", call,
      h->state.load() == 1 ? "aborted (chorusCommAbort)" : "destroyed (chorusCommDestroy)");
}

}  // namespace chorus::capi

namespace {

std::mutex g_handles_mu;
std::vector<std::unique_ptr<chorusComm>>& handles() {
  static auto* v =
      new std::vector<std::unique_ptr<chorusComm>>();  // never destroyed: live until exit
  return *v;
}

chorusComm_t new_handle(std::shared_ptr<CommImpl> c) {
  auto h = std::make_unique<chorusComm>();
  h->live.store(c.get());
  h->comm = std::move(c);
  std::lock_guard<std::mutex> lock(g_handles_mu);
  handles().push_back(std::move(h));
  return handles().back().get();
}

}  // namespace

chorusComm_t chorus::capi::adopt(std::shared_ptr<CommImpl> c) {
  return new_handle(std::move(c));
}

namespace {

// A one-shot start signal for threads: pass() blocks until open(), then says whether to go on.
class Gate {
 public:
  void open(bool go) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      state_ = go ? 1 : -1;
    }
    cv_.notify_all();
  }
  bool pass() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return state_ != 0; });
    return state_ > 0;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int state_ = 0;
};

// timeout_s > 0: the caller's limit for every wait (a config); 0: CHORUS_TIMEOUT's.
chorusResult_t init_comm(chorus::Result<chorus::transport::Rendezvous> rdzv, chorusComm_t* out,
                         const char* call, double timeout_s = 0, int deterministic = -1) {
  if (!rdzv.is_ok()) return report(rdzv.status().wrap(call));
  chorus::Result<double> timeout = timeout_s;
  std::string origin = "the communicator's config";
  if (timeout_s <= 0) {
    timeout = chorus::env_timeout();
    origin = "CHORUS_TIMEOUT";
  }
  if (!timeout.is_ok()) return report(timeout.status().wrap(call));
  if (rdzv->size > CHORUS_MAX_RANKS)
    return fail(Code::kInvalidArgument,
                "{}: a world of {} ranks ({}) is above CHORUS_MAX_RANKS ({})", call, rdzv->size,
                rdzv->method, CHORUS_MAX_RANKS);
  auto deadline = chorus::Deadline::after_seconds(*timeout);
  int rank = rdzv->rank, size = rdzv->size;
  uint64_t uid = chorus::transport::derive_id(rdzv->secret, "chorus/v2/root communicator");
  auto job = chorus::Job::create(std::move(rdzv.value()), deadline);
  if (!job.is_ok()) return report(job.status().wrap(call));
  std::vector<int> ranks(size);
  for (int i = 0; i < size; ++i) ranks[i] = i;
  auto comm = CommImpl::create(job.value(), "r", uid, rank, ranks, deadline, *timeout, origin,
                               deterministic);
  if (!comm.is_ok()) return report(comm.status().wrap(fmt::format("{} on rank {}", call, rank)));
  *out = new_handle(std::move(comm.value()));
  return chorusSuccess;
}

}  // namespace

CHORUS_API const char* chorusGetErrorString(chorusResult_t r) {
  switch (r) {
    case chorusSuccess:
      return "no error";
    case chorusUnhandledCudaError:
      return "unhandled cuda error";
    case chorusInProgress:
      return "operation in progress";
    default:
      return chorus::code_name(static_cast<Code>(r));
  }
}

CHORUS_API const char* chorusGetLastError(chorusComm_t) {
  return t_last_error.c_str();
}

CHORUS_API chorusResult_t chorusGetVersion(int* version) try {
  if (!version) return fail(Code::kInvalidArgument, "chorusGetVersion: version is NULL");
  *version = CHORUS_VERSION_CODE;
  return chorusSuccess;
}
CHORUS_CATCH_ALL

CHORUS_API chorusResult_t chorusMemAlloc(void** ptr, size_t size) try {
  if (!ptr) return fail(Code::kInvalidArgument, "chorusMemAlloc: ptr is NULL");
  *ptr = nullptr;
  auto p = chorus::transport::shared_alloc(size);
  if (!p.is_ok()) return report(p.status());
  *ptr = p.value();
  return chorusSuccess;
}
CHORUS_CATCH_ALL

CHORUS_API chorusResult_t chorusMemFree(void* ptr) try {
  return report(chorus::transport::shared_free(ptr));
}
CHORUS_CATCH_ALL

CHORUS_API chorusResult_t chorusGetUniqueId(chorusUniqueId* id) try {
  if (!id) return fail(Code::kInvalidArgument, "chorusGetUniqueId: id is NULL");
  auto data = chorus::transport::make_unique_id();
  if (!data.is_ok()) return report(data.status().wrap("chorusGetUniqueId"));
  std::memcpy(id->internal, &data.value(), sizeof(chorus::transport::UniqueIdData));
  return chorusSuccess;
}
CHORUS_CATCH_ALL

CHORUS_API chorusResult_t chorusCommInitRank(chorusComm_t* comm, int nranks, chorusUniqueId id,
                                             int rank) try {
  if (!comm) return fail(Code::kInvalidArgument, "chorusCommInitRank: comm is NULL");
  if (Status s = chorus::capi::check_world("chorusCommInitRank", "nranks", nranks, rank);
      !s.is_ok())
    return report(s);
  chorus::transport::UniqueIdData data;
  std::memcpy(&data, id.internal, sizeof data);
  return init_comm(chorus::transport::rendezvous_from_id(data, rank, nranks), comm,
                   "chorusCommInitRank");
}
CHORUS_CATCH_ALL

// A chorusConfig_t as the caller filled it: its timeout (0: the default's) and deterministic
// mode (-1: the default's).
Status check_config(const char* call, const chorusConfig_t& config, double* t, int* det) {
  // The first version of the struct ended before `deterministic`.
  constexpr size_t kSizeV1 = offsetof(chorusConfig_t, deterministic);
  if (config.size != sizeof(chorusConfig_t) && config.size != kSizeV1)
    return make_error(Code::kInvalidArgument,
                      "{}: config->size is {}, expected sizeof(chorusConfig_t) = {} (start from "
                      "CHORUS_CONFIG_INITIALIZER)",
                      call, config.size, sizeof(chorusConfig_t));
  *det = config.size == kSizeV1 ? -1 : config.deterministic;
  if (*det < -1 || *det > 1)
    return make_error(Code::kInvalidArgument,
                      "{}: config->deterministic is {}, expected 1 (on), 0 (off) or -1 "
                      "(CHORUS_DETERMINISTIC's)",
                      call, *det);
  *t = config.timeout_seconds;
  if (!(*t >= 0) || *t > 1e9)
    return make_error(Code::kInvalidArgument,
                      "{}: config->timeout_seconds is {}, expected 0 (CHORUS_TIMEOUT) or more "
                      "than 0 and at most 1e9",
                      call, *t);
  return Status::ok();
}

CHORUS_API chorusResult_t chorusCommInitRankConfig(chorusComm_t* comm, int nranks,
                                                   chorusUniqueId id, int rank,
                                                   const chorusConfig_t* config) try {
  constexpr const char* kCall = "chorusCommInitRankConfig";
  if (!comm) return fail(Code::kInvalidArgument, "{}: comm is NULL", kCall);
  if (!config) return fail(Code::kInvalidArgument, "{}: config is NULL", kCall);
  double t = 0;
  int det = -1;
  if (Status s = check_config(kCall, *config, &t, &det); !s.is_ok()) return report(s);
  if (Status s = chorus::capi::check_world(kCall, "nranks", nranks, rank); !s.is_ok())
    return report(s);
  chorus::transport::UniqueIdData data;
  std::memcpy(&data, id.internal, sizeof data);
  return init_comm(chorus::transport::rendezvous_from_id(data, rank, nranks), comm, kCall, t, det);
}
CHORUS_CATCH_ALL

CHORUS_API chorusResult_t chorusCommInitFromEnv(chorusComm_t* comm) try {
  if (!comm) return fail(Code::kInvalidArgument, "chorusCommInitFromEnv: comm is NULL");
  auto timeout = chorus::env_timeout();
  if (!timeout.is_ok()) return report(timeout.status().wrap("chorusCommInitFromEnv"));
  return init_comm(
      chorus::transport::rendezvous_from_env(chorus::Deadline::after_seconds(*timeout)), comm,
      "chorusCommInitFromEnv");
}
CHORUS_CATCH_ALL

CHORUS_API chorusResult_t chorusCommDestroy(chorusComm_t h) try {
  if (h == nullptr || h->magic != kCommMagic)
    return fail(Code::kInvalidArgument, "chorusCommDestroy: not a chorus communicator");
  std::shared_ptr<CommImpl> c;
  {
    std::lock_guard<std::mutex> lock(h->mu);
    if (h->state.load() == 2)
      return fail(Code::kInvalidUsage,
                  "chorusCommDestroy: communicator was destroyed (chorusCommDestroy)");
    c = h->comm;
    h->live.store(nullptr);
    h->state.store(2);
  }
  return report(c->destroy());  // bounded by CHORUS_TIMEOUT; the object stays for late callers
}
CHORUS_CATCH_ALL

// Fails the current and every later operation, here and (through the watch channel) on every
// peer. Call chorusCommDestroy afterwards to free the communicator.
CHORUS_API chorusResult_t chorusCommAbort(chorusComm_t h) try {
  if (h == nullptr || h->magic != kCommMagic)
    return fail(Code::kInvalidArgument, "chorusCommAbort: not a chorus communicator");
  std::shared_ptr<CommImpl> c;
  {
    std::lock_guard<std::mutex> lock(h->mu);  // taken before liveness is read: destroy may race
    if (h->state.load() != 0)
      return fail(
          Code::kInvalidUsage, "chorusCommAbort: communicator was {}",
          h->state.load() == 1 ? "aborted (chorusCommAbort)" : "destroyed (chorusCommDestroy)");
    c = h->comm;
    h->state.store(1);
    h->live.store(nullptr);
  }
  c->abort(fmt::format("rank {} aborted the communicator (chorusCommAbort)", c->rank()));
  return chorusSuccess;
}
CHORUS_CATCH_ALL

// Fails the current and every later operation with chorusRevoked, here and on every peer
// (through the watch channel and over the links, so without the store too). Unlike abort, the
// handle stays valid: chorusCommCount, chorusCommGetAsyncError and chorusCommDestroy work.
CHORUS_API chorusResult_t chorusCommRevoke(chorusComm_t h) try {
  auto c = live(h, "chorusCommRevoke");
  if (!c.is_ok()) return report(c.status());
  (*c)->revoke();
  return chorusSuccess;
}
CHORUS_CATCH_ALL

CHORUS_API chorusResult_t chorusCommGetAsyncError(chorusComm_t h, chorusResult_t* err) try {
  if (!err) return fail(Code::kInvalidArgument, "chorusCommGetAsyncError: async_error is NULL");
  auto c = live(h, "chorusCommGetAsyncError");
  if (!c.is_ok()) return report(c.status());
  Status s = (*c)->error();
  *err = to_result(s.code());
  if (!s.is_ok()) t_last_error = s.message();
  return chorusSuccess;
}
CHORUS_CATCH_ALL

CHORUS_API chorusResult_t chorusCommCount(const chorusComm_t h, int* count) try {
  if (!count) return fail(Code::kInvalidArgument, "chorusCommCount: count is NULL");
  auto c = live(h, "chorusCommCount");
  if (!c.is_ok()) return report(c.status());
  *count = (*c)->size();
  return chorusSuccess;
}
CHORUS_CATCH_ALL

CHORUS_API chorusResult_t chorusCommUserRank(const chorusComm_t h, int* rank) try {
  if (!rank) return fail(Code::kInvalidArgument, "chorusCommUserRank: rank is NULL");
  auto c = live(h, "chorusCommUserRank");
  if (!c.is_ok()) return report(c.status());
  *rank = (*c)->rank();
  return chorusSuccess;
}
CHORUS_CATCH_ALL

CHORUS_API chorusResult_t chorusCommCapturable(const chorusComm_t h, int* capturable) try {
  if (!capturable) return fail(Code::kInvalidArgument, "chorusCommCapturable: capturable is NULL");
  auto c = live(h, "chorusCommCapturable");
  if (!c.is_ok()) return report(c.status());
  const std::string why = chorus::capi::devcall::staged_why(**c);
  *capturable = why.empty() ? 1 : 0;
  if (!why.empty())
    chorus::log_info(
        "rank {}: chorusCommCapturable: 0, device calls are staged through host memory ({})",
        (*c)->rank(), why);
  return chorusSuccess;
}
CHORUS_CATCH_ALL

CHORUS_API chorusResult_t chorusCommSplit(chorusComm_t h, int color, int key,
                                          chorusComm_t* newcomm) try {
  if (!newcomm) return fail(Code::kInvalidArgument, "chorusCommSplit: newcomm is NULL");
  auto c = live(h, "chorusCommSplit");
  if (!c.is_ok()) return report(c.status());
  if (color < 0 && color != CHORUS_SPLIT_NOCOLOR)
    return fail(Code::kInvalidArgument,
                "chorusCommSplit on rank {}: color {} (use >= 0 or CHORUS_SPLIT_NOCOLOR)",
                (*c)->rank(), color);
  try {
    auto n = (*c)->split(color, key);
    if (!n.is_ok())
      return report(n.status().wrap(fmt::format("chorusCommSplit on rank {}", (*c)->rank())));
    *newcomm = nullptr;
    if (n.value()) *newcomm = new_handle(std::move(n.value()));
    return chorusSuccess;
  } catch (...) {
    // The other ranks are inside the same split: fail them now rather than at their timeout.
    const Status s = chorus::capi::status_from_exception("chorusCommSplit");
    chorus::capi::abort_after_exception(**c, s);
    return report(s);
  }
}
CHORUS_CATCH_ALL

// A communicator of the survivors (shrink.cc). Works on a failed or revoked communicator;
// CHORUS_SHRINK_ABORT revokes this one first, so its pending operations end at once.
CHORUS_API chorusResult_t chorusCommShrink(chorusComm_t h, const int* exclude, int nexclude,
                                           chorusComm_t* newcomm, const chorusConfig_t* config,
                                           int flags) try {
  constexpr const char* kCall = "chorusCommShrink";
  if (!newcomm) return fail(Code::kInvalidArgument, "{}: newcomm is NULL", kCall);
  *newcomm = nullptr;
  auto c = live(h, kCall);
  if (!c.is_ok()) return report(c.status());
  const int rank = (*c)->rank(), size = (*c)->size();
  if (nexclude < 0 || nexclude > size || (nexclude > 0 && !exclude))
    return fail(Code::kInvalidArgument,
                "{} on rank {}: {} excluded ranks at {} (expected 0..{}, and a list when > 0)",
                kCall, rank, nexclude, static_cast<const void*>(exclude), size);
  if (flags & ~(CHORUS_SHRINK_ABORT | CHORUS_SHRINK_AGREE))
    return fail(Code::kInvalidArgument,
                "{} on rank {}: flags {:#x} (expected CHORUS_SHRINK_DEFAULT, _ABORT, _AGREE)",
                kCall, rank, flags);
  double t = 0;
  int det = -1;
  if (config)
    if (Status s = check_config(kCall, *config, &t, &det); !s.is_ok()) return report(s);
  if (flags & CHORUS_SHRINK_ABORT) (*c)->revoke();
  std::vector<int> ex(exclude, exclude + nexclude);
  auto n = (*c)->shrink(ex, (flags & CHORUS_SHRINK_AGREE) != 0, t, det);
  if (!n.is_ok()) return report(n.status().wrap(fmt::format("{} on rank {}", kCall, rank)));
  *newcomm = new_handle(std::move(n.value()));
  return chorusSuccess;
}
CHORUS_CATCH_ALL

CHORUS_API chorusResult_t chorusCommGetUniqueId(chorusComm_t h, chorusUniqueId* id) try {
  constexpr const char* kCall = "chorusCommGetUniqueId";
  if (!id) return fail(Code::kInvalidArgument, "{}: growId is NULL", kCall);
  auto c = live(h, kCall);
  if (!c.is_ok()) return report(c.status());
  chorus::GrowId g;
  if (Status s = (*c)->grow_id(&g); !s.is_ok())
    return report(s.wrap(fmt::format("{} on rank {}", kCall, (*c)->rank())));
  static_assert(sizeof g == sizeof id->internal);
  std::memcpy(id->internal, &g, sizeof g);
  return chorusSuccess;
}
CHORUS_CATCH_ALL

// Members pass their communicator (and rank -1), newcomers NULL and their rank (grow.cc).
CHORUS_API chorusResult_t chorusCommGrow(chorusComm_t h, int nranks, const chorusUniqueId* id,
                                         int rank, chorusComm_t* newcomm,
                                         const chorusConfig_t* config) try {
  constexpr const char* kCall = "chorusCommGrow";
  if (!newcomm) return fail(Code::kInvalidArgument, "{}: newcomm is NULL", kCall);
  *newcomm = nullptr;
  double t = 0;
  int det = -1;
  if (config)
    if (Status s = check_config(kCall, *config, &t, &det); !s.is_ok()) return report(s);
  chorus::GrowId g;
  if (id) std::memcpy(&g, id->internal, sizeof g);
  chorus::Result<std::shared_ptr<CommImpl>> n = std::shared_ptr<CommImpl>();
  if (h) {
    auto c = live(h, kCall);
    if (!c.is_ok()) return report(c.status());
    if (rank != -1)
      return fail(Code::kInvalidArgument,
                  "{} on rank {}: a member passes rank -1 (it keeps its rank), got {}", kCall,
                  (*c)->rank(), rank);
    n = (*c)->grow(nranks, id ? &g : nullptr, t, det);
    if (!n.is_ok())
      return report(n.status().wrap(fmt::format("{} on rank {}", kCall, (*c)->rank())));
  } else {
    if (!id)
      return fail(Code::kInvalidArgument,
                  "{}: a newcomer (comm NULL) needs the grow id from chorusCommGetUniqueId", kCall);
    n = CommImpl::join_grow(g, nranks, rank, t, det);
    if (!n.is_ok())
      return report(n.status().wrap(fmt::format("{} on newcomer rank {}", kCall, rank)));
  }
  *newcomm = new_handle(std::move(n.value()));
  return chorusSuccess;
}
CHORUS_CATCH_ALL

CHORUS_API chorusResult_t chorusCommInitAll(chorusComm_t* comms, int ndev, const int* devlist) try {
  (void)devlist;  // CPU communicators have no device
  if (!comms) return fail(Code::kInvalidArgument, "chorusCommInitAll: comms is NULL");
  if (Status s = chorus::capi::check_world("chorusCommInitAll", "ndev", ndev, std::nullopt);
      !s.is_ok())
    return report(s);
  chorusUniqueId id;
  auto data = chorus::transport::make_unique_id(/*in_process=*/true);  // listens on loopback only
  if (!data.is_ok()) return report(data.status().wrap("chorusCommInitAll"));
  std::memcpy(id.internal, &data.value(), sizeof(chorus::transport::UniqueIdData));
  std::vector<chorusResult_t> rcs(ndev, chorusSuccess);
  std::vector<std::string> errors(ndev);
  // Every thread is started before any joins the job: when one cannot be started, the others
  // give up at once instead of waiting for a rank that never comes.
  Gate gate;
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(ndev));
  try {
    for (int r = 0; r < ndev; ++r)
      threads.emplace_back([&, r] {
        if (!gate.pass()) return;
        rcs[r] = chorusCommInitRank(&comms[r], ndev, id, r);
        if (rcs[r] != chorusSuccess) errors[r] = t_last_error;
      });
  } catch (...) {
    gate.open(false);
    for (auto& t : threads) t.join();
    return caught("chorusCommInitAll");
  }
  gate.open(true);
  for (auto& t : threads) t.join();
  for (int r = 0; r < ndev; ++r)
    if (rcs[r] != chorusSuccess) {
      for (int q = 0; q < ndev; ++q)
        if (rcs[q] == chorusSuccess) chorusCommDestroy(comms[q]);
      t_last_error = errors[r];
      return rcs[r];
    }
  return chorusSuccess;
}
CHORUS_CATCH_ALL
