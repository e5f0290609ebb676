// The bytes of checkpoints: safetensors, snapshot records, atomic writes (checkpoint_format.h).
#include "ddp/train/checkpoint_format.h"

#include <chorus/chorus.h>  // CHORUS_MAX_RANKS, the bound on a recorded world size
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <stdexcept>

namespace chorus {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

}  // namespace

uint64_t fnv1a64(const std::string& bytes) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

std::string read_whole_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f)
    throw std::runtime_error(
        fmt::format("checkpoint: cannot open {}: {}", path, std::strerror(errno)));
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

namespace {

void fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

std::string parent_of(const std::string& path) {
  return fs::path(path).parent_path().string();
}

}  // namespace

namespace {

// A temp file beside `path` under a name no one can guess, created exclusively and never
// through a symlink: a file or link planted at a predictable name cannot redirect the write.
std::pair<int, std::string> create_temp_beside(const std::string& path) {
  std::random_device rd;
  for (int attempt = 0; attempt < 16; ++attempt) {
    const uint64_t r = (uint64_t{rd()} << 32) | rd();
    std::string tmp = fmt::format("{}.tmp.{:016x}", path, r);
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd >= 0) return {fd, std::move(tmp)};
    if (errno != EEXIST)
      throw std::runtime_error(
          fmt::format("checkpoint: cannot create {}: {}", tmp, std::strerror(errno)));
  }
  throw std::runtime_error(
      fmt::format("checkpoint: cannot create a temp file beside {}: 16 names taken", path));
}

}  // namespace

void write_file_atomic(const std::string& path, const std::string& bytes) {
  const auto [fd, tmp] = create_temp_beside(path);
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t w = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      const int e = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      throw std::runtime_error(
          fmt::format("checkpoint: write to {} failed after {} of {} bytes: {}", tmp, done,
                      bytes.size(), std::strerror(e)));
    }
    done += static_cast<size_t>(w);
  }
  const bool synced = ::fsync(fd) == 0;
  const int sync_errno = errno;
  if (::close(fd) != 0 || !synced) {
    const int e = synced ? errno : sync_errno;
    ::unlink(tmp.c_str());
    throw std::runtime_error(
        fmt::format("checkpoint: fsync of {} failed: {}", tmp, std::strerror(e)));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    throw std::runtime_error(
        fmt::format("checkpoint: rename {} -> {} failed: {}", tmp, path, std::strerror(e)));
  }
  fsync_dir(parent_of(path));
}

// ---- safetensors --------------------------------------------------------------------------

