// chorus.hpp: a header-only C++ layer over the C ABI in chorus.h. RAII for communicators and
// requests, exceptions (chorus::Error, with the code and the full message) instead of codes.
//
//   auto comm = chorus::Communicator::from_env();
//   comm.broadcast(data.data(), data.size(), chorusFloat32, /*root=*/0);
//   chorus::Work w = comm.ibarrier();  ...  w.wait();
#pragma once

#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "chorus/chorus.h"

namespace chorus {

class Error : public std::runtime_error {
 public:
  Error(chorusResult_t code, const std::string& what) : std::runtime_error(what), code_(code) {}
  chorusResult_t code() const { return code_; }

 private:
  chorusResult_t code_;
};

inline void check(chorusResult_t rc) {
  if (rc != chorusSuccess && rc != chorusInProgress) {
    std::string msg = chorusGetLastError(nullptr);
    throw Error(rc, std::string(chorusGetErrorString(rc)) + ": " + msg);
  }
}

// An operation in flight. Destroying it does not cancel the operation.
class Work {
 public:
  Work() = default;
  explicit Work(chorusRequest_t r) : req_(r) {}
  Work(Work&& o) noexcept : req_(std::exchange(o.req_, nullptr)) {}
  Work& operator=(Work&& o) noexcept {
    reset();
    req_ = std::exchange(o.req_, nullptr);
    return *this;
  }
  ~Work() { reset(); }
  // Waits; true when done (throws the operation's error), false when `seconds` ran out first.
  bool wait(double seconds = -1) {
    chorusResult_t rc = chorusWait(req_, seconds);
    check(rc);
    return rc != chorusInProgress;
  }
  bool test() {
    int done = 0;
    check(chorusTest(req_, &done));
    return done != 0;
  }

 private:
  void reset() {
    if (req_) chorusRequestFree(req_);
    req_ = nullptr;
  }
  chorusRequest_t req_ = nullptr;
};

class Communicator {
 public:
  Communicator() = default;
  static Communicator from_env() {
    chorusComm_t c = nullptr;
    check(chorusCommInitFromEnv(&c));
    return Communicator(c);
  }
  static chorusUniqueId unique_id() {
    chorusUniqueId id;
    check(chorusGetUniqueId(&id));
    return id;
  }
  static Communicator init(int nranks, const chorusUniqueId& id, int rank) {
    chorusComm_t c = nullptr;
    check(chorusCommInitRank(&c, nranks, id, rank));
    return Communicator(c);
  }
  // With a limit for every wait of this communicator (seconds; 0: CHORUS_TIMEOUT's).
  static Communicator init(int nranks, const chorusUniqueId& id, int rank, double timeout_seconds) {
    chorusComm_t c = nullptr;
    chorusConfig_t config = CHORUS_CONFIG_INITIALIZER;
    config.timeout_seconds = timeout_seconds;
    check(chorusCommInitRankConfig(&c, nranks, id, rank, &config));
    return Communicator(c);
  }
  Communicator(Communicator&& o) noexcept : comm_(std::exchange(o.comm_, nullptr)) {}
  Communicator& operator=(Communicator&& o) noexcept {
    if (this != &o) {
      destroy_quietly();
      comm_ = std::exchange(o.comm_, nullptr);
    }
    return *this;
  }
  ~Communicator() { destroy_quietly(); }

  explicit operator bool() const { return comm_ != nullptr; }
  chorusComm_t handle() const { return comm_; }
  int rank() const {
    int r = -1;
    check(chorusCommUserRank(comm_, &r));
    return r;
  }
  int size() const {
    int n = 0;
    check(chorusCommCount(comm_, &n));
    return n;
  }

  // Every device call may be captured into a CUDA graph, sends and receives too
  // (chorusCommCapturable).
  bool capturable() const {
    int yes = 0;
    check(chorusCommCapturable(comm_, &yes));
    return yes != 0;
  }

