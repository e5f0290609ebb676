// ProcessGroupChorus: the operations on lists of tensors -- all-gather, gather, scatter,
// reduce-scatter and all-to-all (process_group.h). Lists are staged through one contiguous
// block so that each operation is a single chorus call.
#include <c10/util/Exception.h>

#include "process_group.h"

namespace chorus_torch {

namespace {

// The list of `size` tensors a rooted or all-to-all call takes (outputs[0] / inputs[0]).
std::vector<at::Tensor>& rank_list(std::vector<std::vector<at::Tensor>>& lists, int size,
                                   const char* call, const char* what) {
  TORCH_CHECK(lists.size() == 1, "chorus: ", call, ": takes one list of ", what,
              " tensors per process, got ", lists.size());
  TORCH_CHECK(static_cast<int>(lists[0].size()) == size, "chorus: ", call, ": ", what, " holds ",
              lists[0].size(), " tensors, expected one per rank (", size, ")");
  return lists[0];
}

void check_pair(const at::Tensor& out, const at::Tensor& in, int64_t ratio, const char* call) {
  check_tensor(out, call);
  check_tensor(in, call);
  TORCH_CHECK(out.scalar_type() == in.scalar_type(), "chorus: ", call, ": output dtype ",
              out.scalar_type(), " differs from input dtype ", in.scalar_type());
  TORCH_CHECK(out.numel() * (ratio > 0 ? 1 : -ratio) == in.numel() * (ratio > 0 ? ratio : 1),
              "chorus: ", call, ": output has ", out.numel(), " elements and input ", in.numel(),
              ", expected ",
              ratio > 0 ? "output = world size x input" : "input = world size x output",
              " (world size ", ratio > 0 ? ratio : -ratio, ")");
}

}  // namespace

ProcessGroupChorus::WorkPtr ProcessGroupChorus::allgather(TensorLists& outputs, Tensors& inputs,
                                                          const c10d::AllgatherOptions&) {
  at::Tensor in = single(inputs, "all_gather", "input").contiguous();
  Tensors& outs = rank_list(outputs, getSize(), "all_gather", "output");
  check_same(outs, in, "all_gather", "output_tensor_list");
  at::Tensor flat = at::empty({getSize() * in.numel()}, in.options());
  const Reduction m = moved_as(in);
  const size_t n = in.numel() * m.per_element;
  return launch(
      "all_gather", c10d::OpType::ALLGATHER, outs, {in, flat},
      [&](chorusRequest_t* r) {
        return chorusIallGather(in.data_ptr(), flat.data_ptr(), n, m.dtype, comm_, r);
      },
      [flat, outs] { unflatten(flat, outs); });
}

ProcessGroupChorus::WorkPtr ProcessGroupChorus::_allgather_base(at::Tensor& output,
                                                                at::Tensor& input,
                                                                const c10d::AllgatherOptions&) {
  check_pair(output, input, getSize(), "all_gather_into_tensor");
  at::Tensor in = input.contiguous();
  Output out(output);
  const Reduction m = moved_as(in);
  const size_t n = in.numel() * m.per_element;
  return launch(
      "all_gather_into_tensor", c10d::OpType::_ALLGATHER_BASE, {output}, {in, out.buffer},
      [&](chorusRequest_t* r) {
        return chorusIallGather(in.data_ptr(), out.buffer.data_ptr(), n, m.dtype, comm_, r);
      },
      [out] { out.finish(); });
}

ProcessGroupChorus::WorkPtr ProcessGroupChorus::allgather_coalesced(TensorLists& outputs,
                                                                    Tensors& inputs,
                                                                    const c10d::AllgatherOptions&) {
  const char* call = "all_gather_coalesced";
  TORCH_CHECK(!inputs.empty(), "chorus: ", call, ": no input tensors");
  TORCH_CHECK(static_cast<int>(outputs.size()) == getSize(), "chorus: ", call, ": ", outputs.size(),
              " output lists, expected one per rank (", getSize(), ")");
  for (const at::Tensor& in : inputs) {
    check_tensor(in, call);
    TORCH_CHECK(in.scalar_type() == inputs[0].scalar_type(), "chorus: ", call,
                ": inputs of different dtypes (one dtype per call)");
  }
  for (size_t r = 0; r < outputs.size(); ++r) {
    TORCH_CHECK(outputs[r].size() == inputs.size(), "chorus: ", call, ": output list ", r, " has ",
                outputs[r].size(), " tensors, expected ", inputs.size(), " (one per input)");
    for (size_t j = 0; j < inputs.size(); ++j)
      check_same({outputs[r][j]}, inputs[j], call, "output");
  }
  at::Tensor flat_in = flatten(inputs);
  at::Tensor flat_out = at::empty({getSize() * flat_in.numel()}, flat_in.options());
  const Reduction m = moved_as(flat_in);
  const size_t n = flat_in.numel() * m.per_element;
  Tensors all;
  for (auto& list : outputs) all.insert(all.end(), list.begin(), list.end());
  return launch(
      call, c10d::OpType::ALLGATHER_COALESCED, all, {flat_in, flat_out},
      [&](chorusRequest_t* r) {
        return chorusIallGather(flat_in.data_ptr(), flat_out.data_ptr(), n, m.dtype, comm_, r);
      },
      [flat_out, all] { unflatten(flat_out, all); });
}

ProcessGroupChorus::WorkPtr ProcessGroupChorus::gather(TensorLists& outputs, Tensors& inputs,
                                                       const c10d::GatherOptions& opts) {
  at::Tensor in = single(inputs, "gather", "input").contiguous();
  const int root = static_cast<int>(opts.rootRank);
  Tensors outs;
  at::Tensor flat;
  if (getRank() == root) {
    outs = rank_list(outputs, getSize(), "gather", "gather_list");
    check_same(outs, in, "gather", "gather_list");
    flat = at::empty({getSize() * in.numel()}, in.options());
  } else {
    TORCH_CHECK(outputs.empty() || (outputs.size() == 1 && outputs[0].empty()),
                "chorus: ", what("gather"), ": gather_list is for the root (rank ", root, ") only");
  }
  const Reduction m = moved_as(in);
  const size_t n = in.numel() * m.per_element;
  void* recv = flat.defined() ? flat.data_ptr() : nullptr;
  return launch(
      "gather", c10d::OpType::GATHER, outs, {in, flat},
      [&](chorusRequest_t* r) {
        return chorusIgather(in.data_ptr(), recv, n, m.dtype, root, comm_, r);
      },
      [flat, outs] {
        if (flat.defined()) unflatten(flat, outs);
      });
}

ProcessGroupChorus::WorkPtr ProcessGroupChorus::scatter(Tensors& outputs, TensorLists& inputs,
                                                        const c10d::ScatterOptions& opts) {
  at::Tensor& o = single(outputs, "scatter", "output");
  const int root = static_cast<int>(opts.rootRank);
  at::Tensor flat;
  if (getRank() == root) {
    Tensors& ins = rank_list(inputs, getSize(), "scatter", "scatter_list");
    check_same(ins, o, "scatter", "scatter_list");
    flat = flatten(ins);
  } else {
    TORCH_CHECK(inputs.empty() || (inputs.size() == 1 && inputs[0].empty()),
                "chorus: ", what("scatter"), ": scatter_list is for the root (rank ", root,
                ") only");
  }
  Output out(o);
  const Reduction m = moved_as(o);
  const size_t n = o.numel() * m.per_element;
  const void* send = flat.defined() ? flat.data_ptr() : nullptr;
  return launch(
      "scatter", c10d::OpType::SCATTER, {o}, {flat, out.buffer},
      [&](chorusRequest_t* r) {
        return chorusIscatter(send, out.buffer.data_ptr(), n, m.dtype, root, comm_, r);
      },
      [out] { out.finish(); });
}

ProcessGroupChorus::WorkPtr ProcessGroupChorus::reduce_scatter(
    Tensors& outputs, TensorLists& inputs, const c10d::ReduceScatterOptions& opts) {
  at::Tensor& o = single(outputs, "reduce_scatter", "output");
  Tensors& ins = rank_list(inputs, getSize(), "reduce_scatter", "input_list");
  check_same(ins, o, "reduce_scatter", "input_list");
  const Reduction red = reduction_for(o, opts.reduceOp, "reduce_scatter");
  at::Tensor flat = flatten(ins);
  Output out(o);
  const size_t n = o.numel() * red.per_element;
  return launch(
      "reduce_scatter", c10d::OpType::REDUCE_SCATTER, {o}, {flat, out.buffer},
      [&](chorusRequest_t* r) {
        return chorusIreduceScatter(flat.data_ptr(), out.buffer.data_ptr(), n, red.dtype, red.op,
                                    comm_, r);
      },
      [out] { out.finish(); });
}

ProcessGroupChorus::WorkPtr ProcessGroupChorus::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  check_pair(output, input, -getSize(), "reduce_scatter_tensor");
  const Reduction red = reduction_for(output, opts.reduceOp, "reduce_scatter_tensor");
  at::Tensor in = input.contiguous();
  Output out(output);
  const size_t n = output.numel() * red.per_element;
  return launch(
      "reduce_scatter_tensor", c10d::OpType::_REDUCE_SCATTER_BASE, {output}, {in, out.buffer},
      [&](chorusRequest_t* r) {
        return chorusIreduceScatter(in.data_ptr(), out.buffer.data_ptr(), n, red.dtype, red.op,
                                    comm_, r);
      },
      [out] { out.finish(); });
}

