// Autograd: the tape (Nodes linked by Edges), grad mode, and the reverse sweep.
//
// Every op whose inputs need gradients records one Node on its output. backward() sorts the
// nodes reachable from the loss in reverse topological order, runs each node's backward once
// all its consumers have contributed, accumulates into leaf .grad (in place, so a grad that is a
// view into a DDP bucket stays one), and fires each leaf's gradient-ready hooks the moment the
// last edge into that leaf has been processed: once per leaf per backward, in the order the
// gradients become final.
#pragma once

#include <array>
#include <memory>
#include <span>

#include "ddp/tensor/tensor.h"

namespace chorus {

// Where a node sends the gradient for one of its inputs: another node, or a leaf's .grad.
struct Edge {
  std::shared_ptr<Node> fn;
  std::shared_ptr<TensorImpl> leaf;
  bool defined() const { return fn || leaf; }
};

class Node {
 public:
  static constexpr int kMaxInputs = 3;
  virtual ~Node() = default;
  virtual const char* name() const = 0;
  // grad_output has the shape of the node's output. Fill grad_inputs[i] for each input i whose
  // edge is defined (leave the others undefined). Tensors saved by a node are detached, so the
  // tape holds no cycles.
  virtual void backward(const Tensor& grad_output, std::span<Tensor> grad_inputs) = 0;

  const Edge& edge(int i) const { return edges_[static_cast<size_t>(i)]; }
  int num_inputs() const { return num_inputs_; }
  // Edge i comes from inputs[i]: its grad_fn, or the tensor itself when it is a leaf that
  // requires grad.
  void set_inputs(std::initializer_list<const Tensor*> inputs);

  Tensor grad_accum_;  // engine-owned: the sum of incoming gradients during a backward

 private:
  std::array<Edge, kMaxInputs> edges_;
  int num_inputs_ = 0;
};

// Grad mode is per thread, on by default. NoGradGuard turns it off for a scope.
bool grad_mode_enabled();
class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

// True when grad mode is on and any defined input requires grad: the op must record a node.
bool any_requires_grad(std::initializer_list<const Tensor*> inputs);
// Attaches node (already given its inputs) to out: out.grad_fn = node, out.requires_grad = true.
void record(Tensor& out, std::shared_ptr<Node> node);

// The reverse sweep behind Tensor::backward(): root must hold one element; its gradient is 1.
void run_backward(const Tensor& root);

}  // namespace chorus
