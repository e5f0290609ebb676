// ProcessGroupChorus: torch.distributed's backend "chorus" -- every c10d operation as chorus
// collectives on one communicator per group.
//
// Set-up: rank 0 makes a chorus unique id and puts it in the group's c10d store under a key
// counted per creation, the others read it, then all make the communicator with the group's
// timeout as chorus's limit for every wait. Operations are asynchronous: each call submits chorus
// requests and returns a WorkChorus that the group's Completer finishes in call order.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "chorus/chorus.h"
#include "tensors.h"
#include "torch_version.h"
#include "work.h"

namespace chorus_torch {

class ProcessGroupChorus : public PgBase {
 public:
  ProcessGroupChorus(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                     std::chrono::milliseconds timeout);
  // A group over a communicator made already (shrink); the group owns it.
  explicit ProcessGroupChorus(chorusComm_t comm);
  ~ProcessGroupChorus() override;

  const std::string getBackendName() const override { return "chorus"; }

  using Work = c10d::Work;
  using WorkPtr = c10::intrusive_ptr<Work>;
  using Tensors = std::vector<at::Tensor>;
  using TensorLists = std::vector<std::vector<at::Tensor>>;

  WorkPtr broadcast(Tensors& tensors, const c10d::BroadcastOptions& opts) override;
  WorkPtr allreduce(Tensors& tensors, const c10d::AllreduceOptions& opts) override;
  WorkPtr allreduce_coalesced(Tensors& tensors,
                              const c10d::AllreduceCoalescedOptions& opts) override;
  WorkPtr reduce(Tensors& tensors, const c10d::ReduceOptions& opts) override;
  WorkPtr allgather(TensorLists& outputs, Tensors& inputs,
                    const c10d::AllgatherOptions& opts) override;
  WorkPtr _allgather_base(at::Tensor& output, at::Tensor& input,
                          const c10d::AllgatherOptions& opts) override;
  WorkPtr allgather_coalesced(TensorLists& outputs, Tensors& inputs,
                              const c10d::AllgatherOptions& opts) override;
  WorkPtr gather(TensorLists& outputs, Tensors& inputs, const c10d::GatherOptions& opts) override;
  WorkPtr scatter(Tensors& outputs, TensorLists& inputs, const c10d::ScatterOptions& opts) override;
  WorkPtr reduce_scatter(Tensors& outputs, TensorLists& inputs,
                         const c10d::ReduceScatterOptions& opts) override;
  WorkPtr _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                               const c10d::ReduceScatterOptions& opts) override;
  WorkPtr alltoall_base(at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_splits,
                        std::vector<int64_t>& input_splits,
                        const c10d::AllToAllOptions& opts) override;
  WorkPtr alltoall(Tensors& outputs, Tensors& inputs, const c10d::AllToAllOptions& opts) override;
  WorkPtr send(Tensors& tensors, int dst, int tag) override;
  WorkPtr recv(Tensors& tensors, int src, int tag) override;
  WorkPtr recvAnysource(Tensors& tensors, int tag) override;
  WorkPtr barrier(const c10d::BarrierOptions& opts) override;

  chorusComm_t comm() const { return comm_; }

  // chorusCommRevoke: every pending and later operation of this group fails (its Work raises),
  // here and on every other rank. Any thread.
  void revoke();
  // chorusCommShrink: a new group of this one's ranks but `exclude` (or, with `agree`, but the
  // ranks the survivors find failed and agree on), numbered in the same order.
  c10::intrusive_ptr<ProcessGroupChorus> shrink(const std::vector<int>& exclude, bool agree);

 private:
  // A Work for `call`, its request made by `submit` (a chorusI* call); throws with chorus's
  // message when the submission is refused.
  c10::intrusive_ptr<WorkChorus> launch(
      const char* call, c10d::OpType type, Tensors outputs, Tensors keep,
      const std::function<chorusResult_t(chorusRequest_t*)>& submit,
      std::function<void()> after = nullptr);
  std::string what(const char* call) const;
  int check_root(int64_t root, const char* call) const;
  int check_peer(int peer, const char* call) const;

  chorusComm_t comm_ = nullptr;
  std::unique_ptr<Completer> completer_;
};

// The creator torch.distributed calls (store, rank, size, timeout).
c10::intrusive_ptr<PgBase> create_process_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                int rank, int size,
                                                std::chrono::milliseconds timeout);

}  // namespace chorus_torch
