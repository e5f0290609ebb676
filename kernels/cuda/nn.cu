// CUDA kernels for the CNN's operators (nn.h). Small and plain on purpose: the tutorial net's
// tensors are tiny, so launches, not FLOPs, decide its speed; the GEMM is a 16x16 shared-memory
// tile with k split where the tiles are few (gemm_body.h), every reduction runs in a fixed order
// (the same bits on every run).
#include <cuda_runtime.h>
#include <mma.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda/gemm_body.h"
#include "kernels/cuda/nn.h"
#include "kernels/cuda/nn_body.h"

namespace chorus::kernels::cuda::nn {
namespace {

constexpr int kThreads = 256;
constexpr int kTile = body::kGemmTile;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw std::runtime_error(std::string("cuda ") + what + ": " + cudaGetErrorName(e) + ": " +
                             cudaGetErrorString(e));
}
void launched(const char* what) {
  check(cudaGetLastError(), what);
}

int blocks_for(long n) {
  const long b = (n + kThreads - 1) / kThreads;
  return int(b < 1 ? 1 : (b > 65535 * 8 ? 65535 * 8 : b));
}

// Where the calling thread's kernels go: the legacy default stream (nullptr), or while a CUDA
// graph is captured (capture_begin .. capture_end) the capturing stream.
thread_local cudaStream_t t_stream = nullptr;

// Calls that wait for the GPU (a value for the host, scratch to grow) cannot be captured.
void not_capturing(const char* what) {
  if (t_stream)
    throw std::runtime_error(std::string("cuda ") + what +
                             ": waits for the GPU, which a captured step cannot (read host "
                             "values after the replay; run a step of the same shapes before "
                             "capturing, so that no buffer has to grow)");
}

// Device scratch that grows and is kept (per purpose), so a training step allocates nothing
// once the first step has run. One user at a time: the table's callers run on one thread.
// A buffer a CUDA graph captured is never freed: the graph's replays write it for as long as the
// graph lives (an eager op between replays -- the evaluation's larger batch -- may need a larger
// one: it gets a new buffer, and the graph keeps the old).
struct Scratch {
  void* p = nullptr;
  size_t bytes = 0;
  bool in_graph = false;
  void* get(size_t want, const char* what) {
    if (want <= bytes) {
      if (t_stream) in_graph = true;
      return p;
    }
    not_capturing(what);
    if (p && !in_graph) check(cudaFree(p), what);
    in_graph = false;
    p = nullptr;
    bytes = 0;
    check(cudaMalloc(&p, want), what);
    bytes = want;
    return p;
  }
};
Scratch g_col, g_mat, g_small, g_rows, g_split, g_rowsum;
std::mutex g_mu, g_split_mu;  // g_split_mu is taken inside g_mu (conv2d's GEMMs), never around it
std::atomic<bool> g_allow_tf32{false};

// ---- kernels ------------------------------------------------------------------------------

// C = alpha op(A) op(B) + beta C, row-major; C not read when beta is 0 (gemm_body.h). Block z
// of several splits writes its partial tile to `partial` instead; gemm_gather_kernel adds them.
__global__ void gemm_kernel(body::GemmArgs g, int chunk, float alpha, float beta, float* c, int ldc,
                            float* partial) {
  __shared__ body::GemmTileBuf as, bs;
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int k0 = blockIdx.z * chunk, kend = min(g.k, k0 + chunk);
  float acc = 0.0f;
  for (int t = k0; t < kend; t += kTile) {
    body::gemm_load(g, blockIdx.x, blockIdx.y, tx, ty, t, kend, as, bs);
    __syncthreads();
    acc = body::gemm_fma(acc, tx, ty, as, bs);
    __syncthreads();
  }
  const int row = blockIdx.y * kTile + ty, col = blockIdx.x * kTile + tx;
  if (row >= g.m || col >= g.n) return;
  if (partial) {
    partial[long(blockIdx.z) * g.m * g.n + long(row) * g.n + col] = acc;
    return;
  }
  float* out = c + long(row) * ldc + col;
  *out = beta == 0.0f ? alpha * acc : alpha * acc + beta * *out;
}

// The same GEMM on the tensor cores with TF32 inputs (CHORUS_ALLOW_TF32=1): gemm_body.h's
// "TF32". Every GPU this is built for (sm_80, sm_90) has TF32 tensor cores.
__global__ void __launch_bounds__(body::kTf32Threads)
    gemm_tf32_kernel(body::GemmArgs g, int chunk, float alpha, float beta, float* c, int ldc,
                     float* partial) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  namespace wmma = nvcuda::wmma;
  __shared__ __align__(32) body::Tf32Tiles s;
  __shared__ __align__(32) float cs[body::kTf32Tile * body::kTf32LdB];
  const int tid = threadIdx.x, warp = tid / 32;
  const int wr = (warp / 2) * 16, wc = (warp % 2) * 16;  // this warp's quarter of the C tile
  wmma::fragment<wmma::accumulator, 16, 16, 8, float> acc;
  wmma::fill_fragment(acc, 0.0f);
  const int k0 = blockIdx.z * chunk, kend = min(g.k, k0 + chunk);
  for (int t = k0; t < kend; t += body::kTf32K) {
    body::gemm_tf32_load(g, blockIdx.x, blockIdx.y, tid, t, kend, s);
    __syncthreads();
    for (int kk = 0; kk < body::kTf32K; kk += 8) {
      wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, wmma::row_major> fa;
      wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, wmma::row_major> fb;
      wmma::load_matrix_sync(fa, s.a + wr * body::kTf32LdA + kk, body::kTf32LdA);
      wmma::load_matrix_sync(fb, s.b + kk * body::kTf32LdB + wc, body::kTf32LdB);
      // Already TF32 values (tf32_round): the conversion wmma asks for leaves them as they are.
      for (int i = 0; i < fa.num_elements; ++i) fa.x[i] = wmma::__float_to_tf32(fa.x[i]);
      for (int i = 0; i < fb.num_elements; ++i) fb.x[i] = wmma::__float_to_tf32(fb.x[i]);
      wmma::mma_sync(acc, fa, fb, acc);
    }
    __syncthreads();
  }
  wmma::store_matrix_sync(cs + wr * body::kTf32LdB + wc, acc, body::kTf32LdB, wmma::mem_row_major);
  __syncthreads();
  body::gemm_tf32_store(g, blockIdx.x, blockIdx.y, blockIdx.z, tid, cs, alpha, beta, c, ldc,
                        partial);
#endif
}

