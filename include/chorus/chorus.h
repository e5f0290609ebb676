/* chorus: collective communication for CPU processes (and GPUs, later), shaped like NCCL.
 *
 * A quick tour:
 *
 *   chorusComm_t comm;
 *   chorusCommInitFromEnv(&comm);          // under chorus-run, torchrun, mpirun or srun
 *   chorusBroadcast(buf, buf, n, chorusFloat32, 0, comm, NULL);
 *   chorusBarrier(comm, NULL);
 *   chorusCommDestroy(comm);
 *
 * Or, with an id handed around by the caller (as ncclGetUniqueId):
 *   rank 0: chorusGetUniqueId(&id); ...send id to the others...
 *   all:    chorusCommInitRank(&comm, nranks, id, rank);
 *
 * Contracts, written once:
 * - Every call returns a chorusResult_t and never throws; on failure chorusGetLastError()
 *   tells what went wrong in words (which call, which ranks, expected vs got).
 * - Collective calls must be made by every rank of the communicator in the same order.
 *   When ranks disagree (a barrier here, a broadcast there; different counts or roots) every
 *   rank fails at once with chorusMismatch and a message naming both calls.
 * - A dead peer fails every survivor's current and later operations with chorusRemoteError
 *   within seconds; every wait ends by CHORUS_TIMEOUT (seconds, default 300) at the latest.
 * - Blocking calls (chorusSend, chorusBroadcast, ...) return when the operation is complete
 *   on this rank. The chorusI* calls return a request at once; the buffers must stay valid
 *   until chorusWait/chorusTest reports completion. stream must be NULL for CPU buffers.
 * - With device buffers a call returns once its work is enqueued on the stream (as NCCL's). What
 *   goes wrong after that -- a peer that dies; across hosts, where the host part runs later, a
 *   mismatch or a timeout too -- fails the communicator: chorusCommGetAsyncError reports it, the
 *   next call names it, and the stream goes on with void results instead of waiting for ever.
 *   Device collectives may be captured into a CUDA graph by every rank (a communicator's first
 *   call too), and sends and receives by both ranks of each pair (chorusCommCapturable says how
 *   the replays run). Replays keep the rule of the same order on every rank: graphs launched on
 *   streams that nothing orders between them may run their host parts in any order; and one
 *   capture instantiated twice gives two graphs that must not run at once (their calls share
 *   their flag words).
 * - On one host the peers map device buffers (CUDA IPC) at their first use and keep them mapped
 *   while the owner keeps the allocation, as NCCL keeps registered buffers. A peer closes its
 *   mapping of a freed allocation when the owner's next buffer shows it freed: one that lies
 *   where the freed one lay, as cudaMalloc often places it. Freed allocations whose place no
 *   later buffer takes stay mapped, and hold their memory, until the peer ends: reuse buffers (a
 *   caching allocator, as PyTorch's) rather than allocate and free them around every call.
 * - In place: sendbuff == recvbuff is allowed wherever both appear (for gather, scatter and
 *   all-to-all see their comments).
 * - A destroyed or aborted communicator answers every later call with an error, never a crash.
 *   chorusCommAbort may be called from any thread.
 * - No C++ exception leaves any chorus* function. When chorus cannot get memory or a thread,
 *   the call fails with chorusSystemError; if that happens inside an operation call, the
 *   communicator is aborted (its peers fail at once rather than wait for an operation that
 *   will not come).
 *
 * Argument limits (each refusal is chorusInvalidArgument or chorusInvalidUsage, with a message
 * naming the call, the rank, the argument and its value; a refused call has no effect):
 * - datatype is a chorusDataType_t (0 .. chorusNumTypes-1); reductions take only the types
 *   their message lists. op is a chorusRedOp_t (0..4).
 * - count * element size must fit in one buffer: at most PTRDIFF_MAX bytes; for all-gather's
 *   and gather's recvbuff, reduce-scatter's and scatter's sendbuff and both of all-to-all's
 *   buffers, count * element size * nranks.
 * - sendbuff/recvbuff may be NULL only when count is 0 (or where the call ignores them: sendbuff
 *   off the root of a broadcast or scatter, recvbuff off the root of a reduce or gather).
 * - all-to-all-v: sendcounts, sdispls, recvcounts and rdispls are not NULL; for every j,
 *   (displacement + count) * element size is at most PTRDIFF_MAX; a buffer may be NULL only when
 *   all its counts are 0; sendcounts[rank] == recvcounts[rank] (this rank's block to itself).
 * - root and peer are ranks of the communicator (a peer is never this rank).
 * - nranks (chorusCommInitRank), ndev (chorusCommInitAll) and launcher world sizes are
 *   1..CHORUS_MAX_RANKS; rank is 0..nranks-1.
 * - stream must be NULL with host buffers (chorusBarrier: or in a process that uses a CUDA
 *   device); request must not be NULL.
 * - Buffers are host memory (managed memory is taken too: the CPU reads it), or CUDA device
 *   memory of the current device in the calls that take it with a stream: all-reduce, reduce,
 *   broadcast, all-gather, reduce-scatter, gather, scatter, all-to-all(-v) and the blocking
 *   send/recv (README.md). Elsewhere a device buffer is refused with chorusInvalidArgument
 *   naming the argument and the device, before any rank touches it (where no CUDA driver is
 *   loaded, every buffer counts as host memory).
 * - chorusWait: timeout_seconds NaN is refused; a negative value, INFINITY, or anything above
 *   1e9 waits until the operation ends.
 */