std::string encode_safetensors(const std::vector<NamedTensor>& tensors,
                               const std::map<std::string, std::string>& meta) {
  json header = json::object();
  uint64_t off = 0;
  for (const auto& [name, t] : tensors) {
    const uint64_t bytes = sizeof(float) * static_cast<uint64_t>(t.numel());
    header[name] = {
        {"dtype", "F32"}, {"shape", t.shape().vec()}, {"data_offsets", {off, off + bytes}}};
    off += bytes;
  }
  if (!meta.empty()) header["__metadata__"] = meta;
  std::string h = header.dump();
  while (h.size() % 8) h += ' ';  // the spec allows trailing spaces; aligns the data
  std::string out(8, '\0');
  const uint64_t n = h.size();
  for (int i = 0; i < 8; ++i)
    out[static_cast<size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  out += h;
  out.reserve(out.size() + off);
  for (const auto& [name, t] : tensors) {
    if (t.device().is_cpu()) {
      out.append(reinterpret_cast<const char*>(t.data()),
                 sizeof(float) * static_cast<size_t>(t.numel()));
    } else {  // a device tensor: through the host
      const std::vector<float> v = t.to_vector();
      out.append(reinterpret_cast<const char*>(v.data()), sizeof(float) * v.size());
    }
  }
  return out;
}

namespace {

// "checkpoint: <file>: tensor <name>: field <field>: <what>" -- every complaint about a file.
[[noreturn]] void bad_field(const std::string& path, const std::string& where,
                            const std::string& what) {
  throw std::runtime_error(fmt::format("checkpoint: {}: {}: {}", path, where, what));
}

// A JSON value for a message: scalars and short flat arrays as written (strings cut at 64
// characters), other containers by kind and size (never dumped whole: a crafted file could nest
// them deep enough to exhaust the stack).
std::string brief(const json& v) {
  if (v.is_array() && v.size() <= 8 && std::all_of(v.begin(), v.end(), [](const json& e) {
        return e.is_number() || e.is_boolean() || e.is_null();
      }))
    return v.dump();
  if (v.is_array()) return fmt::format("an array of {}", v.size());
  if (v.is_object()) return fmt::format("an object of {}", v.size());
  const auto replace = json::error_handler_t::replace;  // for a character cut in two
  if (v.is_string() && v.get_ref<const std::string&>().size() > 64)
    return json(v.get_ref<const std::string&>().substr(0, 64)).dump(-1, ' ', false, replace) +
           "...";
  return v.dump(-1, ' ', false, replace);
}

// A tensor's "shape": an array of at most Shape::kMaxDims integers, each >= 0, whose product
// (and its size in bytes) fits; checked by Shape itself.
Shape shape_field(const json& v, const std::string& path, const std::string& where) {
  if (!v.is_array())
    bad_field(path, where, fmt::format("is {}, expected an array of integers", brief(v)));
  if (v.size() > static_cast<size_t>(Shape::kMaxDims))
    bad_field(path, where,
              fmt::format("has {} dims, expected at most {}", v.size(), Shape::kMaxDims));
  std::vector<int64_t> dims;
  for (const json& d : v) {
    if (d.is_number_unsigned() && d.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
      bad_field(path, where, fmt::format("dimension {} is larger than 2^63", d.get<uint64_t>()));
    if (!d.is_number_integer())
      bad_field(path, where, fmt::format("holds {}, expected integers", brief(d)));
    dims.push_back(d.get<int64_t>());
  }
  try {
    return Shape::of(dims);
  } catch (const std::invalid_argument& e) {
    bad_field(path, where, e.what());
  }
}

// A tensor's "data_offsets": [begin, end] within the data, end - begin = its size in bytes.
uint64_t offsets_field(const json& v, uint64_t data_size, uint64_t want_bytes,
                       const std::string& path, const std::string& where) {
  if (!v.is_array() || v.size() != 2 || !v[0].is_number_unsigned() || !v[1].is_number_unsigned())
    bad_field(path, where,
              fmt::format("is {}, expected [begin, end] with 0 <= begin <= end", brief(v)));
  const uint64_t b = v[0].get<uint64_t>(), e = v[1].get<uint64_t>();
  if (b > e || e > data_size)
    bad_field(path, where, fmt::format("[{}, {}] is outside the data ({} bytes)", b, e, data_size));
  if (e - b != want_bytes)
    bad_field(path, where,
              fmt::format("[{}, {}] holds {} bytes, the shape needs {}", b, e, e - b, want_bytes));
  return b;
}

// One header entry, checked: {"dtype": "F32", "shape": [...], "data_offsets": [b, e]}.
struct TensorEntry {
  std::string name;
  Shape shape;
  uint64_t begin = 0;
  uint64_t bytes = 0;
};

TensorEntry decode_entry(const std::string& name, const json& v, uint64_t data_size,
                         const std::string& path) {
  const std::string where = "tensor " + name;
  if (!v.is_object()) bad_field(path, where, fmt::format("is {}, expected an object", brief(v)));
  for (const char* field : {"dtype", "shape", "data_offsets"})
    if (!v.contains(field)) bad_field(path, where, fmt::format("field {} is missing", field));
  if (v["dtype"] != "F32")
    bad_field(path, where + ": field dtype",
              fmt::format("is {}, expected \"F32\"", brief(v["dtype"])));
  TensorEntry t{name, shape_field(v["shape"], path, where + ": field shape")};
  t.bytes = sizeof(float) * static_cast<uint64_t>(t.shape.numel());
  t.begin =
      offsets_field(v["data_offsets"], data_size, t.bytes, path, where + ": field data_offsets");
  return t;
}

void decode_metadata(const json& v, const std::string& path,
                     std::map<std::string, std::string>* metadata) {
  if (!v.is_object())
    bad_field(path, "field __metadata__", fmt::format("is {}, expected an object", brief(v)));
  for (auto& [k, s] : v.items()) {
    if (!s.is_string())
      bad_field(path, "field __metadata__." + k, fmt::format("is {}, expected a string", brief(s)));
    if (metadata) (*metadata)[k] = s.get<std::string>();
  }
}

// As the reference implementation demands: the tensors tile the data, in order, without gaps
// or overlaps (so, too, no crafted header can make the reader allocate more than the file).
void check_tiling(std::vector<TensorEntry>& entries, uint64_t data_size, const std::string& path) {
  std::sort(entries.begin(), entries.end(), [](const TensorEntry& a, const TensorEntry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.bytes < b.bytes;  // empty ones first
  });
  uint64_t end = 0;
  for (const TensorEntry& t : entries) {
    if (t.begin != end)
      bad_field(
          path, "tensor " + t.name + ": field data_offsets",
          fmt::format(
              "starts at {}, expected {} (tensors must tile the data without gaps or overlaps)",
              t.begin, end));
    end += t.bytes;
  }
  if (end != data_size)
    bad_field(path, "data", fmt::format("is {} bytes, the tensors cover {}", data_size, end));
}

}  // namespace

std::vector<NamedTensor> parse_safetensors(const std::string& bytes, const std::string& path,
                                           std::map<std::string, std::string>* metadata) {
  if (bytes.size() < 8)
    throw std::runtime_error(fmt::format(
        "checkpoint: {} is truncated: {} bytes, expected at least 8", path, bytes.size()));
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i)
    n |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[static_cast<size_t>(i)]))
         << (8 * i);
  if (n > bytes.size() - 8)
    throw std::runtime_error(
        fmt::format("checkpoint: {}: header length {} runs past the file end ({} bytes)", path, n,
                    bytes.size()));
  json header;
  try {
    header = json::parse(bytes.substr(8, n));
  } catch (const std::exception& e) {
    throw std::runtime_error(fmt::format(
        "checkpoint: {}: the safetensors header is not valid JSON: {}", path, e.what()));
  }
  if (!header.is_object())
    bad_field(path, "header", fmt::format("is {}, expected a JSON object", brief(header)));
  const uint64_t data_size = bytes.size() - 8 - n;
  std::vector<TensorEntry> entries;
  for (auto& [name, v] : header.items()) {
    if (name == "__metadata__")
      decode_metadata(v, path, metadata);
    else
      entries.push_back(decode_entry(name, v, data_size, path));
  }
  check_tiling(entries, data_size, path);
  const char* data = bytes.data() + 8 + n;
  std::vector<NamedTensor> result;
  for (const TensorEntry& e : entries) {
    Tensor t = Tensor::empty(e.shape);
    if (e.bytes > 0) std::memcpy(t.data(), data + e.begin, e.bytes);
    result.emplace_back(e.name, t);
  }
  return result;
}

