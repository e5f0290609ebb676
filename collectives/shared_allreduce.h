// The blocking all-reduce of chorusMemAlloc buffers on one host (issue 14 item 7): every byte
// moves once, straight between the ranks' own buffers. Design at the top of shared_allreduce.cc.
#pragma once

#include "chorus/chorus.h"
#include "collectives/c_api_check.h"

namespace chorus {
class CommImpl;
}

namespace chorus::capi {

// Takes the call when it is one for this path (one host, at least kSharedMinBytes, this rank's
// buffers both from chorusMemAlloc, the path not turned off): then *result is the call's result
// and the answer is true. Otherwise false, and the ordinary path runs the call.
bool shared_all_reduce(chorusComm_t h, CommImpl& comm, const Call& call, const Args& a,
                       const Checked& k, chorusResult_t* result);

// Below this many bytes the ordinary path (one eager message, no handshakes) is faster.
inline constexpr size_t kSharedMinBytes = 64 << 10;

}  // namespace chorus::capi
