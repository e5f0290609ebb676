// The index arithmetic of the CUDA CNN kernels (kernels/cuda/nn_body.h) run on the CPU against
// the CPU kernels: im2col + GEMM + unpack against the direct convolution forward, col2im and the
// weight GEMM against its backward (strides 1-2, padding 0-2, odd sizes); pooling windows and
// their gradient with and without the argmax bytes, overlapping windows included; a softmax row
// and argmax. The GPU runs the same lines (tests/cuda/test_cuda_nn.cu compares there). The tiled,
// k-split GEMM (gemm_body.h) runs here block by block, its __syncthreads as phases: bit for bit
// the sum of each split's k-ordered sum in split order, every transpose, odd shapes, strides.
// The TF32 tiling likewise (loads, rounding, stores, splits; the tensor cores' products summed in
// double here), and tf32_round value by value.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <random>
#include <tuple>
#include <vector>

#include "kernels/cpu/conv2d.h"
#include "kernels/cpu/pool.h"
#include "kernels/cpu/softmax.h"
#include "kernels/cuda/gemm_body.h"
#include "kernels/cuda/nn_body.h"

namespace cpu = chorus::kernels::cpu;
namespace body = chorus::kernels::cuda::nn::body;

namespace {

int g_failed = 0;

void expect_close(const char* what, const std::vector<float>& got, const std::vector<float>& want,
                  float tol) {
  for (size_t i = 0; i < want.size(); ++i)
    if (!(std::fabs(got[i] - want[i]) <= tol * std::fmax(1.0f, std::fabs(want[i])))) {
      if (g_failed++ < 10)
        std::printf("FAIL %s: element %zu: got %g, want %g\n", what, i, got[i], want[i]);
      return;
    }
}

std::vector<float> random_vec(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

// nn.cu's gemm on the host: every block of the grid, its threads' loads, then (after what is a
// __syncthreads on the GPU) their multiply-adds, tile by tile; then the split sums.
void tiled_gemm(const body::GemmArgs& g, float alpha, float beta, float* c, int ldc) {
  const body::GemmSplit sp = body::gemm_split(g.m, g.n, g.k);
  const int T = body::kGemmTile, gx = (g.n + T - 1) / T, gy = (g.m + T - 1) / T;
  const long mn = long(g.m) * g.n;
  std::vector<float> partial(size_t(sp.splits * mn));
  for (int z = 0; z < sp.splits; ++z)
    for (int by = 0; by < gy; ++by)
      for (int bx = 0; bx < gx; ++bx) {
        body::GemmTileBuf as, bs;
        float acc[body::kGemmTile][body::kGemmTile] = {};
        const int k0 = z * sp.chunk, kend = std::min(g.k, k0 + sp.chunk);
        for (int t = k0; t < kend; t += T) {
          for (int ty = 0; ty < T; ++ty)
            for (int tx = 0; tx < T; ++tx) body::gemm_load(g, bx, by, tx, ty, t, kend, as, bs);
          for (int ty = 0; ty < T; ++ty)
            for (int tx = 0; tx < T; ++tx)
              acc[ty][tx] = body::gemm_fma(acc[ty][tx], tx, ty, as, bs);
        }
        for (int ty = 0; ty < T; ++ty)
          for (int tx = 0; tx < T; ++tx) {
            const int row = by * T + ty, col = bx * T + tx;
            if (row < g.m && col < g.n)
              partial[size_t(z * mn + long(row) * g.n + col)] = acc[ty][tx];
          }
      }
  for (long i = 0; i < mn; ++i) {
    const float acc = body::gemm_gather(partial.data(), sp.splits, mn, i);
    float* out = c + (i / g.n) * ldc + i % g.n;
    *out = beta == 0.0f ? alpha * acc : alpha * acc + beta * *out;
  }
}

std::vector<float> tiled_matmul(const std::vector<float>& a, bool ta, const std::vector<float>& b,
                                bool tb, long m, long n, long k) {
  std::vector<float> c(size_t(m * n));
  tiled_gemm(body::GemmArgs{ta, tb, int(m), int(n), int(k), a.data(), int(ta ? m : k), b.data(),
                            int(tb ? k : n)},
             1.0f, 0.0f, c.data(), int(n));
  return c;
}

// One GEMM with leading dimensions past the matrices' widths, alpha and beta, against the sum in
// the same order (each split's k in order, the splits in order): bit for bit.
void gemm_case(bool ta, bool tb, int m, int n, int k, std::mt19937& rng, int* split_cases) {
  const int lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + 5, ldc = n + 2;
  auto a = random_vec(size_t((ta ? k : m) * lda), rng);
  auto b = random_vec(size_t((tb ? n : k) * ldb), rng);
  auto c = random_vec(size_t(m * ldc), rng);
  auto want = c;
  const float alpha = 0.5f, beta = m % 2 ? 0.0f : -1.25f;
  const body::GemmSplit sp = body::gemm_split(m, n, k);
  if (sp.chunk % body::kGemmTile || long(sp.chunk) * sp.splits < k ||
      (sp.splits > 1 && long(sp.chunk) * (sp.splits - 1) >= k)) {
    if (g_failed++ < 10)
      std::printf("FAIL gemm split of %dx%dx%d: %d x %d\n", m, n, k, sp.splits, sp.chunk);
  }
  if (sp.splits > 1) ++*split_cases;
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      float total = 0.0f;
      for (int z = 0; z < sp.splits; ++z) {
        float acc = 0.0f;
        for (int e = z * sp.chunk; e < std::min(k, (z + 1) * sp.chunk); ++e)
          acc += (ta ? a[size_t(e * lda + i)] : a[size_t(i * lda + e)]) *
                 (tb ? b[size_t(j * ldb + e)] : b[size_t(e * ldb + j)]);
        total = z == 0 ? acc : total + acc;
      }
      float& out = want[size_t(i * ldc + j)];
      out = beta == 0.0f ? alpha * total : alpha * total + beta * out;
    }
  tiled_gemm(body::GemmArgs{ta, tb, m, n, k, a.data(), lda, b.data(), ldb}, alpha, beta, c.data(),
             ldc);
  char what[96];
  std::snprintf(what, sizeof what, "gemm %c%c %dx%dx%d (%d splits)", ta ? 'T' : 'N', tb ? 'T' : 'N',
                m, n, k, sp.splits);
  expect_close(what, c, want, 0.0f);
}

// tf32_round, value by value: PTX cvt.rna.tf32.f32 (nearest, ties away from zero).
void tf32_round_cases() {
  const struct {
    uint32_t in, want;
    const char* what;
  } cases[] = {
      {0x3f800000u, 0x3f800000u, "1"},
      {0x3f801000u, 0x3f802000u, "1 + 2^-11 (a tie: away from zero)"},
      {0x3f800fffu, 0x3f800000u, "just below the tie"},
      {0x3f801001u, 0x3f802000u, "just above the tie"},
      {0xbf801000u, 0xbf802000u, "-(1 + 2^-11) (a tie: away from zero)"},
      {0x3fffffffu, 0x40000000u, "a carry into the exponent"},
      {0x7f7fffffu, 0x7f800000u, "float's largest: past TF32's, infinity"},
      {0x7f800000u, 0x7f800000u, "infinity"},
      {0xff800000u, 0xff800000u, "-infinity"},
      {0x7fc00001u, 0x7fc00001u, "a NaN, payload kept"},
      {0x00000fffu, 0x00000000u, "a denormal rounded down"},
      {0x00001000u, 0x00002000u, "a denormal tie"},
  };
  for (const auto& c : cases) {
    float x, r;
    uint32_t got;
    std::memcpy(&x, &c.in, sizeof x);
    r = body::tf32_round(x);
    std::memcpy(&got, &r, sizeof got);
    if (got != c.want && g_failed++ < 10)
      std::printf("FAIL tf32_round(%s: 0x%08x) = 0x%08x, want 0x%08x\n", c.what, c.in, got, c.want);
  }
}

// nn.cu's TF32 GEMM on the host: each block's loads (every thread's gemm_tf32_load, into tiles
// filled with NaN first, so an element no thread writes shows), the tile's products summed in
// double where the tensor cores sum in float, gemm_tf32_store, the split sums. Against the
// products of the rounded operands summed in double: a wrong load, edge or split is an error of
// the operands' size, the float partial sums about 1e-7 of it. And the operands must have been
// rounded: against the unrounded products some element differs by more than that.
void tf32_gemm_case(bool ta, bool tb, int m, int n, int k, std::mt19937& rng, int* split_cases) {
  const int lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + 5, ldc = n + 2;
  auto a = random_vec(size_t((ta ? k : m) * lda), rng);
  auto b = random_vec(size_t((tb ? n : k) * ldb), rng);
  auto c = random_vec(size_t(m * ldc), rng);
  auto want = c, unrounded = c;
  const float alpha = 0.5f, beta = m % 2 ? 0.0f : -1.25f;
  const body::GemmArgs g{ta, tb, m, n, k, a.data(), lda, b.data(), ldb};
  const body::GemmSplit sp = body::gemm_split(m, n, k, body::kTf32Tile);
  if (sp.splits > 1) ++*split_cases;
  const int T = body::kTf32Tile, gx = (n + T - 1) / T, gy = (m + T - 1) / T;
  const long mn = long(m) * n;
  std::vector<float> partial(size_t(sp.splits * mn));
  for (int z = 0; z < sp.splits; ++z)
    for (int by = 0; by < gy; ++by)
      for (int bx = 0; bx < gx; ++bx) {
        std::vector<double> acc(size_t(T * T));
        const int k0 = z * sp.chunk, kend = std::min(k, k0 + sp.chunk);
        for (int t = k0; t < kend; t += body::kTf32K) {
          body::Tf32Tiles s;
          std::fill(std::begin(s.a), std::end(s.a), NAN);
          std::fill(std::begin(s.b), std::end(s.b), NAN);
          for (int tid = 0; tid < body::kTf32Threads; ++tid)
            body::gemm_tf32_load(g, bx, by, tid, t, kend, s);
          for (int i = 0; i < T; ++i)
            for (int j = 0; j < T; ++j)
              for (int e = 0; e < body::kTf32K; ++e)
                acc[size_t(i * T + j)] +=
                    double(s.a[i * body::kTf32LdA + e]) * s.b[e * body::kTf32LdB + j];
        }
        std::vector<float> cs(size_t(T * body::kTf32LdB));
        for (int i = 0; i < T; ++i)
          for (int j = 0; j < T; ++j)
            cs[size_t(i * body::kTf32LdB + j)] = float(acc[size_t(i * T + j)]);
        for (int tid = 0; tid < body::kTf32Threads; ++tid)
          body::gemm_tf32_store(g, bx, by, z, tid, cs.data(), alpha, beta, c.data(), ldc,
                                sp.splits > 1 ? partial.data() : nullptr);
      }
  if (sp.splits > 1)
    for (long i = 0; i < mn; ++i) {
      const float acc = body::gemm_gather(partial.data(), sp.splits, mn, i);
      float* out = c.data() + (i / n) * ldc + i % n;
      *out = beta == 0.0f ? alpha * acc : alpha * acc + beta * *out;
    }
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      double sum = 0.0, exact = 0.0;
      for (int e = 0; e < k; ++e) {
        const float x = ta ? a[size_t(e * lda + i)] : a[size_t(i * lda + e)];
        const float y = tb ? b[size_t(j * ldb + e)] : b[size_t(e * ldb + j)];
        sum += double(body::tf32_round(x)) * body::tf32_round(y);
        exact += double(x) * y;
      }
      float& out = want[size_t(i * ldc + j)];
      float& plain = unrounded[size_t(i * ldc + j)];
      out = beta == 0.0f ? float(alpha * sum) : float(alpha * sum + beta * out);
      plain = beta == 0.0f ? float(alpha * exact) : float(alpha * exact + beta * plain);
    }
  char what[96];
  std::snprintf(what, sizeof what, "tf32 gemm %c%c %dx%dx%d (%d splits)", ta ? 'T' : 'N',
                tb ? 'T' : 'N', m, n, k, sp.splits);
  expect_close(what, c, want, 1e-5f);
  float most = 0.0f;
  for (size_t i = 0; i < c.size(); ++i) most = std::max(most, std::fabs(c[i] - unrounded[i]));
  if (k >= 16 && !(most > 1e-4f) && g_failed++ < 10)
    std::printf("FAIL %s: within %g of the unrounded products: not rounded to TF32?\n", what, most);
}