void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  write_file_atomic(path, encode_safetensors(tensors, metadata));
}

std::vector<NamedTensor> read_safetensors(const std::string& path,
                                          std::map<std::string, std::string>* metadata) {
  return parse_safetensors(read_whole_file(path), path, metadata);
}

// ---- snapshot records ---------------------------------------------------------------------

namespace {

// A field of the record: present, of the right kind, within [lo, hi]; else an error naming it.
const json& record_field(const json& j, const char* field, const std::string& path) {
  if (!j.is_object() || !j.contains(field))
    bad_field(path, fmt::format("field {}", field), "is missing");
  return j[field];
}

int64_t int_field(const json& j, const char* field, int64_t lo, int64_t hi,
                  const std::string& path) {
  const json& v = record_field(j, field, path);
  if (!v.is_number_integer() ||
      (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(hi)) ||
      v.get<int64_t>() < lo || v.get<int64_t>() > hi)
    bad_field(path, fmt::format("field {}", field),
              fmt::format("is {}, expected an integer in {}..{}", brief(v), lo, hi));
  return v.get<int64_t>();
}

// The tensor file is named by the record and must sit beside it: a bare file name, never a
// path that could leave the directory.
std::string tensor_file_field(const json& j, const std::string& path) {
  const json& v = record_field(j, "tensors", path);
  const std::string name = v.is_string() ? v.get<std::string>() : std::string();
  if (!v.is_string() || name.empty() || name == "." || name == ".." ||
      name.find('/') != std::string::npos || name.find('\0') != std::string::npos ||
      !name.ends_with(".safetensors"))
    bad_field(
        path, "field tensors",
        fmt::format("is {}, expected a file name in the same directory ending in .safetensors",
                    brief(v)));
  return name;
}

}  // namespace