namespace {

// Element counts and displacements of the blocks of a tensor cut along dim 0 by `splits` rows
// (equal blocks when splits is empty), in chorus elements.
void blocks(const at::Tensor& t, const std::vector<int64_t>& splits, int size, int64_t per_element,
            const char* side, std::vector<size_t>& counts, std::vector<size_t>& displs) {
  TORCH_CHECK(t.dim() >= 1 || t.numel() == 0, "chorus: all_to_all_single: the ", side,
              " tensor has no dim 0 to split");
  const int64_t rows = t.dim() >= 1 ? t.size(0) : 0;
  const int64_t row = rows > 0 ? t.numel() / rows * per_element : 0;
  std::vector<int64_t> s = splits;
  if (s.empty()) {
    TORCH_CHECK(rows % size == 0, "chorus: all_to_all_single: the ", side, " tensor's ", rows,
                " rows cannot be split evenly among ", size, " ranks; pass split sizes");
    s.assign(size, rows / size);
  }
  TORCH_CHECK(static_cast<int>(s.size()) == size, "chorus: all_to_all_single: ", s.size(), " ",
              side, " split sizes, expected one per rank (", size, ")");
  int64_t off = 0;
  counts.clear();
  displs.clear();
  for (int64_t rows_i : s) {
    TORCH_CHECK(rows_i >= 0, "chorus: all_to_all_single: a negative ", side, " split size ",
                rows_i);
    counts.push_back(static_cast<size_t>(rows_i * row));
    displs.push_back(static_cast<size_t>(off * row));
    off += rows_i;
  }
  TORCH_CHECK(off == rows, "chorus: all_to_all_single: ", side, " split sizes add up to ", off,
              " rows, the tensor has ", rows);
}

}  // namespace