__global__ void gemm_gather_kernel(const float* partial, int splits, int m, int n, float alpha,
                                   float beta, float* c, int ldc) {
  const long mn = long(m) * n;
  for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < mn;
       i += long(gridDim.x) * blockDim.x) {
    const float acc = body::gemm_gather(partial, splits, mn, i);
    float* out = c + (i / n) * ldc + i % n;
    *out = beta == 0.0f ? alpha * acc : alpha * acc + beta * *out;
  }
}

__global__ void im2col_kernel(Conv2dShape s, const float* x, float* col, long cols, long total) {
  for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < total;
       i += long(gridDim.x) * blockDim.x)
    col[i] = body::im2col_at(s, x, i / cols, i % cols);
}

__global__ void col2im_kernel(Conv2dShape s, const float* col, float* dx, long total) {
  for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < total;
       i += long(gridDim.x) * blockDim.x)
    dx[i] = body::col2im_at(s, col, i);
}

// (OC, N*P) <-> (N, OC, P); forward adds the bias.
__global__ void unpack_kernel(const float* mat, const float* bias, float* y, int oc, long p,
                              long total) {
  for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < total;
       i += long(gridDim.x) * blockDim.x) {
    const long q = i % p, c = (i / p) % oc, n = i / (p * oc);
    y[i] = mat[c * (total / oc) + n * p + q] + (bias ? bias[c] : 0.0f);
  }
}
__global__ void pack_kernel(const float* dy, float* mat, int oc, long p, long total) {
  for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < total;
       i += long(gridDim.x) * blockDim.x) {
    const long q = i % p, c = (i / p) % oc, n = i / (p * oc);
    mat[c * (total / oc) + n * p + q] = dy[i];
  }
}

