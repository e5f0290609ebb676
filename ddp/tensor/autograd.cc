// The autograd engine: topological sort, reverse sweep, accumulation, gradient-ready hooks.
#include "ddp/tensor/autograd.h"

#include <fmt/format.h>

#include <stdexcept>
#include <unordered_map>
#include <vector>

#include "ddp/tensor/device_cache.h"
#include "kernels/cpu/elementwise.h"

namespace chorus {
namespace {

thread_local bool t_grad_enabled = true;

// y = a + b on the tensors' device (they are on one: checked by the ops that made them).
void add_on(const Tensor& like, const float* a, const float* b, float* y) {
  if (like.device().is_cpu()) return kernels::cpu::add(like.numel(), a, b, y);
  cuda_backend().add(like.device(), like.numel(), a, b, y);
}

// Returns a + b in a fresh buffer: incoming gradients may alias each other (add's backward hands
// the same tensor to both inputs), so accumulation never writes into one it did not create.
Tensor sum_fresh(const Tensor& a, const Tensor& b) {
  Tensor out = Tensor::empty(a.shape(), a.device());
  add_on(a, a.data(), b.data(), out.data());
  return out;
}

void accumulate_into_leaf(TensorImpl& leaf, const Tensor& g) {
  check_shape("backward: leaf gradient", leaf.shape, g.shape());
  if (!leaf.grad.defined()) {
    leaf.grad = g.clone();
    return;
  }
  add_on(g, leaf.grad.data(), g.data(), leaf.grad.data());
}

void finish_leaf_edge(TensorImpl& leaf, const std::shared_ptr<TensorImpl>& owner) {
  if (--leaf.pending_edges > 0) return;
  Tensor param(owner);
  for (auto& hook : leaf.grad_ready_hooks) hook(param);
}

// Post-order DFS: inputs before consumers. Also counts the edges into every leaf.
void topo_sort(Node* root, std::vector<Node*>& order) {
  std::unordered_map<Node*, bool> seen;
  std::vector<std::pair<Node*, int>> stack{{root, 0}};
  seen[root] = true;
  while (!stack.empty()) {
    auto& [node, next] = stack.back();
    if (next < node->num_inputs()) {
      const Edge& e = node->edge(next++);
      if (e.fn && !seen[e.fn.get()]) {
        seen[e.fn.get()] = true;
        stack.emplace_back(e.fn.get(), 0);
      }
      continue;
    }
    order.push_back(node);
    stack.pop_back();
  }
  for (Node* n : order)
    for (int i = 0; i < n->num_inputs(); ++i)
      if (n->edge(i).leaf) n->edge(i).leaf->pending_edges = 0;
  for (Node* n : order)
    for (int i = 0; i < n->num_inputs(); ++i)
      if (n->edge(i).leaf) ++n->edge(i).leaf->pending_edges;
}

}  // namespace

void Node::set_inputs(std::initializer_list<const Tensor*> inputs) {
  num_inputs_ = 0;
  for (const Tensor* t : inputs) {
    Edge& e = edges_[static_cast<size_t>(num_inputs_++)];
    if (!t || !t->defined() || !t->requires_grad()) continue;
    if (t->grad_fn())
      e.fn = t->grad_fn();
    else
      e.leaf = t->impl_ptr();
  }
}

bool grad_mode_enabled() {
  return t_grad_enabled;
}
NoGradGuard::NoGradGuard() : previous_(t_grad_enabled) {
  t_grad_enabled = false;
}
NoGradGuard::~NoGradGuard() {
  t_grad_enabled = previous_;
}

bool any_requires_grad(std::initializer_list<const Tensor*> inputs) {
  if (!t_grad_enabled) return false;
  for (const Tensor* t : inputs)
    if (t && t->defined() && t->requires_grad()) return true;
  return false;
}

void record(Tensor& out, std::shared_ptr<Node> node) {
  out.impl()->requires_grad = true;
  out.impl()->grad_fn = std::move(node);
}

void run_backward(const Tensor& root) {
  if (root.numel() != 1)
    throw std::invalid_argument(
        fmt::format("backward: expected a one-element loss, got shape {}", root.shape().str()));
  if (!root.requires_grad())
    throw std::invalid_argument(
        "backward: expected a tensor that requires grad, got one that does not");
  Tensor one = Tensor::full(root.shape(), 1.0f, root.device());
  if (!root.grad_fn()) {
    accumulate_into_leaf(*root.impl(), one);
    for (auto& hook : root.impl()->grad_ready_hooks) hook(const_cast<Tensor&>(root));
    return;
  }
  std::vector<Node*> order;
  topo_sort(root.grad_fn().get(), order);
  root.grad_fn()->grad_accum_ = one;
  std::array<Tensor, Node::kMaxInputs> grads;
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    Node* node = *it;
    Tensor g = std::move(node->grad_accum_);
    node->grad_accum_ = Tensor();
    const int n = node->num_inputs();
    for (int i = 0; i < n; ++i) grads[static_cast<size_t>(i)] = Tensor();
    if (g.defined()) node->backward(g, std::span<Tensor>(grads.data(), static_cast<size_t>(n)));
    for (int i = 0; i < n; ++i) {
      const Edge& e = node->edge(i);
      Tensor& gi = grads[static_cast<size_t>(i)];
      if (e.fn && gi.defined()) {
        e.fn->grad_accum_ = e.fn->grad_accum_.defined() ? sum_fresh(e.fn->grad_accum_, gi) : gi;
      } else if (e.leaf) {
        if (gi.defined()) accumulate_into_leaf(*e.leaf, gi);
        finish_leaf_edge(*e.leaf, e.leaf);
      }
      gi = Tensor();
    }
  }
}

}  // namespace chorus
