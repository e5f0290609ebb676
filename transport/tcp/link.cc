// TCP link with striping over several sockets.
#include "transport/tcp/link.h"

#include <sys/socket.h>

#include <algorithm>

namespace chorus::transport {

TcpLink::TcpLink(int peer, std::string peer_name, std::vector<Fd> socks, size_t stripe,
                 TcpWake* wake, Fd control)
    : Link(peer, std::move(peer_name), wake),
      socks_(std::move(socks)),
      control_(std::move(control)),
      stripe_(stripe) {
  for (auto& f : socks_) wake->add(f.get());
  if (control_.valid()) wake->add(control_.get());  // a revoke wakes a sleeping peer
  for (Stream* st : {&send_, &recv_}) {
    st->pos.resize(socks_.size());
    for (size_t s = 0; s < socks_.size(); ++s) st->pos[s] = s * stripe_;
  }
  send_.queue = &sends_;
  recv_.queue = &recvs_;
}

// Completes the requests that lie wholly below the lowest unmoved byte of every socket.
void TcpLink::account(Stream& st, bool sending) {
  uint64_t done = *std::min_element(st.pos.begin(), st.pos.end());
  while (!st.queue->empty() &&
         st.queue_start + st.queue->front().n <= std::min(done, st.posted_end)) {
    st.queue_start += st.queue->front().n;
    sending ? complete_send() : complete_recv();
  }
}

Result<bool> TcpLink::progress_stream(Stream& st, bool sending) {
  bool moved = false;
  const size_t ns = socks_.size();
  for (size_t s = 0; s < ns; ++s) {
    while (st.pos[s] < st.posted_end) {
      // Find the request holding byte pos[s].
      uint64_t off = st.queue_start;
      auto it = st.queue->begin();
      while (it != st.queue->end() && off + it->n <= st.pos[s]) off += (it++)->n;
      if (it == st.queue->end()) break;
      uint64_t stripe_end = (st.pos[s] / stripe_ + 1) * stripe_;
      uint64_t end = std::min({stripe_end, off + it->n, st.posted_end});
      char* p = it->buf + (st.pos[s] - off);
      size_t want = end - st.pos[s];
      auto r = sending ? send_some(socks_[s].get(), p, want, peer_name())
                       : recv_some(socks_[s].get(), p, want, peer_name());
      CHORUS_TRY(r);
      if (*r == 0) break;
      moved = true;
      st.pos[s] += *r;
      if (st.pos[s] == stripe_end) st.pos[s] += (ns - 1) * stripe_;
    }
  }
  account(st, sending);
  return moved;
}

Result<bool> TcpLink::progress() {
  // Newly posted requests extend the stream.
  for (; seen_send_posted_ < sends_posted_; ++seen_send_posted_)
    send_.posted_end += sends_[sends_.size() - (sends_posted_ - seen_send_posted_)].n;
  for (; seen_recv_posted_ < recvs_posted_; ++seen_recv_posted_)
    recv_.posted_end += recvs_[recvs_.size() - (recvs_posted_ - seen_recv_posted_)].n;
  CHORUS_ASSIGN_OR_RETURN(bool a, progress_stream(send_, true));
  CHORUS_ASSIGN_OR_RETURN(bool b, progress_stream(recv_, false));
  return a || b;
}

Status TcpLink::check_alive() {
  if (!revoked_ && !control_closed_ && control_.valid()) {
    char b = 0;
    ssize_t r = recv(control_.get(), &b, 1, MSG_DONTWAIT);
    if (r == 1) revoked_ = true;
    // End of file: the peer closed its side (exit, or destroy after its last call, whose bytes may
    // still be on their way in the data sockets): no error here, the data sockets tell.
    if (r == 0) control_closed_ = true;
  }
  if (revoked_)
    return make_error(Code::kRevoked,
                      "rank {} revoked the communicator (news over the tcp control socket to {})",
                      peer(), peer_name());
  return Status::ok();
}

void TcpLink::signal_revoke() {
  if (!control_.valid()) return;
  const char b = 'R';
  (void)!send(control_.get(), &b, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
}

}  // namespace chorus::transport
