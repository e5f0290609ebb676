// Line prefixing and whole writes of worker output.
#include "tools/run/output.h"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace chorus::run {

void LinePrefixer::feed(const char* data, size_t size, std::string& out) {
  size_t start = 0;
  while (start < size) {
    if (pending_.size() == max_line_ && data[start] != '\n') {
      out += prefix_;  // a full line goes on: cut it here
      out += pending_;
      out += '\n';
      pending_.clear();
    }
    // The line may take `room` more bytes, plus the newline that ends it.
    size_t room = max_line_ - pending_.size();
    size_t left = size - start;
    const void* hit = std::memchr(data + start, '\n', std::min(left, room + 1));
    if (!hit) {
      size_t take = std::min(left, room);
      pending_.append(data + start, take);
      start += take;
      continue;
    }
    size_t end = static_cast<size_t>(static_cast<const char*>(hit) - data) + 1;
    out += prefix_;
    out += pending_;
    pending_.clear();
    out.append(data + start, end - start);
    start = end;
  }
}

void LinePrefixer::finish(std::string& out) {
  if (pending_.empty()) return;
  out += prefix_;
  out += pending_;
  if (!prefix_.empty()) out += '\n';
  pending_.clear();
}

bool OutputSink::write(const std::string& data) {
  size_t done = 0;
  while (!broken_ && done < data.size()) {
    ssize_t n = ::write(fd_, data.data() + done, data.size() - done);
    if (n > 0) {
      done += static_cast<size_t>(n);
    } else if (n < 0 && errno == EAGAIN) {
      pollfd p{fd_, POLLOUT, 0};
      poll(&p, 1, 1000);
    } else if (!(n < 0 && errno == EINTR)) {
      broken_ = true;
    }
  }
  return !broken_;
}

}  // namespace chorus::run
