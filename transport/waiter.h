// Waiter: where a channel's thread sleeps when none of its links can move, built from the
// wake-up sources the backends put into the channel's LinkSet (link.h, WakeSource).
//
// Sources with descriptors are polled together (with an event of the waiter's own, so wake()
// from another thread ends a poll); a doorbell is waited on directly. When both kinds are busy
// the poll lasts at most 1 ms, so the doorbell side is rechecked often.
// Threading: one thread at a time sleeps (the channel's); wake() may come from any thread.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "transport/transport.h"

namespace chorus::transport {

class Waiter {
 public:
  static Result<std::unique_ptr<Waiter>> create(const LinkSet& set);
  ~Waiter();
  Waiter(const Waiter&) = delete;
  Waiter& operator=(const Waiter&) = delete;

  // The sleeping side: arm() announces a sleeper to every doorbell; the caller then looks for
  // work once more and, if rung() is still false, calls sleep(); disarm() after either.
  void arm();
  bool rung() const;
  // Sleeps at most `ms` until a source in `busy` (the sources of links with pending requests)
  // may progress or wake() is called.
  void sleep(std::span<WakeSource* const> busy, int ms);
  void disarm();
  // Ends a sleep from any thread (an abort, a destroy).
  void wake();

 private:
  Waiter() = default;
  struct Bell {
    WakeSource* source;
    uint32_t seen;
  };
  std::vector<Bell> bells_;
  int epoll_fd_ = -1;
  int event_fd_ = -1;
};

}  // namespace chorus::transport
