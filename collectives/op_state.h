// What a communicator's rank is doing -- the operation it runs or last finished, since when --
// for its messages and for peers' timeout queries (CommImpl::state_text). Written only by the
// thread that runs the operation (the inline caller or the progress thread, one at a time: the
// communicator's gate, comm.h), without a lock: an 8-byte all-reduce takes about 0.2 us of the
// library's own time, and two lock pairs a call were a fifth of it. Read by any thread
// (SeqWords, common/seq_words.h).
#pragma once

#include <array>
#include <bit>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "collectives/op.h"
#include "common/seq_words.h"

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
    std::array<uint64_t, kOpWords> op{};
    std::memcpy(op.data(), &d, sizeof d);
    words_.update([&](Writer& w) {
      for (size_t i = 0; i < kOpWords; ++i) w.set(i, op[i]);
      w.set(kFlags, w.get(kFlags) | kBusy);
      w.set(kSince, std::bit_cast<uint64_t>(since));
    });
  }
  // The operation's first long wait: when it began (once). Any of the operation's threads (its
  // parts on other channels wait too, at once): one takes the lock's turn, the rest return.
  void waiting_since(double t) {
    (void)words_.try_update([&](Writer& w) {
      if ((w.get(kFlags) & kBusy) != 0 && w.get(kSince) == std::bit_cast<uint64_t>(0.0))
        w.set(kSince, std::bit_cast<uint64_t>(t));
    });
  }
  void end(double at) {
    words_.update([&](Writer& w) {
      w.set(kFlags, kHaveLast);
      w.set(kDoneAt, std::bit_cast<uint64_t>(at));
    });
  }

  // Any thread.
  Snapshot read() const {
    const Words w = words_.read();
    Snapshot s;
    std::memcpy(static_cast<void*>(&s.op), w.data(), sizeof s.op);  // trivially copyable
    s.busy = (w[kFlags] & kBusy) != 0;
    s.have_last = (w[kFlags] & kHaveLast) != 0;
    s.since = std::bit_cast<double>(w[kSince]);
    s.done_at = std::bit_cast<double>(w[kDoneAt]);
    return s;
  }

 private:
  static_assert(std::is_trivially_copyable_v<OpDesc>);
  static constexpr size_t kOpWords = (sizeof(OpDesc) + 7) / 8;
  static constexpr size_t kFlags = kOpWords, kSince = kOpWords + 1, kDoneAt = kOpWords + 2;
  static constexpr uint64_t kBusy = 1, kHaveLast = 2;
  using Words = SeqWords<kOpWords + 3>::Words;
  using Writer = SeqWords<kOpWords + 3>::Writer;

  SeqWords<kOpWords + 3> words_;
};

}  // namespace chorus
