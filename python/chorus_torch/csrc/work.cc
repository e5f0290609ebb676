// A torch Work for chorus requests, and the thread that completes them (work.h).
#include "work.h"

#include <ATen/core/jit_type.h>
#include <c10/util/Exception.h>

#include <chrono>
#include <stdexcept>
#include <thread>

namespace chorus_torch {

WorkChorus::WorkChorus(int rank, c10d::OpType type, std::string what,
                       std::vector<at::Tensor> outputs, std::vector<at::Tensor> keep)
    : c10d::Work(rank, type, nullptr),
      what_(std::move(what)),
      outputs_(std::move(outputs)),
      keep_(std::move(keep)),
      future_(
          c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {
}

WorkChorus::~WorkChorus() {
  for (chorusRequest_t r : requests_) chorusRequestFree(r);
}

bool WorkChorus::wait(std::chrono::milliseconds timeout) {
  // 0 ms means no limit of the caller's: chorus ends every operation by its own timeout.
  const double seconds = timeout == kNoTimeout ? -1.0 : timeout.count() / 1000.0;
  if (const int ms = slow_finish_ms_.load(); ms > 0)
    std::this_thread::sleep_for(std::chrono::milliseconds(ms / 2));
  TORCH_CHECK(complete(seconds), "chorus: ", what_, " did not finish within the wait's ",
              timeout.count(), " ms (it goes on; the communicator's own timeout ends it)");
  std::unique_lock<std::mutex> lock(mutex_);
  if (exception_) std::rethrow_exception(exception_);
  return true;
}

bool WorkChorus::complete(double seconds) {
  std::string error;
  for (chorusRequest_t r : requests_) {
    const chorusResult_t rc = chorusWait(r, seconds);
    if (rc == chorusInProgress) return false;
    if (rc != chorusSuccess && error.empty())
      error = std::string(chorusGetErrorString(rc)) + ": " + chorusGetLastError(nullptr);
  }
  if (claimed_.exchange(true)) {  // the other caller finishes it; wait for that, Future and all
    future_->wait();
    return true;
  }
  std::exception_ptr eptr;
  if (!error.empty()) {
    eptr = std::make_exception_ptr(std::runtime_error("chorus: " + what_ + " failed: " + error));
  } else {
    try {
      if (after_) after_();
    } catch (const std::exception& e) {
      eptr = std::make_exception_ptr(
          std::runtime_error("chorus: " + what_ + ": copying the result failed: " + e.what()));
    }
  }
  finish_with(eptr);
  return true;
}

void WorkChorus::finish_with(std::exception_ptr error) {
  after_ = nullptr;
  keep_.clear();
  finish(error);
  if (const int ms = slow_finish_ms_.load(); ms > 0)
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  if (error)
    future_->setError(error);
  else
    future_->markCompleted(c10::IValue(outputs_));
}

Completer::Completer() : thread_([this] { run(); }) {}

Completer::~Completer() {
  stop();
}

void Completer::push(c10::intrusive_ptr<WorkChorus> w) {
  std::vector<c10::intrusive_ptr<WorkChorus>> done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(w));
    done.swap(done_);
  }
  cv_.notify_one();
}  // the completed Works are released here, on the caller's thread

void Completer::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

void Completer::run() {
  for (;;) {
    c10::intrusive_ptr<WorkChorus> w;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and everything queued is done
      w = std::move(queue_.front());
      queue_.pop_front();
    }
    w->complete();  // not holding mu_: a future's callbacks may queue more work
    std::lock_guard<std::mutex> lock(mu_);
    done_.push_back(std::move(w));  // not released on this thread (see done_)
  }
}

}  // namespace chorus_torch
