// Whether another process of this host is gone. kill(pid, 0) alone says "alive" for a zombie:
// a process that has died but that its parent has not reaped yet (a launcher polls its children;
// a test harness too). Whoever cleans up after a dead peer (its /dev/shm names) must not take
// that moment for life, or the clean-up is skipped and the names stay.
#pragma once

namespace chorus {

// True when `pid` names no process, a dead one not yet reaped (state Z or X in /proc/PID/stat),
// or one whose main thread is exiting (PF_EXITING in its flags: a process killed, between its
// threads' first close of its sockets and its end). False for a live process, one of another
// user (EPERM), and pid <= 0. (A process whose main thread alone ended, by pthread_exit, reads
// as gone too.)
bool process_gone(int pid);

}  // namespace chorus
