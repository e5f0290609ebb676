// chorus-perf command line: nccl-tests' flags (-b -e -f -i -o -d -n -w -c) plus --coll,
// --algo, --transport, --deterministic, -R, --device, --root, --csv, --json, --time-budget,
// --result-label.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "perf/data.h"

namespace perf {

struct Options {
  size_t min_bytes = 32u << 20;
  size_t max_bytes = 32u << 20;
  double factor = 2;  // > 1: multiply; otherwise add step_bytes
  size_t step_bytes = 1u << 20;
  std::vector<const OpInfo*> ops;
  std::vector<const TypeInfo*> types;
  int iters = 20;
  int warmup = 5;
  bool check = true;
  Coll coll = Coll::kAllReduce;
  std::string algo = "auto";       // CHORUS_ALGO, set before init unless auto
  std::string transport = "auto";  // CHORUS_TRANSPORT, set before init unless auto
  bool deterministic = false;      // CHORUS_DETERMINISTIC=1, set before init when given
  bool mem_alloc = false;          // -R: buffers from chorusMemAlloc (as nccl-tests' -R registers)
  std::string device = "cpu";      // --device cuda: buffers on LOCAL_RANK's GPU (perf/device.h)
  double copy_gbs = 0;             // --device cuda: the local copy traffic rate, measured at start
  int root = 0;
  bool csv = false;
  std::string json_path;  // empty: no JSON
  // Beyond nccl-tests, for bench/compare: cap the timed iterations of a size at about this many
  // seconds (0: always -n), and print bench_common.h's RESULT lines under this peer label.
  double time_budget_s = 0;
  std::string result_label;
};

// "8", "1K", "128M", "1G" (binary multiples, as nccl-tests), "64KB"; nullopt when malformed.
std::optional<size_t> parse_size(const std::string& text);

// The sizes of one sweep, min_bytes up to max_bytes inclusive.
std::vector<size_t> sweep_sizes(const Options& o);

// Parses argv. Returns an exit code when the program should stop (--help: 0, a bad flag: 2),
// nullopt to go on.
std::optional<int> parse_options(int argc, char** argv, Options& o);

}  // namespace perf
