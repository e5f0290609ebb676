// A torch Work for chorus requests, and the thread that completes them in call order.
//
// An operation is one or more chorus requests (chorusI* calls made by the caller's thread) plus
// what to do once they all succeeded (copy staged outputs into the user's tensors). The
// Completer thread of the process group waits for each Work's requests, runs that step, then
// finishes the Work and its Future (a TensorList, as DDP's reducer and comm hooks expect).
// A failure carries chorus's message, which names the ranks and the calls.
#pragma once

#include <ATen/core/ivalue.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "chorus/chorus.h"
#include "torch_version.h"

namespace chorus_torch {

class WorkChorus : public c10d::Work {
 public:
  // `what` names the call in messages ("all_reduce on rank 1 of 3"); outputs go to the future;
  // `keep` holds inputs and staging buffers alive until the requests are done.
  WorkChorus(int rank, c10d::OpType type, std::string what, std::vector<at::Tensor> outputs,
             std::vector<at::Tensor> keep);
  ~WorkChorus() override;

  void add_request(chorusRequest_t r) { requests_.push_back(r); }
  void set_after(std::function<void()> f) { after_ = std::move(f); }
  const std::string& what() const { return what_; }

  bool wait(std::chrono::milliseconds timeout) override;
  // Done once the Future is: c10d's own flag is set a moment before the Future is marked, and a
  // caller that saw wait() return (or is_completed()) must find the Future done as well.
  bool isCompleted() override { return future_->completed(); }
  void synchronize() override {}
  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

  // Waits for every request (up to `seconds`; < 0: the communicator's timeout bounds it), then
  // the first caller to get there runs the after step and finishes the Work; a later caller
  // waits for that. The completer calls it, and so does wait() on the caller's own thread, which
  // spares a blocking call the hand-over to the completer. false: time ran out. Never throws.
  bool complete(double seconds = -1);

  // Test hook: the finisher sleeps `ms` between c10d's finish() and marking the Future, and
  // wait() sleeps ms / 2 before claiming, so that the completer finishes while a caller waits.
  static void test_slow_finish(int ms) { slow_finish_ms_.store(ms); }

 private:
  void finish_with(std::exception_ptr error);

  std::string what_;
  std::vector<at::Tensor> outputs_;
  std::vector<at::Tensor> keep_;
  std::vector<chorusRequest_t> requests_;
  std::function<void()> after_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  std::atomic<bool> claimed_{false};  // someone is finishing the Work
  static inline std::atomic<int> slow_finish_ms_{0};
};

// One thread per process group completing its Works in the order they were made (chorus runs a
// communicator's operations in call order, so waiting in that order never waits needlessly).
class Completer {
 public:
  Completer();
  ~Completer();  // completes everything queued, then joins
  void push(c10::intrusive_ptr<WorkChorus> w);
  void stop();

 private:
  void run();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<c10::intrusive_ptr<WorkChorus>> queue_;
  // Completed here, released by the next push() (the caller's thread) or the destructor: the last
  // reference to a Work may hold the last C++ reference to a tensor whose Python object then
  // needs the GIL, and a thread that takes the GIL while the interpreter finalizes is ended by
  // Python mid-C++ (pthread_exit through noexcept frames: "terminate called without an active
  // exception", seen as SIGABRT at the exit of a script that never destroyed its group).
  std::vector<c10::intrusive_ptr<WorkChorus>> done_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace chorus_torch
