// A process-wide cache of f32 buffers keyed by exact size: the training loop asks for the same
// sizes every step, so after the first step no op touches malloc. Thread-safe.
#pragma once

#include <cstddef>

namespace chorus {

float* buffer_cache_get(size_t count);             // 64-byte aligned, uninitialised
void buffer_cache_put(float* data, size_t count);  // returns it for reuse
void buffer_cache_release();                       // frees every idle buffer

}  // namespace chorus
