// Monotonic time and deadlines: every blocking wait in chorus takes a Deadline.
#pragma once

#include <chrono>
#include <cstdint>
#include <ctime>

namespace chorus {

using Clock = std::chrono::steady_clock;

inline double now_seconds() {
  return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
}

// The same clock (CLOCK_MONOTONIC, as steady_clock on Linux) to the kernel's last tick, a few
// milliseconds behind at most: for stamps taken on every operation that only messages read ("last
// finished 2.3 s ago"). A precise read costs ~25 ns on a VM's kvm-clock, a tenth of an 8-byte
// operation's host time; this one ~4 ns.
inline double coarse_now_seconds() {
  timespec t{};
  clock_gettime(CLOCK_MONOTONIC_COARSE, &t);
  return double(t.tv_sec) + double(t.tv_nsec) * 1e-9;
}

class Deadline {
 public:
  static Deadline after_seconds(double s) { return Deadline(now_seconds() + s, s); }
  static Deadline never() { return Deadline(1e300, 1e300); }
  bool expired() const { return now_seconds() >= at_; }
  double remaining() const {
    double r = at_ - now_seconds();
    return r > 0 ? r : 0;
  }
  // Milliseconds to wait, clamped to [0, cap_ms]; for poll/epoll/futex slices.
  int slice_ms(int cap_ms) const {
    double r = remaining() * 1000.0;
    return r < cap_ms ? static_cast<int>(r + 0.999) : cap_ms;
  }
  double total() const { return total_; }
  double elapsed() const { return total_ - (at_ - now_seconds()); }

 private:
  Deadline(double at, double total) : at_(at), total_(total) {}
  double at_;
  double total_;
};

}  // namespace chorus
