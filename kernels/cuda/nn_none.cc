// kernels/cuda/nn.h in a build without CUDA: unavailable() says so and every kernel throws.
#include <stdexcept>

#include "kernels/cuda/nn.h"

namespace chorus::kernels::cuda::nn {
namespace {

[[noreturn]] void none() {
  throw std::runtime_error("cuda kernels: this build has no CUDA (meson -Dcuda=enabled, nvcc)");
}

}  // namespace

std::string unavailable() {
  return "this build has no CUDA kernels (meson -Dcuda=enabled, with nvcc)";
}
void set_device(int) {
  none();
}
void set_allow_tf32(bool) {}  // a setting: nothing runs that it would change
void gemm(Trans, Trans, int, int, int, float, const float*, int, const float*, int, float, float*,
          int) {
  none();
}
void conv2d_forward(const Conv2dShape&, const float*, const float*, const float*, float*, float*,
                    int) {
  none();
}
void conv2d_backward(const Conv2dShape&, const float*, const float*, const float*, float*, float*,
                     float*, float*, int) {
  none();
}
void max_pool2d_forward(const PoolShape&, const float*, float*, uint8_t*) {
  none();
}
void max_pool2d_backward(const PoolShape&, const float*, const float*, const uint8_t*, const float*,
                         float*) {
  none();
}
void relu_forward(long, const float*, float*) {
  none();
}
void relu_backward(long, const float*, const float*, float*) {
  none();
}
void add(long, const float*, const float*, float*) {
  none();
}
void mul(long, const float*, const float*, float*) {
  none();
}
void scale(long, float, const float*, float*) {
  none();
}
void div_scalar(long, const float*, float, float*) {
  none();
}
void fill(long, float, float*) {
  none();
}
float sum(long, const float*) {
  none();
}
void add_row_bias(int, int, const float*, float*) {
  none();
}
void sum_rows(int, int, const float*, float*) {
  none();
}
void log_softmax_forward(int, int, const float*, float*) {
  none();
}
void log_softmax_backward(int, int, const float*, const float*, float*) {
  none();
}
void nll_forward(int, int, const float*, const int32_t*, bool, float, float*) {
  none();
}
void nll_backward(int, int, const int32_t*, bool, const float*, float, float*) {
  none();
}
void capture_begin(int) {
  none();
}
void* capture_end() {
  none();
}
bool capturing() {
  return false;
}
void* capture_stream() {
  return nullptr;
}
void graph_launch(void*) {
  none();
}
void graph_destroy(void*) {}
void argmax_rows(int, int, const float*, int32_t*) {
  none();
}
void sgd_update(const SgdStep&, long, float*, const float*, float*, bool) {
  none();
}

}  // namespace chorus::kernels::cuda::nn
