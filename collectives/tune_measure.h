// Ring or direct for large all-reduces over shared memory: measured once per communicator
// (design at the top of tune_measure.cc).
#pragma once

#include "chorus/chorus.h"

namespace chorus {
class CommImpl;
}

namespace chorus::capi {

// Before an all-reduce of `bytes` is described: when it is the communicator's first that takes
// the measured choice (tuner.h, takes_large_in_place), measures ring and direct on scratch
// buffers and records the faster. Every rank reaches it at the same call and decides the same.
chorusResult_t measure_large_in_place(chorusComm_t h, CommImpl& comm, size_t bytes);

}  // namespace chorus::capi
