// Tuner: picks the algorithm and piece size of each call from an alpha-beta cost model.
//
// Each transport backend gives its links' latency alpha (seconds per message) and bandwidth
// beta (bytes per second) in its LinkModel (transport/transport.h); reductions also cost gamma
// (bytes per second reduced). Defaults were measured with bench/ on the project machine (see
// bench/RESULTS.md); CHORUS_ALPHA_US and CHORUS_BETA_GBPS replace them. CHORUS_ALGO (ring|tree|rd),
// CHORUS_CHUNK_BYTES and CHORUS_NCHANNELS override the choice (read when a communicator is
// created); the tuner cuts a call into as many parts as there are channels when each part is at
// least 256 KiB. CHORUS_DETERMINISTIC=1 keeps reductions to the ordered algorithms (ordered.cc).
// CHORUS_DEBUG=INFO prints each distinct choice once. The inputs are the same on
// every rank (sizes, rank count, the slowest link's model), so every rank picks the same; the
// operation header double-checks it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "collectives/op.h"
#include "common/seq_words.h"
#include "transport/transport.h"

namespace chorus {

struct TuneInput {
  OpKind kind;
  size_t bytes;  // the whole buffer (all-gather: the result)
  int nranks;
  transport::LinkModel link;          // of the slowest link any pair of ranks uses
  int channels;                       // channels the communicator has
  int nhosts = 1;                     // hosts the ranks are on (hosts.h)
  int max_local = 0;                  // the most ranks one host has
  transport::LinkModel local_link{};  // of the links inside a host (when max_local > 1)
  // The all-reduce for large buffers over links read in place (shm), measured on this
  // communicator (tune_measure.cc): ring or direct; kNone until measured (direct).
  Algo large_in_place = Algo::kNone;
};

struct Tuned {
  Algo algo;
  uint32_t piece;
  int nchannels;
};

// The knobs, read once when a communicator is created (as NCCL reads its variables once).
struct TunerConfig {
  Algo forced_algo = Algo::kNone;  // CHORUS_ALGO
  size_t chunk_bytes = 0;          // CHORUS_CHUNK_BYTES (0: tuner's choice)
  double alpha_us = -1;            // CHORUS_ALPHA_US (< 0: the link's default)
  double beta_gbps = -1;           // CHORUS_BETA_GBPS
  int nchannels = 1;               // CHORUS_NCHANNELS: channels opened per communicator (1..8)
  // CHORUS_DETERMINISTIC=1 (or the communicator's config): reductions run only the ordered
  // algorithms (direct, fold), whose bits depend on nothing but the inputs and the rank count;
  // a forced ring then means direct, rd and tree mean fold.
  bool deterministic = false;
  bool measure = true;           // CHORUS_TUNE_MEASURE: ring against direct, once (tune_measure.cc)
  Algo test_slow = Algo::kNone;  // CHORUS_TEST_SLOW_ALGO: test hook, 250 ms more per all-reduce
  bool quiet = false;            // no INFO line (the measurement's calls)
  static Result<TunerConfig> from_env();
};

// From this size an all-reduce over links read in place (shm) on one host takes ring or direct,
// whichever measured faster on the communicator (tune_measure.cc), instead of the model's choice.
constexpr size_t kLargeInPlaceBytes = 4 << 20;
// Whether an all-reduce of `in` takes that measured choice (false where another rule decides:
// two ranks below the link's whole-buffer crossover, several hosts, the deterministic mode).
bool takes_large_in_place(const TuneInput& in, const TunerConfig& cfg);

Tuned tune(const TuneInput& in, const TunerConfig& cfg);

// The last answer for one (kind, size), which any thread reads without a lock (SeqWords,
// common/seq_words.h). Writers (store, clear) must be serialized by the owner's lock; a reader
// that meets a write under way gets nothing and asks the slow way.
class TuneCache {
 public:
  std::optional<Tuned> lookup(OpKind kind, size_t bytes) const {
    const std::optional<SeqWords<2>::Words> w = words_.try_read();
    if (!w) return std::nullopt;
    const auto [b, p] = *w;
    if (b != bytes || (p >> 48) != static_cast<uint64_t>(kind)) return std::nullopt;
    return Tuned{.algo = static_cast<Algo>((p >> 40) & 0xff),
                 .piece = static_cast<uint32_t>(p),
                 .nchannels = static_cast<int>((p >> 32) & 0xff)};
  }
  // false (nothing stored) for an answer that does not pack: an algorithm or channel count
  // past 255.
  bool store(OpKind kind, size_t bytes, const Tuned& t) {
    const auto algo = static_cast<uint64_t>(t.algo);
    const auto nch = static_cast<uint64_t>(t.nchannels);
    if (algo > 0xff || nch > 0xff) {
      clear();
      return false;
    }
    write(bytes, static_cast<uint64_t>(kind) << 48 | algo << 40 | nch << 32 | t.piece);
    return true;
  }
  void clear() { write(0, 0); }  // OpKind 0 is none: every lookup misses
  // Tests: called between a write's two stores, to hold a write half done.
  static inline void (*test_mid_write)() = nullptr;

 private:
  void write(uint64_t bytes, uint64_t packed) {
    words_.update([&](SeqWords<2>::Writer& w) {
      w.set(0, bytes);
      if (test_mid_write != nullptr) test_mid_write();
      w.set(1, packed);
    });
  }
  SeqWords<2> words_;  // bytes; kind << 48 | algo << 40 | nchannels << 32 | piece
};

// Modelled seconds of an all-reduce algorithm (exposed for tests and bench/).
double model_allreduce_seconds(Algo a, size_t bytes, int n, double alpha, double beta,
                               double gamma);
// The hierarchical all-reduce's (hier_allreduce.cc): alpha and beta of the links between hosts.
double model_hier_seconds(const TuneInput& in, double alpha, double beta);

}  // namespace chorus