// Row sums of a (rows, cols) matrix in two passes, in a fixed order whatever the GPU: pass 1
// sums each kRowChunk-wide piece of a row in a block (a fixed tree, in double), pass 2 adds a
// row's pieces in order. (One block per row was 6 blocks over 784 x batch columns for conv1's
// bias: a GPU's SMs mostly idle, each thread's loads one after another.)
constexpr long kRowChunk = 8192;

__global__ void row_chunk_sums_kernel(const float* mat, long cols, int chunks, double* partial) {
  __shared__ double part[kThreads];
  const long c0 = long(blockIdx.x) * kRowChunk, c1 = min(cols, c0 + kRowChunk);
  const float* r = mat + long(blockIdx.y) * cols;
  double acc = 0.0;
  for (long j = c0 + threadIdx.x; j < c1; j += blockDim.x) acc += r[j];
  part[threadIdx.x] = acc;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[long(blockIdx.y) * chunks + blockIdx.x] = part[0];
}

__global__ void row_sums_kernel(const double* partial, int rows, int chunks, float* out) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  double acc = 0.0;
  for (int c = 0; c < chunks; ++c) acc += partial[long(r) * chunks + c];
  out[r] = float(acc);
}

__global__ void pool_forward_kernel(PoolShape s, const float* x, float* y, uint8_t* argmax,
                                    long total) {
  for (long o = blockIdx.x * long(blockDim.x) + threadIdx.x; o < total;
       o += long(gridDim.x) * blockDim.x) {
    int at = 0;
    y[o] = body::pool_max_at(s, x, o, &at);
    if (argmax) argmax[o] = uint8_t(at);
  }
}

__global__ void pool_backward_kernel(PoolShape s, const float* x, const uint8_t* argmax,
                                     const float* dy, float* dx, long total) {
  for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < total;
       i += long(gridDim.x) * blockDim.x)
    dx[i] = body::pool_grad_at(s, x, argmax, dy, i);
}

enum class Ew { kRelu, kReluGrad, kAdd, kMul, kScale, kDiv, kFill };

__global__ void elementwise_kernel(Ew op, long n, float alpha, const float* a, const float* b,
                                   float* y) {
  for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < n;
       i += long(gridDim.x) * blockDim.x) {
    switch (op) {
      case Ew::kRelu:
        y[i] = a[i] > 0.0f ? a[i] : 0.0f;
        break;
      case Ew::kReluGrad:  // a: y, b: dy
        y[i] = a[i] > 0.0f ? b[i] : 0.0f;
        break;
      case Ew::kAdd:
        y[i] = a[i] + b[i];
        break;
      case Ew::kMul:
        y[i] = a[i] * b[i];
        break;
      case Ew::kScale:
        y[i] = alpha * a[i];
        break;
      case Ew::kDiv:
        y[i] = __fdiv_rn(a[i], alpha);
        break;
      case Ew::kFill:
        y[i] = alpha;
        break;
    }
  }
}

// Partial sums in double, one per block, in a fixed order; the host adds them in block order.
__global__ void sum_kernel(long n, const float* x, double* partial) {
  __shared__ double part[kThreads];
  double acc = 0.0;
  for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < n;
       i += long(gridDim.x) * blockDim.x)
    acc += x[i];
  part[threadIdx.x] = acc;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = part[0];
}

__global__ void add_row_bias_kernel(int rows, int cols, const float* bias, float* y) {
  const long total = long(rows) * cols;
  for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < total;
       i += long(gridDim.x) * blockDim.x)
    y[i] += bias[i % cols];
}

// dbias[c] = sum over rows in row order, as the CPU.
__global__ void sum_rows_kernel(int rows, int cols, const float* dy, float* dbias) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  float acc = 0.0f;
  for (int r = 0; r < rows; ++r) acc += dy[long(r) * cols + c];
  dbias[c] = acc;
}

