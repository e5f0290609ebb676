// Device buffers for chorus-perf --device cuda: device.cu in CUDA builds, device_none.cc
// elsewhere (every call says there is no CUDA). chorus-perf itself keeps to the public API; this
// is the CUDA runtime, as a user program of chorus would call it.
#pragma once

#include <cstddef>
#include <string>

namespace perf::device {

// Empty when buffers on device 0 can be had; otherwise why not (no CUDA build, no device).
std::string unavailable();
// LOCAL_RANK's device (modulo the devices there are), made current, with a stream of its own.
void init(int local_rank);
void* alloc(size_t bytes);  // zero-filled; throws std::runtime_error naming the CUDA error
void release(void* p);
void to_device(void* dst, const void* src, size_t bytes);  // synchronous
void to_host(void* dst, const void* src, size_t bytes);    // synchronous
void* stream();                                            // the cudaStream_t of init()
void sync();                                               // waits for stream()
// The local device-to-device copy traffic rate (read + write bytes per second, 1e9), of
// `bytes`-byte copies: the efficiency column's denominator (../shared/notes/gpu-collectives.md).
double copy_traffic_gbs(size_t bytes);
std::string name();  // "cuda:0 (NVIDIA H200)"

}  // namespace perf::device
