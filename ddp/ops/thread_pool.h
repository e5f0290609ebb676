// The intra-op thread pool: a small fixed pool of worker threads across which ops split a batch.
// One process-wide pool (ops are called from one training thread at a time). With 1 thread
// everything runs inline on the caller, with no synchronisation at all.
#pragma once

#include <functional>

namespace chorus {

// Resizes the pool; n < 1 counts as 1.
void set_intra_op_threads(int n);
int intra_op_threads();
// Calls fn(part) for every part in [0, parts) -- part 0 on the caller, the rest on the pool --
// and returns when all are done. parts must be <= intra_op_threads(). The first exception thrown
// by any part is rethrown on the caller.
void parallel_parts(int parts, const std::function<void(int part)>& fn);

}  // namespace chorus