__global__ void log_softmax_kernel(int rows, int cols, const float* x, float* y) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r < rows) body::log_softmax_row(cols, x + long(r) * cols, y + long(r) * cols);
}

__global__ void log_softmax_grad_kernel(int rows, int cols, const float* y, const float* dy,
                                        float* dx) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r < rows)
    body::log_softmax_grad_row(cols, y + long(r) * cols, dy + long(r) * cols, dx + long(r) * cols);
}

// The loss in one block, as the CPU sums it: -logp[r, labels[r]] in double, row by row (the
// block loads a chunk of rows at once, one thread adds them in order), then / divisor in float.
__global__ void nll_kernel(int rows, int cols, const float* logp, const int32_t* labels,
                           float divisor, float* y) {
  __shared__ float picked[kThreads];
  double s = 0.0;
  for (int r0 = 0; r0 < rows; r0 += kThreads) {
    const int r = r0 + threadIdx.x;
    if (r < rows) picked[threadIdx.x] = logp[long(r) * cols + labels[r]];
    __syncthreads();
    if (threadIdx.x == 0)
      for (int i = 0; i < kThreads && r0 + i < rows; ++i) s -= picked[i];
    __syncthreads();
  }
  if (threadIdx.x == 0) *y = float(s) / divisor;
}

__global__ void nll_grad_kernel(int rows, int cols, const int32_t* labels, const float* dy,
                                float scale, float* dlogp) {
  const float g = -(*dy * scale);
  const long total = long(rows) * cols;
  for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < total;
       i += long(gridDim.x) * blockDim.x)
    dlogp[i] = i % cols == labels[i / cols] ? g : 0.0f;
}

__global__ void argmax_kernel(int rows, int cols, const float* x, int32_t* out) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r < rows) out[r] = body::argmax_row(cols, x + long(r) * cols);
}

__global__ void sgd_kernel(SgdStep o, long n, float* w, const float* grad, float* buf, bool first) {
  for (long j = blockIdx.x * long(blockDim.x) + threadIdx.x; j < n;
       j += long(gridDim.x) * blockDim.x) {
    float d = grad[j];
    if (o.weight_decay != 0.0f) d = __fadd_rn(d, __fmul_rn(o.weight_decay, w[j]));
    if (buf) {
      buf[j] =
          first ? d : __fadd_rn(__fmul_rn(buf[j], o.momentum), __fmul_rn(1.0f - o.dampening, d));
      d = o.nesterov ? __fadd_rn(d, __fmul_rn(o.momentum, buf[j])) : buf[j];
    }
    w[j] = __fadd_rn(w[j], __fmul_rn(-o.lr, d));
  }
}

void elementwise(Ew op, long n, float alpha, const float* a, const float* b, float* y,
                 const char* what) {
  if (n <= 0) return;
  elementwise_kernel<<<blocks_for(n), kThreads, 0, t_stream>>>(op, n, alpha, a, b, y);
  launched(what);
}

// Labels (host) into device memory, queued on the legacy default stream behind the kernels
// already there. cudaMemcpy from pageable memory first waits for every kernel queued (a stall of
// the host in the middle of each step); cudaMemcpyAsync need not (CUDA's "API synchronization
// behavior": it may still, where the driver must stage the bytes).
const int32_t* labels_on_device(int rows, const int32_t* labels) {
  not_capturing("nll labels from host memory");  // a graph would read them again at replay
  auto* d = static_cast<int32_t*>(g_small.get(sizeof(int32_t) * rows, "nll labels"));
  check(cudaMemcpyAsync(d, labels, sizeof(int32_t) * rows, cudaMemcpyHostToDevice, t_stream),
        "nll labels");
  return d;
}

}  // namespace

std::string unavailable() {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) return std::string("no CUDA device: ") + cudaGetErrorString(e);
  return n > 0 ? std::string() : std::string("no CUDA device");
}

bool capturing() {
  return t_stream != nullptr;
}

void* capture_stream() {
  return t_stream;
}

