// libFuzzer target: chorus-run's worker output splitter (tools/run/output.cc: LinePrefixer),
// which reads whatever bytes a worker program writes, in whatever pieces the pipe delivers.
//
// Input: byte 0 picks the prefix, byte 1 the line cap (1..64, so that cuts happen on small
// inputs), then pieces: a length byte and that many bytes, as successive reads. The output must
// equal what a plain reference computes from the whole stream at once.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "tools/run/output.h"

namespace {

// Every line of `stream` cut into pieces of at most `cap` bytes, each piece on its own prefixed
// line; a last line without a newline gets one only when there is a prefix.
std::string reference(const std::string& stream, const std::string& prefix, size_t cap) {
  std::string out;
  size_t start = 0;
  while (start < stream.size()) {
    size_t nl = stream.find('\n', start);
    bool ended = nl != std::string::npos;
    std::string line = stream.substr(start, (ended ? nl : stream.size()) - start);
    start = ended ? nl + 1 : stream.size();
    size_t at = 0;
    do {
      std::string piece = line.substr(at, cap);
      at += piece.size();
      bool last = at >= line.size();
      out += prefix + piece;
      if (!last || ended || !prefix.empty()) out += '\n';
    } while (at < line.size());
  }
  return out;
}

// Printable form of any bytes: "\n" and "\x00" escapes.
std::string shown(const std::string& bytes) {
  std::string out;
  for (unsigned char c : bytes) {
    char hex[8];
    std::snprintf(hex, sizeof hex, "\\x%02x", c);
    out += c == '\n' ? std::string("\\n") : c >= 32 && c < 127 ? std::string(1, c) : hex;
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  std::string prefix = in.ConsumeBool() ? "[12] " : "";
  size_t cap = in.ConsumeIntegralInRange<size_t>(1, 64);
  chorus::run::LinePrefixer splitter(prefix, cap);
  std::string stream, out;
  while (in.remaining_bytes() > 0) {
    std::string piece = in.ConsumeBytesAsString(in.ConsumeIntegral<uint8_t>());
    stream += piece;
    splitter.feed(piece.data(), piece.size(), out);
  }
  splitter.finish(out);
  std::string want = reference(stream, prefix, cap);
  if (out != want) {
    std::fprintf(
        stderr,
        "run_output: cap %zu, prefix '%s'\ninput:     '%s'\noutput:    '%s'\nreference: '%s'\n",
        cap, prefix.c_str(), shown(stream).c_str(), shown(out).c_str(), shown(want).c_str());
    std::abort();
  }
  return 0;
}
