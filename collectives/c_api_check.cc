// The C API's argument table and check, and the exception boundary (see c_api_check.h).
#include "collectives/c_api_check.h"

#include "collectives/device_ops.h"
#include "kernels/cuda/ipc.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <iterator>
#include <new>
#include <string>
#include <system_error>

#include "kernels/cuda/memory.h"

namespace chorus::capi {
namespace {

// "chorusAllReduce on rank 3", formatted only into messages (the passing path never allocates).
struct At {
  const char* call;
  int rank;
};

}  // namespace
}  // namespace chorus::capi

template <>
struct fmt::formatter<chorus::capi::At> : fmt::formatter<std::string_view> {
  auto format(const chorus::capi::At& at, fmt::format_context& ctx) const {
    return fmt::format_to(ctx.out(), "{} on rank {}", at.call, at.rank);
  }
};

namespace chorus::capi {
namespace {

// One row per operation kind.
// clang-format off
constexpr OpRule kRules[] = {
  // kind                  sendbuff       recvbuff       send*n recv*n root   peer   reduce per-rk count
  {OpKind::kSend,          Need::kAlways, Need::kNo,     false, false, false, true,  false, false, "count"},
  {OpKind::kRecv,          Need::kNo,     Need::kAlways, false, false, false, true,  false, false, "count"},
  {OpKind::kBarrier,       Need::kNo,     Need::kNo,     false, false, false, false, false, false, "count"},
  {OpKind::kBroadcast,     Need::kAtRoot, Need::kAlways, false, false, true,  false, false, false, "count"},
  {OpKind::kAllReduce,     Need::kAlways, Need::kAlways, false, false, false, false, true,  false, "count"},
  {OpKind::kReduce,        Need::kAlways, Need::kAtRoot, false, false, true,  false, true,  false, "count"},
  {OpKind::kAllGather,     Need::kAlways, Need::kAlways, false, true,  false, false, false, false, "sendcount"},
  {OpKind::kReduceScatter, Need::kAlways, Need::kAlways, true,  false, false, false, true,  false, "recvcount"},
  {OpKind::kGather,        Need::kAlways, Need::kAtRoot, false, true,  true,  false, false, false, "sendcount"},
  {OpKind::kScatter,       Need::kAtRoot, Need::kAlways, true,  false, true,  false, false, false, "recvcount"},
  {OpKind::kAllToAll,      Need::kAlways, Need::kAlways, true,  true,  false, false, false, false, "count"},
  // all-to-all-v: buffers and sizes from the per-rank arrays (check_per_rank)
  {OpKind::kAllToAllv,     Need::kNo,     Need::kNo,     false, false, false, false, false, true,  "count"},
};
// clang-format on

// "u8, i32, f32, ..." for every datatype the reduction kernels take (op.cc's table decides).
std::string reducible_types() {
  std::string out;
  for (int t = 0; t < chorusNumTypes; ++t)
    if (kernel_dtype(t)) out += fmt::format("{}{}", out.empty() ? "" : ", ", dtype_name(t));
  return out;
}

// "sum 0, prod 1, ..." for every op the reduction kernels take.
std::string known_ops() {
  std::string out;
  for (int op = 0; op < 64; ++op)
    if (kernel_redop(op))
      out += fmt::format("{}{} {}", out.empty() ? "" : ", ", redop_name(op), op);
  return out;
}

Status check_types(const OpRule& rule, const Args& a, At at) {
  if (dtype_size(a.datatype) == 0)
    return make_error(Code::kInvalidArgument, "{}: datatype {} is not a chorusDataType_t (0..{})",
                      at, a.datatype, chorusNumTypes - 1);
  if (!rule.reduction) return Status::ok();
  if (!kernel_dtype(a.datatype))
    return make_error(Code::kInvalidArgument,
                      "{}: datatype {} ({}) cannot be reduced (reducible: {})", at,
                      dtype_name(a.datatype), a.datatype, reducible_types());
  if (!kernel_redop(a.op))
    return make_error(Code::kInvalidArgument, "{}: op {} is not a chorusRedOp_t ({})", at, a.op,
                      known_ops());
  return Status::ok();
}

Status check_ranks(const OpRule& rule, const Args& a, int rank, int nranks, At at) {
  if (rule.root && (a.root < 0 || a.root >= nranks))
    return make_error(Code::kInvalidArgument, "{}: root {} is outside 0..{}", at, a.root,
                      nranks - 1);
  if (rule.peer && (a.peer < 0 || a.peer >= nranks))
    return make_error(Code::kInvalidArgument, "{}: peer {} is outside 0..{}", at, a.peer,
                      nranks - 1);
  if (rule.peer && a.peer == rank)
    return make_error(Code::kInvalidUsage,
                      "{}: peer {} is this rank (send/recv to self is not supported)", at, a.peer);
  return Status::ok();
}

// count * element size (* nranks for a scaled buffer) must fit in one buffer.
Result<Checked> check_sizes(const OpRule& rule, const Args& a, int nranks, At at) {
  Checked c;
  c.elem_size = dtype_size(a.datatype);
  // (no division: it would cost more than the rest of a small call's checks)
  if (__builtin_mul_overflow(a.count, c.elem_size, &c.block_bytes) ||
      c.block_bytes > kMaxBufferBytes)
    return make_error(Code::kInvalidArgument,
                      "{}: {} {} of {} ({} bytes each) is more than a buffer can hold ({} bytes)",
                      at, rule.count_name, a.count, dtype_name(a.datatype), c.elem_size,
                      kMaxBufferBytes);
  c.total_bytes = c.block_bytes;
  if (!rule.send_scaled && !rule.recv_scaled) return c;
  if (c.block_bytes > kMaxBufferBytes / static_cast<size_t>(nranks))
    return make_error(Code::kInvalidArgument,
                      "{}: {} {} of {} times {} ranks is more than {} can hold ({} bytes)", at,
                      rule.count_name, a.count, dtype_name(a.datatype), nranks,
                      !rule.recv_scaled   ? "sendbuff"
                      : !rule.send_scaled ? "recvbuff"
                                          : "sendbuff or recvbuff",
                      kMaxBufferBytes);
  c.total_bytes = c.block_bytes * static_cast<size_t>(nranks);
  return c;
}

Status check_buffers(const OpRule& rule, const Args& a, int rank, At at) {
  auto needed = [&](Need n) {
    return n == Need::kAlways || (n == Need::kAtRoot && rank == a.root);
  };
  if (a.count > 0 && needed(rule.sendbuff) && a.sendbuff == nullptr)
    return make_error(Code::kInvalidArgument, "{}: sendbuff is NULL with {} {}", at,
                      rule.count_name, a.count);
  if (a.count > 0 && needed(rule.recvbuff) && a.recvbuff == nullptr)
    return make_error(Code::kInvalidArgument, "{}: recvbuff is NULL with {} {}", at,
                      rule.count_name, a.count);
  return Status::ok();
}

// Where the buffers live: the calls without a device path (device_ops.h) move host memory (and
// managed memory, which the CPU reads); a device buffer is refused here, by name, before any
// rank touches it.
Status check_space(const void* buf, const char* name, At at) {
  if (buf == nullptr) return Status::ok();
  kernels::cuda::PointerInfo info = kernels::cuda::classify_pointer(buf);
  if (info.space != kernels::cuda::MemSpace::kDevice) return Status::ok();
  return make_error(
      Code::kInvalidArgument,
      "{}: {} {} is memory of CUDA device {}; device memory goes to all-reduce, "
      "reduce, broadcast, all-gather, reduce-scatter, gather, scatter, all-to-all(-v) "
      "and the blocking send/recv, not to this call (copy it to host memory, or "
      "use managed memory)",
      at, name, buf, info.device);
}

// The buffers the call's rule uses (any rank's role: a root's buffer is checked everywhere).
Status check_spaces(const OpRule& rule, const Args& a, At at) {
  if (rule.sendbuff != Need::kNo || rule.per_rank)
    CHORUS_TRY(check_space(a.sendbuff, "sendbuff", at));
  if (rule.recvbuff != Need::kNo || rule.per_rank)
    CHORUS_TRY(check_space(a.recvbuff, "recvbuff", at));
  return Status::ok();
}

// One side of an all-to-all-v: its arrays are there, each block's end (displacement + count)
// fits in a buffer, and the buffer is there when a block is not empty.
Result<size_t> check_side(const Args& a, int nranks, At at, bool send) {
  const char* side = send ? "send" : "recv";
  const size_t* counts = send ? a.sendcounts : a.recvcounts;
  const size_t* displs = send ? a.sdispls : a.rdispls;
  const char* counts_name = send ? "sendcounts" : "recvcounts";
  if (!counts)
    return make_error(Code::kInvalidArgument, "{}: {} is NULL ({} entries expected)", at,
                      counts_name, nranks);
  if (!displs)
    return make_error(Code::kInvalidArgument, "{}: {} is NULL ({} entries expected)", at,
                      send ? "sdispls" : "rdispls", nranks);
  const size_t es = dtype_size(a.datatype), most = kMaxBufferBytes / es;
  size_t end = 0;  // bytes
  for (int j = 0; j < nranks; ++j) {
    if (counts[j] > most || displs[j] > most - counts[j])
      return make_error(Code::kInvalidArgument,
                        "{}: {}[{}] {} + {}[{}] {} elements of {} ({} bytes each) end past what "
                        "a buffer can hold ({} bytes)",
                        at, send ? "sdispls" : "rdispls", j, displs[j], counts_name, j, counts[j],
                        dtype_name(a.datatype), es, kMaxBufferBytes);
    if (counts[j] > 0 && (send ? a.sendbuff == nullptr : a.recvbuff == nullptr))
      return make_error(Code::kInvalidArgument, "{}: {}buff is NULL with {}[{}] {}", at, side,
                        counts_name, j, counts[j]);
    if (counts[j] > 0) end = std::max(end, (displs[j] + counts[j]) * es);
  }
  return end;
}

// All-to-all-v: both sides, and this rank's block to itself the same size on both.
Result<Checked> check_per_rank(const Args& a, int rank, int nranks, At at) {
  Checked c;
  c.elem_size = dtype_size(a.datatype);
  CHORUS_ASSIGN_OR_RETURN(size_t send_end, check_side(a, nranks, at, true));
  CHORUS_ASSIGN_OR_RETURN(size_t recv_end, check_side(a, nranks, at, false));
  if (a.sendcounts[rank] != a.recvcounts[rank])
    return make_error(Code::kInvalidArgument,
                      "{}: sendcounts[{}] {} but recvcounts[{}] {} (this rank's block to itself "
                      "must be the same size on both sides)",
                      at, rank, a.sendcounts[rank], rank, a.recvcounts[rank]);
  c.total_bytes = std::max(send_end, recv_end);
  return c;
}

}  // namespace

// Row k - 1 is OpKind k's: the lookup is an index (it runs a few times per call).
constexpr bool rows_in_kind_order() {
  for (size_t i = 0; i < std::size(kRules); ++i)
    if (static_cast<size_t>(kRules[i].kind) != i + 1) return false;
  return true;
}
static_assert(rows_in_kind_order() && std::size(kRules) == static_cast<size_t>(OpKind::kAllToAllv),
              "kRules: one row per OpKind, in the enum's order");

const OpRule& rule_for(OpKind kind) {
  const auto i = static_cast<size_t>(kind) - 1;
  CHORUS_ASSERT(i < std::size(kRules) && "an OpKind without a row in kRules");
  return kRules[i];
}

Status check_form(const Call& call, const Args& a) {
  if (call.async && a.request == nullptr)
    return make_error(Code::kInvalidArgument, "{}: request is NULL", call.name);
  // With device buffers the buffers speak first (check_spaces names them).
  if (!call.async && a.stream != nullptr && !takes_device_path(call, a) &&
      !device_buffers(a.sendbuff, a.recvbuff))
    return make_error(Code::kInvalidArgument,
                      "{}: stream {} is not NULL with host buffers (a stream goes with device "
                      "buffers, and with chorusBarrier in a process that uses a CUDA device)",
                      call.name, a.stream);
  return Status::ok();
}

bool takes_device_path(const Call& call, const Args& a) {
  switch (call.kind) {
    case OpKind::kBarrier:  // in a process without a CUDA device, a stream is refused
      return !call.async && a.stream != nullptr && kernels::cuda::ipc().current_device() >= 0;
    case OpKind::kSend:
    case OpKind::kRecv:
    case OpKind::kAllReduce:
    case OpKind::kReduce:
    case OpKind::kBroadcast:
    case OpKind::kAllGather:
    case OpKind::kReduceScatter:
    case OpKind::kGather:
    case OpKind::kScatter:
    case OpKind::kAllToAll:
    case OpKind::kAllToAllv:
      return device_buffers(a.sendbuff, a.recvbuff);
    default:
      return false;
  }
}

Result<Checked> check_args(const Call& call, const Args& a, int rank, int nranks,
                           bool spaces_known) {
  const OpRule& rule = rule_for(call.kind);
  const At at{call.name, rank};
  CHORUS_TRY(check_types(rule, a, at));
  if (rule.per_rank) {
    if (!spaces_known) CHORUS_TRY(check_spaces(rule, a, at));
    return check_per_rank(a, rank, nranks, at);
  }
  CHORUS_ASSIGN_OR_RETURN(Checked c, check_sizes(rule, a, nranks, at));
  CHORUS_TRY(check_ranks(rule, a, rank, nranks, at));
  CHORUS_TRY(check_buffers(rule, a, rank, at));
  if (!spaces_known) CHORUS_TRY(check_spaces(rule, a, at));
  return c;
}

Status check_world(const char* call, const char* what, int n, std::optional<int> rank) {
  if (n < 1 || n > CHORUS_MAX_RANKS)
    return make_error(Code::kInvalidArgument, "{}: {} {} is outside 1..{} (CHORUS_MAX_RANKS)", call,
                      what, n, CHORUS_MAX_RANKS);
  if (rank && (*rank < 0 || *rank >= n))
    return make_error(Code::kInvalidArgument, "{}: rank {} is outside 0..{} ({} {})", call, *rank,
                      n - 1, what, n);
  return Status::ok();
}

Result<double> check_wait_timeout(double seconds) {
  if (std::isnan(seconds))
    return make_error(
        Code::kInvalidArgument,
        "chorusWait: timeout_seconds {} is not a number (a negative value or INFINITY "
        "waits until the operation ends)",
        seconds);
  return seconds > kWaitForever ? -1.0 : seconds;
}

Status status_from_exception(const char* call) noexcept {
  try {
    try {
      throw;
    } catch (const std::bad_alloc& e) {
      return make_error(Code::kSystemError, "{}: out of memory ({})", call, e.what());
    } catch (const std::system_error& e) {
      return make_error(Code::kSystemError, "{}: system error: {} (std::system_error)", call,
                        e.what());
    } catch (const std::exception& e) {
      return make_error(Code::kInternalError, "{}: internal error: unexpected exception: {}", call,
                        e.what());
    } catch (...) {
      return make_error(Code::kInternalError, "{}: internal error: unexpected exception", call);
    }
  } catch (...) {
    // Formatting the message failed too (out of memory): the code alone must do.
    return Status(Code::kSystemError, std::string());
  }
}

}  // namespace chorus::capi
