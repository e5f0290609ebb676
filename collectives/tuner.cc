// Alpha-beta tuner (see tuner.h).
#include "collectives/tuner.h"

#include <algorithm>
#include <cmath>
#include <mutex>
#include <set>
#include <tuple>

#include "common/env.h"
#include "common/log.h"

namespace chorus {
namespace {

constexpr double kGamma = 8.0e9;  // f32 a+b -> c, one core, memory-bound sizes
constexpr size_t kMinChannelBytes = 256 << 10;

int log2_ceil(int n) {
  int k = 0;
  while ((1 << k) < n) ++k;
  return k;
}

}  // namespace

double model_allreduce_seconds(Algo a, size_t bytes, int n, double alpha, double beta,
                               double gamma) {
  const double s = static_cast<double>(bytes);
  switch (a) {
    case Algo::kFold:  // one round, W-1 whole buffers out and in, all folded here
      return alpha + (n - 1.0) * s / beta + (n - 1.0) * s / gamma;
    case Algo::kDirect:  // two rounds, the ring's bytes; each slice folded once from W inputs
      return 2.0 * alpha + 2.0 * (n - 1) / n * s / beta + (n - 1.0) / n * s / gamma;
    case Algo::kRecursiveDoubling: {
      int rounds = log2_ceil(n) + ((n & (n - 1)) ? 1 : 0);  // folding costs about a round
      return rounds * (alpha + s / beta + s / gamma);
    }
    case Algo::kRing:
      return 2.0 * (n - 1) * alpha + 2.0 * (n - 1) / n * s / beta + (n - 1.0) / n * s / gamma;
    case Algo::kTree:
      return 2.0 * log2_ceil(n) * alpha + 2.0 * s / beta + s / gamma;
    default:
      return 1e30;
  }
}

double model_hier_seconds(const TuneInput& in, double alpha, double beta) {
  const double s = static_cast<double>(in.bytes), h = in.nhosts;
  const double la = in.local_link.alpha_s, lb = in.local_link.beta_bytes_per_s;
  // Two chains inside the largest host (pipelined: a buffer's time plus a step per rank), and
  // the leaders' ring across hosts with the slowest link's figures.
  const double chains = 2.0 * ((in.max_local - 1) * la + s / lb) + s / kGamma;
  return chains + 2.0 * (h - 1) * alpha + 2.0 * (h - 1) / h * s / beta + (h - 1) / h * s / kGamma;
}

Result<TunerConfig> TunerConfig::from_env() {
  TunerConfig c;
  if (auto forced = env_get("CHORUS_ALGO")) {
    if (*forced == "ring")
      c.forced_algo = Algo::kRing;
    else if (*forced == "tree")
      c.forced_algo = Algo::kTree;
    else if (*forced == "rd")
      c.forced_algo = Algo::kRecursiveDoubling;
    else if (*forced == "direct")
      c.forced_algo = Algo::kDirect;
    else if (*forced == "fold")
      c.forced_algo = Algo::kFold;
    else if (*forced == "hier")
      c.forced_algo = Algo::kHier;
    else if (*forced != "auto")
      return make_error(Code::kInvalidArgument,
                        "CHORUS_ALGO='{}': expected ring, tree, rd, direct, fold, hier or auto",
                        *forced);
  }
  CHORUS_ASSIGN_OR_RETURN(int64_t det, env_int_in("CHORUS_DETERMINISTIC", 0, 0, 1));
  c.deterministic = det == 1;
  CHORUS_ASSIGN_OR_RETURN(int64_t chunk, env_int_in("CHORUS_CHUNK_BYTES", 0, 0, int64_t{1} << 30));
  c.chunk_bytes = static_cast<size_t>(chunk);
  CHORUS_ASSIGN_OR_RETURN(c.alpha_us, env_seconds("CHORUS_ALPHA_US", -1));
  CHORUS_ASSIGN_OR_RETURN(c.beta_gbps, env_seconds("CHORUS_BETA_GBPS", -1));
  if (env_get("CHORUS_BETA_GBPS") && c.beta_gbps <= 0)
    return make_error(Code::kInvalidArgument, "CHORUS_BETA_GBPS={} must be positive", c.beta_gbps);
  CHORUS_ASSIGN_OR_RETURN(int64_t nch, env_int_in("CHORUS_NCHANNELS", 1, 1, 8));
  c.nchannels = static_cast<int>(nch);
  CHORUS_ASSIGN_OR_RETURN(int64_t measure, env_int_in("CHORUS_TUNE_MEASURE", 1, 0, 1));
  c.measure = measure == 1;
  if (auto slow = env_get("CHORUS_TEST_SLOW_ALGO")) {
    if (*slow == "ring")
      c.test_slow = Algo::kRing;
    else if (*slow == "direct")
      c.test_slow = Algo::kDirect;
    else if (!slow->empty())
      return make_error(Code::kInvalidArgument,
                        "CHORUS_TEST_SLOW_ALGO='{}': expected ring or direct", *slow);
  }
  return c;
}

bool takes_large_in_place(const TuneInput& in, const TunerConfig& cfg) {
  return in.kind == OpKind::kAllReduce && !cfg.deterministic && cfg.forced_algo == Algo::kNone &&
         in.link.read_in_place && in.bytes >= kLargeInPlaceBytes && in.nhosts == 1 &&
         in.nranks > 1 && !(in.nranks == 2 && in.bytes <= in.link.rd_two_rank_bytes);
}

namespace {

// The deterministic mode's choice (ordered.cc): fold or direct by the model, two ranks
// exchanging whole buffers up to the link's measured crossover; reduce-scatter is direct.
// An all-reduce of two ranks may also take the ring, which combines each element once in rank
// order there (ring_allreduce.cc): where the link stages what it receives (tcp) the ring's
// pipeline, which overlaps its two halves, beats direct's two rounds (bench/RESULTS.md).
Algo ordered_algo(const TuneInput& in, const TunerConfig& cfg, double alpha, double beta) {
  const bool two_rank_ring = in.nranks == 2 && in.kind == OpKind::kAllReduce;
  const Algo slices = two_rank_ring && !in.link.read_in_place ? Algo::kRing : Algo::kDirect;
  switch (cfg.forced_algo) {
    case Algo::kRing:
      return two_rank_ring ? Algo::kRing : Algo::kDirect;
    case Algo::kDirect:
      return Algo::kDirect;
    case Algo::kTree:
    case Algo::kRecursiveDoubling:
    case Algo::kFold:
      return in.kind == OpKind::kReduceScatter ? Algo::kDirect : Algo::kFold;
    default:
      break;
  }
  if (in.kind == OpKind::kReduceScatter) return Algo::kDirect;
  if (in.nranks == 2 && in.bytes <= in.link.rd_two_rank_bytes) return Algo::kFold;
  const double fold =
      model_allreduce_seconds(Algo::kFold, in.bytes, in.nranks, alpha, beta, kGamma);
  const double direct =
      model_allreduce_seconds(Algo::kDirect, in.bytes, in.nranks, alpha, beta, kGamma);
  return fold <= direct ? Algo::kFold : slices;
}

}  // namespace

Tuned tune(const TuneInput& in, const TunerConfig& cfg) {
  const transport::LinkModel& m = in.link;
  const double alpha = cfg.alpha_us >= 0 ? cfg.alpha_us * 1e-6 : m.alpha_s;
  const double beta = cfg.beta_gbps > 0 ? cfg.beta_gbps * 1e9 : m.beta_bytes_per_s;

  Tuned t{Algo::kChain, 0, 1};
  const bool ordered =
      cfg.deterministic || cfg.forced_algo == Algo::kDirect || cfg.forced_algo == Algo::kFold;
  const bool reduction = in.kind == OpKind::kAllReduce || in.kind == OpKind::kReduce ||
                         in.kind == OpKind::kReduceScatter;
  if (ordered && reduction) {
    t.algo = ordered_algo(in, cfg, alpha, beta);
  } else {
    switch (in.kind) {
      case OpKind::kAllReduce: {
        t.algo = Algo::kRecursiveDoubling;
        double best = 1e30;
        for (Algo a : {Algo::kRecursiveDoubling, Algo::kRing, Algo::kTree}) {
          double c = model_allreduce_seconds(a, in.bytes, in.nranks, alpha, beta, kGamma);
          if (c < best) best = c, t.algo = a;
        }
        // Measured, not modelled: with two ranks a buffer that stays in cache may be faster
        // exchanged whole (one step) than cut into the ring's three steps; the link's model says
        // up to which size (shm: near 2 MiB, bench/RESULTS.md, "tuner crossover").
        if (in.nranks == 2 && in.bytes <= m.rd_two_rank_bytes) t.algo = Algo::kRecursiveDoubling;
        // Over links read in place (shm), direct (ordered.cc) folds each rank's slice once,
        // straight out of the peers' slots: on one machine 1.2-2.8x the ring from 4 MiB up at
        // 2, 3 and 4 ranks, on another 0.6-0.8x (bench/RESULTS.md, "Direct by default", "Ring or
        // direct, measured"). So the communicator measures both (tune_measure.cc); direct until
        // then. At 2 MiB and below direct is not reliably faster anywhere.
        if (takes_large_in_place(in, cfg))
          t.algo = in.large_in_place == Algo::kRing ? Algo::kRing : Algo::kDirect;
        if (in.nhosts > 1 && in.max_local > 1 && model_hier_seconds(in, alpha, beta) < best)
          t.algo = Algo::kHier;
        if (cfg.forced_algo != Algo::kNone) t.algo = cfg.forced_algo;
        break;
      }
      case OpKind::kAllGather:
      case OpKind::kReduceScatter:
        t.algo = Algo::kRing;
        break;
      default:
        t.algo = Algo::kChain;
    }
  }
  // Pieces: small enough that a buffer splits into a few per rank (the pipeline fills),
  // never larger than a slot; multiples of 4 KiB.
  size_t per = in.bytes / (2 * static_cast<size_t>(std::max(1, in.nranks)));
  size_t piece = std::clamp<size_t>((per + 4095) & ~size_t{4095}, 8 << 10, m.max_piece);
  if (t.algo == Algo::kRecursiveDoubling) piece = m.max_piece;
  // Channels: a call is cut into parts that run at once, one per channel (a thread and links
  // of its own), when each part still moves a worthwhile amount. Gathers and scatters keep one.
  const bool splittable =
      in.kind == OpKind::kAllReduce || in.kind == OpKind::kReduce || in.kind == OpKind::kBroadcast;
  t.nchannels = 1;
  if (splittable && in.channels > 1 &&
      in.bytes >= static_cast<size_t>(in.channels) * kMinChannelBytes)
    t.nchannels = in.channels;
  if (t.nchannels > 1)
    piece = std::min(piece, std::max<size_t>(8 << 10, (per / t.nchannels + 4095) & ~size_t{4095}));
  if (cfg.chunk_bytes > 0) piece = cfg.chunk_bytes;
  t.piece = static_cast<uint32_t>(piece);

  if (log_level() <= LogLevel::kInfo && !cfg.quiet) {
    static std::mutex mu;
    static std::set<std::tuple<int, int, uint32_t>> printed;
    std::lock_guard<std::mutex> lock(mu);
    if (printed.insert({static_cast<int>(in.kind), static_cast<int>(t.algo), t.piece}).second)
      log_info(
          "tuner: {} of {} bytes on {} ranks ({}): algorithm {}, piece {} bytes, {} channel(s)",
          op_name(in.kind), in.bytes, in.nranks, m.name, algo_name(t.algo), t.piece, t.nchannels);
  }
  return t;
}

}  // namespace chorus