#ifndef CHORUS_CHORUS_H_
#define CHORUS_CHORUS_H_

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CHORUS_VERSION_CODE 100 /* 0.1.0 */
#define CHORUS_UNIQUE_ID_BYTES 128
#define CHORUS_SPLIT_NOCOLOR (-1)
/* The most ranks a communicator may have; larger nranks, ndev or world sizes are refused. */
#define CHORUS_MAX_RANKS 65536

typedef struct chorusComm* chorusComm_t;
typedef struct chorusRequest* chorusRequest_t;
typedef void* chorusStream_t; /* a cudaStream_t for GPU buffers; NULL for CPU buffers */
typedef struct {
  char internal[CHORUS_UNIQUE_ID_BYTES];
} chorusUniqueId;

/* A C caller may pass any int where these enums are expected (calls refuse values outside them
 * with a clear error). C++ gives an enum without a fixed underlying type no such values, so for
 * C++ (chorus itself, and C++ callers) the underlying type is int, as C's is in practice. */
#ifdef __cplusplus
#define CHORUS_ENUM_BASE : int
#else
#define CHORUS_ENUM_BASE
#endif

typedef enum CHORUS_ENUM_BASE {
  chorusSuccess = 0,
  chorusUnhandledCudaError = 1,
  chorusSystemError = 2,
  chorusInternalError = 3,
  chorusInvalidArgument = 4,
  chorusInvalidUsage = 5,
  chorusRemoteError = 6,
  chorusTimeout = 7,
  chorusAborted = 8,
  chorusMismatch = 9,
  chorusInProgress = 10,
  chorusRevoked = 11
} chorusResult_t;

/* Same numbering as NCCL's ncclDataType_t. Every collective takes all ten. Reductions: integer
 * sum and prod wrap (two's complement), min/max compare as the type's signedness, avg divides
 * the (wrapped) sum and truncates toward zero; f16 and bf16 are computed in float and rounded
 * back to nearest even; float min/max propagate NaN. */
typedef enum CHORUS_ENUM_BASE {
  chorusInt8 = 0,
  chorusUint8 = 1,
  chorusInt32 = 2,
  chorusUint32 = 3,
  chorusInt64 = 4,
  chorusUint64 = 5,
  chorusFloat16 = 6,
  chorusFloat32 = 7,
  chorusFloat64 = 8,
  chorusBfloat16 = 9,
  chorusNumTypes = 10
} chorusDataType_t;

typedef enum CHORUS_ENUM_BASE {
  chorusSum = 0,
  chorusProd = 1,
  chorusMax = 2,
  chorusMin = 3,
  chorusAvg = 4
} chorusRedOp_t;

const char* chorusGetErrorString(chorusResult_t result);
/* The message of the last failed call on this thread ("" if none). */
const char* chorusGetLastError(chorusComm_t comm);
chorusResult_t chorusGetVersion(int* version);

