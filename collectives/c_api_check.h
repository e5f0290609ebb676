// The C API's argument rules, as one table, and the one check that reads it. Every entry point
// that starts an operation names its call and passes its arguments here, so null buffers, count
// overflow, datatype and op range, root/peer range, stream and request are checked the same way
// everywhere, each refusal naming the call, the rank, the argument and its value. Also the
// exception boundary: what a caught C++ exception becomes at the C ABI.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "chorus/chorus.h"
#include "collectives/op.h"
#include "common/status.h"

namespace chorus::capi {

// Whether an operation reads a buffer: never, on every rank, or on the root only.
enum class Need : uint8_t { kNo, kAlways, kAtRoot };

// What one kind of operation takes. The table (c_api_check.cc) has one row per OpKind.
struct OpRule {
  OpKind kind;
  Need sendbuff;
  Need recvbuff;
  bool send_scaled;        // sendbuff holds nranks * count elements (reduce-scatter, scatter)
  bool recv_scaled;        // recvbuff holds nranks * count elements (all-gather, gather)
  bool root;               // takes a root in 0..nranks-1
  bool peer;               // takes a peer in 0..nranks-1, not this rank
  bool reduction;          // datatype must be reducible and op a chorusRedOp_t
  bool per_rank;           // counts and displacements per rank in arrays, not one count
  const char* count_name;  // the count's name in chorus.h: count, sendcount, recvcount
};
const OpRule& rule_for(OpKind kind);

// One entry point: its name in messages, what it does, and whether it returns a request
// (chorusI*: request must not be NULL) or blocks (stream must be NULL for CPU buffers).
struct Call {
  const char* name;
  OpKind kind;
  bool async;
};
// Call::async, as the C API's calls spell it.
constexpr bool kBlocking = false, kAsync = true;

// The arguments of any operation call; those a call does not take keep their defaults.
struct Args {
  const void* sendbuff = nullptr;
  void* recvbuff = nullptr;
  size_t count = 0;
  int datatype = chorusUint8;
  int op = -1;
  int root = -1;
  int peer = -1;
  int tag = 0;
  chorusStream_t stream = nullptr;
  chorusRequest_t* request = nullptr;
  // All-to-all-v: nranks entries each, in elements.
  const size_t* sendcounts = nullptr;
  const size_t* sdispls = nullptr;
  const size_t* recvcounts = nullptr;
  const size_t* rdispls = nullptr;
};

// What the check learned: element size, bytes of one rank's block, bytes the whole call moves
// (block * nranks for all-gather, reduce-scatter, gather, scatter and all-to-all; for
// all-to-all-v the larger of the two buffers' extents), all known to fit in a buffer.
struct Checked {
  size_t elem_size = 0;
  size_t block_bytes = 0;
  size_t total_bytes = 0;
};

// The largest buffer any call accepts: no object is larger than PTRDIFF_MAX bytes.
constexpr size_t kMaxBufferBytes = static_cast<size_t>(PTRDIFF_MAX);

// Arguments that need no communicator: the stream of a blocking call, the request of an
// asynchronous one.
Status check_form(const Call& call, const Args& args);
// The rest, for the communicator's rank and size. `spaces_known`: the caller has already
// decided where the buffers live -- the device path (device_ops.h) takes device memory, and a
// call for which takes_device_path() said no has none -- so device memory is not looked for
// again (asking the CUDA driver about a pointer is not free).
Result<Checked> check_args(const Call& call, const Args& args, int rank, int nranks,
                           bool spaces_known = false);
// Whether the call takes the device path: device buffers in a call that takes them, or a
// blocking barrier with a stream in a process that uses a CUDA device.
bool takes_device_path(const Call& call, const Args& args);
// The size of a new communicator (`what`: "nranks", "ndev"), 1..CHORUS_MAX_RANKS, and the
// rank, when given, 0..n-1.
Status check_world(const char* call, const char* what, int n, std::optional<int> rank);
// timeout_seconds of chorusWait: NaN is refused; +inf and anything above kWaitForever mean
// "until the operation ends" (returned as -1); otherwise the value itself.
Result<double> check_wait_timeout(double seconds);
constexpr double kWaitForever = 1e9;  // about 31 years

// Inside a catch handler: the current exception as a Status naming `call` (bad_alloc and
// system_error as kSystemError, anything else kInternalError). Never throws.
Status status_from_exception(const char* call) noexcept;

}  // namespace chorus::capi
