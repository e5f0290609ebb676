// CHORUS_DEVICE_TIMING=N: where the GPU's time goes in a communicator's first N device calls
// over CUDA IPC (device_ops.cc). After each stage a call enqueues on its stream -- a signal to
// a peer, a wait for one, a kernel, a copy through the bounce buffer -- comes a time stamp (a
// CUDA event that keeps its time) on the same stream. At destroy, when no call runs any more,
// each rank reads its stamps (polling, within the communicator's timeout) and prints on stderr,
// per call, the milliseconds from one stamp to the next, named by the stage that ends there,
// then the median of each stage over the calls of the same shape. A wait that takes the time is
// a late peer or the GPU switching between the processes that share it; a kernel that takes it
// is the kernel. Off (0): nothing recorded, nothing printed.
#pragma once

#include <deque>
#include <string>
#include <vector>

namespace chorus {

struct DeviceTiming {
  struct Stage {
    std::string what;
    void* stamp = nullptr;
  };
  struct Call {
    std::string name;
    std::vector<Stage> stages;  // the first: "start", before the call's first stage
  };
  int left = 0;            // calls still to time
  std::deque<Call> calls;  // a deque: a running call's CallTimer points into it
};

// The stamps of one call, on its stream; nothing when `timing` is null or its calls are used up.
class CallTimer {
 public:
  CallTimer(DeviceTiming* timing, std::string call, void* stream);
  // A stamp after the stage just enqueued, named `what`.
  void stamp(const std::string& what);
  bool on() const { return call_ != nullptr; }

 private:
  DeviceTiming::Call* call_ = nullptr;
  void* stream_ = nullptr;
};

// Prints every timed call of `rank` and the medians (stderr), waiting for the stamps at most
// `seconds`, then releases them.
void device_timing_report(DeviceTiming& timing, int rank, double seconds);

}  // namespace chorus