/* Host memory for collective buffers (as ncclMemAlloc): page-aligned, zero-filled, and mappable
 * by the other ranks of the host. A blocking chorusAllReduce of 64 KiB or more whose sendbuff and
 * recvbuff come from here on every rank of a one-host communicator reads and writes the peers'
 * buffers directly, moving each byte once. Every rank of such a call must pass chorusMemAlloc
 * buffers, or none (a mix fails on every rank as a mismatch). Any other use is ordinary memory. */
chorusResult_t chorusMemAlloc(void** ptr, size_t size);
/* Frees what chorusMemAlloc returned (NULL: nothing); anything else is refused by name. The peers
 * that mapped the buffer unmap it at their next new mapping, so its memory is returned. */
chorusResult_t chorusMemFree(void* ptr);

chorusResult_t chorusGetUniqueId(chorusUniqueId* unique_id);
chorusResult_t chorusCommInitRank(chorusComm_t* comm, int nranks, chorusUniqueId comm_id, int rank);
/* ndev communicators in this process, ranks 0..ndev-1 of one job (threads drive them).
 * devlist is for GPU builds and may be NULL for CPU communicators. */
chorusResult_t chorusCommInitAll(chorusComm_t* comms, int ndev, const int* devlist);
/* Options of a communicator (as ncclConfig_t). Start from CHORUS_CONFIG_INITIALIZER and set
 * what differs; size lets later versions add fields (a config of the first version, without
 * `deterministic`, is still accepted). */
typedef struct {
  size_t size;            /* sizeof(chorusConfig_t) */
  double timeout_seconds; /* limit of every wait of this communicator; 0: CHORUS_TIMEOUT's */
  int deterministic; /* 1: deterministic reductions (below), 0: not; -1: CHORUS_DETERMINISTIC's */
} chorusConfig_t;
#define CHORUS_CONFIG_INITIALIZER \
  { sizeof(chorusConfig_t), 0.0, -1 }
/* chorusCommInitRank with options; config is read during the call only. */
chorusResult_t chorusCommInitRankConfig(chorusComm_t* comm, int nranks, chorusUniqueId comm_id,
                                        int rank, const chorusConfig_t* config);
/* Reads the launcher's variables: chorus-run/torchrun, OpenMPI's mpirun, Slurm's srun. */
chorusResult_t chorusCommInitFromEnv(chorusComm_t* comm);
/* Waits for queued operations (up to CHORUS_TIMEOUT), then frees the communicator. Destroy the
 * CUDA graphs that captured its calls first: a replay after this waits for ever on its stream (as
 * with NCCL), and a warning names how many captured calls live graphs still hold. */
chorusResult_t chorusCommDestroy(chorusComm_t comm);
/* Stops at once: the current operation fails here and on every peer. Any thread. */
chorusResult_t chorusCommAbort(chorusComm_t comm);
/* Revokes the communicator (as NCCL's ncclCommRevoke, MPI ULFM's MPI_Comm_revoke): the pending
 * and every later operation fails with chorusRevoked on every rank, within 100 ms of the call.
 * The news travels through the bootstrap store's watch channel and over every link (shared
 * memory, tcp, ib), so it arrives also when the store's process is gone. The handle stays valid for
 * chorusCommCount, chorusCommGetAsyncError and chorusCommDestroy. Any thread. */
chorusResult_t chorusCommRevoke(chorusComm_t comm);
chorusResult_t chorusCommGetAsyncError(chorusComm_t comm, chorusResult_t* async_error);
chorusResult_t chorusCommCount(const chorusComm_t comm, int* count);
chorusResult_t chorusCommUserRank(const chorusComm_t comm, int* rank);
/* *capturable = 1 when the communicator's device calls are captured into CUDA graphs whole (its
 * ranks are on one host, at most 32, with GPUs that map each other: they go over CUDA IPC, and a
 * replay is GPU work only); 0 when its device calls are staged through host memory: they are
 * captured too, but each replay's host part runs on a thread of the communicator's when the
 * graph's host node does (collectives on a communicator split off at the first collective's
 * capture, sends and receives on a communicator of the pair's two ranks alone, made from the
 * pair's first capture on). The same answer on every rank; local, no communication. */
