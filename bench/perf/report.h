// chorus-perf output: nccl-tests' table, or CSV, on rank 0's stdout; optionally a JSON file.
#pragma once

#include <cstddef>
#include <cstdio>
#include <string>
#include <vector>

#include "perf/options.h"

namespace perf {

// One timed variant (out-of-place or in-place) of one size. Times are per operation, each
// iteration's time being the slowest rank's.
struct Measure {
  double avg_us = 0;  // the reported time (nccl-tests: mean over iterations)
  double median_us = 0;
  double p10_us = 0;
  double p90_us = 0;
  double min_us = 0;
  double max_us = 0;
  int iters = 0;
  double algbw = 0;  // GB/s, 1e9 bytes
  double busbw = 0;
  long long wrong = -1;  // elements wrong, summed over ranks; -1: not checked (N/A)
  double eff = -1;       // --device cuda: traffic_factor x size / time / copy rate; -1: none
  double host_us = -1;   // --device cuda: the host's time per call (enqueueing), slowest rank
};

struct Row {
  size_t bytes = 0;  // nccl-tests' "size": the total for all_gather / reduce_scatter
  size_t count = 0;
  const char* type = "";
  const char* redop = "";
  int root = -1;
  Measure out_of_place, in_place;
};

class Reporter {
 public:
  // Only the reporter of rank 0 prints (`active`); every rank keeps the totals.
  Reporter(const Options& o, int nranks, bool active) : opt_(o), nranks_(nranks), active_(active) {}

  // rank_lines: "Rank 0 Pid 123 on host" for each rank.
  void header(const std::vector<std::string>& rank_lines);
  void row(const Row& r);
  // Prints the totals; returns the number of wrong elements over every row.
  long long footer();
  // Writes every row to opt_.json_path; false (with a message) when the file cannot be written.
  bool write_json(const std::vector<std::string>& rank_lines) const;

 private:
  const Options& opt_;
  int nranks_;
  bool active_;
  std::vector<Row> rows_;
  double busbw_sum_ = 0;
  int busbw_count_ = 0;
  long long wrong_ = 0;
};

}  // namespace perf
