// Worker output: splitting a byte stream into lines prefixed "[rank] ", and writing it out whole.
#pragma once

#include <cstddef>
#include <string>

namespace chorus::run {

// Turns the bytes of one worker stream into whole prefixed lines. Not thread-safe; one per stream.
// With an empty prefix lines pass through unchanged (still whole, so ranks never interleave
// mid-line). A line longer than max_line bytes (kMaxLine unless given) is cut after its first
// max_line bytes, the rest continuing on a new prefixed line, so memory stays bounded.
class LinePrefixer {
 public:
  static constexpr size_t kMaxLine = 1 << 20;

  explicit LinePrefixer(std::string prefix, size_t max_line = kMaxLine)
      : prefix_(std::move(prefix)), max_line_(max_line > 0 ? max_line : 1) {}

  // Appends to `out` every line completed by these bytes; keeps the rest for later.
  void feed(const char* data, size_t size, std::string& out);
  // End of stream: appends the pending partial line, if any (plus a newline when prefixing).
  void finish(std::string& out);

 private:
  std::string prefix_;
  size_t max_line_;
  std::string pending_;  // the current line's bytes so far: at most max_line_
};

// Writes all of `data` to `fd` (retrying short writes and EINTR; waiting out EAGAIN). Returns
// false once the reader is gone (EPIPE) or the fd fails; later calls then drop the data.
class OutputSink {
 public:
  explicit OutputSink(int fd) : fd_(fd) {}
  bool write(const std::string& data);

 private:
  int fd_;
  bool broken_ = false;
};

}  // namespace chorus::run
