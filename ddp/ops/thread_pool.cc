// The intra-op worker pool: a generation counter wakes the workers, a countdown reports completion.
#include "ddp/ops/thread_pool.h"

#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace chorus {
namespace {

class ThreadPool {
 public:
  ~ThreadPool() { resize(1); }

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  void resize(int n) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    wake_.notify_all();
    for (auto& t : workers_) t.join();
    workers_.clear();
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = false;
    // A new worker starts from the current generation: it must not run a job that was
    // handed out (and finished) before it existed.
    for (int i = 1; i < n; ++i) workers_.emplace_back([this, i, g = generation_] { work(i, g); });
  }

  void run(int parts, const std::function<void(int)>& fn) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      fn_ = &fn;
      parts_ = parts;
      pending_ = parts - 1;
      error_ = nullptr;
      ++generation_;
    }
    wake_.notify_all();
    std::exception_ptr mine;
    try {
      fn(0);
    } catch (...) {
      mine = std::current_exception();
    }
    std::unique_lock<std::mutex> lock(mu_);
    done_.wait(lock, [&] { return pending_ == 0; });
    if (mine) std::rethrow_exception(mine);
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void work(int index, uint64_t seen) {
    for (;;) {
      const std::function<void(int)>* fn;
      {
        std::unique_lock<std::mutex> lock(mu_);
        wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        if (index >= parts_) continue;
        fn = fn_;
      }
      std::exception_ptr err;
      try {
        (*fn)(index);
      } catch (...) {
        err = std::current_exception();
      }
      std::lock_guard<std::mutex> lock(mu_);
      if (err && !error_) error_ = err;
      if (--pending_ == 0) done_.notify_all();
    }
  }

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable wake_, done_;
  const std::function<void(int)>* fn_ = nullptr;
  int parts_ = 0, pending_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

ThreadPool& pool() {
  static ThreadPool p;
  return p;
}

}  // namespace

void set_intra_op_threads(int n) {
  pool().resize(n < 1 ? 1 : n);
}
int intra_op_threads() {
  return pool().size();
}

void parallel_parts(int parts, const std::function<void(int part)>& fn) {
  if (parts <= 1) return fn(0);
  pool().run(parts, fn);
}

}  // namespace chorus
