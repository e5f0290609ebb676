// The engine's test hooks reach the points they are meant to stir (collectives/engine.cc), and the
// communicator's gate and state (comm.h, op_state.h) hold under calls from several threads.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <thread>
#include <vector>

#include "chorus/chorus.hpp"
#include "collectives/c_api_internal.h"
#include "collectives/comm.h"
#include "collectives/op_state.h"
#include "common/seq_words.h"
#include "harness.h"

using chorus::test::run_ranks;
using chorus::test::RunOptions;

// An 8-byte all-reduce of two ranks over direct slots is an eager exchange: a slot to write, the
// peer's message to read, then no link busy. Each of the three is a wait that CHORUS_TEST_JITTER_US
// may delay, also where a first look finds it over (a free slot, the message already in), which
// the eager path otherwise skips without setting up a wait.
TEST_CASE("CHORUS_TEST_JITTER_US draws at every wait of an 8-byte all-reduce", "[jitter]") {
  constexpr int kCalls = 200;
  for (const char* transport : {"shm", "tcp"}) {
    RunOptions o;
    o.env["CHORUS_TRANSPORT"] = transport;
    o.env["CHORUS_TEST_JITTER_US"] = "1";
    auto res = run_ranks(
        2,
        [](int rank) {
          auto comm = chorus::Communicator::from_env();
          chorusComm_t h = comm.handle();
          chorus::Result<chorus::CommImpl*> impl = chorus::capi::live(h, "test");
          if (!impl.is_ok()) return 2;
          const uint64_t before = (*impl)->jitter_points_for_test();
          for (int i = 0; i < kCalls; ++i) {
            double x = rank + 1;
            chorus::check(chorusAllReduce(&x, &x, 1, chorusFloat64, chorusSum, h, nullptr));
            if (x != 3.0) return 3;
          }
          const uint64_t points = (*impl)->jitter_points_for_test() - before;
          std::printf("rank %d: %llu jitter points in %d calls\n", rank,
                      static_cast<unsigned long long>(points), kCalls);
          return points >= 3u * kCalls ? 0 : 4;
        },
        o);
    for (int r = 0; r < 2; ++r) {
      INFO(transport << ", rank " << r << ":\n" << res[r].output);
      CHECK(res[r].exit_code == 0);
    }
  }
}

// The gate (comm.h): an operation runs on the caller's thread only when none runs and none is
// queued. Nonblocking all-reduces go to the progress thread; each blocking one right after them
// must wait its turn behind them (same order on every rank), the next nonblocking ones behind
// it. Rank 1's waits jitter, so that either side of the hand-off is late at times.
TEST_CASE("blocking calls between nonblocking ones keep their order", "[gate]") {
  RunOptions o;
  o.env["CHORUS_TRANSPORT"] = "shm";
  auto res = run_ranks(
      2,
      [](int rank) {
        if (rank == 1) setenv("CHORUS_TEST_JITTER_US", "20", 1);
        auto comm = chorus::Communicator::from_env();
        chorusComm_t h = comm.handle();
        for (int round = 0; round < 300; ++round) {
          double a[3] = {1.0 * rank + round, 10.0 * rank, 100.0 + rank};
          chorusRequest_t req[2];
          chorus::check(chorusIallReduce(&a[0], &a[0], 1, chorusFloat64, chorusSum, h, &req[0]));
          chorus::check(chorusIallReduce(&a[1], &a[1], 1, chorusFloat64, chorusMax, h, &req[1]));
          chorus::check(chorusAllReduce(&a[2], &a[2], 1, chorusFloat64, chorusMin, h, nullptr));
          for (chorusRequest_t r : req) {
            chorus::check(chorusWait(r, -1));
            chorus::check(chorusRequestFree(r));
          }
          if (a[0] != 1.0 + 2.0 * round || a[1] != 10.0 || a[2] != 100.0) {
            std::printf("round %d: %g %g %g\n", round, a[0], a[1], a[2]);
            return 3;
          }
        }
        return 0;
      },
      o);
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r << ":\n" << res[r].output);
    CHECK(res[r].exit_code == 0);
  }
}

