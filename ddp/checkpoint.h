// Checkpoints ("snapshots", as in the torchrun tutorial): model and optimizer tensors as
// safetensors, training state as JSON, both written atomically (temp file, fsync, rename, fsync
// of the directory).
//
// A snapshot of step S in DIR is two files: snapshot-<S>.safetensors (tensors "model.<name>" and
// "optimizer.momentum.<name>") and snapshot-<S>.json (epoch, step, sampler and RNG state, and the
// size and FNV-1a hash of the tensor file). The JSON is written last, so a snapshot exists once
// its JSON does; a crash mid-write leaves only a temp file or an orphan tensor file. Loading checks
// the hash, the safetensors header and every shape, and throws a message naming the file and what
// is wrong; load_latest_snapshot() then falls back to the previous snapshot.
//
// Multi-rank use: rank 0 writes, every rank then waits at a barrier (save_checkpoint does both);
// any rank may read.
#pragma once

#include <chorus/chorus.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ddp/nn.h"
#include "ddp/optim.h"

namespace chorus {

// safetensors (https://github.com/huggingface/safetensors): 8-byte little-endian header length N,
// N bytes of JSON header ({"name": {"dtype": "F32", "shape": [...], "data_offsets": [b, e]},
// "__metadata__": {...}}), then the raw little-endian data. F32 only.
void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});
// Reading checks every field: the header is an object; each tensor has dtype "F32", a shape of
// at most 6 dims >= 0 whose size fits, data_offsets inside the data and matching the shape;
// the tensors tile the data; metadata values are strings. Errors name the file and the field.
std::vector<NamedTensor> read_safetensors(const std::string& path, std::map<std::string, std::string>* metadata = nullptr);
// The same from bytes in memory; `path` names them in messages.
std::vector<NamedTensor> parse_safetensors(const std::string& bytes, const std::string& path,
                                           std::map<std::string, std::string>* metadata = nullptr);

// Writes bytes to path atomically: a temp file beside it with an unguessable name, created with
// O_EXCL | O_NOFOLLOW (a planted file or symlink is never written through), fsync, rename over
// path, fsync the directory.
void write_file_atomic(const std::string& path, const std::string& bytes);

struct TrainState {
  int64_t epoch = 1;          // the epoch in progress (1-based)
  int64_t step_in_epoch = 0;  // steps of that epoch already done
  int64_t global_step = 0;    // steps done in all
  uint64_t seed = 0;          // sampler / loader seed (the only RNG the loop draws from)
  bool shuffle = true;
  int world_size = 1;
  int64_t batch_size = 0;     // per rank
  double lr = 0;
};

struct Snapshot {
  std::string path;  // the .json
  TrainState state;
  StateDict model;
  StateDict momentum;  // by parameter name; absent before the first step
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

std::string snapshot_json_path(const std::string& dir, int64_t global_step);
// Writes a snapshot (whoever calls it); returns the JSON path. Keeps the `keep` newest snapshots.
std::string write_snapshot(const std::string& dir, const Module& model, Sgd& optimizer, const TrainState& state,
                           int keep = 3);
// Rank 0 writes, then all ranks meet at a barrier (comm may be null: single process).
std::string save_checkpoint(Communicator* comm, const std::string& dir, const Module& model, Sgd& optimizer,
                            const TrainState& state, int keep = 3);
// Reads and checks one snapshot (its .json path); throws naming the file on any problem.
Snapshot read_snapshot(const std::string& json_path);
// Newest readable snapshot in dir (nullopt when there is none); each unreadable newer one is
// reported on stderr and skipped.
std::optional<Snapshot> load_latest_snapshot(const std::string& dir);
// Copies a snapshot into model and optimizer (shapes checked by name).
void apply_snapshot(const Snapshot& snap, Module& model, Sgd& optimizer);

}  // namespace chorus
