// Whether another process of this host is gone. kill(pid, 0) alone says "alive" for a zombie:
// a process that has died but that its parent has not reaped yet (a launcher polls its children;
// a test harness too). Whoever cleans up after a dead peer (its /dev/shm names) must not take
// that moment for life, or the clean-up is skipped and the names stay.
#pragma once

#include <atomic>

namespace chorus {

// True when `pid` names no process, a dead one not yet reaped (state Z or X in /proc/PID/stat),
// or one whose main thread is exiting (PF_EXITING in its flags: a process killed, between its
// threads' first close of its sockets and its end). False for a live process, one of another
// user (EPERM), and pid <= 0. (A process whose main thread alone ended, by pthread_exit, reads
// as gone too.)
bool process_gone(int pid);

// A peer process, for waits that ask whether it is gone before every sleep: kill(pid, 0) each
// time (a reaped process), and the whole of process_gone (a zombie, one exiting) at most every
// 100 ms, as that reads /proc. Copies take the pid and the time of the last full look.
class PeerProcess {
 public:
  PeerProcess() = default;
  explicit PeerProcess(int pid) : pid_(pid) {}
  PeerProcess(const PeerProcess& o) : pid_(o.pid_), next_look_(o.next_look_.load()) {}
  PeerProcess& operator=(const PeerProcess& o) {
    pid_ = o.pid_;
    next_look_ = o.next_look_.load();
    return *this;
  }
  int pid() const { return pid_; }
  bool gone();

 private:
  int pid_ = 0;
  std::atomic<double> next_look_{0};  // now_seconds() of the next full look
};

}  // namespace chorus
