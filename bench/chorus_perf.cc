// chorus-perf: times one collective over a range of sizes in the manner of nccl-tests
// (out-of-place and in-place, algbw and busbw, #wrong) and checks every element of every
// rank's output against a serial reference.
//
//   chorus-run -n 2 build/bench/chorus-perf -b 8 -e 128M -f 2 --coll all_reduce -d float -o sum
//   mpirun -n 2 build/bench/chorus-perf -b 1K -e 1M -f 4 --csv
//
// Time per op: each iteration is timed on every rank (steady_clock), the per-iteration times
// are all-reduced with MAX (the slowest rank), and the table shows their mean over -n
// iterations; the JSON file has the median, quantiles, min and max as well. With --device cuda
// the buffers are on LOCAL_RANK's GPU and the calls go on a stream: the -n calls are timed
// together up to a stream synchronisation (as nccl-tests does), the inputs are written and the
// outputs checked through host copies. Flags and columns: bench/README.md.
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "chorus/chorus.hpp"
#include "perf/data.h"
#include "perf/device.h"
#include "perf/options.h"
#include "perf/report.h"

namespace perf {
namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct FreeDeleter {
  bool shared = false;  // from chorusMemAlloc
  void operator()(void* p) const {
    if (shared)
      chorusMemFree(p);
    else
      std::free(p);
  }
};
using Buffer = std::unique_ptr<unsigned char, FreeDeleter>;

Buffer alloc_buffer(size_t bytes, bool shared) {
  const size_t rounded = std::max<size_t>(4096, (bytes + 4095) / 4096 * 4096);
  void* p = nullptr;
  if (shared) {
    if (chorusMemAlloc(&p, rounded) != chorusSuccess)
      throw std::runtime_error(chorusGetLastError(nullptr));
  } else if (!(p = std::aligned_alloc(4096, rounded))) {
    throw std::bad_alloc();
  }
  std::memset(p, 0, rounded);  // fault every page in before timing
  return Buffer(static_cast<unsigned char*>(p), FreeDeleter{shared});
}

// The buffers of a run: host memory, or (--device cuda) device memory with host twins in which
// the pattern is written and the outputs checked.
struct Buffers {
  Buffer send, recv;         // host: the buffers themselves, or the device ones' twins
  void* dev_send = nullptr;  // --device cuda
  void* dev_recv = nullptr;
  size_t bytes = 0;

