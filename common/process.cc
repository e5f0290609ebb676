#include "common/process.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "common/clock.h"

namespace chorus {

bool process_gone(int pid) {
  if (pid <= 0) return false;
  if (kill(pid, 0) != 0) return errno == ESRCH;
  // "PID (COMM) STATE ...": COMM may hold spaces and parentheses, the state follows the last ')'.
  char path[32], buf[512];
  std::snprintf(path, sizeof path, "/proc/%d/stat", pid);
  const int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT;  // reaped since
  const ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return false;
  buf[n] = '\0';
  const char* end = std::strrchr(buf, ')');
  if (end == nullptr || end[1] != ' ') return false;
  if (end[2] == 'Z' || end[2] == 'X') return true;
  // Dying: the flags word (the 9th field, 6 after the state) has PF_EXITING, set as its exit
  // begins. A process killed closes its sockets partway through its exit, and the rest of it
  // (longer when a busy machine preempts it there) comes before it is a zombie.
  unsigned long flags = 0;
  if (std::sscanf(end + 2, "%*c %*d %*d %*d %*d %*d %lu", &flags) != 1) return false;
  constexpr unsigned long kPfExiting = 0x4;  // include/linux/sched.h
  return (flags & kPfExiting) != 0;
}

bool PeerProcess::gone() {
  if (pid_ <= 0) return false;
  if (kill(pid_, 0) != 0 && errno == ESRCH) return true;
  const double now = now_seconds();
  if (now < next_look_.load(std::memory_order_relaxed)) return false;
  next_look_.store(now + 0.1, std::memory_order_relaxed);
  return process_gone(pid_);
}

}  // namespace chorus