chorusResult_t chorusCommCapturable(const chorusComm_t comm, int* capturable);
/* Collective over comm: ranks with the same color form a new communicator, ordered by key
 * (then by old rank). color CHORUS_SPLIT_NOCOLOR gives *newcomm = NULL. */
chorusResult_t chorusCommSplit(chorusComm_t comm, int color, int key, chorusComm_t* newcomm);
/* A new communicator of every rank but the excluded ones (as NCCL's ncclCommShrink), called by
 * each survivor, also on a communicator that failed or was revoked; ranks keep their order.
 * config (may be NULL: this communicator's) sets the new one's timeout and mode. Flags:
 *   CHORUS_SHRINK_DEFAULT  exclude exactly the listed ranks (every survivor lists the same);
 *   CHORUS_SHRINK_ABORT    revoke this communicator first, so its pending operations end;
 *   CHORUS_SHRINK_AGREE    the library excludes, besides the listed ranks, every rank that has
 *                          failed (died, or sent no word within 80% of the timeout), and all
 *                          survivors agree on the same set even when ranks die meanwhile
 *                          (collectives/shrink.cc says how, and what it assumes: the
 *                          bootstrap store's process is alive). A rank that dies after the
 *                          agreement fails the new communicator's creation: shrink again.
 * Bounded by the timeout; a survivor excluded by the others gets chorusRemoteError. */
#define CHORUS_SHRINK_DEFAULT 0x0
#define CHORUS_SHRINK_ABORT 0x1
#define CHORUS_SHRINK_AGREE 0x2
chorusResult_t chorusCommShrink(chorusComm_t comm, const int* excludeRanksList,
                                int excludeRanksCount, chorusComm_t* newcomm,
                                const chorusConfig_t* config, int shrinkFlags);

/* A larger communicator (as NCCL's ncclCommGrow): a running communicator's ranks, which keep
 * their numbers, and new processes that join the job -- a restarted worker, or more workers.
 * One member (the coordinator) gets a grow id from chorusCommGetUniqueId and hands it to the
 * newcomers by its own means; then every member calls chorusCommGrow(comm, nRanks, id on the
 * coordinator and NULL on the others, -1, ...) and each newcomer chorusCommGrow(NULL, nRanks,
 * &id, rank, ...) with rank in [old size, nRanks). An id serves one grow. config (may be NULL)
 * sets the new communicator's timeout and mode; by default members keep this communicator's,
 * newcomers take CHORUS_TIMEOUT's and the members' mode. Needs the bootstrap store's process
 * alive (chorus-run --elastic hosts it in the launcher); one grow at a time per job. Bounded by
 * the timeout; collectives/grow.cc has the protocol. */
chorusResult_t chorusCommGetUniqueId(chorusComm_t comm, chorusUniqueId* growId);
chorusResult_t chorusCommGrow(chorusComm_t comm, int nRanks, const chorusUniqueId* growId, int rank,
                              chorusComm_t* newcomm, const chorusConfig_t* config);

/* Blocking operations. */
chorusResult_t chorusSend(const void* sendbuff, size_t count, chorusDataType_t datatype, int peer,
                          chorusComm_t comm, chorusStream_t stream);
chorusResult_t chorusRecv(void* recvbuff, size_t count, chorusDataType_t datatype, int peer,
                          chorusComm_t comm, chorusStream_t stream);
chorusResult_t chorusBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                               chorusDataType_t datatype, int root, chorusComm_t comm,
                               chorusStream_t stream);
chorusResult_t chorusBarrier(chorusComm_t comm, chorusStream_t stream);

