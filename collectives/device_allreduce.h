// All-reduce of device buffers between ranks of one host over CUDA IPC (issue 19, first part):
// design and ordering rules at the top of device_allreduce.cc.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "chorus/chorus.h"

namespace chorus {

class CommImpl;

// A communicator's state for device collectives, made at its first device call.
struct DeviceIpc {
  int device = -1;
  std::string gpu;                    // its UUID, when the driver says
  void* flags = nullptr;              // this rank's flag words: ready[p] then done[p]
  std::vector<uint32_t*> peer_flags;  // every rank's, mapped here (this rank's own too)
  uint32_t seq = 0;                   // device calls so far
};

// Whether a call's buffers are (at least partly) device memory and take the device path.
bool device_buffers(const void* sendbuff, const void* recvbuff);

}  // namespace chorus

namespace chorus::capi {

// chorusAllReduce on device buffers: enqueued on `stream` after the work already there; the
// host returns once the ranks have exchanged their buffers' handles, without waiting for the
// GPU. `h` is the handle the call came with (the handle exchange runs through it). Reports its
// error as every C API call does.
chorusResult_t device_all_reduce(chorusComm_t h, CommImpl& comm, const char* call,
                                 const void* sendbuff, void* recvbuff, size_t count, int datatype,
                                 int op, void* stream);

}  // namespace chorus::capi
