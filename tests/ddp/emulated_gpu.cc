#include "emulated_gpu.h"

#include <cstring>

#include "../collectives/fake_gpu.h"
#include "ddp/ops/kernel_table.h"

namespace chorus::test {
namespace {

std::string event_name(void* event) {
  return "e" + std::to_string(reinterpret_cast<uintptr_t>(event));
}

std::string stream_name(void* s) {
  return s == nullptr ? "default" : s == EmulatedGpu::kCommStream ? "comm" : "another stream";
}

}  // namespace

void* EmulatedGpu::alloc(Device, size_t bytes) {
  return fake_device_alloc(bytes);
}

void EmulatedGpu::free(Device, void* p) {
  fake_device_free(p);
}

void EmulatedGpu::copy(void* dst, Device, const void* src, Device, size_t bytes) {
  std::memmove(dst, src, bytes);
}

void EmulatedGpu::add(Device, long n, const float* a, const float* b, float* y) {
  for (long i = 0; i < n; ++i) y[i] = a[i] + b[i];
}

void* EmulatedGpu::new_stream(Device) {
  trace.push_back("new comm");
  return kCommStream;
}

void EmulatedGpu::record_event(Device, void* stream, void** event) {
  if (*event == nullptr) *event = reinterpret_cast<void*>(++events_);
  trace.push_back("record " + event_name(*event) + " on " + stream_name(stream));
}

void EmulatedGpu::wait_event(Device, void* stream, void* event) {
  trace.push_back("wait " + stream_name(stream) + " for " + event_name(event));
}

EmulatedGpu& emulated_gpu() {
  static EmulatedGpu gpu;
  return gpu;
}

void use_emulated_gpu() {
  install_fake_gpu();
  set_cuda_backend_for_test(&emulated_gpu());
  set_cuda_kernel_table_for_test(&kernel_table_for(Device::cpu()));
}

}  // namespace chorus::test