ProcessGroupChorus::WorkPtr ProcessGroupChorus::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                              std::vector<int64_t>& output_splits,
                                                              std::vector<int64_t>& input_splits,
                                                              const c10d::AllToAllOptions&) {
  const char* call = "all_to_all_single";
  check_tensor(output, call);
  check_tensor(input, call);
  TORCH_CHECK(output.scalar_type() == input.scalar_type(), "chorus: ", call, ": output dtype ",
              output.scalar_type(), " differs from input dtype ", input.scalar_type());
  at::Tensor in = input.contiguous();
  Output out(output);
  const Reduction m = moved_as(in);
  std::vector<size_t> sc, sd, rc, rd;
  blocks(in, input_splits, getSize(), m.per_element, "input", sc, sd);
  blocks(output, output_splits, getSize(), m.per_element, "output", rc, rd);
  return launch(
      call, c10d::OpType::ALLTOALL_BASE, {output}, {in, out.buffer},
      [&](chorusRequest_t* r) {
        return chorusIallToAllv(in.data_ptr(), sc.data(), sd.data(), out.buffer.data_ptr(),
                                rc.data(), rd.data(), m.dtype, comm_, r);
      },
      [out] { out.finish(); });
}

ProcessGroupChorus::WorkPtr ProcessGroupChorus::alltoall(Tensors& outputs, Tensors& inputs,
                                                         const c10d::AllToAllOptions&) {
  const char* call = "all_to_all";
  const int size = getSize();
  TORCH_CHECK(static_cast<int>(inputs.size()) == size && static_cast<int>(outputs.size()) == size,
              "chorus: ", call, ": ", inputs.size(), " inputs and ", outputs.size(),
              " outputs, expected one of each per rank (", size, ")");
  for (int i = 0; i < size; ++i) {
    check_tensor(inputs[i], call);
    check_tensor(outputs[i], call);
    TORCH_CHECK(inputs[i].scalar_type() == inputs[0].scalar_type() &&
                    outputs[i].scalar_type() == inputs[0].scalar_type(),
                "chorus: ", call, ": tensors of different dtypes (one dtype per call)");
  }
  at::Tensor flat_in = flatten(inputs);
  int64_t out_numel = 0;
  for (const at::Tensor& t : outputs) out_numel += t.numel();
  at::Tensor flat_out = at::empty({out_numel}, flat_in.options());
  const Reduction m = moved_as(flat_in);
  std::vector<size_t> sc, sd, rc, rd;
  size_t so = 0, ro = 0;
  for (int i = 0; i < size; ++i) {
    sc.push_back(inputs[i].numel() * m.per_element);
    sd.push_back(so);
    so += sc.back();
    rc.push_back(outputs[i].numel() * m.per_element);
    rd.push_back(ro);
    ro += rc.back();
  }
  return launch(
      call, c10d::OpType::ALLTOALL, outputs, {flat_in, flat_out},
      [&](chorusRequest_t* r) {
        return chorusIallToAllv(flat_in.data_ptr(), sc.data(), sd.data(), flat_out.data_ptr(),
                                rc.data(), rd.data(), m.dtype, comm_, r);
      },
      [flat_out, outputs] { unflatten(flat_out, outputs); });
}

}  // namespace chorus_torch
