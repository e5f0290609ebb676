// safetensors reading/writing, atomic files, and snapshots.
#include "ddp/checkpoint.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

namespace chorus {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

uint64_t fnv1a64(const std::string& bytes) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error(fmt::format("checkpoint: cannot open {}: {}", path, std::strerror(errno)));
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

std::string parent_of(const std::string& path) { return fs::path(path).parent_path().string(); }

}  // namespace

void write_file_atomic(const std::string& path, const std::string& bytes) {
  const std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw std::runtime_error(fmt::format("checkpoint: cannot create {}: {}", tmp, std::strerror(errno)));
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t w = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      const int e = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      throw std::runtime_error(fmt::format("checkpoint: write to {} failed after {} of {} bytes: {}", tmp, done,
                                           bytes.size(), std::strerror(e)));
    }
    done += static_cast<size_t>(w);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    ::unlink(tmp.c_str());
    throw std::runtime_error(fmt::format("checkpoint: fsync of {} failed: {}", tmp, std::strerror(errno)));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    throw std::runtime_error(fmt::format("checkpoint: rename {} -> {} failed: {}", tmp, path, std::strerror(e)));
  }
  fsync_dir(parent_of(path));
}

// ---- safetensors --------------------------------------------------------------------------

namespace {

std::string encode_safetensors(const std::vector<NamedTensor>& tensors, const std::map<std::string, std::string>& meta) {
  json header = json::object();
  uint64_t off = 0;
  for (const auto& [name, t] : tensors) {
    const uint64_t bytes = sizeof(float) * static_cast<uint64_t>(t.numel());
    header[name] = {{"dtype", "F32"}, {"shape", t.shape().vec()}, {"data_offsets", {off, off + bytes}}};
    off += bytes;
  }
  if (!meta.empty()) header["__metadata__"] = meta;
  std::string h = header.dump();
  while (h.size() % 8) h += ' ';  // the spec allows trailing spaces; aligns the data
  std::string out(8, '\0');
  const uint64_t n = h.size();
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  out += h;
  out.reserve(out.size() + off);
  for (const auto& [name, t] : tensors)
    out.append(reinterpret_cast<const char*>(t.data()), sizeof(float) * static_cast<size_t>(t.numel()));
  return out;
}

std::vector<NamedTensor> decode_safetensors(const std::string& bytes, const std::string& path,
                                            std::map<std::string, std::string>* metadata) {
  if (bytes.size() < 8)
    throw std::runtime_error(fmt::format("checkpoint: {} is truncated: {} bytes, expected at least 8", path, bytes.size()));
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[static_cast<size_t>(i)])) << (8 * i);
  if (n > bytes.size() - 8)
    throw std::runtime_error(fmt::format("checkpoint: {}: header length {} runs past the file end ({} bytes)", path, n,
                                         bytes.size()));
  json header;
  try {
    header = json::parse(bytes.substr(8, n));
  } catch (const std::exception& e) {
    throw std::runtime_error(fmt::format("checkpoint: {}: the safetensors header is not valid JSON: {}", path, e.what()));
  }
  const uint64_t data_size = bytes.size() - 8 - n;
  const char* data = bytes.data() + 8 + n;
  std::vector<std::pair<uint64_t, NamedTensor>> out;
  for (auto& [name, v] : header.items()) {
    if (name == "__metadata__") {
      if (metadata)
        for (auto& [k, s] : v.items()) (*metadata)[k] = s.get<std::string>();
      continue;
    }
    if (v.value("dtype", "") != "F32")
      throw std::runtime_error(fmt::format("checkpoint: {}: tensor {} has dtype {}, expected F32", path, name,
                                           v.value("dtype", "?")));
    const auto dims = v.at("shape").get<std::vector<int64_t>>();
    const auto offs = v.at("data_offsets").get<std::vector<uint64_t>>();
    const Shape shape = Shape::of(dims);
    if (offs.size() != 2 || offs[1] < offs[0] || offs[1] > data_size ||
        offs[1] - offs[0] != sizeof(float) * static_cast<uint64_t>(shape.numel()))
      throw std::runtime_error(fmt::format("checkpoint: {}: tensor {} {} has bad data offsets (data is {} bytes)", path,
                                           name, shape.str(), data_size));
    Tensor t = Tensor::empty(shape);
    std::memcpy(t.data(), data + offs[0], offs[1] - offs[0]);
    out.push_back({offs[0], {name, t}});
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<NamedTensor> result;
  for (auto& [off, nt] : out) result.push_back(std::move(nt));
  return result;
}

}  // namespace

void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  write_file_atomic(path, encode_safetensors(tensors, metadata));
}

std::vector<NamedTensor> read_safetensors(const std::string& path, std::map<std::string, std::string>* metadata) {
  return decode_safetensors(read_file(path), path, metadata);
}

// ---- snapshots ----------------------------------------------------------------------------