void conv_case(const cpu::Conv2dShape& s, std::mt19937& rng) {
  const long K = s.patch(), cols = s.pixels(), P = long(s.oh()) * s.ow();
  auto x = random_vec(size_t(s.n) * s.c * s.h * s.w, rng);
  auto w = random_vec(size_t(s.oc * K), rng);
  auto b = random_vec(size_t(s.oc), rng);
  auto dy = random_vec(size_t(s.n * s.oc * P), rng);
  std::vector<float> col(size_t(K * cols));
  for (long k = 0; k < K; ++k)
    for (long j = 0; j < cols; ++j) col[size_t(k * cols + j)] = body::im2col_at(s, x.data(), k, j);
  // forward: (OC, cols) -> (N, OC, P) + bias
  auto mat = tiled_matmul(w, false, col, false, s.oc, cols, K);
  std::vector<float> y(size_t(s.n * s.oc * P)), want(y.size());
  for (long n = 0; n < s.n; ++n)
    for (long c = 0; c < s.oc; ++c)
      for (long q = 0; q < P; ++q)
        y[size_t((n * s.oc + c) * P + q)] = mat[size_t(c * cols + n * P + q)] + b[size_t(c)];
  cpu::conv2d_forward_ref(s, x.data(), w.data(), b.data(), want.data());
  expect_close("conv2d forward", y, want, 1e-5f);
  // backward: dy packed to (OC, cols); dw = dy col^T; dcol = w^T dy; dx = col2im(dcol)
  std::vector<float> dmat(size_t(s.oc * cols));
  for (long n = 0; n < s.n; ++n)
    for (long c = 0; c < s.oc; ++c)
      for (long q = 0; q < P; ++q)
        dmat[size_t(c * cols + n * P + q)] = dy[size_t((n * s.oc + c) * P + q)];
  auto dw = tiled_matmul(dmat, false, col, true, s.oc, K, cols);
  auto dcol = tiled_matmul(w, true, dmat, false, K, cols, s.oc);
  std::vector<float> dx(x.size());
  for (size_t i = 0; i < dx.size(); ++i) dx[i] = body::col2im_at(s, dcol.data(), long(i));
  std::vector<float> want_dx(x.size()), want_dw(w.size()), want_db(b.size());
  cpu::conv2d_backward_ref(s, x.data(), w.data(), dy.data(), want_dx.data(), want_dw.data(),
                           want_db.data());
  expect_close("conv2d backward dx", dx, want_dx, 1e-4f);
  expect_close("conv2d backward dw", dw, want_dw, 1e-4f);
}