/* Reductions. op chorusAvg divides the sum by the number of ranks (integers: truncating).
 * f16 and bf16 are accumulated at float precision; avg divides before the last rounding. Algorithm,
 * chunk size and channels come from the tuner (CHORUS_ALGO=ring|tree|rd|direct|fold,
 * CHORUS_CHUNK_BYTES, CHORUS_NCHANNELS override it).
 *
 * Deterministic reductions (CHORUS_DETERMINISTIC=1, or config.deterministic = 1; every rank
 * must agree, creation fails otherwise). Off by default: the ring and tree are faster at some
 * sizes (README, "Deterministic reductions"). When on, chorusAllReduce, chorusReduce and
 * chorusReduceScatter give for every element, bit for bit, the left fold of the W ranks'
 * values in rank order,
 *     r = (...((x0 op x1) op x2) ... op x(W-1)),
 * computed in the accumulation type (float for f16 and bf16: each input widened exactly, one
 * rounding to the 16-bit type at the end; the type itself otherwise); for chorusAvg, r is then
 * divided by W once, before that rounding. The result depends on nothing but W and the values:
 * not on the element's position or the count, the call being cut into several calls, the
 * algorithm (CHORUS_ALGO=ring then runs an ordered direct reduce-scatter and all-gather, or at
 * two ranks the ring itself, which combines each element once, x0 op x1; rd and tree an
 * all-gather with a local ordered fold), chunk size, channel count, transport
 * (shm, tcp), timing, or CPU vector width (CHORUS_CPU_ISA). min and max follow the same
 * order (it matters for -0 vs +0 and for which NaN). Integer sum and prod wrap and are exact,
 * so they are deterministic in either mode. One exception: where sum, prod or avg give a NaN,
 * the result is a NaN but its payload bits are not part of the contract (the kernel builds
 * propagate different operands' payloads, as the hardware does). */
chorusResult_t chorusAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                               chorusDataType_t datatype, chorusRedOp_t op, chorusComm_t comm,
                               chorusStream_t stream);
/* recvbuff is significant on root only. */
chorusResult_t chorusReduce(const void* sendbuff, void* recvbuff, size_t count,
                            chorusDataType_t datatype, chorusRedOp_t op, int root,
                            chorusComm_t comm, chorusStream_t stream);
/* recvbuff holds nranks * sendcount elements, rank i's at offset i * sendcount. */
chorusResult_t chorusAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                               chorusDataType_t datatype, chorusComm_t comm, chorusStream_t stream);
/* sendbuff holds nranks * recvcount elements; rank i receives the reduction of block i. */
chorusResult_t chorusReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                   chorusDataType_t datatype, chorusRedOp_t op, chorusComm_t comm,
                                   chorusStream_t stream);

/* Each rank's own block (as MPI_Gather, MPI_Scatter, MPI_Alltoall, MPI_Alltoallv): all ten types,
 * no reduction, so the bytes arrive as sent. Every rank passes the same count, type and root. */
/* recvbuff (root only) holds nranks * sendcount elements, rank i's at offset i * sendcount. In
 * place: the root's sendbuff may lie anywhere in recvbuff (recvbuff + root * sendcount as
 * MPI_IN_PLACE). */
chorusResult_t chorusGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                            chorusDataType_t datatype, int root, chorusComm_t comm,
                            chorusStream_t stream);
/* sendbuff (root only) holds nranks * recvcount elements; rank i receives block i. In place: the
 * root's recvbuff may lie anywhere in sendbuff. */
chorusResult_t chorusScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                             chorusDataType_t datatype, int root, chorusComm_t comm,
                             chorusStream_t stream);
/* sendbuff: nranks blocks of count elements, block j goes to rank j; recvbuff block i came from
 * rank i. In place (sendbuff == recvbuff, or any overlap) works: the input is first copied
 * aside, which costs one more copy of it and as much memory for the call's duration. */
chorusResult_t chorusAllToAll(const void* sendbuff, void* recvbuff, size_t count,
                              chorusDataType_t datatype, chorusComm_t comm, chorusStream_t stream);
/* MPI_Alltoallv's shape: counts and displacements in elements, one per rank (nranks entries
 * each). Block j (sendcounts[j] elements at sendbuff + sdispls[j]) goes to rank j; block i of
 * recvbuff (recvcounts[i] at rdispls[i]) comes from rank i. Rank i's sendcounts[j] must equal
 * rank j's recvcounts[i]: a pair that disagrees fails on every rank with chorusMismatch naming
 * both ranks and both counts (no truncated block). Zero counts are fine. The arrays are copied
 * by the call (an I-call's caller may free them when it returns); in place as chorusAllToAll. */
