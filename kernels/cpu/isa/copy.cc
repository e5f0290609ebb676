// Streaming copy (copy.h) of one instruction-set build: non-temporal stores of the widest vector
// the build has (16 bytes with baseline SSE2, 32 with AVX2, 64 with AVX-512), four per
// iteration, after a plain copy of the head that aligns the destination.
#include <cstdint>
#include <cstring>

#include "kernels/cpu/isa/entries.h"

#if defined(__SSE2__)
#include <immintrin.h>
#endif

namespace chorus::kernels::CHORUS_ISA_NS {
namespace {

#if CHORUS_ISA_LEVEL == 2
constexpr size_t kVec = 64;
void stream_block(char* d, const char* s) {
  for (int k = 0; k < 4; k++)
    _mm512_stream_si512(reinterpret_cast<__m512i*>(d + k * kVec), _mm512_loadu_si512(s + k * kVec));
}
#elif CHORUS_ISA_LEVEL == 1
constexpr size_t kVec = 32;
void stream_block(char* d, const char* s) {
  for (int k = 0; k < 4; k++)
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + k * kVec),
                        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + k * kVec)));
}
#elif defined(__SSE2__)
constexpr size_t kVec = 16;
void stream_block(char* d, const char* s) {
  for (int k = 0; k < 4; k++)
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + k * kVec),
                     _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + k * kVec)));
}
#else
constexpr size_t kVec = 0;  // no streaming stores (not x86): copy_streaming is a memcpy
void stream_block(char*, const char*) {}
#endif

}  // namespace

void copy_streaming(void* dst, const void* src, size_t bytes) {
  if constexpr (kVec == 0) {
    if (bytes) std::memcpy(dst, src, bytes);
  } else {
    constexpr size_t kBlock = 4 * kVec;
    auto* d = static_cast<char*>(dst);
    auto* s = static_cast<const char*>(src);
    size_t head = (kVec - (reinterpret_cast<uintptr_t>(d) & (kVec - 1))) & (kVec - 1);
    if (bytes < head + kBlock) {
      if (bytes) std::memcpy(dst, src, bytes);
      return;
    }
    std::memcpy(d, s, head);
    d += head, s += head, bytes -= head;
    size_t body = bytes & ~(kBlock - 1);
    for (size_t i = 0; i < body; i += kBlock) stream_block(d + i, s + i);
    std::memcpy(d + body, s + body, bytes - body);
#if defined(__SSE2__)
    _mm_sfence();
#endif
  }
}

}  // namespace chorus::kernels::CHORUS_ISA_NS