  void send(const void* buf, size_t count, chorusDataType_t dt, int peer, int tag = 0) {
    if (tag == 0) return check(chorusSend(buf, count, dt, peer, comm_, nullptr));
    isend(buf, count, dt, peer, tag).wait();
  }
  void recv(void* buf, size_t count, chorusDataType_t dt, int peer, int tag = 0) {
    if (tag == 0) return check(chorusRecv(buf, count, dt, peer, comm_, nullptr));
    irecv(buf, count, dt, peer, tag).wait();
  }
  void broadcast(void* buf, size_t count, chorusDataType_t dt, int root) {
    check(chorusBroadcast(buf, buf, count, dt, root, comm_, nullptr));
  }
  void barrier() { check(chorusBarrier(comm_, nullptr)); }

  // On device buffers, enqueued on `stream` (nullptr: the legacy default stream); returns
  // without waiting for the GPU.
  void all_reduce(const void* send, void* recv, size_t count, chorusDataType_t dt, chorusRedOp_t op,
                  chorusStream_t stream = nullptr) {
    check(chorusAllReduce(send, recv, count, dt, op, comm_, stream));
  }
  void reduce(const void* send, void* recv, size_t count, chorusDataType_t dt, chorusRedOp_t op,
              int root) {
    check(chorusReduce(send, recv, count, dt, op, root, comm_, nullptr));
  }
  void all_gather(const void* send, void* recv, size_t sendcount, chorusDataType_t dt) {
    check(chorusAllGather(send, recv, sendcount, dt, comm_, nullptr));
  }
  void reduce_scatter(const void* send, void* recv, size_t recvcount, chorusDataType_t dt,
                      chorusRedOp_t op) {
    check(chorusReduceScatter(send, recv, recvcount, dt, op, comm_, nullptr));
  }
  // recv (root only): size() blocks of sendcount elements.
  void gather(const void* send, void* recv, size_t sendcount, chorusDataType_t dt, int root) {
    check(chorusGather(send, recv, sendcount, dt, root, comm_, nullptr));
  }
  // send (root only): size() blocks of recvcount elements; this rank receives block rank().
  void scatter(const void* send, void* recv, size_t recvcount, chorusDataType_t dt, int root) {
    check(chorusScatter(send, recv, recvcount, dt, root, comm_, nullptr));
  }
  void all_to_all(const void* send, void* recv, size_t count, chorusDataType_t dt) {
    check(chorusAllToAll(send, recv, count, dt, comm_, nullptr));
  }
  // Counts and displacements in elements, size() entries each (copied by the call).
  void all_to_all_v(const void* send, const size_t* sendcounts, const size_t* sdispls, void* recv,
                    const size_t* recvcounts, const size_t* rdispls, chorusDataType_t dt) {
    check(
        chorusAllToAllv(send, sendcounts, sdispls, recv, recvcounts, rdispls, dt, comm_, nullptr));
  }
  Work igather(const void* send, void* recv, size_t sendcount, chorusDataType_t dt, int root) {
    chorusRequest_t r = nullptr;
    check(chorusIgather(send, recv, sendcount, dt, root, comm_, &r));
    return Work(r);
  }
  Work iscatter(const void* send, void* recv, size_t recvcount, chorusDataType_t dt, int root) {
    chorusRequest_t r = nullptr;
    check(chorusIscatter(send, recv, recvcount, dt, root, comm_, &r));
    return Work(r);
  }
  Work iall_to_all(const void* send, void* recv, size_t count, chorusDataType_t dt) {
    chorusRequest_t r = nullptr;
    check(chorusIallToAll(send, recv, count, dt, comm_, &r));
    return Work(r);
  }
  Work iall_to_all_v(const void* send, const size_t* sendcounts, const size_t* sdispls, void* recv,
                     const size_t* recvcounts, const size_t* rdispls, chorusDataType_t dt) {
    chorusRequest_t r = nullptr;
    check(chorusIallToAllv(send, sendcounts, sdispls, recv, recvcounts, rdispls, dt, comm_, &r));
    return Work(r);
  }
  Work iall_reduce(const void* send, void* recv, size_t count, chorusDataType_t dt,
                   chorusRedOp_t op) {
    chorusRequest_t r = nullptr;
    check(chorusIallReduce(send, recv, count, dt, op, comm_, &r));
    return Work(r);
  }
  Work ireduce(const void* send, void* recv, size_t count, chorusDataType_t dt, chorusRedOp_t op,
               int root) {
    chorusRequest_t r = nullptr;
    check(chorusIreduce(send, recv, count, dt, op, root, comm_, &r));
    return Work(r);
  }
  Work iall_gather(const void* send, void* recv, size_t sendcount, chorusDataType_t dt) {
    chorusRequest_t r = nullptr;
    check(chorusIallGather(send, recv, sendcount, dt, comm_, &r));
    return Work(r);
  }
  Work ireduce_scatter(const void* send, void* recv, size_t recvcount, chorusDataType_t dt,
                       chorusRedOp_t op) {
    chorusRequest_t r = nullptr;
    check(chorusIreduceScatter(send, recv, recvcount, dt, op, comm_, &r));
    return Work(r);
  }