void pool_case(const cpu::PoolShape& s, std::mt19937& rng) {
  auto x = random_vec(size_t(s.planes) * s.h * s.w, rng);
  for (size_t i = 0; i < x.size(); i += 7) x[i] = x[i / 2];  // ties: the first maximum wins
  const long outs = long(s.planes) * s.oh() * s.ow();
  std::vector<float> y(static_cast<size_t>(outs)), want(y.size());
  std::vector<uint8_t> argmax(static_cast<size_t>(outs));
  for (long o = 0; o < outs; ++o) {
    int at = 0;
    y[size_t(o)] = body::pool_max_at(s, x.data(), o, &at);
    argmax[size_t(o)] = uint8_t(at);
  }
  cpu::max_pool2d_forward_ref(s, x.data(), want.data());
  expect_close("max_pool2d forward", y, want, 0.0f);
  auto dy = random_vec(size_t(outs), rng);
  std::vector<float> want_dx(x.size());
  cpu::max_pool2d_backward_ref(s, x.data(), y.data(), dy.data(), want_dx.data());
  for (const uint8_t* am :
       {static_cast<const uint8_t*>(argmax.data()), static_cast<const uint8_t*>(nullptr)}) {
    std::vector<float> dx(x.size());
    for (size_t i = 0; i < dx.size(); ++i)
      dx[i] = body::pool_grad_at(s, x.data(), am, dy.data(), long(i));
    expect_close(am ? "max_pool2d backward (argmax)" : "max_pool2d backward", dx, want_dx, 1e-6f);
  }
}

}  // namespace

