// CUDA kernels for the CNN's operators (issue 12): the same entry points, with the same
// semantics, as the CPU kernels the tensor layer's table holds (ddp/ops/kernel_table.h), on
// device pointers. Plain C++ interface: nn.cu in CUDA builds, nn_none.cc elsewhere (available()
// false, every call throws). Each enqueues on the legacy default stream -- the stream the device
// all-reduce of a NULL stream and the chorusI* calls use -- so a step's kernels and its gradient
// all-reduces are ordered without events. Calls that return a host value (sum, argmax_rows)
// wait for it. Failures throw std::runtime_error naming the kernel and the CUDA
// error. Row-major throughout, as the CPU kernels.
//
// The index arithmetic (im2col, col2im, pooling windows, a softmax row) is nn_body.h's, shared
// with the host so that tests/kernels/test_cuda_nn_host.cc checks it against the CPU kernels on
// every machine.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/cpu/conv2d.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/pool.h"
#include "kernels/cpu/sgd.h"

namespace chorus::kernels::cuda::nn {

using cpu::Conv2dShape;
using cpu::PoolShape;
using cpu::SgdStep;
using cpu::Trans;

// Empty where the kernels can run (a CUDA build and a device); otherwise why not.
std::string unavailable();
void set_device(int device);  // the calling thread's current device
// CUDA graphs (ddp/train/step_graph.h). capture_begin: from here the calling thread's kernels
// are captured on a capturing stream of `device`, not run; a call here that would wait for the
// GPU (sum, argmax_rows, scratch that must grow) throws instead. The capture is relaxed
// (cudaStreamCaptureModeRelaxed), so that the caching allocator may cudaMalloc a block the
// captured step needs; nothing here touches the legacy stream while capturing.
// capture_end: the graph, instantiated (an opaque handle); the thread's kernels go to the legacy
// default stream again, also when the capture failed and it throws. graph_launch replays it on
// the legacy default stream, ordered with every other kernel and copy there.
void capture_begin(int device);
void* capture_end();
bool capturing();  // the calling thread's kernels are being captured
// The stream the calling thread captures on (null when it does not): DDP's events fork its
// buckets' all-reduces from it into the graph and join them back.
void* capture_stream();
void graph_launch(void* graph);
void graph_destroy(void* graph);

// TF32 tensor cores for the GEMMs (linear and convolution layers) when true; false (the start)
// keeps every product in float, within 1e-5 of the CPU. PyTorch's allow_tf32, process-wide.
void set_allow_tf32(bool allow);

void gemm(Trans ta, Trans tb, int m, int n, int k, float alpha, const float* a, int lda,
          const float* b, int ldb, float beta, float* c, int ldc);
// workspace and chunk are the CPU's (sized for its chunks); these kernels keep scratch of their
// own and take the whole batch in one GEMM.
void conv2d_forward(const Conv2dShape& s, const float* x, const float* w, const float* b, float* y,
                    float* workspace, int chunk);
void conv2d_backward(const Conv2dShape& s, const float* x, const float* w, const float* dy,
                     float* dx, float* dw, float* db, float* workspace, int chunk);
// argmax: one byte per output (the window position of its first maximum), or null; the
// backward finds the maxima again from x when it is null.
void max_pool2d_forward(const PoolShape& s, const float* x, float* y, uint8_t* argmax);
void max_pool2d_backward(const PoolShape& s, const float* x, const float* y, const uint8_t* argmax,
                         const float* dy, float* dx);
void relu_forward(long n, const float* x, float* y);
void relu_backward(long n, const float* y, const float* dy, float* dx);
void add(long n, const float* a, const float* b, float* y);
void mul(long n, const float* a, const float* b, float* y);
void scale(long n, float alpha, const float* x, float* y);
void div_scalar(long n, const float* x, float d, float* y);  // y = x / d, correctly rounded
void fill(long n, float value, float* y);
float sum(long n, const float* x);  // accumulated in double, in a fixed order
void add_row_bias(int rows, int cols, const float* bias, float* y);
void sum_rows(int rows, int cols, const float* dy, float* dbias);
void log_softmax_forward(int rows, int cols, const float* x, float* y);
void log_softmax_backward(int rows, int cols, const float* y, const float* dy, float* dx);
// labels: host memory (rows values), as the CPU's. The loss stays on the device: y[0] = the
// CPU's sum of -logp[r, labels[r]] (double, row order, rounded to float) / divisor; the backward
// reads dy[0] there: dlogp[r, labels[r]] = -(dy[0] * scale). Neither waits for the GPU.
// on_device: labels already in device memory (a captured step's static input).
void nll_forward(int rows, int cols, const float* logp, const int32_t* labels, bool on_device,
                 float divisor, float* y);
void nll_backward(int rows, int cols, const int32_t* labels, bool on_device, const float* dy,
                  float scale, float* dlogp);
void argmax_rows(int rows, int cols, const float* x, int32_t* out);  // out: host memory
// kernels/cpu/sgd.h's step, rounded the same way: w, grad and buf (null without momentum) on the
// device.
void sgd_update(const SgdStep& o, long n, float* w, const float* grad, float* buf, bool first);

}  // namespace chorus::kernels::cuda::nn
