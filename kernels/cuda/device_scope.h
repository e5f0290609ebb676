// The calling thread's current device for a scope, for the .cu files of kernels/cuda (driver.cu):
// `device` is made current (also on a thread that had no CUDA context: the driver calls in the
// scope need one), and the thread's device before it is made current again at the end -- unless
// the thread had no CUDA context before, which stays on `device`. (CUDA 12 makes a
// device's primary context at cudaSetDevice, so "restoring" an unused thread's nominal device 0
// would make one on GPU 0 for a rank that uses another.) rc(): 0, or the failure that left the
// thread where it was.
#pragma once

namespace chorus::kernels::cuda {

class DeviceScope {
 public:
  explicit DeviceScope(int device);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;
  int rc() const { return rc_; }

 private:
  int restore_ = -1;  // the caller's device, made current again at the end (-1: none)
  int rc_ = 0;
};

}  // namespace chorus::kernels::cuda