int main() {
  std::mt19937 rng(7);
  int cases = 0;
  for (int stride : {1, 2})
    for (int pad : {0, 1, 2})
      for (int k : {1, 3, 5}) {
        cpu::Conv2dShape s;
        s.n = 3, s.c = 2, s.h = 9, s.w = 11, s.oc = 4, s.kh = k, s.kw = k, s.stride = stride;
        s.pad = pad;
        conv_case(s, rng);
        ++cases;
      }
  // GEMMs: every transpose; one tile and less, odd edges, the convolutions' weight gradients
  // (6 x 75 and 16 x 150 over 784 and 100 pixels a sample, batch 16 and 64: k split), a
  // linear layer's (120 x 400 over a batch of 256: enough tiles, k whole).
  int split_cases = 0;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (auto [m, n, k] : {std::tuple{1, 1, 1},
                             {5, 3, 0},
                             {17, 33, 5},
                             {6, 75, 784 * 16},
                             {16, 150, 100 * 64},
                             {120, 400, 256},
                             {33, 17, 1000}}) {
        gemm_case(ta, tb, m, n, k, rng, &split_cases);
        ++cases;
      }
  if (split_cases < 8 && g_failed++ < 10)
    std::printf("FAIL only %d GEMM cases split k\n", split_cases);
  tf32_round_cases();
  int tf32_split_cases = 0;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (auto [m, n, k] : {std::tuple{1, 1, 1},
                             {5, 3, 0},
                             {17, 33, 5},
                             {33, 65, 40},
                             {6, 75, 784 * 4},
                             {16, 150, 100 * 16},
                             {120, 400, 64}}) {
        tf32_gemm_case(ta, tb, m, n, k, rng, &tf32_split_cases);
        ++cases;
      }
  if (tf32_split_cases < 8 && g_failed++ < 10)
    std::printf("FAIL only %d TF32 GEMM cases split k\n", tf32_split_cases);
  if (const body::GemmSplit sp = body::gemm_split(6, 75, 784 * 256); sp.splits < 64) {
    if (g_failed++ < 10)  // batch 256's conv1 weight gradient: 5 tiles need many splits
      std::printf("FAIL 6x75x%d: %d splits\n", 784 * 256, sp.splits);
  }
  cpu::Conv2dShape lenet;  // the tutorial net's layers
  lenet.n = 4, lenet.c = 3, lenet.h = 32, lenet.w = 32, lenet.oc = 6, lenet.kh = lenet.kw = 5;
  conv_case(lenet, rng);
  lenet.c = 6, lenet.h = lenet.w = 14, lenet.oc = 16;
  conv_case(lenet, rng);
  cases += 2;
  for (auto [kernel, stride] : {std::pair{2, 2}, {3, 2}, {3, 1}, {2, 1}})
    for (int h : {4, 7, 28}) {
      cpu::PoolShape s;
      s.planes = 5, s.h = h, s.w = h + 1, s.kernel = kernel, s.stride = stride;
      pool_case(s, rng);
      ++cases;
    }
  // log_softmax, its gradient and argmax: the CPU's loops, bit for bit.
  const int rows = 33, cols = 10;
  auto x = random_vec(size_t(rows * cols), rng), dy = random_vec(size_t(rows * cols), rng);
  std::vector<float> y(x.size()), want(x.size()), dx(x.size()), want_dx(x.size());
  for (int r = 0; r < rows; ++r)
    body::log_softmax_row(cols, &x[size_t(r * cols)], &y[size_t(r * cols)]);
  cpu::log_softmax_forward(rows, cols, x.data(), want.data());
  expect_close("log_softmax", y, want, 0.0f);
  for (int r = 0; r < rows; ++r)
    body::log_softmax_grad_row(cols, &y[size_t(r * cols)], &dy[size_t(r * cols)],
                               &dx[size_t(r * cols)]);
  cpu::log_softmax_backward(rows, cols, y.data(), dy.data(), want_dx.data());
  expect_close("log_softmax backward", dx, want_dx, 0.0f);
  std::vector<int32_t> am(rows);
  cpu::argmax_rows(rows, cols, x.data(), am.data());
  for (int r = 0; r < rows; ++r)
    if (body::argmax_row(cols, &x[size_t(r * cols)]) != am[size_t(r)] && g_failed++ < 10)
      std::printf("FAIL argmax row %d\n", r);
  cases += 3;
  std::printf("%d cases, %s\n", cases, g_failed ? "FAILED" : "ok");
  return g_failed ? 1 : 0;
}
