// Which GPU a rank uses, for the device-identity exchange at communicator creation (issue 19
// item 3). Plain C++ interface, in every build (driver.cu with CUDA, driver_none.cc without).
#pragma once

#include <optional>
#include <string>

#include "common/status.h"
#include "kernels/cuda/gpu_identity.h"

namespace chorus::kernels::cuda {

// The GPU of the calling thread's current CUDA context: a rank that has used CUDA (cudaSetDevice
// then any allocation or launch, as every GPU program does before creating a communicator). No
// context (a CPU-only rank, no driver, no CUDA build): nullopt, and the rank takes part in no
// GPU check. Creates no context. CHORUS_TEST_GPU_UUID=<uuid>[@<bus>[@<peer bus>,...]] makes the
// rank report that GPU (tests of the exchange on machines without one).
Result<std::optional<GpuIdentity>> current_gpu();

// The test hook's identity: CHORUS_TEST_GPU_UUID's GPU, or nullopt when it is unset.
Result<std::optional<GpuIdentity>> test_gpu_from_env();

// The driver's part (driver.cu; driver_none.cc says 0): 1 with *out filled, 0 when there is no
// current context (or no driver), -CUresult when a query failed.
int driver_current_gpu(GpuIdentity* out);

// "default", "exclusive-thread", "prohibited", "exclusive-process".
const char* compute_mode_name(int mode);

}  // namespace chorus::kernels::cuda
