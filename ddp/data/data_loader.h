// DataLoader: batches of a Dataset in a seeded per-epoch order, assembled by a background thread
// while the caller trains on the previous batch.
//
// Order: shuffle -> Generator(seed + epoch).permutation(size), else 0..size-1; or a caller-given
// order function (DDP's DistributedSampler plugs in here). drop_last drops a short final batch.
// Threading: one consumer thread calls begin_epoch()/next(); one producer thread per epoch fills a
// bounded queue of `prefetch` batches. Same seed -> same batches, whatever the thread timing.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "ddp/data/dataset.h"

namespace chorus {

struct Batch {
  Tensor images;                 // (B, C, H, W)
  std::vector<int32_t> labels;   // B
  std::vector<int64_t> indices;  // B: which samples of the data set
  int64_t size() const { return static_cast<int64_t>(labels.size()); }
};

struct LoaderOptions {
  int64_t batch_size = 64;
  bool shuffle = true;
  uint64_t seed = 0;
  bool drop_last = false;
  int prefetch = 2;  // batches prepared ahead; 0 = assemble on the caller's thread
};

using OrderFn = std::function<std::vector<int64_t>(int64_t epoch)>;

class DataLoader {
 public:
  DataLoader(std::shared_ptr<const Dataset> data, LoaderOptions options, OrderFn order = nullptr);
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // Starts an epoch (stopping any unfinished one).
  void begin_epoch(int64_t epoch);
  // Stops the prefetch thread early (an epoch cut short); begin_epoch() and the destructor call it.
  void end_epoch();
  // The next batch of this epoch; false when the epoch is done.
  bool next(Batch& out);
  // With an order function these count the current epoch's order: call after begin_epoch().
  int64_t batches_per_epoch() const;
  int64_t samples_per_epoch() const;
  const Dataset& dataset() const { return *data_; }

 private:
  Batch assemble(int64_t first) const;
  void produce();

  std::shared_ptr<const Dataset> data_;
  LoaderOptions options_;
  OrderFn order_fn_;
  std::vector<int64_t> order_;
  int64_t num_batches_ = 0;
  int64_t next_batch_ = 0;  // consumer side, synchronous mode

  std::thread worker_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Batch> queue_;
  int64_t produced_ = 0, consumed_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

}  // namespace chorus
