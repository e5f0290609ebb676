// The bytes of checkpoints and every check on bytes read back: safetensors files, snapshot
// records (the JSON beside each tensor file), atomic file writes. Needs tensors and JSON only,
// so the checkpoint fuzz target (fuzz/checkpoint_reader.cc) links this without the model code.
// Errors are std::runtime_error naming the file and the field.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "ddp/tensor/tensor.h"

namespace chorus {

using NamedTensor = std::pair<std::string, Tensor>;  // as in ddp/nn/modules.h

// safetensors (https://github.com/huggingface/safetensors): 8-byte little-endian header length N,
// N bytes of JSON header ({"name": {"dtype": "F32", "shape": [...], "data_offsets": [b, e]},
// "__metadata__": {...}}), then the raw little-endian data. F32 only.
void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});
// Reading checks every field: the header is an object; each tensor has dtype "F32", a shape of
// at most 6 dims >= 0 whose size fits, data_offsets inside the data and matching the shape;
// the tensors tile the data; metadata values are strings. Errors name the file and the field.
std::vector<NamedTensor> read_safetensors(const std::string& path,
                                          std::map<std::string, std::string>* metadata = nullptr);
// The same from bytes in memory; `path` names them in messages.
std::vector<NamedTensor> parse_safetensors(const std::string& bytes, const std::string& path,
                                           std::map<std::string, std::string>* metadata = nullptr);

// Writes bytes to path atomically: a temp file beside it with an unguessable name, created with
// O_EXCL | O_NOFOLLOW (a planted file or symlink is never written through), fsync, rename over
// path, fsync the directory.
void write_file_atomic(const std::string& path, const std::string& bytes);
// The bytes write_safetensors writes (header padded to 8 bytes, then the data).
std::string encode_safetensors(const std::vector<NamedTensor>& tensors,
                               const std::map<std::string, std::string>& metadata = {});

// The whole file; throws naming it when it cannot be read.
std::string read_whole_file(const std::string& path);
// FNV-1a, 64 bits: the snapshot record's check on its tensor file.
uint64_t fnv1a64(const std::string& bytes);

struct TrainState {
  int64_t epoch = 1;          // the epoch in progress (1-based)
  int64_t step_in_epoch = 0;  // steps of that epoch already done
  int64_t global_step = 0;    // steps done in all
  uint64_t seed = 0;          // sampler / loader seed (the only RNG the loop draws from)
  bool shuffle = true;
  int world_size = 1;
  int64_t batch_size = 0;  // per rank
  double lr = 0;
};

// A snapshot's JSON record, parsed and checked field by field (errors name the file and the
// field): epoch >= 1, steps >= 0, world_size 1..CHORUS_MAX_RANKS, batch_size >= 0, lr finite
// and >= 0, tensors a bare file name ending in .safetensors (never a path out of the
// directory), tensors_fnv1a64 16 hex digits.
struct SnapshotRecord {
  TrainState state;
  std::string tensors;  // file name, beside the record
  uint64_t tensors_bytes = 0;
  std::string tensors_fnv1a64;
};
SnapshotRecord parse_snapshot_record(const std::string& text, const std::string& path);

}  // namespace chorus
