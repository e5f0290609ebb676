// All-reduce of buffers that every rank of one host allocated with chorusMemAlloc
// (transport/shm/shared_mem.h). The ordinary shm path copies each byte through the slot rings
// twice (sender into a slot, receiver out of it); here each rank maps its peers' buffers and
//   1. exchanges where its sendbuff and recvbuff lie (pid, descriptor, allocation id, offset)
//      through a host all-gather, which also tells every rank that the others' inputs are ready;
//   2. maps what it has not mapped yet, and says whether that worked in a second all-gather: if
//      any rank failed, every rank turns the path off for this communicator (one INFO line) and
//      the ordinary path runs the call, the inputs untouched;
//   3. folds slice r (r = its rank) of every rank's sendbuff, in rank order, into its own
//      recvbuff, chunk by chunk, and copies each chunk while it is in cache into every peer's
//      recvbuff;
//   4. leaves after a barrier: no rank returns while another still reads its sendbuff or
//      writes its recvbuff.
// Each byte of input is read once and each byte of output written once: the bound of issue 14
// without the slots' copy. In place is safe: slice r is read and written by rank r alone, and
// read before it is written. The fold is kernels::reduce_fold in rank order, so the result is
// the same bits as the deterministic mode's (collectives/ordered.cc).
//
// All ranks of a call must pass chorusMemAlloc buffers, or none: a rank that does not runs the
// ordinary all-reduce while the others exchange, and every rank fails at once naming the
// mismatch (the others' exchange shows as an all_gather of the same sequence number).
#include "collectives/shared_allreduce.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "collectives/c_api_internal.h"
#include "collectives/comm.h"
#include "collectives/executor.h"
#include "collectives/op.h"
#include "common/log.h"
#include "transport/shm/shared_mem.h"

