// Streaming copy (see copy.h).
#include "kernels/cpu/copy.h"

#include <cstdint>
#include <cstring>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace chorus::kernels {

void copy_ref(void* dst, const void* src, size_t bytes) {
  if (bytes) std::memcpy(dst, src, bytes);
}

void copy_streaming(void* dst, const void* src, size_t bytes) {
#if defined(__AVX512F__)
  auto* d = static_cast<char*>(dst);
  auto* s = static_cast<const char*>(src);
  size_t head = (64 - (reinterpret_cast<uintptr_t>(d) & 63)) & 63;
  if (bytes < head + 256) return copy_ref(dst, src, bytes);
  std::memcpy(d, s, head);
  d += head, s += head, bytes -= head;
  size_t body = bytes & ~size_t{255};
  for (size_t i = 0; i < body; i += 256) {
    __m512i a = _mm512_loadu_si512(s + i), b = _mm512_loadu_si512(s + i + 64);
    __m512i c = _mm512_loadu_si512(s + i + 128), e = _mm512_loadu_si512(s + i + 192);
    _mm512_stream_si512(reinterpret_cast<__m512i*>(d + i), a);
    _mm512_stream_si512(reinterpret_cast<__m512i*>(d + i + 64), b);
    _mm512_stream_si512(reinterpret_cast<__m512i*>(d + i + 128), c);
    _mm512_stream_si512(reinterpret_cast<__m512i*>(d + i + 192), e);
  }
  std::memcpy(d + body, s + body, bytes - body);
  _mm_sfence();
#else
  copy_ref(dst, src, bytes);
#endif
}

}  // namespace chorus::kernels
