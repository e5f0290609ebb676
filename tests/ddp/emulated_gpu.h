// cuda:0 of the tensors on the emulated GPU of tests/collectives/fake_gpu.h: its shared memory,
// which the CPU reads and writes, allocated by the tensors' device backend, and the CPU's kernel
// table as the CUDA one. With it, GPU training's host side -- the ops' dispatch by device,
// autograd, SGD, the DDP reducer's buckets on the device (all-reduced by the communicator's
// device path over the emulation), the parameter broadcast -- runs on machines without a GPU.
// The kernels themselves are the GPU's only where one is lent.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ddp/tensor/device_cache.h"

namespace chorus::test {

class EmulatedGpu final : public DeviceBackend {
 public:
  int count() override { return 1; }
  void* alloc(Device, size_t bytes) override;
  void free(Device, void* p) override;
  void copy(void* dst, Device, const void* src, Device, size_t bytes) override;
  void add(Device, long n, const float* a, const float* b, float* y) override;
  void fill(Device, long n, float value, float* y) override;
  // CUDA graphs as CUDA captures them: between capture_begin and capture_end every kernel (the
  // kernel table's, add, fill) is recorded with its arguments, not run; a kernel that returns a
  // host value, argmax, NLL labels in host memory, copy() and new_stream throw, as they would
  // on a GPU. Events fork and join as CUDA's cross-stream capture: the communication stream
  // joins the capture by waiting for an event recorded in it, and its communicator calls are
  // then recorded by the device path's emulation (fake_gpu.h) in pieces, each replayed where it
  // began; a capture that ends before the capturing stream waited for the communication
  // stream's last event throws (unjoined), and so does a wait for an event recorded outside it.
  // The graph replays the recording in order. `captured_kernels`: the last capture's length
  // (each communicator piece one entry).
  void capture_begin(Device) override;
  void* capture_end(Device) override;
  void graph_launch(Device, void* graph) override;
  void graph_destroy(Device, void* graph) override;
  size_t captured_kernels = 0;
  int graph_launches = 0;
  // Streams and events order nothing here (every operation is done when enqueued): what DDP
  // asks of them is written down instead, as "new comm", "record e1 on default",
  // "wait comm for e1".
  static inline void* const kCommStream = reinterpret_cast<void*>(0x5c);
  std::vector<std::string> trace;
  void* new_stream(Device) override;
  void record_event(Device, void* stream, void** event) override;
  void wait_event(Device, void* stream, void* event) override;
  // Every stream's work is done (false: `never_drains`, a stream stuck for the test).
  bool drained(Device, const std::vector<void*>& streams, double seconds) override;
  bool never_drains = false;

 private:
  uintptr_t events_ = 0;
};

EmulatedGpu& emulated_gpu();

// This process's cuda:0 becomes the emulation (the communicator's device path included). Call it
// in each rank before its communicator is made.
void use_emulated_gpu();

}  // namespace chorus::test
