// A GPU's identity (device.h), in a header nvcc can read: no fmt, no Status.
#pragma once

#include <string>

namespace chorus::kernels::cuda {

struct GpuIdentity {
  std::string uuid;      // "GPU-1a2b3c4d-...", as nvidia-smi -L prints it
  int ordinal = -1;      // the device number in this process (after CUDA_VISIBLE_DEVICES)
  std::string bus_id;    // "0000:3b:00.0"
  int compute_mode = 0;  // CU_COMPUTEMODE_*: 0 default, 2 prohibited, 3 exclusive-process
  // The PCI addresses of the other GPUs this process sees whose memory this one can reach peer
  // to peer (cudaDeviceCanAccessPeer), comma-separated; "" when none.
  std::string peers;
};

}  // namespace chorus::kernels::cuda