chorusResult_t chorusAllToAllv(const void* sendbuff, const size_t* sendcounts,
                               const size_t* sdispls, void* recvbuff, const size_t* recvcounts,
                               const size_t* rdispls, chorusDataType_t datatype, chorusComm_t comm,
                               chorusStream_t stream);

/* Groups (as ncclGroupStart/End): calls between Start and End are checked and queued, then run
 * at End: the collectives first, in call order (on each communicator every rank must make them
 * in the same order, as outside a group; those on host buffers are queued on every communicator
 * before End waits for any, so one thread may drive several communicators, as with
 * chorusCommInitAll), then the sends and receives together, so that pairwise exchanges cannot
 * deadlock. End returns when the host calls are done and the device calls enqueued on their
 * streams; its result is the first error. Inside a group the chorusI* forms are refused (End
 * completes every call), and so are bad arguments, at the call. */
chorusResult_t chorusGroupStart(void);
chorusResult_t chorusGroupEnd(void);

/* Asynchronous operations: a request to wait on. tag must match between sender and receiver
 * (messages between a pair are matched in call order, and the tag is checked). */
chorusResult_t chorusIsend(const void* sendbuff, size_t count, chorusDataType_t datatype, int peer,
                           int tag, chorusComm_t comm, chorusRequest_t* request);
chorusResult_t chorusIrecv(void* recvbuff, size_t count, chorusDataType_t datatype, int peer,
                           int tag, chorusComm_t comm, chorusRequest_t* request);
chorusResult_t chorusIbroadcast(const void* sendbuff, void* recvbuff, size_t count,
                                chorusDataType_t datatype, int root, chorusComm_t comm,
                                chorusRequest_t* request);
chorusResult_t chorusIbarrier(chorusComm_t comm, chorusRequest_t* request);
chorusResult_t chorusIallReduce(const void* sendbuff, void* recvbuff, size_t count,
                                chorusDataType_t datatype, chorusRedOp_t op, chorusComm_t comm,
                                chorusRequest_t* request);
chorusResult_t chorusIreduce(const void* sendbuff, void* recvbuff, size_t count,
                             chorusDataType_t datatype, chorusRedOp_t op, int root,
                             chorusComm_t comm, chorusRequest_t* request);
chorusResult_t chorusIallGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                                chorusDataType_t datatype, chorusComm_t comm,
                                chorusRequest_t* request);
chorusResult_t chorusIreduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                    chorusDataType_t datatype, chorusRedOp_t op, chorusComm_t comm,
                                    chorusRequest_t* request);
chorusResult_t chorusIgather(const void* sendbuff, void* recvbuff, size_t sendcount,
                             chorusDataType_t datatype, int root, chorusComm_t comm,
                             chorusRequest_t* request);
chorusResult_t chorusIscatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                              chorusDataType_t datatype, int root, chorusComm_t comm,
                              chorusRequest_t* request);
chorusResult_t chorusIallToAll(const void* sendbuff, void* recvbuff, size_t count,
                               chorusDataType_t datatype, chorusComm_t comm,
                               chorusRequest_t* request);
chorusResult_t chorusIallToAllv(const void* sendbuff, const size_t* sendcounts,
                                const size_t* sdispls, void* recvbuff, const size_t* recvcounts,
                                const size_t* rdispls, chorusDataType_t datatype, chorusComm_t comm,
                                chorusRequest_t* request);
/* Waits up to timeout_seconds (< 0, INFINITY or > 1e9: until the operation ends, itself bounded
 * by CHORUS_TIMEOUT; NaN: chorusInvalidArgument). chorusInProgress when the time ran out first;
 * the operation's own error otherwise. */
chorusResult_t chorusWait(chorusRequest_t request, double timeout_seconds);
/* *done = 1 when finished; returns the operation's error once finished. */
chorusResult_t chorusTest(chorusRequest_t request, int* done);
/* Releases the handle; a running operation continues (its buffers must stay valid). */
chorusResult_t chorusRequestFree(chorusRequest_t request);

#ifdef __cplusplus
}
#endif

#endif /* CHORUS_CHORUS_H_ */
