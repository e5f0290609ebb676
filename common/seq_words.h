// SeqWords: a few 64-bit words that writers change one at a time and any thread reads without a
// lock -- a sequence lock over atomics (the counter is odd while a write is under way; a reader
// that saw it change or odd throws its copy away). The words are atomics, so a racing read is a
// torn copy to discard, never a data race (TSan agrees).
//
// Writers do not exclude each other: update calls must be serialized by their owner (a lock,
// or a single thread), and never run while a try_update does. try_update claims the counter by
// compare-and-swap and gives up when someone else holds it, for threads that only sometimes have
// something to add (several may race; one wins).
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <thread>

namespace chorus {

template <size_t N>
class SeqWords {
 public:
  using Words = std::array<uint64_t, N>;
  // What update's and try_update's f gets: the words themselves, each read or stored alone.
  class Writer {
   public:
    uint64_t get(size_t i) const { return words_[i].load(std::memory_order_relaxed); }
    void set(size_t i, uint64_t v) { words_[i].store(v, std::memory_order_relaxed); }

   private:
    friend class SeqWords;
    explicit Writer(std::array<std::atomic<uint64_t>, N>& w) : words_(w) {}
    std::array<std::atomic<uint64_t>, N>& words_;
  };

  // f(Writer&) reads and stores words; readers see all its stores or none.
  template <typename F>
  void update(F&& f) {
    const uint32_t s = seq_.load(std::memory_order_relaxed);
    seq_.store(s + 1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
    Writer w(words_);
    f(w);
    seq_.store(s + 2, std::memory_order_release);
  }
  // As update, unless another holds the words: then nothing, and false.
  template <typename F>
  bool try_update(F&& f) {
    uint32_t s = seq_.load(std::memory_order_relaxed);
    if (s % 2 != 0 || !seq_.compare_exchange_strong(s, s + 1, std::memory_order_acquire,
                                                    std::memory_order_relaxed))
      return false;
    std::atomic_thread_fence(std::memory_order_release);
    Writer w(words_);
    f(w);
    seq_.store(s + 2, std::memory_order_release);
    return true;
  }

  // A whole copy, or nothing while a write is under way.
  std::optional<Words> try_read() const {
    const uint32_t before = seq_.load(std::memory_order_acquire);
    Words w = load();
    std::atomic_thread_fence(std::memory_order_acquire);
    if (before % 2 != 0 || seq_.load(std::memory_order_relaxed) != before) return std::nullopt;
    return w;
  }
  // A whole copy: retries while a write is under way, yielding after a while (the writer may
  // have been preempted mid-write).
  Words read() const {
    for (int tries = 0;; ++tries) {
      if (tries > 64) std::this_thread::yield();
      if (std::optional<Words> w = try_read()) return *w;
    }
  }

 private:
  Words load() const {
    Words w;
    for (size_t i = 0; i < N; ++i) w[i] = words_[i].load(std::memory_order_relaxed);
    return w;
  }
  std::atomic<uint32_t> seq_{0};
  std::array<std::atomic<uint64_t>, N> words_{};
};

}  // namespace chorus
