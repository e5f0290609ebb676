// chorus-run --mps: CUDA's MPS control daemon for the job, so that workers sharing a GPU run
// their kernels side by side instead of taking turns by time slice (on an H100, 2-rank DDP of
// the tutorial CNN on one GPU: 10,900 images/s without, 84,200 with; bench/RESULTS.md).
#pragma once

#include <string>

namespace chorus::run {

class MpsDaemon {
 public:
  // Starts `nvidia-cuda-mps-control -d` (found on PATH) with pipe and log directories of the
  // job's own, set in this process's environment (CUDA_MPS_PIPE_DIRECTORY,
  // CUDA_MPS_LOG_DIRECTORY) for the workers to inherit, and waits (10 s at most) for its control
  // pipe. A daemon already there (CUDA_MPS_PIPE_DIRECTORY/control exists) is used as it is and
  // left running. False, with `error` naming what went wrong, when it cannot.
  bool start(std::string& error);
  // Asks the daemon this started to quit (20 s at most) and removes its directories.
  ~MpsDaemon();
  const std::string& pipe_dir() const { return pipe_dir_; }
  bool started() const { return !root_.empty(); }

 private:
  std::string control_;  // the control program's path
  std::string root_;     // the directories made here (empty: none, nothing to stop)
  std::string pipe_dir_;
};

}  // namespace chorus::run
