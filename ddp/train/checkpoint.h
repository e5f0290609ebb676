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
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ddp/nn/modules.h"
#include "ddp/nn/optim.h"
#include "ddp/train/checkpoint_format.h"

namespace chorus {

struct Snapshot {
  std::string path;  // the .json
  TrainState state;
  StateDict model;
  StateDict momentum;  // by parameter name; absent before the first step
};

std::string snapshot_json_path(const std::string& dir, int64_t global_step);
// Writes a snapshot (whoever calls it); returns the JSON path. Keeps the `keep` newest snapshots.
// Testing: called by write_snapshot between its two files (the tensors are on disk, the record
// that makes them a snapshot is not yet) with the snapshot's global step; empty: none.
void set_snapshot_write_hook(std::function<void(int64_t global_step)> hook);
std::string write_snapshot(const std::string& dir, const Module& model, Sgd& optimizer,
                           const TrainState& state, int keep = 3);
// Rank 0 writes, then all ranks meet at a barrier (comm may be null: single process).
std::string save_checkpoint(Communicator* comm, const std::string& dir, const Module& model,
                            Sgd& optimizer, const TrainState& state, int keep = 3);
// Reads and checks one snapshot (its .json path); throws naming the file on any problem.
Snapshot read_snapshot(const std::string& json_path);
// Newest readable snapshot in dir (nullopt when there is none); each unreadable newer one is
// reported on stderr and skipped.
std::optional<Snapshot> load_latest_snapshot(const std::string& dir);
// Copies a snapshot into model and optimizer (shapes checked by name).
void apply_snapshot(const Snapshot& snap, Module& model, Sgd& optimizer);

}  // namespace chorus
