// chorus-perf command line (see options.h).
#include "perf/options.h"

#include <CLI/CLI.hpp>
#include <cctype>
#include <limits>

namespace perf {

std::optional<size_t> parse_size(const std::string& text) {
  size_t pos = 0;
  while (pos < text.size() && std::isdigit(static_cast<unsigned char>(text[pos]))) ++pos;
  if (pos == 0 || pos > 19) return std::nullopt;
  size_t value = std::stoull(text.substr(0, pos));
  std::string unit = text.substr(pos);
  if (!unit.empty() && (unit.back() == 'B' || unit.back() == 'b') && unit.size() <= 2)
    unit.pop_back();
  int shift = 0;
  if (unit == "K" || unit == "k") {
    shift = 10;
  } else if (unit == "M" || unit == "m") {
    shift = 20;
  } else if (unit == "G" || unit == "g") {
    shift = 30;
  } else if (!unit.empty()) {
    return std::nullopt;
  }
  if (value > (std::numeric_limits<size_t>::max() >> shift)) return std::nullopt;
  return value << shift;
}

std::vector<size_t> sweep_sizes(const Options& o) {
  std::vector<size_t> sizes;
  for (size_t s = o.min_bytes; s <= o.max_bytes;) {
    sizes.push_back(s);
    size_t next =
        o.factor > 1 ? static_cast<size_t>(static_cast<double>(s) * o.factor) : s + o.step_bytes;
    if (next <= s) next = s + 1;  // -b 0 with a factor still moves on
    s = next;
  }
  return sizes;
}

std::optional<int> parse_options(int argc, char** argv, Options& o) {
  CLI::App app{
      "chorus-perf: collective benchmark in the manner of nccl-tests.\n"
      "Run under a launcher: chorus-run -n 2 chorus-perf -b 8 -e 128M -f 2"};
  std::string min_s = "32M", max_s = "32M", step_s = "1M", op_s = "sum", type_s = "float";
  std::string coll_s = "all_reduce";
  int check = 1;
  app.add_option("-b,--minbytes", min_s, "smallest size in bytes (K/M/G suffixes)")
      ->capture_default_str();
  app.add_option("-e,--maxbytes", max_s, "largest size in bytes (K/M/G suffixes)")
      ->capture_default_str();
  app.add_option("-f,--stepfactor", o.factor, "multiply the size by this factor per step")
      ->capture_default_str();
  app.add_option("-i,--stepbytes", step_s, "add this many bytes per step when -f is 1")
      ->capture_default_str();
  app.add_option("-o,--op", op_s, "reduce op: sum|prod|min|max|avg|all")->capture_default_str();
  app.add_option("-d,--datatype", type_s,
                 "float|f32, double|f64, half|f16, bfloat16|bf16, int8|i8, uint8|u8, "
                 "int32|i32, uint32|u32, int64|i64, uint64|u64, or all")
      ->capture_default_str();
  app.add_option("-n,--iters", o.iters, "timed iterations per size")
      ->check(CLI::Range(1, 100000000))
      ->capture_default_str();
  app.add_option("-w,--warmup_iters", o.warmup, "warm-up iterations per size (not timed)")
      ->check(CLI::Range(0, 100000000))
      ->capture_default_str();
  app.add_option("-c,--check", check, "1: check every element of every rank's output")
      ->check(CLI::Range(0, 1))
      ->capture_default_str();
  app.add_option("--coll", coll_s, "collective")
      ->check(CLI::IsMember(coll_names()))
      ->capture_default_str();
  app.add_option("--algo", o.algo, "CHORUS_ALGO for this run: ring|tree|rd|direct|fold|hier|auto")
      ->check(CLI::IsMember({"ring", "tree", "rd", "direct", "fold", "hier", "auto"}))
      ->capture_default_str();
  app.add_option(
         "--transport", o.transport,
         "CHORUS_TRANSPORT for this run: shm|tcp|ib|auto (ib: a verbs port, or CHORUS_IB_EMULATE)")
      ->check(CLI::IsMember({"shm", "tcp", "ib", "auto"}))
      ->capture_default_str();
  app.add_flag("--deterministic", o.deterministic,
               "CHORUS_DETERMINISTIC=1 for this run: reductions in rank order, the same bits "
               "whatever the size, algorithm or transport");
  app.add_flag("-R,--mem-alloc", o.mem_alloc,
               "buffers from chorusMemAlloc: an all-reduce on one host from 64 KiB maps the "
               "peers' buffers and moves each byte once");
  app.add_option("--device", o.device,
                 "where the buffers live: cpu, or cuda (LOCAL_RANK's GPU; the calls get a stream "
                 "and the table an efficiency column)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  app.add_option("-r,--root", o.root, "root rank of broadcast, reduce, gather and scatter")
      ->capture_default_str();
  app.add_flag("--csv", o.csv,
               "print CSV (a header row, then one row per size) instead of the table");
  app.add_option("--json", o.json_path, "also write every result to this JSON file (rank 0)");
  app.add_option("--time-budget", o.time_budget_s,
                 "seconds of timed ops per size and variant: fewer iterations than -n (at least 5) "
                 "when the warm-up shows they would take longer; 0: always -n")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--result-label", o.result_label,
                 "also print a RESULT line per size (peers' bench_common.h format, out-of-place, "
                 "median) under this label; used by bench/compare.sh");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);  // prints help, or the error
    return rc == 0 ? 0 : 2;
  }

  auto bad = [](const std::string& what) {
    std::fprintf(stderr, "chorus-perf: %s\n", what.c_str());
    return 2;
  };
  const auto min_b = parse_size(min_s), max_b = parse_size(max_s), step_b = parse_size(step_s);
  if (!min_b) return bad("-b: cannot read size '" + min_s + "' (e.g. 8, 64K, 128M, 1G)");
  if (!max_b) return bad("-e: cannot read size '" + max_s + "' (e.g. 8, 64K, 128M, 1G)");
  if (!step_b || *step_b == 0) return bad("-i: cannot read a positive size from '" + step_s + "'");
  if (*max_b < *min_b) return bad("-e " + max_s + " is smaller than -b " + min_s);
  if (o.factor <= 0) return bad("-f must be positive");
  o.min_bytes = *min_b;
  o.max_bytes = *max_b;
  o.step_bytes = *step_b;
  o.check = check != 0;
  o.coll = coll_from_name(coll_s);
  if (o.mem_alloc && o.device == "cuda")
    return bad("-R (chorusMemAlloc: host memory) and --device cuda exclude each other");

  if (op_s == "all") {
    for (const auto& op : all_ops()) o.ops.push_back(&op);
  } else if (const OpInfo* op = op_from_name(op_s)) {
    o.ops.push_back(op);
  } else {
    return bad("-o: unknown op '" + op_s + "' (sum, prod, min, max, avg, all)");
  }
  if (type_s == "all") {
    for (const auto& t : all_types()) o.types.push_back(&t);
  } else if (const TypeInfo* t = type_from_name(type_s)) {
    o.types.push_back(t);
  } else {
    return bad("-d: unknown type '" + type_s +
               "' (float, double, half, bfloat16, int32, int64, uint8, their short names, all)");
  }
  return std::nullopt;
}

}  // namespace perf