void capture_begin(int device) {
  if (t_stream) throw std::runtime_error("cuda graph: this thread is capturing already");
  check(cudaSetDevice(device), "cudaSetDevice");
  cudaStream_t s = nullptr;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  if (const cudaError_t e = cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed);
      e != cudaSuccess) {
    cudaStreamDestroy(s);
    check(e, "cudaStreamBeginCapture");
  }
  t_stream = s;
}

void* capture_end() {
  if (!t_stream) throw std::runtime_error("cuda graph: this thread is not capturing");
  cudaStream_t s = t_stream;
  t_stream = nullptr;
  cudaGraph_t graph = nullptr;
  const cudaError_t e = cudaStreamEndCapture(s, &graph);
  cudaStreamDestroy(s);
  check(e, "cudaStreamEndCapture");
  cudaGraphExec_t exec = nullptr;
  const cudaError_t ie = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  check(ie, "cudaGraphInstantiate");
  return exec;
}

void graph_launch(void* graph) {
  not_capturing("graph launch");
  check(cudaGraphLaunch(static_cast<cudaGraphExec_t>(graph), 0), "cudaGraphLaunch");
}

void graph_destroy(void* graph) {
  if (graph) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(graph));
}

void set_device(int device) {
  check(cudaSetDevice(device), "cudaSetDevice");
}

void set_allow_tf32(bool allow) {
  g_allow_tf32.store(allow);
}

void gemm(Trans ta, Trans tb, int m, int n, int k, float alpha, const float* a, int lda,
          const float* b, int ldb, float beta, float* c, int ldc) {
  if (m <= 0 || n <= 0) return;
  const body::GemmArgs g{ta == Trans::kYes, tb == Trans::kYes, m, n, k, a, lda, b, ldb};
  const bool tf32 = g_allow_tf32.load(std::memory_order_relaxed);
  const int tile = tf32 ? body::kTf32Tile : kTile;
  const body::GemmSplit split = body::gemm_split(m, n, k, tile);
  const dim3 grid((n + tile - 1) / tile, (m + tile - 1) / tile, split.splits);
  auto launch = [&](float* partial) {
    if (tf32)
      gemm_tf32_kernel<<<grid, body::kTf32Threads, 0, t_stream>>>(g, split.chunk, alpha, beta, c,
                                                                  ldc, partial);
    else
      gemm_kernel<<<grid, dim3(kTile, kTile), 0, t_stream>>>(g, split.chunk, alpha, beta, c, ldc,
                                                             partial);
    launched(tf32 ? "gemm (tf32)" : "gemm");
  };
  if (split.splits == 1) {
    launch(nullptr);
    return;
  }
  std::lock_guard<std::mutex> lock(g_split_mu);
  auto* partial = static_cast<float*>(
      g_split.get(sizeof(float) * size_t(split.splits) * size_t(m) * size_t(n), "gemm split"));
  launch(partial);
  gemm_gather_kernel<<<blocks_for(long(m) * n), kThreads, 0, t_stream>>>(partial, split.splits, m,
                                                                         n, alpha, beta, c, ldc);
  launched("gemm split sums");
}

void conv2d_forward(const Conv2dShape& s, const float* x, const float* w, const float* b, float* y,
                    float*, int) {
  std::lock_guard<std::mutex> lock(g_mu);
  const long K = s.patch(), cols = s.pixels(), P = long(s.oh()) * s.ow();
  if (cols == 0) return;
  auto* col = static_cast<float*>(g_col.get(sizeof(float) * K * cols, "conv2d im2col"));
  auto* mat = static_cast<float*>(g_mat.get(sizeof(float) * s.oc * cols, "conv2d output"));
  im2col_kernel<<<blocks_for(K * cols), kThreads, 0, t_stream>>>(s, x, col, cols, K * cols);
  launched("im2col");
  nn::gemm(Trans::kNo, Trans::kNo, s.oc, int(cols), int(K), 1.0f, w, int(K), col, int(cols), 0.0f,
           mat, int(cols));
  unpack_kernel<<<blocks_for(s.oc * cols), kThreads, 0, t_stream>>>(mat, b, y, s.oc, P,
                                                                    s.oc * cols);
  launched("conv2d output");
}

