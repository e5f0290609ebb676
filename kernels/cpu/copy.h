// Copies for large buffers that are not read again soon: non-temporal (streaming) stores skip
// the read-for-ownership of each destination line, so a copy costs two memory passes, not three.
#pragma once

#include <cstddef>

namespace chorus::kernels {

// dst <- src (no overlap). Ends with a store fence: the data is globally visible on return.
// Runs the active instruction-set build (isa.h): 16-, 32- or 64-byte streaming stores.
void copy_streaming(void* dst, const void* src, size_t bytes);
// The plain reference: memcpy.
void copy_ref(void* dst, const void* src, size_t bytes);

}  // namespace chorus::kernels
