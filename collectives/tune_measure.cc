// Ring or direct for large all-reduces over shared memory: measured, not modelled.
//
// Which of the two is faster depends on the machine in ways the ranks cannot read from it: on
// one 2-core AMD EPYC VM direct ran 1.2-2.8x the ring from 4 MiB up, on another of the same
// type the ring ran 1.3-1.6x direct (bench/RESULTS.md, "Direct by default" and "Ring or
// direct, measured"). So a communicator's first all-reduce that takes this choice (tuner.h,
// takes_large_in_place) runs both first on scratch buffers of kTrialBytes: one warm-up call
// each, then kTimed calls each, alternating. The slowest rank's best time of each is shared by
// an all-reduce (max), so every rank has the same two numbers and takes the same answer; the
// operation header checks it at every later call anyway. It costs about 2 * (1 + kTimed) calls
// of 8 MiB once per communicator (~25 ms here); CHORUS_TUNE_MEASURE=0 keeps direct without it.
#include "collectives/tune_measure.h"

#include <algorithm>
#include <vector>

#include "collectives/c_api_internal.h"
#include "collectives/comm.h"
#include "common/clock.h"
#include "common/log.h"

namespace chorus {

bool CommImpl::begin_measurement(size_t bytes) {
  // Every all-reduce asks: small ones, and all once it has run, without taking the lock.
  if (bytes < kLargeInPlaceBytes || measure_begun_.load(std::memory_order_relaxed)) return false;
  std::lock_guard<std::mutex> lock(tune_mu_);
  if (measure_begun_ || !tuner_.measure) return false;
  if (!takes_large_in_place(tune_input(OpKind::kAllReduce, bytes), tuner_)) return false;
  measure_begun_ = true;
  return true;
}

Tuned CommImpl::tune_slow(OpKind kind, size_t bytes) {
  std::lock_guard<std::mutex> lock(tune_mu_);
  if (trial_algo_ != Algo::kNone) {  // measuring: not cached
    TunerConfig forced = tuner_;
    forced.forced_algo = trial_algo_;
    forced.quiet = true;
    return chorus::tune(tune_input(kind, bytes), forced);
  }
  const Tuned t = chorus::tune(tune_input(kind, bytes), tuner_);
  tune_cache_.store(kind, bytes, t);
  return t;
}

void CommImpl::set_trial_algo(Algo a) {
  std::lock_guard<std::mutex> lock(tune_mu_);
  trial_algo_ = a;
  tune_cache_.clear();  // the trial's calls are not answered from the cache
}

void CommImpl::end_measurement(Algo chosen) {
  std::lock_guard<std::mutex> lock(tune_mu_);
  trial_algo_ = Algo::kNone;
  large_in_place_ = chosen;
  tune_cache_.clear();  // forget the cached answer: it may predate the choice
}

}  // namespace chorus

namespace chorus::capi {

namespace {
constexpr size_t kTrialBytes = 8 << 20;
constexpr int kTimed = 3;
}  // namespace

chorusResult_t measure_large_in_place(chorusComm_t h, CommImpl& comm, size_t bytes) {
  if (!comm.begin_measurement(bytes)) return chorusSuccess;
  const Call call{"chorusAllReduce (the tuner's measurement of ring against direct)",
                  OpKind::kAllReduce, false};
  const size_t count = kTrialBytes / sizeof(float);
  std::vector<float> in(count, 1.0f), out(count);
  const Algo algos[2] = {Algo::kRing, Algo::kDirect};
  double best[2] = {1e30, 1e30};
  for (int round = 0; round <= kTimed; ++round) {
    for (int k = 0; k < 2; ++k) {
      comm.set_trial_algo(algos[k]);
      const double t0 = now_seconds();
      chorusResult_t rc = run_op(call, h,
                                 {.sendbuff = in.data(),
                                  .recvbuff = out.data(),
                                  .count = count,
                                  .datatype = chorusFloat32,
                                  .op = chorusSum});
      const double t = now_seconds() - t0;
      comm.set_trial_algo(Algo::kNone);
      if (rc != chorusSuccess) {
        comm.end_measurement(Algo::kNone);
        return rc;
      }
      if (round > 0) best[k] = std::min(best[k], t);
    }
  }
  chorusResult_t rc = run_op(
      call, h,
      {.sendbuff = best, .recvbuff = best, .count = 2, .datatype = chorusFloat64, .op = chorusMax});
  if (rc != chorusSuccess) {
    comm.end_measurement(Algo::kNone);
    return rc;
  }
  const Algo chosen = best[0] < best[1] ? Algo::kRing : Algo::kDirect;
  comm.end_measurement(chosen);
  log_info(
      "tuner: all-reduce of {} bytes on {} ranks over shm, the slowest rank's best of {}: "
      "ring {:.3f} ms, direct {:.3f} ms: {} from {} bytes",
      kTrialBytes, comm.size(), kTimed, best[0] * 1e3, best[1] * 1e3, algo_name(chosen),
      kLargeInPlaceBytes);
  return chorusSuccess;
}

}  // namespace chorus::capi