void conv2d_backward(const Conv2dShape& s, const float* x, const float* w, const float* dy,
                     float* dx, float* dw, float* db, float*, int) {
  std::lock_guard<std::mutex> lock(g_mu);
  const long K = s.patch(), cols = s.pixels(), P = long(s.oh()) * s.ow();
  auto* col =
      static_cast<float*>(g_col.get(sizeof(float) * K * std::max(cols, 1L), "conv2d im2col"));
  auto* mat =
      static_cast<float*>(g_mat.get(sizeof(float) * s.oc * std::max(cols, 1L), "conv2d dy"));
  pack_kernel<<<blocks_for(s.oc * cols), kThreads, 0, t_stream>>>(dy, mat, s.oc, P, s.oc * cols);
  launched("conv2d dy");
  im2col_kernel<<<blocks_for(K * cols), kThreads, 0, t_stream>>>(s, x, col, cols, K * cols);
  launched("im2col");
  // dw (OC, K) = dy (OC, cols) x col^T; db = row sums of dy; dcol = w^T x dy, into col.
  nn::gemm(Trans::kNo, Trans::kYes, s.oc, int(K), int(cols), 1.0f, mat, int(cols), col, int(cols),
           0.0f, dw, int(K));
  if (db) {
    const int chunks = int(std::max(1L, (cols + kRowChunk - 1) / kRowChunk));
    auto* partial = static_cast<double*>(
        g_rowsum.get(sizeof(double) * size_t(chunks) * size_t(s.oc), "conv2d db"));
    row_chunk_sums_kernel<<<dim3(chunks, s.oc), kThreads, 0, t_stream>>>(mat, cols, chunks,
                                                                         partial);
    launched("conv2d db");
    row_sums_kernel<<<(s.oc + kThreads - 1) / kThreads, kThreads, 0, t_stream>>>(partial, s.oc,
                                                                                 chunks, db);
    launched("conv2d db");
  }
  if (dx) {
    nn::gemm(Trans::kYes, Trans::kNo, int(K), int(cols), s.oc, 1.0f, w, int(K), mat, int(cols),
             0.0f, col, int(cols));
    const long total = long(s.n) * s.c * s.h * s.w;
    col2im_kernel<<<blocks_for(total), kThreads, 0, t_stream>>>(s, col, dx, total);
    launched("col2im");
  }
}

void max_pool2d_forward(const PoolShape& s, const float* x, float* y, uint8_t* argmax) {
  const long total = long(s.planes) * s.oh() * s.ow();
  if (total == 0) return;
  pool_forward_kernel<<<blocks_for(total), kThreads, 0, t_stream>>>(s, x, y, argmax, total);
  launched("max_pool2d");
}

void max_pool2d_backward(const PoolShape& s, const float* x, const float*, const uint8_t* argmax,
                         const float* dy, float* dx) {
  const long total = long(s.planes) * s.h * s.w;
  if (total == 0) return;
  pool_backward_kernel<<<blocks_for(total), kThreads, 0, t_stream>>>(s, x, argmax, dy, dx, total);
  launched("max_pool2d backward");
}

void relu_forward(long n, const float* x, float* y) {
  elementwise(Ew::kRelu, n, 0, x, nullptr, y, "relu");
}
void relu_backward(long n, const float* y, const float* dy, float* dx) {
  elementwise(Ew::kReluGrad, n, 0, y, dy, dx, "relu backward");
}
void add(long n, const float* a, const float* b, float* y) {
  elementwise(Ew::kAdd, n, 0, a, b, y, "add");
}
void mul(long n, const float* a, const float* b, float* y) {
  elementwise(Ew::kMul, n, 0, a, b, y, "mul");
}
void scale(long n, float alpha, const float* x, float* y) {
  elementwise(Ew::kScale, n, alpha, x, nullptr, y, "scale");
}
void div_scalar(long n, const float* x, float d, float* y) {
  elementwise(Ew::kDiv, n, d, x, nullptr, y, "div");
}
void fill(long n, float value, float* y) {
  elementwise(Ew::kFill, n, value, nullptr, nullptr, y, "fill");
}

