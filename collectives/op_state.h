// What a communicator's rank is doing -- the operation it runs or last finished, since when --
// for its messages and for peers' timeout queries (CommImpl::state_text). Written only by the
// thread that runs the operation (the inline caller or the progress thread, one at a time: the
// communicator's gate, comm.h), without a lock: an 8-byte all-reduce takes about 0.2 us of the
// library's own time, and two lock pairs a call were a fifth of it. Read by any thread, as a
// sequence lock over atomics (a reader retries while a write is under way).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <thread>
#include <type_traits>

#include "collectives/op.h"

namespace chorus {

class OpState {
 public:
  struct Snapshot {
    bool busy = false;       // in `op`
    bool have_last = false;  // else idle: `op` is the last finished, at `done_at`
    OpDesc op;
    double since = 0;  // busy: when it first waited long (0: not yet)
    double done_at = 0;
  };

  // The writer's calls: begin and end by the thread that holds the gate, before and after the
  // operation (whose waits alone call waiting_since).
  void begin(const OpDesc& d, double since) {
    std::array<uint64_t, kWords> w{};
    std::memcpy(w.data(), &d, sizeof d);
    write([&] {
      for (size_t i = 0; i < kWords; ++i) op_[i].store(w[i], std::memory_order_relaxed);
      busy_.store(true, std::memory_order_relaxed);
      since_.store(since, std::memory_order_relaxed);
    });
  }
  // The operation's first long wait: when it began (once). Any of the operation's threads (its
  // parts on other channels wait too, at once): one takes the lock's turn, the rest return.
  void waiting_since(double t) {
    uint32_t s = seq_.load(std::memory_order_relaxed);
    if (s % 2 != 0 || !seq_.compare_exchange_strong(s, s + 1, std::memory_order_acquire,
                                                    std::memory_order_relaxed))
      return;
    std::atomic_thread_fence(std::memory_order_release);
    if (busy_.load(std::memory_order_relaxed) && since_.load(std::memory_order_relaxed) == 0)
      since_.store(t, std::memory_order_relaxed);
    seq_.store(s + 2, std::memory_order_release);
  }
  void end(double at) {
    write([&] {
      busy_.store(false, std::memory_order_relaxed);
      have_last_.store(true, std::memory_order_relaxed);
      done_at_.store(at, std::memory_order_relaxed);
    });
  }

  // Any thread.
  Snapshot read() const {
    Snapshot s;
    std::array<uint64_t, kWords> w{};
    for (int tries = 0;; ++tries) {
      if (tries > 64) std::this_thread::yield();  // the writer was preempted mid-write
      const uint32_t before = seq_.load(std::memory_order_acquire);
      for (size_t i = 0; i < kWords; ++i) w[i] = op_[i].load(std::memory_order_relaxed);
      s.busy = busy_.load(std::memory_order_relaxed);
      s.have_last = have_last_.load(std::memory_order_relaxed);
      s.since = since_.load(std::memory_order_relaxed);
      s.done_at = done_at_.load(std::memory_order_relaxed);
      std::atomic_thread_fence(std::memory_order_acquire);
      if (before % 2 == 0 && seq_.load(std::memory_order_relaxed) == before) break;
    }
    std::memcpy(static_cast<void*>(&s.op), w.data(), sizeof s.op);  // trivially copyable
    return s;
  }

 private:
  static_assert(std::is_trivially_copyable_v<OpDesc>);
  static constexpr size_t kWords = (sizeof(OpDesc) + 7) / 8;

  template <typename F>
  void write(F&& stores) {
    const uint32_t s = seq_.load(std::memory_order_relaxed);
    seq_.store(s + 1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
    stores();
    seq_.store(s + 2, std::memory_order_release);
  }

  std::atomic<uint32_t> seq_{0};
  std::array<std::atomic<uint64_t>, kWords> op_{};
  std::atomic<bool> busy_{false};
  std::atomic<bool> have_last_{false};
  std::atomic<double> since_{0};
  std::atomic<double> done_at_{0};
};

}  // namespace chorus