std::string snapshot_json_path(const std::string& dir, int64_t global_step) {
  return (fs::path(dir) / fmt::format("snapshot-{:09d}.json", global_step)).string();
}

namespace {

std::vector<std::string> snapshots_newest_first(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("snapshot-", 0) == 0 && name.size() > 5 && name.ends_with(".json")) out.push_back(e.path().string());
  }
  std::sort(out.rbegin(), out.rend());
  return out;
}

}  // namespace

std::string write_snapshot(const std::string& dir, const Module& model, Sgd& optimizer, const TrainState& state,
                           int keep) {
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
  json j = {{"format", "chorus-snapshot-1"},
            {"epoch", state.epoch},
            {"step_in_epoch", state.step_in_epoch},
            {"global_step", state.global_step},
            {"sampler", {{"seed", state.seed}, {"shuffle", state.shuffle}, {"epoch", state.epoch - 1}}},
            {"rng", {{"kind", "mt19937_64"}, {"seed", state.seed}, {"note", "loader order = seed + epoch"}}},
            {"world_size", state.world_size},
            {"batch_size", state.batch_size},
            {"lr", state.lr},
            {"tensors", fs::path(tensor_path).filename().string()},
            {"tensors_bytes", bytes.size()},
            {"tensors_fnv1a64", fmt::format("{:016x}", fnv1a64(bytes))}};
  write_file_atomic(json_path, j.dump(2) + "\n");
  // Keep the newest `keep` snapshots.
  const auto all = snapshots_newest_first(dir);
  for (size_t i = static_cast<size_t>(std::max(keep, 1)); i < all.size(); ++i) {
    std::error_code ec;
    fs::remove(all[i], ec);
    fs::remove(all[i].substr(0, all[i].size() - 5) + ".safetensors", ec);
  }
  return json_path;
}

std::string save_checkpoint(Communicator* comm, const std::string& dir, const Module& model, Sgd& optimizer,
                            const TrainState& state, int keep) {
  std::string path = snapshot_json_path(dir, state.global_step);
  if (!comm || comm->rank() == 0) path = write_snapshot(dir, model, optimizer, state, keep);
  if (comm) comm->barrier();
  return path;
}

Snapshot read_snapshot(const std::string& json_path) {
  Snapshot s;
  s.path = json_path;
  json j;
  try {
    j = json::parse(read_file(json_path));
    if (j.value("format", "") != "chorus-snapshot-1")
      throw std::runtime_error(fmt::format("format '{}', expected chorus-snapshot-1", j.value("format", "")));
    s.state.epoch = j.at("epoch").get<int64_t>();
    s.state.step_in_epoch = j.at("step_in_epoch").get<int64_t>();
    s.state.global_step = j.at("global_step").get<int64_t>();
    s.state.seed = j.at("sampler").at("seed").get<uint64_t>();
    s.state.shuffle = j.at("sampler").at("shuffle").get<bool>();
    s.state.world_size = j.at("world_size").get<int>();
    s.state.batch_size = j.at("batch_size").get<int64_t>();
    s.state.lr = j.at("lr").get<double>();
  } catch (const std::exception& e) {
    throw std::runtime_error(fmt::format("checkpoint: {} is not a valid snapshot record: {}", json_path, e.what()));
  }
  const std::string tensor_path = (fs::path(json_path).parent_path() / j.at("tensors").get<std::string>()).string();
  const std::string bytes = read_file(tensor_path);
  const auto want_bytes = j.at("tensors_bytes").get<uint64_t>();
  if (bytes.size() != want_bytes)
    throw std::runtime_error(fmt::format("checkpoint: {} is {} bytes, its record {} says {} (partial or replaced file)",
                                         tensor_path, bytes.size(), json_path, want_bytes));
  const std::string hash = fmt::format("{:016x}", fnv1a64(bytes));
  if (hash != j.at("tensors_fnv1a64").get<std::string>())
    throw std::runtime_error(fmt::format("checkpoint: {} is corrupt: FNV-1a hash {}, its record {} says {}", tensor_path,
                                         hash, json_path, j.at("tensors_fnv1a64").get<std::string>()));
  for (auto& [name, t] : decode_safetensors(bytes, tensor_path, nullptr)) {
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
    throw std::runtime_error(fmt::format("checkpoint: {} does not fit this model: {}", snap.path, e.what()));
  }
  const auto params = model.named_parameters();
  auto& bufs = optimizer.momentum_buffers();
  for (size_t i = 0; i < params.size() && i < bufs.size(); ++i) {
    bufs[i] = Tensor();
    for (const auto& [name, t] : snap.momentum)
      if (name == params[i].first) {
        check_shape(("checkpoint: momentum of " + name).c_str(), params[i].second.shape(), t.shape());
        bufs[i] = t.clone();
      }
  }
}

}  // namespace chorus
