// An emulated GPU for tests of the device operations (collectives/device_ops.cc) on machines
// without one. "Device memory" is shared host memory (transport/shm/shared_mem.h) that the
// pointer classifier calls memory of CUDA device 0; an IPC handle carries its SharedRef, and a
// peer maps it through /proc; a stream runs each operation at once, in order, on the calling
// thread -- a write-value is an atomic store, a wait spins until the word is written (at most
// 30 s, then an error), a kernel is the CPU's fold. The whole protocol -- the records, the
// plans, the ready/done words, the pairing of sends and receives -- runs as on a GPU; only the
// asynchrony is missing (the host returns after the work, not before). Memory that CUDA IPC
// cannot map (VMM, cudaMallocAsync) is emulated too: device memory whose export fails with
// kNotLegacyIpc, and VMM memory that also exports as a file descriptor. Marks (events) order
// nothing here: each stream operation is done when enqueued; the emulation checks only that a mark
// waited for is one recorded. Page-locked host memory is ordinary memory; marks report reached.
// An async stream (fake_async_stream) adds the asynchrony back for the tests that need it.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

namespace chorus::test {

// Makes this process use the emulation (the ipc backend and the pointer classifier).
void install_fake_gpu();
// Emulated device memory (zero-filled), and its release. fake_device_alloc_at: at `at` if that
// range is free (an address used again, as cudaMalloc often does after a free).
void* fake_device_alloc(size_t bytes);
void* fake_device_alloc_at(void* at, size_t bytes);
void fake_device_free(void* p);
// Emulated device memory that CUDA IPC cannot map (as VMM memory): the same, but ipc_export
// refuses it with kNotLegacyIpc. Freed with fake_device_free.
void* fake_unmapped_alloc(size_t bytes);
// Emulated VMM memory that CUDA exports as a file descriptor (PyTorch's expandable segments): no
// legacy IPC handle either, but vmm_identify/vmm_export_fd take it (its memfd), and a peer maps
// the descriptor it is passed. Freed with fake_device_free.
void* fake_vmm_alloc(size_t bytes);
// In this process: the retains of VMM allocations not yet released, and the descriptors
// exported so far.
int fake_vmm_retained();
int fake_vmm_exported();
// In this process: the peers' VMM allocations mapped here (vmm_map's, not yet unmapped).
int fake_vmm_mapped();
// The stream of the last operation enqueued through the emulation (a write, a wait or a kernel),
// in this process.
void* fake_last_stream();
// What was asked of marks in this process, in order: "record on S", "wait on S for the record on
// T" (or "for none"), streams printed as pointers.
std::vector<std::string> fake_mark_log();
// A stream that runs its operations in order on a thread of its own (the others run each when
// it is enqueued): the host returns before the work is done, as with a GPU. Never destroyed.
// fake_stream_sync waits until its work is done and returns its first error (0: none).
void* fake_async_stream();
int fake_stream_sync(void* stream);
// While on, `stream` says it is being captured into a CUDA graph (and runs what it is given).
void fake_capturing(void* stream, bool on);
// A CUDA graph's capture: from fake_capture_begin to fake_capture_end the stream records its
// operations (writes and waits with their values, kernels with their pointers) instead of running
// them, and says it is capturing; fake_graph_launch enqueues them on a stream, as a replay.
// fake_graph_ops: how many operations a graph holds; fake_graph_free releases one.
void fake_capture_begin(void* stream);
void* fake_capture_end(void* stream);
int fake_graph_launch(void* graph, void* stream);
int fake_graph_ops(void* graph);
void fake_graph_free(void* graph);
// As CUDA may: the graph and its user objects' destructors go `ms` later, on a thread of their
// own (after cudaGraphDestroy CUDA runs them on a thread of its, a moment later).
void fake_graph_free_later(void* graph, int ms);
// An operation that sleeps `ms` on the stream: its rank falls behind its peers there.
void fake_stream_delay(void* stream, int ms);
// Every stream wait of this process sleeps `ms` when its turn comes, before it looks at its word
// (0: none): the rank's peers run ahead between its signals and its waits.
void fake_wait_delay(int ms);
// The next n mark_record calls of this process fail (with 999), recording nothing.
void fake_fail_marks(int n);
// While set, no mark is ever reached (a stream whose earlier work never ends).
void fake_marks_stuck(bool stuck);
// While set, pinned_alloc fails (out of memory).
void fake_pinned_alloc_fails(bool on);
// fn() runs once, in the next pinned_alloc that fails, before it fails: a test holds that rank
// there until a peer is where the test wants it.
void fake_before_pinned_failure(std::function<void()> fn);
// pinned_alloc's blocks not yet freed, in this process; pinned_free's calls so far.
int fake_pinned_live();
int fake_pinned_frees();
// The allocations of peers that ipc close released so far, in this process.
int fake_ipc_closes();
// flags_free's calls so far (bounce buffers freed), in this process.
int fake_flags_frees();
// The ranges of host memory registered with the emulated CUDA (host_register) in this process;
// while `on`, host_register refuses (as CUDA does memory it cannot map at the same address).
int fake_host_registered();
void fake_host_register_fails(bool on);
// flags_release's calls so far, in this process (each a stream write on a GPU).
int fake_flags_releases();
// While set (an async stream; nullptr: off), the process's streams share one hardware queue, as
// with CUDA_DEVICE_MAX_CONNECTIONS=1: flags_release's writes go behind the work already on
// `stream`, waits included.
void fake_one_queue(void* stream);
// pinned_free calls made while a capture (fake_capture_begin) was under way, in this process:
// CUDA refuses them there (a free synchronises), and they invalidate the capture.
int fake_frees_in_capture();
// IPC closes and VMM unmaps made while a capture was under way, in this process: on a GPU they
// may synchronise, which a capture forbids.
int fake_closes_in_capture();

}  // namespace chorus::test
