// DataLoader: order, batch assembly, and the prefetch thread.
#include "ddp/data/data_loader.h"

#include <fmt/format.h>

#include <numeric>
#include <stdexcept>

#include "ddp/tensor/random.h"

namespace chorus {

DataLoader::DataLoader(std::shared_ptr<const Dataset> data, LoaderOptions options, OrderFn order)
    : data_(std::move(data)), options_(options), order_fn_(std::move(order)) {
  if (options_.batch_size < 1)
    throw std::invalid_argument(
        fmt::format("data loader: expected batch size >= 1, got {}", options_.batch_size));
  if (options_.prefetch < 0)
    throw std::invalid_argument(
        fmt::format("data loader: expected prefetch >= 0, got {}", options_.prefetch));
}

DataLoader::~DataLoader() {
  end_epoch();
}

void DataLoader::end_epoch() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
  queue_.clear();
}

int64_t DataLoader::samples_per_epoch() const {
  const int64_t n = order_fn_ ? static_cast<int64_t>(order_.size()) : data_->size();
  return options_.drop_last ? (n / options_.batch_size) * options_.batch_size : n;
}

int64_t DataLoader::batches_per_epoch() const {
  const int64_t n = order_fn_ ? static_cast<int64_t>(order_.size()) : data_->size();
  return options_.drop_last ? n / options_.batch_size
                            : (n + options_.batch_size - 1) / options_.batch_size;
}

void DataLoader::begin_epoch(int64_t epoch) {
  end_epoch();
  if (order_fn_) {
    order_ = order_fn_(epoch);
  } else if (options_.shuffle) {
    order_ = Generator(options_.seed + static_cast<uint64_t>(epoch)).permutation(data_->size());
  } else {
    order_.resize(static_cast<size_t>(data_->size()));
    std::iota(order_.begin(), order_.end(), 0);
  }
  for (int64_t i : order_)
    if (i < 0 || i >= data_->size())
      throw std::invalid_argument(
          fmt::format("data loader: expected indices in [0, {}), got {}", data_->size(), i));
  num_batches_ = batches_per_epoch();
  next_batch_ = 0;
  produced_ = consumed_ = 0;
  stop_ = false;
  error_ = nullptr;
  if (options_.prefetch > 0) worker_ = std::thread([this] { produce(); });
}

Batch DataLoader::assemble(int64_t b) const {
  const int64_t first = b * options_.batch_size;
  const int64_t count =
      std::min<int64_t>(options_.batch_size, static_cast<int64_t>(order_.size()) - first);
  const Shape s = data_->sample_shape();
  const int64_t per = s.numel();
  Batch batch;
  batch.images = Tensor::empty(Shape{count, s[0], s[1], s[2]});
  batch.labels.resize(static_cast<size_t>(count));
  batch.indices.assign(order_.begin() + first, order_.begin() + first + count);
  for (int64_t i = 0; i < count; ++i)
    batch.labels[static_cast<size_t>(i)] =
        data_->get(order_[static_cast<size_t>(first + i)], batch.images.data() + i * per);
  return batch;
}

void DataLoader::produce() {
  try {
    for (int64_t b = 0; b < num_batches_; ++b) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || produced_ - consumed_ < options_.prefetch; });
        if (stop_) return;
      }
      Batch batch = assemble(b);
      {
        std::lock_guard<std::mutex> lock(mu_);
        queue_.push_back(std::move(batch));
        ++produced_;
      }
      cv_.notify_all();
    }
  } catch (...) {
    std::lock_guard<std::mutex> lock(mu_);
    error_ = std::current_exception();
    cv_.notify_all();
  }
}

bool DataLoader::next(Batch& out) {
  if (options_.prefetch == 0) {
    if (next_batch_ >= num_batches_) return false;
    out = assemble(next_batch_++);
    return true;
  }
  std::unique_lock<std::mutex> lock(mu_);
  if (consumed_ >= num_batches_) return false;
  cv_.wait(lock, [&] { return !queue_.empty() || error_; });
  if (error_) std::rethrow_exception(error_);
  out = std::move(queue_.front());
  queue_.pop_front();
  ++consumed_;
  lock.unlock();
  cv_.notify_all();
  return true;
}

}  // namespace chorus
