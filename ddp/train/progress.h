// Progress display for a training epoch: a redrawn bar on a terminal, plain lines (every ~10%)
// when the output is a file or pipe.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace chorus {

class ProgressBar {
 public:
  // ranks > 1: the loss shown is this rank's (labelled so), images/s the whole job's.
  ProgressBar(std::FILE* out, std::string label, int64_t total_steps, bool enabled, int ranks = 1);
  // Call after each step with the running mean loss and the images the whole job has seen.
  void update(int64_t step, double mean_loss, int64_t images);
  void finish();  // clears the bar on a terminal

 private:
  std::FILE* out_;
  std::string label_;
  int64_t total_;
  std::string loss_label_, rate_label_;
  bool enabled_, tty_;
  int64_t next_plain_ = 0;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

}  // namespace chorus
