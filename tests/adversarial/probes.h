// What the adversarial tests measure about a process (descriptors, threads, CPU time, listening
// sockets) and the raw TCP moves of an attacker (connect, send bytes, hold the connection).
#pragma once

#include <string>
#include <vector>

namespace chorus::test {

int open_fds();        // entries in /proc/self/fd
int live_threads();    // entries in /proc/self/task
double cpu_seconds();  // user + system time of this process
long rss_bytes();      // resident memory of this process
// Local addresses ("127.0.0.1:29500", "0.0.0.0:29500") of TCP sockets this process listens on.
std::vector<std::string> listening_addresses();
// A plain TCP connection to 127.0.0.1:port, or -1.
int raw_connect(int port);
// Connects, sends `bytes`, half-closes, reads until the peer closes (or 3 s); true if it connected.
bool send_and_close(int port, const std::string& bytes);
// Returns true once the peer has closed `fd` (read returns 0 or an error) within `seconds`.
bool closed_by_peer(int fd, double seconds);
// Reads until the peer closes or `seconds` pass; what arrived.
std::string read_all(int fd, double seconds);
double now_s();
// True when a rank's output holds a sanitizer's report (ranks end with _exit, so a report
// does not change their exit code).
bool sanitizer_report(const std::string& output);
// True in builds under ASan or TSan (address-space limits do not apply there).
bool sanitized_build();

}  // namespace chorus::test
