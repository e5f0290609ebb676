// Acceptor: takes connections off a listening socket and runs their handshakes side by side on
// the calling thread, so that a connection that fails its handshake costs nothing.
//
// A connection holds one descriptor and no thread until it has proved it knows the job secret.
// Each handshake has kHandshakeSeconds in all (a slow talker cannot stretch it); at most
// `max_pending` are in flight, and when that many wait, the oldest one that has waited over
// kEvictSeconds is dropped to make room (real ranks answer within milliseconds, and their dial()
// retries). When accept fails for lack of descriptors (EMFILE, ENFILE) the acceptor drops its
// oldest pending handshake and backs off instead of spinning. Refusals are logged, at most
// kLoggedPerWindow per 10 s, then one line with the count.
//
// Threading: one thread drives an Acceptor.
#pragma once

#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "common/socket.h"
#include "transport/wire.h"

namespace chorus::transport {

struct AcceptorOptions {
  unsigned allowed_kinds = 0;
  int max_pending = 0;  // 0: a quarter of RLIMIT_NOFILE, within 4..128
  double handshake_seconds = kHandshakeSeconds;
  std::string what;  // who listens, for log lines: "bootstrap", "tcp (links of rank 2)"
  std::string host;  // this end's host identity, sent with the challenge
};

struct Accepted {
  Fd fd;
  Hello hello;
  std::string peer;  // "10.0.0.4:51234"
};

class Acceptor {
 public:
  static constexpr double kEvictSeconds = 0.5;
  static constexpr int kLoggedPerWindow = 10;

  Acceptor(int listen_fd, const Secret& secret, AcceptorOptions opt);
  ~Acceptor();
  // Waits at most `ms` for something to happen, then returns the connections whose handshake
  // just succeeded (their verdict is the caller's to send).
  std::vector<Accepted> poll(int ms);
  size_t pending() const { return pending_.size(); }
  int max_pending() const { return opt_.max_pending; }
  // Counters, for tests and logs.
  uint64_t refused() const { return refused_; }
  uint64_t accept_errors() const { return accept_errors_; }

 private:
  struct Pending;
  void accept_new();
  void drop_oldest(const char* why);
  bool advance(Pending& p, short revents);  // false: finished (failed or authenticated)
  void refuse(Pending& p, const std::string& why);
  void note_refusal(const std::string& line);
  void flush_log(bool force);

  int listen_fd_;
  Secret secret_;
  AcceptorOptions opt_;
  std::deque<std::unique_ptr<Pending>> pending_;
  std::vector<Accepted> done_;
  double backoff_until_ = 0;
  double backoff_s_ = 0;
  uint64_t refused_ = 0;
  uint64_t accept_errors_ = 0;
  double window_start_ = 0;
  int logged_in_window_ = 0;
  int unlogged_in_window_ = 0;
};

}  // namespace chorus::transport
