// Host memory that other processes of the same host can map: chorusMemAlloc's buffers. Each
// allocation is its own memfd, mapped shared; a peer maps it by opening /proc/<pid>/fd/<fd> (the
// same user, as every rank of a job is). Collectives whose buffers all come from here on every
// rank read and write the peers' buffers directly (collectives/shared_allreduce.cc) instead of
// staging every byte through the shm rings.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "common/status.h"

namespace chorus::transport {

// Where a byte range lives, as a peer needs it to map it: the owner's pid and descriptor, an id
// unique to the allocation (pid and descriptor numbers are reused; the id is not), and the
// range's place in it. Exchanged as raw bytes between the ranks of a job.
struct SharedRef {
  int32_t pid = 0;
  int32_t fd = -1;
  uint64_t id = 0;
  uint64_t size = 0;    // of the whole allocation
  uint64_t offset = 0;  // of the range
};

// An allocation of `bytes` (> 0), page-aligned, zero-filled; at `hint` if that range is free
// (mmap's hint: tests that need an address used again).
Result<void*> shared_alloc(size_t bytes, void* hint = nullptr);
// Frees what shared_alloc returned; anything else is refused by name.
Status shared_free(void* p);
// The allocation holding [p, p + bytes), if it is one of this process's shared allocations.
std::optional<SharedRef> find_shared(const void* p, size_t bytes);

// Maps a peer's range of `bytes` (which must lie inside its allocation) and holds it until
// release_shared(ref): the allocation is mapped once per (pid, id); returns the range's address
// here. A mapping that nothing holds stays for later calls while its owner keeps the allocation,
// and is unmapped at the next new mapping once the owner has freed it (or ended): else it would
// keep the freed memory for the life of this process. Fails naming the pid and the path when the
// kernel refuses (another user, a hardened /proc), or when `fail_for_test`
// (CHORUS_TEST_SHARED_MAP_FAIL) and the allocation is not mapped yet.
Result<char*> map_shared(const SharedRef& ref, size_t bytes, bool fail_for_test = false);
// Ends one hold of map_shared's on ref's allocation (none left: nothing).
void release_shared(const SharedRef& ref);
// How many peers' allocations are mapped here (tests).
int shared_peer_mappings();

}  // namespace chorus::transport
