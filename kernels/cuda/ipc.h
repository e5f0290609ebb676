// Device memory shared between processes on one host (CUDA IPC, legacy handles) and stream
// memory operations, for the device collectives (collectives/device_ops.cc). Plain C++
// interface, in every build: ipc.cu with CUDA (the driver reached through
// cudaGetDriverEntryPointByVersion, never linked), driver_none.cc without (every call fails with
// kNoCuda).
//
// Every int result is 0 on success, a cudaError_t (> 0), -CUresult (< 0) or one of the answers
// below (past every cudaError_t, so that none is taken for CUDA's own); ipc_error_string names
// it. Nothing here waits for the GPU: the stream functions enqueue and return.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/cpu/reduce.h"

namespace chorus::kernels::cuda {

inline constexpr int kNoCuda = 100;  // cudaErrorNoDevice: no CUDA build, driver or device
// ipc_export's answer for device memory that has no legacy IPC handle -- VMM (cuMem, PyTorch's
// expandable segments) and stream-ordered (cudaMallocAsync) memory -- which the device
// collectives then stage through a buffer of their own (collectives/device_ops.cc).
inline constexpr int kNotLegacyIpc = 100801;

// vmm_identify's answer for memory that is not inside one VMM allocation that CUDA can export as
// a POSIX file descriptor (cudaMallocAsync memory; cuMem memory created without that handle
// type; a buffer across two allocations): it goes through the bounce buffer instead.
inline constexpr int kNotFdExportable = 100803;

// flags_release's answer on a device where no flags_alloc ran (nothing made its stream).
inline constexpr int kReleaseUnprepared = 100804;

// buffer_id's answer for an address that lies in no allocation of this process (the one there
// was freed): CUDA_ERROR_INVALID_VALUE, as a -CUresult.
inline constexpr int kNotAllocated = -1;

// What a peer needs to map a buffer: the legacy IPC handle of the allocation holding it and the
// buffer's offset inside that allocation; where the allocation lies in its owner's address space
// (a later allocation there means this one was freed); the owner process (a token of the
// collectives', export_for_peers in collectives/device_ops.h) and the allocation's identity there
// (buffer_id; 0: unknown), both set by export_for_peers. Exchanged as raw bytes.
struct IpcHandle {
  unsigned char bytes[64];  // cudaIpcMemHandle_t
  uint64_t offset;
  uint64_t base;  // the allocation's start and size in its owner's process
  uint64_t size;
  uint64_t owner;
  uint64_t id;
};

// The handle of p's allocation (cudaMalloc memory), p's offset in it and the allocation's range
// (owner and id left 0); kNotLegacyIpc for VMM and stream-ordered memory, which export no legacy
// handle.
int ipc_export(const void* p, IpcHandle* out);
// Maps a peer's buffer into this process: base + offset. Each allocation opens once per process
// (cached by handle bytes, as the driver allows one open per context); never in the process
// that exported it (use the raw pointer there).
int ipc_open(const IpcHandle& h, void** out);
// Closes what ipc_open mapped for h's allocation (nothing if it is not open): its owner freed it,
// and no work of this process uses it any more.
void ipc_close(const IpcHandle& h);
// Closes every allocation ipc_open mapped (tests; a process that ends needs nothing).
void ipc_close_all();
// The identity of the allocation holding p (CU_POINTER_ATTRIBUTE_BUFFER_ID: never the same for
// two allocations of a process, also one made where a freed one lay); kNotAllocated when p lies in
// none. For an owner to learn that an allocation it exported was freed (collectives/
// device_freed.h).
int buffer_id(const void* p, uint64_t* id);

// VMM (cuMem) memory -- PyTorch's expandable segments -- shared by file descriptor: its
// allocation exported as a POSIX fd (CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR), passed to the
// peers over a Unix socket (transport/fd_pass.h), imported and mapped there.
struct VmmAllocation {
  uint64_t identity = 0;  // the allocation's handle, retained: no other allocation has it while
                          // the retain lasts (vmm_release ends it)
  uint64_t base = 0;      // where it is mapped here, and its size
  uint64_t size = 0;
};
// The allocation holding [p, p + bytes), retained; kNotFdExportable (nothing retained) when there
// is none that CUDA can export as a file descriptor.
int vmm_identify(const void* p, size_t bytes, VmmAllocation* out);
int vmm_release(uint64_t identity);
// A new descriptor of the allocation (the caller closes it).
int vmm_export_fd(uint64_t identity, int* fd);
// Maps a peer's allocation of `size` bytes from its descriptor onto the current device, readable
// and writable; the mapping holds the memory until vmm_unmap (fd may be closed at once).
int vmm_map(int fd, uint64_t size, void** out);
int vmm_unmap(void* p, uint64_t size);

// `bytes` of zeroed device memory on the current device that ipc_export can share: flag words
// peers write into, and the staging buffers of memory that cannot be shared.
int flags_alloc(size_t bytes, void** out);
// Frees what flags_alloc gave (cudaFree; nullptr: nothing), once no work of this process uses it
// (cudaFree may wait for the whole device). Peers that opened it keep its memory until they
// close it. A failure is ignored: the memory stays allocated.
void flags_free(void* p);

// `bytes` of zeroed page-locked host memory mapped into every device's address space at the same
// address (cudaHostAllocMapped | Portable, unified addressing): 32-bit words a stream waits on
// (stream_wait_u32_geq) and a host thread ends the wait by storing into them -- no stream, no CUDA
// call, nothing a hardware queue shared with the waiting stream could hold behind the wait.
// kNotLegacyIpc when the device address differs from the host's. Never freed.
int host_words_alloc(size_t bytes, void** out);
// The same for `bytes` of host memory at p that this process already has -- memory shared with
// other processes of the host (transport/shm/shared_mem.h), where each process registers its own
// mapping: page-locked and mapped for every device at p (cudaHostRegister, Portable | Mapped).
// The CUDA IPC path's flag words, which peers' streams write into and the host releases by a
// store (collectives/device_words.h). kNotLegacyIpc when the device address differs from p.
int host_register(void* p, size_t bytes);
// Ends host_register's registration of p (cudaHostUnregister), once no work of this process uses
// it; the memory stays mapped. A failure is ignored.
void host_unregister(void* p);

// Writes values[0..count) into the 32-bit flag words at `flags` (flags_alloc's, on `device`), on
// a stream of its own, which waits for no other: values that end the stream waits on them. For
// a communicator that failed (a peer died mid-call): its streams must not wait for ever. Any
// thread, also while another is blocked in a CUDA call behind those waits: it makes nothing
// (flags_alloc made its stream) and stages no host memory. `values` may be reused as soon as it
// returns.
int flags_release(int device, void* flags, const uint32_t* values, size_t count);

// On `stream` (nullptr: the legacy default stream): write v into the 32-bit word at `word`
// (this process's memory or a peer's, mapped by ipc_open) once the work before it is done and
// visible; wait until the word at `word` is >= v. A wait holds no SM: another process sharing
// the GPU runs meanwhile.
int stream_write_u32(void* stream, void* word, uint32_t v);
int stream_wait_u32_geq(void* stream, const void* word, uint32_t v);
// Orders work on different streams: mark_record records a mark (a CUDA event, made at the first
// call into *mark) after the work already on `stream`; mark_wait makes later work on `stream` wait
// for the latest record of `mark` (nullptr: nothing to wait for). Neither waits on the host.
int mark_record(void* stream, void** mark);
int mark_wait(void* stream, void* mark);
// Time stamps on a stream (CHORUS_DEVICE_TIMING, collectives/device_timing.h): stamp_record
// records one (made at the first call into *stamp) after the work already on `stream`;
// stamp_ms gives the milliseconds between two once the GPU has reached both, and kStampNotReady
// before (it does not wait); stamp_free releases one.
inline constexpr int kStampNotReady = 600;  // cudaErrorNotReady
int stamp_record(void* stream, void** stamp);
int stamp_ms(void* from, void* to, float* ms);
void stamp_free(void* stamp);
// Host staging, for ranks that CUDA IPC cannot join (several hosts; collectives/device_staged.cc):
// page-locked host memory (cudaHostAlloc), which copies on a stream read or write when the stream
// reaches them, not when they are enqueued; a copy of device memory into it, and of host memory
// into device memory, on `stream` (from page-locked memory the copy reads `src` when it runs;
// from other memory, before it returns). Both only enqueue.
int copy_to_device(void* dst, const void* src, size_t bytes, void* stream);
int pinned_alloc(size_t bytes, void** out);
void pinned_free(void* p);
int copy_to_host_async(void* dst, const void* src, size_t bytes, void* stream);
// *out = 1 when `stream` is being captured into a CUDA graph (cudaStreamIsCapturing: also when
// the capture was invalidated), else 0.
int stream_capturing(void* stream, int* out);
// While `stream` is being captured: fn(arg) once the graph being captured is destroyed, with
// every executable graph made from it (a user object the graph holds, as NCCL keeps a captured
// call's resources); fn runs on a thread of CUDA's and calls no CUDA. Else an error, and fn is
// never called.
int graph_destructor(void* stream, void (*fn)(void*), void* arg);
// fn(arg) on a thread of CUDA's once the work before it on `stream` is done, before the work
// after it starts (cudaLaunchHostFunc; captured, a host node that runs at every replay); fn calls
// no CUDA and returns soon.
int host_func(void* stream, void (*fn)(void*), void* arg);
// The calling thread's current device (0 when it has used none), or -1 without CUDA.
int current_device();

std::string ipc_error_string(int rc);

// The calls above that the device collectives make, as one table: the driver's (the functions
// above), or a test's, which emulates device memory, IPC and in-order streams in host shared
// memory so that the collectives' host logic and GPU-side protocol run on machines without a GPU
// (tests/collectives/fake_gpu.h). The table's functions follow the contracts above.
struct IpcBackend {
  int (*export_buffer)(const void* p, IpcHandle* out);
  int (*open)(const IpcHandle& h, void** out);
  void (*close)(const IpcHandle& h);
  int (*buffer_id)(const void* p, uint64_t* id);
  int (*flags_alloc)(size_t bytes, void** out);
  void (*flags_free)(void* p);
  int (*host_words_alloc)(size_t bytes, void** out);
  int (*host_register)(void* p, size_t bytes);
  void (*host_unregister)(void* p);
  int (*flags_release)(int device, void* flags, const uint32_t* values, size_t count);
  int (*write_u32)(void* stream, void* word, uint32_t v);
  int (*wait_u32_geq)(void* stream, const void* word, uint32_t v);
  int (*mark_record)(void* stream, void** mark);
  int (*mark_wait)(void* stream, void* mark);
  int (*stamp_record)(void* stream, void** stamp);
  int (*stamp_ms)(void* from, void* to, float* ms);
  void (*stamp_free)(void* stamp);
  // reduce_fold_to's contract (reduce.h); a copy is a fold of one input.
  int (*fold)(DType t, RedOp op, const void* const* in, int w, void* const* out, int nout,
              size_t count, int avg_n, void* stream);
  int (*to_device)(void* dst, const void* src, size_t bytes, void* stream);
  int (*pinned_alloc)(size_t bytes, void** out);
  void (*pinned_free)(void* p);
  int (*to_host_async)(void* dst, const void* src, size_t bytes, void* stream);
  int (*capturing)(void* stream, int* out);
  int (*graph_destructor)(void* stream, void (*fn)(void*), void* arg);
  int (*host_func)(void* stream, void (*fn)(void*), void* arg);
  // Whether the work before a mark's latest record is done: 0, kStampNotReady (not yet), or an
  // error; it does not wait. `device`: the mark's (current for the query: a thread of chorus's
  // may have used none yet). Any thread, also while another captures a stream. mark_free
  // releases a mark (nullptr: nothing).
  int (*mark_done)(int device, void* mark);
  void (*mark_free)(void* mark);
  int (*current_device)();
  std::string (*error_string)(int rc);
  int (*vmm_identify)(const void* p, size_t bytes, VmmAllocation* out);
  int (*vmm_release)(uint64_t identity);
  int (*vmm_export_fd)(uint64_t identity, int* fd);
  int (*vmm_map)(int fd, uint64_t size, void** out);
  int (*vmm_unmap)(void* p, uint64_t size);
};
const IpcBackend& ipc();
// Tests: replace the table (nullptr: back to the driver's). Set before the first device call.
void set_ipc_backend_for_test(const IpcBackend* backend);

}  // namespace chorus::kernels::cuda