SnapshotRecord parse_snapshot_record(const std::string& text, const std::string& path) {
  json j;
  try {
    j = json::parse(text);
  } catch (const std::exception& e) {
    throw std::runtime_error(
        fmt::format("checkpoint: {} is not a valid snapshot record: {}", path, e.what()));
  }
  if (!j.is_object() || !j.contains("format") || j["format"] != "chorus-snapshot-1")
    bad_field(path, "field format",
              fmt::format("is {}, expected \"chorus-snapshot-1\" (not a valid snapshot record)",
                          j.is_object() && j.contains("format") ? brief(j["format"]) : "missing"));
  SnapshotRecord r;
  r.state.epoch = int_field(j, "epoch", 1, INT64_MAX, path);
  r.state.step_in_epoch = int_field(j, "step_in_epoch", 0, INT64_MAX, path);
  r.state.global_step = int_field(j, "global_step", 0, INT64_MAX, path);
  const json& sampler = record_field(j, "sampler", path);
  const json& seed = record_field(sampler, "seed", path + ": field sampler");
  if (!seed.is_number_unsigned())
    bad_field(path, "field sampler.seed",
              fmt::format("is {}, expected an unsigned integer", brief(seed)));
  r.state.seed = seed.get<uint64_t>();
  const json& shuffle = record_field(sampler, "shuffle", path + ": field sampler");
  if (!shuffle.is_boolean())
    bad_field(path, "field sampler.shuffle",
              fmt::format("is {}, expected true or false", brief(shuffle)));
  r.state.shuffle = shuffle.get<bool>();
  r.state.world_size = static_cast<int>(int_field(j, "world_size", 1, CHORUS_MAX_RANKS, path));
  r.state.batch_size = int_field(j, "batch_size", 0, INT64_MAX, path);  // 0: not recorded
  const json& lr = record_field(j, "lr", path);
  if (!lr.is_number() || !std::isfinite(lr.get<double>()) || lr.get<double>() < 0)
    bad_field(path, "field lr", fmt::format("is {}, expected a finite number >= 0", brief(lr)));
  r.state.lr = lr.get<double>();
  r.tensors = tensor_file_field(j, path);
  r.tensors_bytes = static_cast<uint64_t>(int_field(j, "tensors_bytes", 0, INT64_MAX, path));
  const json& hash = record_field(j, "tensors_fnv1a64", path);
  if (!hash.is_string() || hash.get<std::string>().size() != 16 ||
      hash.get<std::string>().find_first_not_of("0123456789abcdef") != std::string::npos)
    bad_field(path, "field tensors_fnv1a64",
              fmt::format("is {}, expected 16 lower-case hex digits", brief(hash)));
  r.tensors_fnv1a64 = hash.get<std::string>();
  return r;
}

}  // namespace chorus
