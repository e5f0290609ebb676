// Snapshots of a model and its optimizer: written, found, read back and applied (checkpoint.h).
#include "ddp/train/checkpoint.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <stdexcept>

namespace chorus {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

std::function<void(int64_t)>& snapshot_write_hook() {
  static std::function<void(int64_t)> hook;
  return hook;
}

}  // namespace

void set_snapshot_write_hook(std::function<void(int64_t global_step)> hook) {
  snapshot_write_hook() = std::move(hook);
}

std::string snapshot_json_path(const std::string& dir, int64_t global_step) {
  return (fs::path(dir) / fmt::format("snapshot-{:09d}.json", global_step)).string();
}

namespace {

std::vector<std::string> snapshots_newest_first(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("snapshot-", 0) == 0 && name.size() > 5 && name.ends_with(".json"))
      out.push_back(e.path().string());
  }
  std::sort(out.rbegin(), out.rend());
  return out;
}

}  // namespace

std::string write_snapshot(const std::string& dir, const Module& model, Sgd& optimizer,
                           const TrainState& state, int keep) {
  fs::create_directories(dir);
  const auto params = model.named_parameters();
  std::vector<NamedTensor> tensors;
  for (const auto& [name, t] : params) tensors.emplace_back("model." + name, t);
  auto& bufs = optimizer.momentum_buffers();
  for (size_t i = 0; i < params.size() && i < bufs.size(); ++i)
    if (bufs[i].defined()) tensors.emplace_back("optimizer.momentum." + params[i].first, bufs[i]);
  const std::string json_path = snapshot_json_path(dir, state.global_step);
  const std::string tensor_path = json_path.substr(0, json_path.size() - 5) + ".safetensors";
  const std::string bytes = encode_safetensors(tensors, {{"format", "chorus-snapshot-1"}});
  write_file_atomic(tensor_path, bytes);
  if (snapshot_write_hook()) snapshot_write_hook()(state.global_step);
  json j = {
      {"format", "chorus-snapshot-1"},
      {"epoch", state.epoch},
      {"step_in_epoch", state.step_in_epoch},
      {"global_step", state.global_step},
      {"sampler", {{"seed", state.seed}, {"shuffle", state.shuffle}, {"epoch", state.epoch - 1}}},
      {"rng",
       {{"kind", "mt19937_64"}, {"seed", state.seed}, {"note", "loader order = seed + epoch"}}},
      {"world_size", state.world_size},
      {"batch_size", state.batch_size},
      {"lr", state.lr},
      {"tensors", fs::path(tensor_path).filename().string()},
      {"tensors_bytes", bytes.size()},
      {"tensors_fnv1a64", fmt::format("{:016x}", fnv1a64(bytes))}};
  write_file_atomic(json_path, j.dump(2) + "\n");
  // Keep the newest `keep` snapshots; drop tensors whose record was never written (a writer
  // that died between the two files).
  const auto all = snapshots_newest_first(dir);
  for (size_t i = static_cast<size_t>(std::max(keep, 1)); i < all.size(); ++i) {
    std::error_code ec;
    fs::remove(all[i], ec);
    fs::remove(all[i].substr(0, all[i].size() - 5) + ".safetensors", ec);
  }
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string p = e.path().string();
    if (e.path().filename().string().rfind("snapshot-", 0) == 0 && p.ends_with(".safetensors") &&
        p != tensor_path && !fs::exists(p.substr(0, p.size() - 12) + ".json"))
      fs::remove(p, ec);
  }
  return json_path;
}

std::string save_checkpoint(Communicator* comm, const std::string& dir, const Module& model,
                            Sgd& optimizer, const TrainState& state, int keep) {
  std::string path = snapshot_json_path(dir, state.global_step);
  if (!comm || comm->rank() == 0) path = write_snapshot(dir, model, optimizer, state, keep);
  if (comm) comm->barrier();
  return path;
}

Snapshot read_snapshot(const std::string& json_path) {
  Snapshot s;
  s.path = json_path;
  const SnapshotRecord r = parse_snapshot_record(read_whole_file(json_path), json_path);
  s.state = r.state;
  const std::string tensor_path = (fs::path(json_path).parent_path() / r.tensors).string();
  const std::string bytes = read_whole_file(tensor_path);
  if (bytes.size() != r.tensors_bytes)
    throw std::runtime_error(
        fmt::format("checkpoint: {} is {} bytes, its record {} says {} (partial or replaced file)",
                    tensor_path, bytes.size(), json_path, r.tensors_bytes));
  const std::string hash = fmt::format("{:016x}", fnv1a64(bytes));
  if (hash != r.tensors_fnv1a64)
    throw std::runtime_error(
        fmt::format("checkpoint: {} is corrupt: FNV-1a hash {}, its record {} says {}", tensor_path,
                    hash, json_path, r.tensors_fnv1a64));
  for (auto& [name, t] : parse_safetensors(bytes, tensor_path, nullptr)) {
    if (name.rfind("model.", 0) == 0)
      s.model.emplace_back(name.substr(6), t);
    else if (name.rfind("optimizer.momentum.", 0) == 0)
      s.momentum.emplace_back(name.substr(19), t);
  }
  return s;
}

std::optional<Snapshot> load_latest_snapshot(const std::string& dir) {
  for (const std::string& p : snapshots_newest_first(dir)) {
    try {
      return read_snapshot(p);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s; trying the previous snapshot\n", e.what());
    }
  }
  return std::nullopt;
}

void apply_snapshot(const Snapshot& snap, Module& model, Sgd& optimizer) {
  try {
    model.load_state_dict(snap.model);
  } catch (const std::exception& e) {
    throw std::runtime_error(
        fmt::format("checkpoint: {} does not fit this model: {}", snap.path, e.what()));
  }
  const auto params = model.named_parameters();
  auto& bufs = optimizer.momentum_buffers();
  for (size_t i = 0; i < params.size() && i < bufs.size(); ++i) {
    bufs[i] = Tensor();
    for (const auto& [name, t] : snap.momentum)
      if (name == params[i].first) {
        check_shape(("checkpoint: momentum of " + name).c_str(), params[i].second.shape(),
                    t.shape());
        // On the parameter's device: a snapshot holds values only, so it loads onto whatever
        // device the model is on (cpu, or another GPU than the one that wrote it).
        const Device d = params[i].second.device();
        bufs[i] = d == t.device() ? t.clone() : t.to(d);
      }
  }
}

}  // namespace chorus