// What a rank is doing (OpState, op_state.h) is written without a lock by the thread that runs
// the operation and read by any (the watch thread answering a peer's timeout query): a reader
// never sees parts of two operations.
TEST_CASE("a rank's state reads whole while it changes", "[gate]") {
  chorus::OpState state;
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    for (uint64_t i = 1; !stop.load(); ++i) {
      chorus::OpDesc d;
      d.seq = d.count = i;
      d.root = d.peer = d.tag = static_cast<int>(i);
      d.piece = static_cast<uint32_t>(i);
      state.begin(d, static_cast<double>(i));
      state.waiting_since(1.0);  // since is set already: no change
      state.end(static_cast<double>(i));
    }
  });
  int torn = 0, seen = 0;
  uint64_t last = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
  for (int reads = 0; reads < 3000000 && std::chrono::steady_clock::now() < until; ++reads) {
    chorus::OpState::Snapshot s = state.read();
    const uint64_t i = s.op.seq;
    if (i == 0) continue;
    seen += i != last;
    last = i;
    if (s.op.count != i || s.op.root != int(i) || s.op.peer != int(i) || s.op.tag != int(i) ||
        s.op.piece != uint32_t(i) || (s.busy && s.since != double(i)) ||
        (!s.busy && (!s.have_last || s.done_at != double(i))))
      ++torn;
  }
  stop = true;
  writer.join();
  INFO(seen << " states seen");
  CHECK(torn == 0);
  // waiting_since: once, and only while busy.
  chorus::OpState one;
  one.waiting_since(5.0);
  CHECK(one.read().since == 0);
  one.begin(chorus::OpDesc{}, 0);
  one.waiting_since(7.0);
  one.waiting_since(9.0);
  CHECK(one.read().since == 7.0);
  CHECK(one.read().busy);
  one.end(3.0);
  CHECK(!one.read().busy);
  CHECK(one.read().done_at == 3.0);
}

// try_update (SeqWords, common/seq_words.h) lets one of several racing threads change the words
// and turns the rest away: an update that thinks it won never overlaps another, so no increment
// is lost. (Reads meanwhile are few: the racers hold the words nearly all the time. Torn reads
// are the test above's.) Without the compare-and-swap, two racers win at once and one's
// increment is lost within the 300 ms.
TEST_CASE("racing try_updates: the winners' changes all land, whole", "[gate]") {
  chorus::SeqWords<2> words;
  std::atomic<bool> stop{false};
  std::atomic<long> won{0}, lost{0};
  std::vector<std::thread> racers;
  for (int t = 0; t < 4; ++t)
    racers.emplace_back([&] {
      while (!stop.load(std::memory_order_relaxed)) {
        const bool ok = words.try_update([](chorus::SeqWords<2>::Writer& w) {
          w.set(0, w.get(0) + 1);
          std::this_thread::yield();  // widen the window another racer could slip into
          w.set(1, w.get(1) + 1);
        });
        (ok ? won : lost).fetch_add(1, std::memory_order_relaxed);
      }
    });
  long torn = 0, reads = 0, busy = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
  while (std::chrono::steady_clock::now() < until || lost.load() == 0) {
    if (const auto w = words.try_read()) {
      torn += (*w)[0] != (*w)[1];
      ++reads;
    } else {
      ++busy;
    }
  }
  stop = true;
  for (std::thread& t : racers) t.join();
  const auto w = words.read();
  INFO(won.load() << " won, " << lost.load() << " turned away; " << reads << " reads, " << busy
                  << " met a write");
  CHECK(torn == 0);
  CHECK(w[0] == static_cast<uint64_t>(won.load()));
  CHECK(w[1] == w[0]);
  CHECK(lost.load() > 0);
  CHECK_FALSE(words.try_read() == std::nullopt);  // no write under way: a copy
}
