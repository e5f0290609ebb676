// Acceptor: many handshakes on one thread (see acceptor.h).
#include "transport/acceptor.h"

#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>

#include "common/log.h"

namespace chorus::transport {

struct Acceptor::Pending {
  Fd fd;
  std::string peer;
  double started = 0;
  std::unique_ptr<ServerHandshake> hs;
  std::string out;  // bytes still to send
};

namespace {

int default_max_pending() {
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return 128;
  return static_cast<int>(std::clamp<rlim_t>(rl.rlim_cur / 4, 4, 128));
}

}  // namespace

Acceptor::Acceptor(int listen_fd, const Secret& secret, AcceptorOptions opt)
    : listen_fd_(listen_fd), secret_(secret), opt_(std::move(opt)) {
  if (opt_.max_pending <= 0) opt_.max_pending = default_max_pending();
  window_start_ = now_seconds();
}

Acceptor::~Acceptor() {
  flush_log(true);
}

void Acceptor::note_refusal(const std::string& line) {
  ++refused_;
  flush_log(false);
  if (logged_in_window_ < kLoggedPerWindow) {
    ++logged_in_window_;
    log_warn("{}: {}", opt_.what, line);
  } else {
    ++unlogged_in_window_;
  }
}

void Acceptor::flush_log(bool force) {
  double now = now_seconds();
  if (!force && now - window_start_ < 10.0) return;
  if (unlogged_in_window_ > 0)
    log_warn("{}: refused {} more connections in the last {:.0f} s (not logged one by one)",
             opt_.what, unlogged_in_window_, now - window_start_);
  window_start_ = now;
  logged_in_window_ = 0;
  unlogged_in_window_ = 0;
}

void Acceptor::refuse(Pending& p, const std::string& why) {
  note_refusal(fmt::format("refused connection from {}: {}", p.peer, why));
  // Best effort: the refusal (if any) goes out now or never; the descriptor closes at once.
  std::string out = p.out + (p.hs ? p.hs->take_output() : std::string());
  if (!out.empty()) (void)!::send(p.fd.get(), out.data(), out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  p.fd.reset();
}

void Acceptor::drop_oldest(const char* why) {
  if (pending_.empty()) return;
  auto& p = *pending_.front();
  refuse(p, fmt::format("incomplete handshake after {:.1f} s ({} bytes received); dropped {}",
                        now_seconds() - p.started, p.hs->received(), why));
  pending_.pop_front();
}

void Acceptor::accept_new() {
  for (int i = 0; i < 64; ++i) {
    if (static_cast<int>(pending_.size()) >= opt_.max_pending) {
      if (now_seconds() - pending_.front()->started < kEvictSeconds)
        return;  // the rest wait in the backlog
      drop_oldest("to make room for new connections");
    }
    SockAddr peer;
    int e = 0;
    auto fd = tcp_accept_now(listen_fd_, &peer, &e);
    if (!fd.is_ok()) {
      if (e == EAGAIN || e == EWOULDBLOCK || e == EINTR) return;  // nothing more waiting
      ++accept_errors_;
      if (e == EMFILE || e == ENFILE || e == ENOBUFS || e == ENOMEM) {
        backoff_s_ = backoff_s_ == 0 ? 0.05 : std::min(backoff_s_ * 2, 1.0);
        backoff_until_ = now_seconds() + backoff_s_;
        note_refusal(fmt::format(
            "cannot accept: {} (out of descriptors or memory); pausing accepts for {:.2f} s",
            strerror(e), backoff_s_));
        drop_oldest("to free a descriptor");
      }
      return;
    }
    backoff_s_ = 0;
    auto p = std::make_unique<Pending>();
    p->fd = std::move(fd.value());
    p->peer = peer.to_string();
    p->started = now_seconds();
    Nonce nonce{};
    if (!random_bytes(nonce.data(), nonce.size()).is_ok()) {
      refuse(*p, "no random bytes for a nonce");
      continue;
    }
    p->hs = std::make_unique<ServerHandshake>(secret_, opt_.allowed_kinds, nonce);
    pending_.push_back(std::move(p));
  }
}

bool Acceptor::advance(Pending& p, short revents) {
  if (revents & POLLIN) {
    char buf[sizeof(Hello)];
    size_t want = std::min(p.hs->want(), sizeof buf);
    ssize_t n = ::recv(p.fd.get(), buf, want, 0);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
      refuse(p, fmt::format("incomplete handshake (connection closed after {} bytes)",
                            p.hs->received()));
      return false;
    }
    if (n > 0) p.hs->feed(buf, static_cast<size_t>(n));
  } else if (revents & (POLLERR | POLLHUP)) {
    refuse(p,
           fmt::format("incomplete handshake (connection reset after {} bytes)", p.hs->received()));
    return false;
  }
  if (p.hs->state() == ServerHandshake::State::kFailed) {
    refuse(p, p.hs->error().message());
    return false;
  }
  p.out += p.hs->take_output();
  while (!p.out.empty()) {
    ssize_t n = ::send(p.fd.get(), p.out.data(), p.out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n <= 0) {
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) break;
      refuse(p, fmt::format("send failed during the handshake: {}", strerror(errno)));
      return false;
    }
    p.out.erase(0, static_cast<size_t>(n));
  }
  if (p.hs->state() == ServerHandshake::State::kAuthenticated && p.out.empty()) {
    done_.push_back({std::move(p.fd), p.hs->hello(), p.peer});
    return false;
  }
  return true;
}