  Buffers(size_t max_bytes, const Options& o)
      : send(alloc_buffer(max_bytes, o.mem_alloc)), recv(alloc_buffer(max_bytes, o.mem_alloc)) {
    bytes = std::max<size_t>(4096, (max_bytes + 4095) / 4096 * 4096);
    if (o.device == "cuda") {
      dev_send = device::alloc(bytes);
      dev_recv = device::alloc(bytes);
    }
  }
  ~Buffers() {
    if (dev_send) device::release(dev_send);
    if (dev_recv) device::release(dev_recv);
  }
  Buffers(const Buffers&) = delete;
  Buffers& operator=(const Buffers&) = delete;
  bool on_device() const { return dev_send != nullptr; }
  // The device address of a host-twin address.
  void* device_of(const void* host) const {
    const auto* h = static_cast<const unsigned char*>(host);
    if (h >= send.get() && h < send.get() + bytes)
      return static_cast<unsigned char*>(dev_send) + (h - send.get());
    return static_cast<unsigned char*>(dev_recv) + (h - recv.get());
  }
};

// One call's arguments: where the input and output lie for this variant.
struct Call {
  Coll coll;
  const void* send;
  void* recv;
  size_t count;
  chorusDataType_t dtype;
  chorusRedOp_t op;
  int root;
  chorusStream_t stream = nullptr;  // --device cuda
};

// The call on the device twins of its buffers.
Call on_device(const Call& c, const Buffers& b) {
  Call d = c;
  d.send = b.device_of(c.send);
  d.recv = b.device_of(c.recv);
  d.stream = static_cast<chorusStream_t>(device::stream());
  return d;
}

void run_call(chorus::Communicator& comm, const Call& c) {
  chorusComm_t h = comm.handle();
  chorusStream_t st = c.stream;
  switch (c.coll) {
    case Coll::kAllReduce:
      return chorus::check(chorusAllReduce(c.send, c.recv, c.count, c.dtype, c.op, h, st));
    case Coll::kBroadcast:
      return chorus::check(chorusBroadcast(c.send, c.recv, c.count, c.dtype, c.root, h, st));
    case Coll::kReduce:
      return chorus::check(chorusReduce(c.send, c.recv, c.count, c.dtype, c.op, c.root, h, st));
    case Coll::kAllGather:
      return chorus::check(chorusAllGather(c.send, c.recv, c.count, c.dtype, h, st));
    case Coll::kReduceScatter:
      return chorus::check(chorusReduceScatter(c.send, c.recv, c.count, c.dtype, c.op, h, st));
    case Coll::kGather:
      return chorus::check(chorusGather(c.send, c.recv, c.count, c.dtype, c.root, h, st));
    case Coll::kScatter:
      return chorus::check(chorusScatter(c.send, c.recv, c.count, c.dtype, c.root, h, st));
    case Coll::kAllToAll:
      return chorus::check(chorusAllToAll(c.send, c.recv, c.count, c.dtype, h, st));
    case Coll::kSendRecv: {  // a ring shift: send to the next rank, receive from the previous
      // Grouped, as nccl-tests does: both are posted together, so the ring cannot deadlock.
      const int n = comm.size(), r = comm.rank();
      chorus::check(chorusGroupStart());
      chorusResult_t rc = chorusSend(c.send, c.count, c.dtype, (r + 1) % n, h, st);
      if (rc == chorusSuccess) rc = chorusRecv(c.recv, c.count, c.dtype, (r - 1 + n) % n, h, st);
      const chorusResult_t end = chorusGroupEnd();  // always close the group
      chorus::check(rc);
      return chorus::check(end);
    }
  }
}

// Sets up the buffers of one variant with the check pattern and returns the call to make.
// In place follows NCCL: all_gather (and gather) sends from recv + rank*count, reduce_scatter
// (and scatter) receives into send + rank*count; all_to_all in one buffer.
Call prepare(const CheckSpec& s, bool in_place, unsigned char* send, unsigned char* recv) {
  const size_t ts = s.type->size, per = s.shape.count;
  const bool is_root = s.rank == s.root;
  Call c{s.coll, send, recv, per, s.type->dtype, s.op, s.root};
  if (!in_place) {
    if ((s.coll == Coll::kBroadcast || s.coll == Coll::kScatter) && !is_root) {
      fill_sentinel(send, s.shape.send_count * ts);  // only the root's input may travel
    } else {
      fill_pattern(s, send, 0, s.shape.send_count);
    }
    fill_sentinel(recv, s.shape.recv_count * ts);
    return c;
  }
  c.send = recv;
  switch (s.coll) {
    case Coll::kBroadcast:
      if (is_root) {
        fill_pattern(s, recv, 0, per);
      } else {
        fill_sentinel(recv, per * ts);
      }
      break;
    case Coll::kAllGather:
    case Coll::kGather:
      fill_sentinel(recv, s.shape.recv_count * ts);
      fill_pattern(s, recv + s.rank * per * ts, 0, per);
      c.send = recv + s.rank * per * ts;
      break;
    case Coll::kReduceScatter:
    case Coll::kScatter:
      if (s.coll == Coll::kScatter && !is_root) {
        fill_sentinel(recv, s.shape.send_count * ts);
      } else {
        fill_pattern(s, recv, 0, s.shape.send_count);
      }
      c.recv = recv + s.rank * per * ts;
      break;
    case Coll::kAllToAll:
      fill_pattern(s, recv, 0, s.shape.send_count);
      break;
    default:  // all_reduce, reduce, send_recv
      fill_pattern(s, recv, 0, per);
  }
  return c;
}

// Elements of the host twins that a variant's inputs and outputs span.
size_t span_bytes(const CheckSpec& s) {
  return std::max(s.shape.send_count, s.shape.recv_count) * s.type->size;
}

// Runs the call once with fresh inputs and returns the wrong elements summed over ranks.
long long check_once(chorus::Communicator& comm, const CheckSpec& s, const Call& c,
                     const Buffers& b) {
  if (b.on_device()) {
    const size_t span = span_bytes(s);
    device::to_device(b.dev_send, b.send.get(), span);
    device::to_device(b.dev_recv, b.recv.get(), span);
    run_call(comm, on_device(c, b));
    device::to_host(b.recv.get(), b.dev_recv, span);
  } else {
    run_call(comm, c);
  }
  long long wrong = static_cast<long long>(count_wrong(s, c.recv));
  comm.all_reduce(&wrong, &wrong, 1, chorusInt64, chorusSum);
  return wrong;
}

// Linear interpolation between order statistics, as the peers' bench_common.h.
double quantile(const std::vector<double>& sorted, double f) {
  const double idx = f * static_cast<double>(sorted.size() - 1);
  const size_t lo = static_cast<size_t>(idx);
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  const double w = idx - static_cast<double>(lo);
  return sorted[lo] * (1 - w) + sorted[hi] * w;
}

// Iterations to time: -n, or fewer (at least 5) when --time-budget and the warm-up, timed on
// the slowest rank, say -n would take longer. Every rank gets the same answer.
int pick_iters(chorus::Communicator& comm, const Options& o, double warmup_s, int warmups) {
  if (o.time_budget_s <= 0 || warmups == 0) return o.iters;
  double per_op = warmup_s / warmups;
  comm.all_reduce(&per_op, &per_op, 1, chorusFloat64, chorusMax);
  if (per_op <= 0) return o.iters;
  const double fit = o.time_budget_s / per_op;
  return static_cast<int>(std::clamp(fit, std::min(5.0, double(o.iters)), double(o.iters)));
}

Measure time_call(chorus::Communicator& comm, const Options& o, const Call& c, size_t bytes,
                  double factor, bool on_device) {
  const int warmups = o.time_budget_s > 0 ? std::max(o.warmup, 1) : o.warmup;
  const double w0 = now_s();
  for (int i = 0; i < warmups; ++i) run_call(comm, c);
  if (on_device) device::sync();
  const int iters = pick_iters(comm, o, now_s() - w0, warmups);
  std::vector<double> t(static_cast<size_t>(iters));
  double host_s = -1;
  comm.barrier();
  if (on_device) {  // enqueued back to back, timed up to the stream's end
    const double a = now_s();
    for (int i = 0; i < iters; ++i) run_call(comm, c);
    host_s = (now_s() - a) / iters;  // the host's part: a slow call that is not the GPU's
    device::sync();
    std::fill(t.begin(), t.end(), (now_s() - a) / iters);
  } else {
    for (double& ti : t) {
      const double a = now_s();
      run_call(comm, c);
      ti = now_s() - a;
    }
  }
  comm.all_reduce(t.data(), t.data(), t.size(), chorusFloat64, chorusMax);  // slowest rank
  Measure m;
  m.iters = iters;
  m.avg_us = std::accumulate(t.begin(), t.end(), 0.0) / static_cast<double>(t.size()) * 1e6;
  std::sort(t.begin(), t.end());
  m.median_us = quantile(t, 0.5) * 1e6;
  m.p10_us = quantile(t, 0.1) * 1e6;
  m.p90_us = quantile(t, 0.9) * 1e6;
  m.min_us = t.front() * 1e6;
  m.max_us = t.back() * 1e6;
  m.algbw = m.avg_us > 0 ? static_cast<double>(bytes) / (m.avg_us * 1e3) : 0;  // GB/s
  m.busbw = m.algbw * factor;
  if (on_device && o.copy_gbs > 0)
    m.eff = m.algbw * traffic_factor(o.coll, comm.size()) / o.copy_gbs;
  if (on_device) {
    comm.all_reduce(&host_s, &host_s, 1, chorusFloat64, chorusMax);
    m.host_us = host_s * 1e6;
  }
  return m;
}

// "Rank  0 Pid  1234 on host", collected on rank 0 with point-to-point messages.
std::vector<std::string> rank_lines(chorus::Communicator& comm) {
  char host[64] = "";
  gethostname(host, sizeof host - 1);
  char line[128];
  std::snprintf(line, sizeof line, "Rank %2d Pid %6d on %10s", comm.rank(),
                static_cast<int>(getpid()), host);
  std::vector<std::string> lines;
  if (comm.rank() != 0) {
    comm.send(line, sizeof line, chorusUint8, 0);
    return lines;
  }
  lines.emplace_back(line);
  for (int r = 1; r < comm.size(); ++r) {
    comm.recv(line, sizeof line, chorusUint8, r);
    line[sizeof line - 1] = '\0';
    lines.emplace_back(line);
  }
  return lines;
}

// Out-of-place then in-place at one size: check once each (with -c 1), then time.
Row run_size(chorus::Communicator& comm, const Options& o, const TypeInfo& type, const OpInfo* op,
             size_t bytes, const Buffers& b) {
  const int nranks = comm.size();
  const CheckSpec spec{o.coll,
                       &type,
                       op ? op->op : chorusSum,
                       comm.rank(),
                       nranks,
                       coll_has_root(o.coll) ? o.root : -1,
                       shape_for(o.coll, bytes, type.size, nranks)};
  Row row;
  row.count = spec.shape.total_count;
  row.bytes = row.count * type.size;
  row.type = type.name;
  row.redop = op ? op->name : "none";
  row.root = spec.root;
  for (bool in_place : {false, true}) {
    const Call call = prepare(spec, in_place, b.send.get(), b.recv.get());
    // send_recv in place would send and receive through one buffer at once: the data that
    // arrives overwrites what is still to be sent, so it is timed, not checked.
    const bool checkable = o.check && !(in_place && o.coll == Coll::kSendRecv);
    const long long wrong = checkable ? check_once(comm, spec, call, b) : -1;
    Measure m = time_call(comm, o, b.on_device() ? on_device(call, b) : call, row.bytes,
                          bus_factor(o.coll, nranks), b.on_device());
    m.wrong = wrong;
    (in_place ? row.in_place : row.out_of_place) = m;
  }
  return row;
}

int run(Options o) {
  if (o.algo != "auto") setenv("CHORUS_ALGO", o.algo.c_str(), 1);
  if (o.transport != "auto") setenv("CHORUS_TRANSPORT", o.transport.c_str(), 1);
  if (o.deterministic) setenv("CHORUS_DETERMINISTIC", "1", 1);
  auto comm = chorus::Communicator::from_env();
  const int rank = comm.rank(), nranks = comm.size();
  if (coll_has_root(o.coll) && (o.root < 0 || o.root >= nranks)) {
    if (rank == 0)
      std::fprintf(stderr, "chorus-perf: --root %d is not a rank of %d\n", o.root, nranks);
    return 2;
  }
  if (o.coll == Coll::kSendRecv && nranks < 2) {
    if (rank == 0) std::fprintf(stderr, "chorus-perf: send_recv needs at least 2 ranks\n");
    return 2;
  }
  const std::vector<size_t> sizes = sweep_sizes(o);
  const size_t max_bytes = sizes.empty() ? 0 : sizes.back();
  if (o.device == "cuda") {
    if (const std::string why = device::unavailable(); !why.empty()) {
      if (rank == 0) std::fprintf(stderr, "chorus-perf: --device cuda: %s\n", why.c_str());
      return 77;  // skipped, as the test suites count it
    }
    const char* local = std::getenv("LOCAL_RANK");
    device::init(local ? std::atoi(local) : rank);
    o.copy_gbs = device::copy_traffic_gbs(std::clamp<size_t>(max_bytes, 1 << 20, 256 << 20));
    comm.all_reduce(&o.copy_gbs, &o.copy_gbs, 1, chorusFloat64, chorusMin);
  }
  const std::vector<std::string> lines = rank_lines(comm);
  Reporter report(o, nranks, rank == 0);
  report.header(lines);

  const Buffers buffers(max_bytes, o);
  const std::vector<const OpInfo*> no_op = {nullptr};

  for (const TypeInfo* type : o.types) {
    for (const OpInfo* op : coll_reduces(o.coll) ? o.ops : no_op) {
      for (size_t bytes : sizes) {
        report.row(run_size(comm, o, *type, op, bytes, buffers));
      }
    }
  }
  const long long wrong = report.footer();
  const bool json_ok = report.write_json(lines);
  comm.barrier();  // the communicator is destroyed on return
  if (wrong > 0) return 1;
  return json_ok ? 0 : 1;
}

}  // namespace
}  // namespace perf

int main(int argc, char** argv) {
  perf::Options opt;
  if (auto rc = perf::parse_options(argc, argv, opt)) return *rc;
  try {
    return perf::run(opt);
  } catch (const chorus::Error& e) {
    std::fprintf(stderr, "chorus-perf: %s\n", e.what());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "chorus-perf: error: %s\n", e.what());
  }
  return 1;
}