  Work isend(const void* buf, size_t count, chorusDataType_t dt, int peer, int tag = 0) {
    chorusRequest_t r = nullptr;
    check(chorusIsend(buf, count, dt, peer, tag, comm_, &r));
    return Work(r);
  }
  Work irecv(void* buf, size_t count, chorusDataType_t dt, int peer, int tag = 0) {
    chorusRequest_t r = nullptr;
    check(chorusIrecv(buf, count, dt, peer, tag, comm_, &r));
    return Work(r);
  }
  Work ibroadcast(const void* send, void* recv, size_t count, chorusDataType_t dt, int root) {
    chorusRequest_t r = nullptr;
    check(chorusIbroadcast(send, recv, count, dt, root, comm_, &r));
    return Work(r);
  }
  Work ibarrier() {
    chorusRequest_t r = nullptr;
    check(chorusIbarrier(comm_, &r));
    return Work(r);
  }
  // Collective; an empty Communicator for color CHORUS_SPLIT_NOCOLOR.
  Communicator split(int color, int key) {
    chorusComm_t c = nullptr;
    check(chorusCommSplit(comm_, color, key, &c));
    return Communicator(c);
  }
  // A communicator of the survivors: every rank but `exclude`; flags CHORUS_SHRINK_*.
  Communicator shrink(const std::vector<int>& exclude, int flags = CHORUS_SHRINK_DEFAULT) {
    chorusComm_t c = nullptr;
    check(chorusCommShrink(comm_, exclude.data(), static_cast<int>(exclude.size()), &c, nullptr,
                           flags));
    return Communicator(c);
  }
  // Growing (chorus.h, chorusCommGrow): the coordinator's id for the newcomers; the members'
  // larger communicator (the coordinator passes its id, the others nothing); a newcomer's.
  chorusUniqueId grow_id() {
    chorusUniqueId id;
    check(chorusCommGetUniqueId(comm_, &id));
    return id;
  }
  Communicator grow(int nranks, const chorusUniqueId* id = nullptr) {
    chorusComm_t c = nullptr;
    check(chorusCommGrow(comm_, nranks, id, -1, &c, nullptr));
    return Communicator(c);
  }
  static Communicator join_grow(int nranks, const chorusUniqueId& id, int rank) {
    chorusComm_t c = nullptr;
    check(chorusCommGrow(nullptr, nranks, &id, rank, &c, nullptr));
    return Communicator(c);
  }
  void abort() { check(chorusCommAbort(comm_)); }
  void revoke() { check(chorusCommRevoke(comm_)); }
  void destroy() { check(chorusCommDestroy(comm_)); }
  // Keeps the (destroyed) handle so later calls fail with an error; see chorus.h.
  chorusResult_t async_error() const {
    chorusResult_t e = chorusSuccess;
    check(chorusCommGetAsyncError(comm_, &e));
    return e;
  }

 private:
  explicit Communicator(chorusComm_t c) : comm_(c) {}
  void destroy_quietly() {
    if (comm_) chorusCommDestroy(comm_);
    comm_ = nullptr;
  }
  chorusComm_t comm_ = nullptr;
};

}  // namespace chorus