std::vector<Accepted> Acceptor::poll(int ms) {
  const double now = now_seconds();
  const bool backing_off = now < backoff_until_;
  // Full of young handshakes: leave new connections in the kernel's backlog until one ends
  // or the oldest may be dropped.
  const bool full = static_cast<int>(pending_.size()) >= opt_.max_pending;
  const double full_until = full ? pending_.front()->started + kEvictSeconds : 0;
  const bool listen = !backing_off && !(full && now < full_until);
  std::vector<pollfd> fds;
  fds.reserve(pending_.size() + 1);
  fds.push_back({listen ? listen_fd_ : -1, POLLIN, 0});
  for (auto& p : pending_)
    fds.push_back({p->fd.get(), static_cast<short>(p->out.empty() ? POLLIN : POLLOUT), 0});
  int wait_ms = ms;
  if (backing_off) wait_ms = std::min(wait_ms, static_cast<int>((backoff_until_ - now) * 1000) + 1);
  if (full && now < full_until)
    wait_ms = std::min(wait_ms, static_cast<int>((full_until - now) * 1000) + 1);
  if (!pending_.empty()) {
    double first_expiry = pending_.front()->started + opt_.handshake_seconds - now;
    wait_ms = std::clamp(static_cast<int>(first_expiry * 1000) + 1, 0, wait_ms);
  }
  int rc = ::poll(fds.data(), fds.size(), wait_ms);
  if (rc < 0 && errno != EINTR) usleep(1000);  // poll itself failed (ENOMEM): do not spin
  // Advance the handshakes first (their indices match fds), then accept.
  std::deque<std::unique_ptr<Pending>> keep;
  for (size_t i = 0; i < pending_.size(); ++i) {
    Pending& p = *pending_[i];
    short rev = rc > 0 ? fds[i + 1].revents : 0;
    bool alive = rev ? advance(p, rev) : true;
    if (alive && now_seconds() - p.started > opt_.handshake_seconds) {
      refuse(p, fmt::format("incomplete handshake ({} bytes in {:.0f} s)", p.hs->received(),
                            opt_.handshake_seconds));
      alive = false;
    }
    if (alive) keep.push_back(std::move(pending_[i]));
  }
  pending_.swap(keep);
  if (rc > 0 && (fds[0].revents & POLLIN)) accept_new();
  flush_log(false);
  return std::exchange(done_, {});
}

}  // namespace chorus::transport
