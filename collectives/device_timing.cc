#include "collectives/device_timing.h"

#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <thread>

#include "kernels/cuda/ipc.h"

namespace chorus {

namespace kc = kernels::cuda;

CallTimer::CallTimer(DeviceTiming* timing, std::string call, void* stream) : stream_(stream) {
  if (timing == nullptr || timing->left <= 0) return;
  --timing->left;
  timing->calls.push_back({std::move(call), {}});
  call_ = &timing->calls.back();
  stamp("start");
}

void CallTimer::stamp(const std::string& what) {
  if (call_ == nullptr) return;
  DeviceTiming::Stage s{what, nullptr};
  if (kc::ipc().stamp_record(stream_, &s.stamp) != 0) s.what += " (no stamp)";
  call_->stages.push_back(std::move(s));
}

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty()      ? 0
         : v.size() % 2 ? v[v.size() / 2]
                        : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

// Milliseconds from stamp `from` to `to`, polling until the GPU has reached both or `deadline`;
// a negative value when it has not (or a stamp is missing).
double elapsed(void* from, void* to, std::chrono::steady_clock::time_point deadline) {
  if (from == nullptr || to == nullptr) return -1;
  for (;;) {
    float ms = 0;
    const int rc = kc::ipc().stamp_ms(from, to, &ms);
    if (rc == 0) return ms;
    if (rc != kc::kStampNotReady || std::chrono::steady_clock::now() > deadline) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

std::string stage_text(const std::string& what, double ms) {
  return ms < 0 ? fmt::format(" | {}: not reached", what)
                : fmt::format(" | {}: {:.3f} ms", what, ms);
}

}  // namespace

void device_timing_report(DeviceTiming& timing, int rank, double seconds) {
  if (timing.calls.empty()) return;
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
  // Calls of the same shape (name and stages), in order of appearance, for the medians.
  using Shape = std::pair<std::string, std::vector<std::string>>;
  std::map<Shape, std::vector<std::vector<double>>> times;
  std::vector<Shape> shapes;
  int index = 0;
  for (const DeviceTiming::Call& c : timing.calls) {
    Shape shape{c.name, {}};
    std::vector<double> ms;
    std::string line;
    double total = 0;
    for (size_t i = 1; i < c.stages.size(); ++i) {
      const double t = elapsed(c.stages[i - 1].stamp, c.stages[i].stamp, deadline);
      line += stage_text(c.stages[i].what, t);
      shape.second.push_back(c.stages[i].what);
      ms.push_back(t);
      total += std::max(t, 0.0);
    }
    fmt::print(stderr, "chorus: rank {}: device timing, call {} ({}){} | total {:.3f} ms\n", rank,
               ++index, c.name, line, total);
    if (!times.count(shape)) shapes.push_back(shape);
    times[shape].push_back(std::move(ms));
  }
  for (const Shape& shape : shapes) {
    const auto& calls = times[shape];
    std::string line;
    for (size_t i = 0; i < shape.second.size(); ++i) {
      std::vector<double> v;
      for (const auto& c : calls)
        if (c[i] >= 0) v.push_back(c[i]);
      line += stage_text(shape.second[i], v.empty() ? -1 : median(v));
    }
    fmt::print(stderr, "chorus: rank {}: device timing, median of {} call(s) ({}){}\n", rank,
               calls.size(), shape.first, line);
  }
  for (DeviceTiming::Call& c : timing.calls)
    for (DeviceTiming::Stage& s : c.stages) kc::ipc().stamp_free(s.stamp);
  timing.calls.clear();
}

}  // namespace chorus