namespace chorus::capi {
namespace {

struct Record {
  transport::SharedRef send, recv;
  uint64_t count;
  int32_t datatype;
  int32_t op;
};

// The peers' buffers mapped for one call, held until it ends (transport::release_shared): a
// peer's buffer that is freed later is unmapped at a later call's new mapping.
struct Mapped {
  std::vector<const char*> send;
  std::vector<char*> recv;
  std::vector<transport::SharedRef> held;
  explicit Mapped(int p) : send(p), recv(p) {}
  Mapped(const Mapped&) = delete;
  Mapped& operator=(const Mapped&) = delete;
  ~Mapped() {
    for (const transport::SharedRef& ref : held) transport::release_shared(ref);
  }
  // Rank q's range `ref` of `bytes`, mapped and held.
  Result<char*> map(const transport::SharedRef& ref, size_t bytes, bool fail_for_test) {
    Result<char*> at = transport::map_shared(ref, bytes, fail_for_test);
    if (at.is_ok()) held.push_back(ref);
    return at;
  }
};

constexpr size_t kChunkBytes = 64 << 10;  // folded then copied out while still in cache
constexpr size_t kStreamingBytes = 4 << 20;

// Step 3 for rank r.
void fold_slice(const Mapped& m, int r, int p, kernels::DType dt, kernels::RedOp op, size_t es,
                size_t count) {
  const size_t align = std::max<size_t>(1, 64 / es);  // slices start on cache lines
  const size_t per = ((count + p - 1) / p + align - 1) / align * align;
  const size_t lo = std::min(count, per * r), n = std::min(per, count - lo);
  const int avg_n = op == kernels::RedOp::kAvg ? p : 0;
  const size_t chunk = std::max<size_t>(1, kChunkBytes / es);
  // A slice larger than a cache holds goes to the peers with streaming stores (no
  // read-for-ownership of lines nobody reads before the call returns).
  const bool stream = n * es >= kStreamingBytes;
  std::vector<const char*> in(p);
  for (size_t at = lo; at < lo + n; at += chunk) {
    const size_t c = std::min(chunk, lo + n - at);
    for (int q = 0; q < p; ++q) in[q] = m.send[q] + at * es;
    char* mine = m.recv[r] + at * es;
    cpu_executor().reduce_fold(dt, op, in.data(), p, mine, c, avg_n);
    for (int q = 0; q < p; ++q)
      if (q == r)
        continue;
      else if (stream)
        cpu_executor().copy_streaming(m.recv[q] + at * es, mine, c * es);
      else
        std::memcpy(m.recv[q] + at * es, mine, c * es);
  }
}

}  // namespace

bool shared_all_reduce(chorusComm_t h, CommImpl& comm, const Call& call, const Args& a,
                       const Checked& k, chorusResult_t* result) {
  const int r = comm.rank(), p = comm.size();
  if (p < 2 || k.block_bytes < kSharedMinBytes || comm.hosts().nhosts() != 1 ||
      !comm.shared_buffers())
    return false;
  std::optional<transport::SharedRef> send = transport::find_shared(a.sendbuff, k.block_bytes);
  std::optional<transport::SharedRef> recv = transport::find_shared(a.recvbuff, k.block_bytes);
  if (!send || !recv) return false;

  // 1. Where every rank's buffers are.
  Record me{*send, *recv, a.count, a.datatype, a.op};
  std::vector<Record> all(p);
  *result = run_op(
      {call.name, OpKind::kAllGather, false}, h,
      {.sendbuff = &me, .recvbuff = all.data(), .count = sizeof me, .datatype = chorusUint8});
  if (*result != chorusSuccess) return true;
  for (int q = 0; q < p; ++q)
    if (all[q].count != me.count || all[q].datatype != me.datatype || all[q].op != me.op) {
      *result = fail(Code::kMismatch,
                     "{} on rank {}: ranks disagree: rank {} reduces count {} of {} by {}, rank "
                     "{} count {} of {} by {}",
                     call.name, r, r, a.count, dtype_name(a.datatype), redop_name(a.op), q,
                     all[q].count, dtype_name(all[q].datatype), redop_name(all[q].op));
      return true;
    }

  // 2. Map the peers' buffers; every rank learns whether all could.
  Mapped m(p);
  std::string why;
  for (int q = 0; q < p && why.empty(); ++q) {
    if (q == r) {
      m.send[q] = static_cast<const char*>(a.sendbuff);
      m.recv[q] = static_cast<char*>(a.recvbuff);
      continue;
    }
    Result<char*> s = m.map(all[q].send, k.block_bytes, comm.shared_map_fail_for_test());
    Result<char*> d =
        s.is_ok() ? m.map(all[q].recv, k.block_bytes, comm.shared_map_fail_for_test()) : s;
    if (!d.is_ok()) {
      why = fmt::format("rank {}'s buffers: {}", q, d.status().message());
      break;
    }
    m.send[q] = s.value();
    m.recv[q] = d.value();
  }
  int32_t ok = why.empty() ? 1 : 0;
  std::vector<int32_t> oks(p);
  *result = run_op(
      {call.name, OpKind::kAllGather, false}, h,
      {.sendbuff = &ok, .recvbuff = oks.data(), .count = sizeof ok, .datatype = chorusUint8});
  if (*result != chorusSuccess) return true;
  for (int q = 0; q < p; ++q)
    if (!oks[q]) {
      comm.disable_shared_buffers();
      if (q == r)
        log_info(
            "rank {}: chorusMemAlloc buffers: cannot map {}; this communicator copies "
            "through the shm rings from now on",
            r, why);
      else if (why.empty())
        log_info(
            "rank {}: rank {} cannot map chorusMemAlloc buffers; this communicator copies "
            "through the shm rings from now on",
            r, q);
      return false;
    }

  // 3. and 4.
  const kernels::DType dt = *kernel_dtype(a.datatype);
  const kernels::RedOp op = *kernel_redop(a.op);
  fold_slice(m, r, p, dt, op, k.elem_size, a.count);
  *result = run_op({call.name, OpKind::kBarrier, false}, h, {});
  return true;
}

}  // namespace chorus::capi