float sum(long n, const float* x) {
  if (n <= 0) return 0.0f;
  std::lock_guard<std::mutex> lock(g_mu);
  const int blocks = int(std::min<long>(1024, (n + kThreads - 1) / kThreads));
  auto* partial = static_cast<double*>(g_small.get(sizeof(double) * blocks, "sum"));
  sum_kernel<<<blocks, kThreads, 0, t_stream>>>(n, x, partial);
  launched("sum");
  std::vector<double> host(blocks);
  not_capturing("sum");
  check(cudaMemcpy(host.data(), partial, sizeof(double) * blocks, cudaMemcpyDeviceToHost), "sum");
  double s = 0.0;
  for (double v : host) s += v;
  return float(s);
}

void add_row_bias(int rows, int cols, const float* bias, float* y) {
  if (long(rows) * cols == 0) return;
  add_row_bias_kernel<<<blocks_for(long(rows) * cols), kThreads, 0, t_stream>>>(rows, cols, bias,
                                                                                y);
  launched("add_row_bias");
}

void sum_rows(int rows, int cols, const float* dy, float* dbias) {
  if (cols == 0) return;
  sum_rows_kernel<<<(cols + kThreads - 1) / kThreads, kThreads, 0, t_stream>>>(rows, cols, dy,
                                                                               dbias);
  launched("sum_rows");
}

void log_softmax_forward(int rows, int cols, const float* x, float* y) {
  if (rows == 0) return;
  log_softmax_kernel<<<(rows + kThreads - 1) / kThreads, kThreads, 0, t_stream>>>(rows, cols, x, y);
  launched("log_softmax");
}

void log_softmax_backward(int rows, int cols, const float* y, const float* dy, float* dx) {
  if (rows == 0) return;
  log_softmax_grad_kernel<<<(rows + kThreads - 1) / kThreads, kThreads, 0, t_stream>>>(rows, cols,
                                                                                       y, dy, dx);
  launched("log_softmax backward");
}

void nll_forward(int rows, int cols, const float* logp, const int32_t* labels, bool on_device,
                 float divisor, float* y) {
  std::lock_guard<std::mutex> lock(g_mu);
  const int32_t* d_labels = on_device || rows == 0 ? labels : labels_on_device(rows, labels);
  nll_kernel<<<1, kThreads, 0, t_stream>>>(rows, cols, logp, d_labels, divisor, y);
  launched("nll");
}

void nll_backward(int rows, int cols, const int32_t* labels, bool on_device, const float* dy,
                  float scale, float* dlogp) {
  if (long(rows) * cols == 0) return;
  std::lock_guard<std::mutex> lock(g_mu);
  const int32_t* d_labels = on_device ? labels : labels_on_device(rows, labels);
  nll_grad_kernel<<<blocks_for(long(rows) * cols), kThreads, 0, t_stream>>>(rows, cols, d_labels,
                                                                            dy, scale, dlogp);
  launched("nll backward");
}

void argmax_rows(int rows, int cols, const float* x, int32_t* out) {
  if (rows == 0) return;
  std::lock_guard<std::mutex> lock(g_mu);
  auto* d = static_cast<int32_t*>(g_rows.get(sizeof(int32_t) * rows, "argmax"));
  argmax_kernel<<<(rows + kThreads - 1) / kThreads, kThreads, 0, t_stream>>>(rows, cols, x, d);
  launched("argmax");
  not_capturing("argmax");
  check(cudaMemcpy(out, d, sizeof(int32_t) * rows, cudaMemcpyDeviceToHost), "argmax");
}

void sgd_update(const SgdStep& o, long n, float* w, const float* grad, float* buf, bool first) {
  if (n <= 0) return;
  sgd_kernel<<<blocks_for(n), kThreads, 0, t_stream>>>(o, n, w, grad, buf, first);
  launched("sgd");
}

}  // namespace chorus::kernels::cuda::nn
