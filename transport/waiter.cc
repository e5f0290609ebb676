// Waiter: epoll over the descriptor sources, futex doorbells through their sources (waiter.h).
#include "transport/waiter.h"

#include <errno.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>

namespace chorus::transport {

Result<std::unique_ptr<Waiter>> Waiter::create(const LinkSet& set) {
  std::unique_ptr<Waiter> w(new Waiter());
  w->event_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  w->epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  if (w->event_fd_ < 0 || w->epoll_fd_ < 0)
    return make_error(Code::kSystemError, "epoll/eventfd: {}", strerror(errno));
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = w->event_fd_;
  epoll_ctl(w->epoll_fd_, EPOLL_CTL_ADD, w->event_fd_, &ev);
  for (auto& src : set.wake_sources) {
    if (src->has_doorbell()) w->bells_.push_back({src.get(), 0});
    for (int fd : src->poll_fds()) {
      epoll_event e{};
      e.events = EPOLLIN | EPOLLOUT | EPOLLET | EPOLLRDHUP;
      e.data.fd = fd;
      epoll_ctl(w->epoll_fd_, EPOLL_CTL_ADD, fd, &e);
    }
  }
  return w;
}

Waiter::~Waiter() {
  if (epoll_fd_ >= 0) close(epoll_fd_);
  if (event_fd_ >= 0) close(event_fd_);
}

void Waiter::arm() {
  for (Bell& b : bells_) b.seen = b.source->arm();
}

bool Waiter::rung() const {
  for (const Bell& b : bells_)
    if (b.source->rung_since(b.seen)) return true;
  return false;
}

void Waiter::disarm() {
  for (Bell& b : bells_) b.source->disarm();
}

void Waiter::sleep(std::span<WakeSource* const> busy, int ms) {
  bool polled_busy = false, bell_busy = false;
  for (WakeSource* s : busy) {
    if (s->has_doorbell())
      bell_busy = true;
    else
      polled_busy = true;
  }
  if (polled_busy) {
    epoll_event evs[16];
    int n = epoll_wait(epoll_fd_, evs, 16, bell_busy ? std::min(ms, 1) : ms);
    for (int i = 0; i < n; ++i)
      if (evs[i].data.fd == event_fd_) {
        uint64_t v;
        (void)!read(event_fd_, &v, sizeof v);
      }
    return;
  }
  // A busy doorbell source, else the first (as good as any: wake() rings them all).
  const Bell* bell = bells_.empty() ? nullptr : &bells_[0];
  for (const Bell& b : bells_)
    if (std::find(busy.begin(), busy.end(), b.source) != busy.end()) bell = &b;
  if (bell) {
    bell->source->wait(bell->seen, ms);
    return;
  }
  usleep(1000);  // a one-rank communicator has nothing to wait for; not reached in practice
}

void Waiter::wake() {
  for (Bell& b : bells_) b.source->ring();
  uint64_t one = 1;
  (void)!write(event_fd_, &one, sizeof one);
}

}  // namespace chorus::transport
