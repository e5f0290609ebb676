// VMM (cuMem) memory shared by file descriptor (ipc.h), with the driver reached at run time.
// As NCCL and MSCCL++ share cuMem buffers: the allocation's handle (cuMemRetainAllocationHandle,
// the very handle that was mapped), exported as a POSIX fd; the peer imports it, reserves an
// address range, maps it and gives its device access.
#include <cuda.h>
#include <cuda_runtime.h>

#include <mutex>

#include "kernels/cuda/capture_mode.h"
#include "kernels/cuda/driver_entry.h"
#include "kernels/cuda/ipc.h"
#include "kernels/cuda/memory.h"

namespace chorus::kernels::cuda {
namespace {

struct Vmm {
  bool ok = false;
  CUresult (*pointer_attribute)(void*, CUpointer_attribute, CUdeviceptr) = nullptr;
  CUresult (*address_range)(CUdeviceptr*, size_t*, CUdeviceptr) = nullptr;
  CUresult (*retain)(CUmemGenericAllocationHandle*, void*) = nullptr;
  CUresult (*release)(CUmemGenericAllocationHandle) = nullptr;
  CUresult (*export_handle)(void*, CUmemGenericAllocationHandle, CUmemAllocationHandleType,
                            unsigned long long) = nullptr;
  CUresult (*import_handle)(CUmemGenericAllocationHandle*, void*,
                            CUmemAllocationHandleType) = nullptr;
  CUresult (*properties)(CUmemAllocationProp*, CUmemGenericAllocationHandle) = nullptr;
  CUresult (*granularity)(size_t*, const CUmemAllocationProp*,
                          CUmemAllocationGranularity_flags) = nullptr;
  CUresult (*reserve)(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long) = nullptr;
  CUresult (*free_range)(CUdeviceptr, size_t) = nullptr;
  CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                  unsigned long long) = nullptr;
  CUresult (*unmap)(CUdeviceptr, size_t) = nullptr;
  CUresult (*set_access)(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t) = nullptr;
};

const Vmm& vmm() {
  static Vmm v;
  static std::once_flag once;
  std::call_once(once, [] {
    if (device_count() == 0) return;
    v.ok = driver_entry("cuPointerGetAttribute", v.pointer_attribute) &&
           driver_entry("cuMemGetAddressRange", v.address_range) &&
           driver_entry("cuMemRetainAllocationHandle", v.retain) &&
           driver_entry("cuMemRelease", v.release) &&
           driver_entry("cuMemExportToShareableHandle", v.export_handle) &&
           driver_entry("cuMemImportFromShareableHandle", v.import_handle) &&
           driver_entry("cuMemGetAllocationPropertiesFromHandle", v.properties) &&
           driver_entry("cuMemGetAllocationGranularity", v.granularity) &&
           driver_entry("cuMemAddressReserve", v.reserve) &&
           driver_entry("cuMemAddressFree", v.free_range) && driver_entry("cuMemMap", v.map) &&
           driver_entry("cuMemUnmap", v.unmap) && driver_entry("cuMemSetAccess", v.set_access);
  });
  return v;
}

}  // namespace

int vmm_identify(const void* p, size_t bytes, VmmAllocation* out) {
  const Vmm& v = vmm();
  if (!v.ok) return kNoCuda;
  const RelaxedCapture relaxed;  // capture_mode.h
  const auto at = reinterpret_cast<CUdeviceptr>(p);
  // Which handle types the allocation may be exported as (none: cudaMallocAsync's default pool).
  unsigned long long types = 0;
  if (v.pointer_attribute(&types, CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES, at) != CUDA_SUCCESS ||
      !(types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))
    return kNotFdExportable;
  // Memory of a stream-ordered pool made with that handle type says so too, but it is a piece of
  // the pool's allocation, which only cuMemPoolExportPointer shares: the bounce buffer takes it.
  CUmemoryPool pool = nullptr;
  if (v.pointer_attribute(&pool, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, at) == CUDA_SUCCESS &&
      pool != nullptr)
    return kNotFdExportable;
  // For VMM memory: the range of the one mapping (of one allocation) that holds p.
  CUdeviceptr base = 0;
  size_t size = 0;
  if (CUresult r = v.address_range(&base, &size, at); r) return -int(r);
  if (at + bytes > base + size) return kNotFdExportable;  // across two allocations
  CUmemGenericAllocationHandle h = 0;
  if (v.retain(&h, reinterpret_cast<void*>(base)) != CUDA_SUCCESS) return kNotFdExportable;
  *out = VmmAllocation{uint64_t(h), uint64_t(base), uint64_t(size)};
  return 0;
}

int vmm_release(uint64_t identity) {
  const Vmm& v = vmm();
  if (!v.ok) return kNoCuda;
  const RelaxedCapture relaxed;  // capture_mode.h
  return -int(v.release(CUmemGenericAllocationHandle(identity)));
}

int vmm_export_fd(uint64_t identity, int* fd) {
  *fd = -1;
  const Vmm& v = vmm();
  if (!v.ok) return kNoCuda;
  const RelaxedCapture relaxed;  // capture_mode.h
  if (CUresult r = v.export_handle(fd, CUmemGenericAllocationHandle(identity),
                                   CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
      r) {
    *fd = -1;
    return -int(r);
  }
  return 0;
}

int vmm_map(int fd, uint64_t size, void** out) {
  *out = nullptr;
  const Vmm& v = vmm();
  if (!v.ok) return kNoCuda;
  const RelaxedCapture relaxed;  // capture_mode.h
  CUmemGenericAllocationHandle h = 0;
  if (CUresult r = v.import_handle(&h, reinterpret_cast<void*>(uintptr_t(fd)),
                                   CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
      r)
    return -int(r);
  CUmemAllocationProp prop{};
  size_t align = 0;
  CUresult r = v.properties(&prop, h);
  if (r == CUDA_SUCCESS) r = v.granularity(&align, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  CUdeviceptr va = 0;
  if (r == CUDA_SUCCESS) r = v.reserve(&va, size, align, 0, 0);
  if (r == CUDA_SUCCESS) {
    r = v.map(va, size, 0, h, 0);
    if (r == CUDA_SUCCESS) {
      CUmemAccessDesc access{};
      access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      access.location.id = current_device();
      access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
      r = v.set_access(va, size, &access, 1);
      if (r != CUDA_SUCCESS) v.unmap(va, size);
    }
    if (r != CUDA_SUCCESS) v.free_range(va, size);
  }
  v.release(h);  // the mapping holds the memory from here on
  if (r != CUDA_SUCCESS) return -int(r);
  *out = reinterpret_cast<void*>(va);
  return 0;
}

int vmm_unmap(void* p, uint64_t size) {
  const Vmm& v = vmm();
  if (!v.ok) return kNoCuda;
  const RelaxedCapture relaxed;  // capture_mode.h: as ipc_close, for another thread's capture
  const auto va = reinterpret_cast<CUdeviceptr>(p);
  CUresult r = v.unmap(va, size);
  const CUresult f = v.free_range(va, size);
  return -int(r != CUDA_SUCCESS ? r : f);
}

}  // namespace chorus::kernels::cuda
