// The CPU executor: the step primitives' copies and reductions on the CPU kernels.
#include "collectives/executor.h"

#include <cstring>

#include "kernels/cpu/copy.h"

namespace chorus {
namespace {

class CpuExecutor final : public Executor {
 public:
  void copy(char* dst, const char* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void copy_streaming(char* dst, const char* src, size_t bytes) override {
    kernels::copy_streaming(dst, src, bytes);
  }
  void reduce(kernels::DType t, kernels::RedOp op, const char* a, const char* b, char* out,
              size_t count) override {
    kernels::reduce(t, op, a, b, out, count);
  }
  void reduce_copy(kernels::DType t, kernels::RedOp op, const char* a, const char* b, char* out,
                   char* out2, size_t count) override {
    kernels::reduce_copy(t, op, a, b, out, out2, count);
  }
  void reduce_fold(kernels::DType t, kernels::RedOp op, const char* const* in, int w, char* out,
                   size_t count, int avg_n) override {
    kernels::reduce_fold(t, op, reinterpret_cast<const void* const*>(in), w, out, count, avg_n);
  }
};

}  // namespace

Executor& cpu_executor() {
  static CpuExecutor cpu;
  return cpu;
}

}  // namespace chorus
