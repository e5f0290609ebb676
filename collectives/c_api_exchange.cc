// The C ABI (include/chorus/chorus.h), the operations that give each rank its own block:
// gather, scatter, all-to-all and all-to-all-v, blocking and chorusI*. Each names its call and
// hands its arguments to run_op (c_api_ops.cc), the path every operation takes.
#include "chorus/chorus.h"
#include "collectives/c_api_internal.h"

using chorus::OpKind;
using chorus::capi::kAsync;
using chorus::capi::kBlocking;
using chorus::capi::run_op;

CHORUS_API chorusResult_t chorusGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                                       chorusDataType_t datatype, int root, chorusComm_t comm,
                                       chorusStream_t stream) try {
  return run_op({"chorusGather", OpKind::kGather, kBlocking}, comm,
                {.sendbuff = sendbuff,
                 .recvbuff = recvbuff,
                 .count = sendcount,
                 .datatype = datatype,
                 .root = root,
                 .stream = stream});
}
CHORUS_CATCH_ALL

CHORUS_API chorusResult_t chorusScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                        chorusDataType_t datatype, int root, chorusComm_t comm,
                                        chorusStream_t stream) try {
  return run_op({"chorusScatter", OpKind::kScatter, kBlocking}, comm,
                {.sendbuff = sendbuff,
                 .recvbuff = recvbuff,
                 .count = recvcount,
                 .datatype = datatype,
                 .root = root,
                 .stream = stream});
}
CHORUS_CATCH_ALL

CHORUS_API chorusResult_t chorusAllToAll(const void* sendbuff, void* recvbuff, size_t count,
                                         chorusDataType_t datatype, chorusComm_t comm,
                                         chorusStream_t stream) try {
  return run_op({"chorusAllToAll", OpKind::kAllToAll, kBlocking}, comm,
                {.sendbuff = sendbuff,
                 .recvbuff = recvbuff,
                 .count = count,
                 .datatype = datatype,
                 .stream = stream});
}
CHORUS_CATCH_ALL

CHORUS_API chorusResult_t chorusAllToAllv(const void* sendbuff, const size_t* sendcounts,
                                          const size_t* sdispls, void* recvbuff,
                                          const size_t* recvcounts, const size_t* rdispls,
                                          chorusDataType_t datatype, chorusComm_t comm,
                                          chorusStream_t stream) try {
  return run_op({"chorusAllToAllv", OpKind::kAllToAllv, kBlocking}, comm,
                {.sendbuff = sendbuff,
                 .recvbuff = recvbuff,
                 .datatype = datatype,
                 .stream = stream,
                 .sendcounts = sendcounts,
                 .sdispls = sdispls,
                 .recvcounts = recvcounts,
                 .rdispls = rdispls});
}
CHORUS_CATCH_ALL

CHORUS_API chorusResult_t chorusIgather(const void* sendbuff, void* recvbuff, size_t sendcount,
                                        chorusDataType_t datatype, int root, chorusComm_t comm,
                                        chorusRequest_t* request) try {
  return run_op({"chorusIgather", OpKind::kGather, kAsync}, comm,
                {.sendbuff = sendbuff,
                 .recvbuff = recvbuff,
                 .count = sendcount,
                 .datatype = datatype,
                 .root = root,
                 .request = request});
}
CHORUS_CATCH_ALL

CHORUS_API chorusResult_t chorusIscatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                         chorusDataType_t datatype, int root, chorusComm_t comm,
                                         chorusRequest_t* request) try {
  return run_op({"chorusIscatter", OpKind::kScatter, kAsync}, comm,
                {.sendbuff = sendbuff,
                 .recvbuff = recvbuff,
                 .count = recvcount,
                 .datatype = datatype,
                 .root = root,
                 .request = request});
}
CHORUS_CATCH_ALL

CHORUS_API chorusResult_t chorusIallToAll(const void* sendbuff, void* recvbuff, size_t count,
                                          chorusDataType_t datatype, chorusComm_t comm,
                                          chorusRequest_t* request) try {
  return run_op({"chorusIallToAll", OpKind::kAllToAll, kAsync}, comm,
                {.sendbuff = sendbuff,
                 .recvbuff = recvbuff,
                 .count = count,
                 .datatype = datatype,
                 .request = request});
}
CHORUS_CATCH_ALL

CHORUS_API chorusResult_t chorusIallToAllv(const void* sendbuff, const size_t* sendcounts,
                                           const size_t* sdispls, void* recvbuff,
                                           const size_t* recvcounts, const size_t* rdispls,
                                           chorusDataType_t datatype, chorusComm_t comm,
                                           chorusRequest_t* request) try {
  return run_op({"chorusIallToAllv", OpKind::kAllToAllv, kAsync}, comm,
                {.sendbuff = sendbuff,
                 .recvbuff = recvbuff,
                 .datatype = datatype,
                 .request = request,
                 .sendcounts = sendcounts,
                 .sdispls = sdispls,
                 .recvcounts = recvcounts,
                 .rdispls = rdispls});
}
CHORUS_CATCH_ALL
