// An emulated GPU for tests of the device operations (collectives/device_ops.cc) on machines
// without one. "Device memory" is shared host memory (transport/shm/shared_mem.h) that the
// pointer classifier calls memory of CUDA device 0; an IPC handle carries its SharedRef, and a
// peer maps it through /proc; a stream runs each operation at once, in order, on the calling
// thread -- a write-value is an atomic store, a wait spins until the word is written (at most
// 30 s, then an error), a kernel is the CPU's fold. The whole protocol -- the records, the
// plans, the ready/done words, the pairing of sends and receives -- runs as on a GPU; only the
// asynchrony is missing (the host returns after the work, not before).
#pragma once

#include <cstddef>

namespace chorus::test {

// Makes this process use the emulation (the ipc backend and the pointer classifier).
void install_fake_gpu();
// Emulated device memory (zero-filled), and its release.
void* fake_device_alloc(size_t bytes);
void fake_device_free(void* p);

}  // namespace chorus::test
