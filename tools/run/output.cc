// Line prefixing and whole writes of worker output.
#include "tools/run/output.h"

#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace chorus::run {

void LinePrefixer::feed(const char* data, size_t size, std::string& out) {
  size_t start = 0;
  while (start < size) {
    const void* hit = std::memchr(data + start, '\n', size - start);
    if (!hit) {
      pending_.append(data + start, size - start);
      if (pending_.size() >= kMaxLine) {
        out += prefix_;
        out += pending_;
        out += '\n';
        pending_.clear();
      }
      return;
    }
    size_t end = static_cast<size_t>(static_cast<const char*>(hit) - data) + 1;
    out += prefix_;
    if (!pending_.empty()) {
      out += pending_;
      pending_.clear();
    }
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
