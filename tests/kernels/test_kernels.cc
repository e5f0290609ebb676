// Fast CPU kernels against their plain references: GEMM (blocked and BLAS), conv2d (im2col +
// GEMM), max_pool2d (2x2 fast path), on odd sizes, strides and paddings; each in every
// instruction-set build this CPU runs (isa.h), and every build bit for bit against the scalar one.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/conv2d.h"
#include "kernels/cpu/copy.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/pool.h"
#include "kernels/cpu/softmax.h"

namespace k = chorus::kernels::cpu;
using chorus::kernels::Isa;

namespace {

std::vector<Isa> isas() {
  std::vector<Isa> v;
  for (int i = 0; i < chorus::kernels::kNumIsas; i++)
    if (chorus::kernels::cpu_supports(Isa(i))) v.push_back(Isa(i));
  return v;
}

void use(Isa isa) {
  chorus::Status s = chorus::kernels::set_isa(isa);
  INFO(s.message());
  REQUIRE(s.is_ok());
}

std::vector<float> random_vec(size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(gen);
  return v;
}

// max |a - b| / (1 + max |b|)
double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0.0, scale = 1.0;
  for (size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, static_cast<double>(std::fabs(a[i] - b[i])));
    scale = std::max(scale, static_cast<double>(std::fabs(b[i])));
  }
  return worst / scale;
}

}  // namespace

TEST_CASE("gemm: blocked and blas match the reference for every transpose", "[kernels][gemm]") {
  const Isa isa = GENERATE(Isa::kScalar, Isa::kAvx2, Isa::kAvx512);
  if (!chorus::kernels::cpu_supports(isa)) return;  // the qemu run covers avx2 without avx512
  use(isa);
  INFO("build " << chorus::kernels::isa_name(isa));
  const int shapes[][3] = {{1, 1, 1},     {6, 37, 25},    {16, 150, 64},
                           {33, 17, 129}, {64, 120, 256}, {5, 3, 0}};
  for (auto [m, n, kk] : shapes) {
    for (auto ta : {k::Trans::kNo, k::Trans::kYes})
      for (auto tb : {k::Trans::kNo, k::Trans::kYes})
        for (float beta : {0.0f, 1.0f, 0.5f}) {
          const int lda = ta == k::Trans::kNo ? std::max(kk, 1) : m;
          const int ldb = tb == k::Trans::kNo ? n : std::max(kk, 1);
          auto a = random_vec(static_cast<size_t>(m) * std::max(kk, 1), 1);
          auto b = random_vec(static_cast<size_t>(std::max(kk, 1)) * n, 2);
          auto c0 = random_vec(static_cast<size_t>(m) * n, 3);
          auto ref = c0, blocked = c0, blas = c0;
          k::gemm_ref(ta, tb, m, n, kk, 0.75f, a.data(), lda, b.data(), ldb, beta, ref.data(), n);
          k::gemm_blocked(ta, tb, m, n, kk, 0.75f, a.data(), lda, b.data(), ldb, beta,
                          blocked.data(), n);
          k::gemm_blas(ta, tb, m, n, kk, 0.75f, a.data(), lda, b.data(), ldb, beta, blas.data(), n);
          INFO("m " << m << " n " << n << " k " << kk << " ta " << int(ta) << " tb " << int(tb)
                    << " beta " << beta);
          CHECK(rel_err(blocked, ref) < 1e-5);
          CHECK(rel_err(blas, ref) < 1e-5);
        }
  }
}

TEST_CASE("conv2d: im2col + gemm matches the direct reference", "[kernels][conv]") {
  const Isa isa = GENERATE(Isa::kScalar, Isa::kAvx2, Isa::kAvx512);
  if (!chorus::kernels::cpu_supports(isa)) return;  // the qemu run covers avx2 without avx512
  use(isa);
  INFO("build " << chorus::kernels::isa_name(isa));
  struct Case {
    int n, c, h, w, oc, kh, kw, stride, pad;
  };
  const Case cases[] = {{2, 1, 28, 28, 6, 5, 5, 1, 0},
                        {3, 6, 12, 12, 16, 5, 5, 1, 0},
                        {1, 3, 7, 9, 4, 3, 3, 2, 1},
                        {2, 2, 5, 6, 3, 3, 2, 1, 2},
                        {1, 1, 4, 4, 1, 4, 4, 1, 0},
                        {2, 3, 11, 10, 5, 3, 3, 3, 1},
                        {2, 3, 26, 26, 4, 3, 3, 1, 0} /* direct path, C > 1 */,
                        {1, 2, 27, 30, 3, 4, 4, 1, 0} /* not direct */,
                        {1, 1, 24, 28, 2, 1, 5, 1, 0} /* direct, non-square */,
                        {3, 3, 32, 32, 6, 5, 5, 1, 0} /* direct, 28-wide */,
                        {1, 4, 30, 30, 2, 5, 5, 1, 0} /* 100 taps */};
  int direct = 0;
  for (const Case& t : cases) {
    k::Conv2dShape s;
    s.n = t.n, s.c = t.c, s.h = t.h, s.w = t.w, s.oc = t.oc, s.kh = t.kh, s.kw = t.kw,
    s.stride = t.stride, s.pad = t.pad;
    INFO("n " << t.n << " c " << t.c << " h " << t.h << " w " << t.w << " oc " << t.oc << " k "
              << t.kh << "x" << t.kw << " stride " << t.stride << " pad " << t.pad);
    const size_t xs = static_cast<size_t>(s.n) * s.c * s.h * s.w,
                 ws = static_cast<size_t>(s.oc) * s.patch(),
                 ys = static_cast<size_t>(s.n) * s.oc * s.oh() * s.ow();
    auto x = random_vec(xs, 4), w = random_vec(ws, 5), b = random_vec(static_cast<size_t>(s.oc), 6);
    auto dy = random_vec(ys, 7);
    std::vector<float> y_ref(ys), dx_ref(xs), dw_ref(ws), db_ref(static_cast<size_t>(s.oc));
    k::conv2d_forward_ref(s, x.data(), w.data(), b.data(), y_ref.data());
    k::conv2d_backward_ref(s, x.data(), w.data(), dy.data(), dx_ref.data(), dw_ref.data(),
                           db_ref.data());
    direct += k::conv2d_direct_applies(s);
    for (int chunk : {1, 2, s.n, k::conv2d_default_chunk(s)}) {
      INFO("chunk " << chunk);
      std::vector<float> y(ys), work(k::conv2d_workspace_floats(s, chunk)), dx(xs), dw(ws),
          db(static_cast<size_t>(s.oc));
      k::conv2d_forward(s, x.data(), w.data(), b.data(), y.data(), work.data(), chunk);
      CHECK(rel_err(y, y_ref) < 1e-5);
      k::conv2d_backward(s, x.data(), w.data(), dy.data(), dx.data(), dw.data(), db.data(),
                         work.data(), chunk);
      CHECK(rel_err(dx, dx_ref) < 1e-5);
      CHECK(rel_err(dw, dw_ref) < 1e-5);
      CHECK(rel_err(db, db_ref) < 1e-5);
    }
  }
  CHECK(direct == 4);  // both paths are exercised
}

TEST_CASE("max_pool2d: 2x2 fast path matches the reference, ties go to the first maximum",
          "[kernels][pool]") {
  const Isa isa = GENERATE(Isa::kScalar, Isa::kAvx2, Isa::kAvx512);
  if (!chorus::kernels::cpu_supports(isa)) return;  // the qemu run covers avx2 without avx512
  use(isa);
  INFO("build " << chorus::kernels::isa_name(isa));
  for (auto [planes, h, w, kern, stride] : {std::array<int, 5>{6, 24, 24, 2, 2},
                                            {3, 7, 9, 2, 2},
                                            {1, 2, 2, 2, 2},
                                            {2, 5, 4, 2, 2},
                                            {2, 7, 8, 3, 2},
                                            {1, 5, 5, 2, 1}}) {
    k::PoolShape s;
    s.planes = planes, s.h = h, s.w = w, s.kernel = kern, s.stride = stride;
    INFO("planes " << planes << " h " << h << " w " << w << " kernel " << kern << " stride "
                   << stride);
    auto x = random_vec(static_cast<size_t>(planes) * h * w, 8);
    for (size_t i = 0; i < x.size(); i += 3) x[i] = 0.0f;  // ties, as after relu
    const size_t ys = static_cast<size_t>(planes) * s.oh() * s.ow();
    auto dy = random_vec(ys, 9);
    std::vector<float> y_ref(ys), y(ys), dx_ref(x.size()), dx(x.size(), 42.0f);
    std::vector<uint8_t> idx(ys);
    k::max_pool2d_forward_ref(s, x.data(), y_ref.data());
    k::max_pool2d_forward(s, x.data(), y.data(), idx.data());
    CHECK(y == y_ref);
    k::max_pool2d_backward_ref(s, x.data(), y_ref.data(), dy.data(), dx_ref.data());
    k::max_pool2d_backward(s, x.data(), y.data(), idx.data(), dy.data(), dx.data());
    CHECK(dx == dx_ref);
  }
  // one window of four zeros: the gradient lands on the first
  k::PoolShape s;
  s.planes = 1, s.h = 2, s.w = 2;
  std::vector<float> x(4, 0.0f), y(1), dx(4);
  uint8_t idx = 9;
  const float dy = 1.0f;
  k::max_pool2d_forward(s, x.data(), y.data(), &idx);
  k::max_pool2d_backward(s, x.data(), y.data(), &idx, &dy, dx.data());
  CHECK(dx == std::vector<float>{1, 0, 0, 0});
}

TEST_CASE("log_softmax and nll: hand-computed values", "[kernels][softmax]") {
  const float x[] = {1.0f, 2.0f, 3.0f, 1000.0f, 1000.0f, 1000.0f};
  float y[6];
  k::log_softmax_forward(2, 3, x, y);
  const double lse = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0));
  CHECK(y[0] == Approx(1.0 - lse));
  CHECK(y[2] == Approx(3.0 - lse));
  CHECK(
      y[4] ==
      Approx(-std::log(3.0)).epsilon(1e-4));  // no overflow at large logits (f32 ulp at 1000: 6e-5)
  const int32_t labels[] = {2, 0};
  CHECK(k::nll_forward(2, 3, y, labels) == Approx(-(y[2] + y[3])));
  int32_t am[2];
  k::argmax_rows(2, 3, x, am);
  CHECK(am[0] == 2);
  CHECK(am[1] == 0);  // first maximum wins
}

namespace {

// Runs `fn` (which returns every output it computed, as bytes) in each build this CPU runs; each
// build's bytes must equal the scalar build's.
template <class F>
void same_bits_in_every_build(const std::string& what, F&& fn) {
  std::vector<uint8_t> want;
  for (Isa isa : isas()) {
    use(isa);
    std::vector<uint8_t> got = fn();
    if (isa == Isa::kScalar) {
      want = got;
      continue;
    }
    INFO(what << ": " << chorus::kernels::isa_name(isa) << " build vs scalar build");
    REQUIRE(got.size() == want.size());
    size_t first = 0;
    while (first < got.size() && got[first] == want[first]) ++first;
    INFO("first differing byte " << first << " of " << got.size());
    CHECK(first == got.size());
  }
  use(chorus::kernels::best_isa());
}

void append(std::vector<uint8_t>& out, const void* p, size_t bytes) {
  const auto* b = static_cast<const uint8_t*>(p);
  out.insert(out.end(), b, b + bytes);
}
template <class T>
void append(std::vector<uint8_t>& out, const std::vector<T>& v) {
  append(out, v.data(), v.size() * sizeof(T));
}

// Values with ties (zeros, repeats) and both signs, as relu and pooling see them.
std::vector<float> tied_vec(size_t n, unsigned seed) {
  auto v = random_vec(n, seed);
  for (size_t i = 0; i < n; i += 5) v[i] = 0.0f;
  for (size_t i = 3; i < n; i += 7) v[i] = v[i - 1];
  return v;
}

}  // namespace

TEST_CASE("elementwise kernels give the same bits in every build", "[kernels][isa]") {
  for (long n : {1L, 7L, 31L, 1000L, 4099L}) {
    same_bits_in_every_build("elementwise n=" + std::to_string(n), [n] {
      auto x = tied_vec(static_cast<size_t>(n), 11), y = tied_vec(static_cast<size_t>(n), 12);
      std::vector<uint8_t> out;
      std::vector<float> r(static_cast<size_t>(n));
      k::relu_forward(n, x.data(), r.data());
      append(out, r);
      k::relu_backward(n, x.data(), y.data(), r.data());
      append(out, r);
      k::add(n, x.data(), y.data(), r.data());
      append(out, r);
      k::mul(n, x.data(), y.data(), r.data());
      append(out, r);
      k::scale(n, 0.3f, x.data(), r.data());
      append(out, r);
      k::axpy(n, -1.7f, x.data(), r.data());
      append(out, r);
      k::fill(n, 2.5f, r.data());
      append(out, r);
      float s = k::sum(n, x.data());
      append(out, &s, sizeof s);
      const int rows = 3, cols = static_cast<int>(n);
      auto m = tied_vec(static_cast<size_t>(rows) * cols, 13);
      k::add_row_bias(rows, cols, y.data(), m.data());
      append(out, m);
      k::sum_rows(rows, cols, m.data(), r.data());
      append(out, r);
      return out;
    });
  }
}

TEST_CASE("conv2d, pooling and blocked gemm give the same bits in every build", "[kernels][isa]") {
  struct Case {
    int n, c, h, w, oc, kh, kw, stride, pad;
  };
  // Direct path (24- and 28-wide rows), im2col + GEMM, padding and stride.
  const Case cases[] = {{3, 1, 28, 28, 6, 5, 5, 1, 0},
                        {2, 3, 32, 32, 6, 5, 5, 1, 0},
                        {3, 6, 12, 12, 16, 5, 5, 1, 0},
                        {2, 3, 11, 10, 5, 3, 3, 3, 1}};
  for (const Case& t : cases) {
    k::Conv2dShape s;
    s.n = t.n, s.c = t.c, s.h = t.h, s.w = t.w, s.oc = t.oc, s.kh = t.kh, s.kw = t.kw,
    s.stride = t.stride, s.pad = t.pad;
    same_bits_in_every_build("conv2d c " + std::to_string(t.c) + " h " + std::to_string(t.h), [&] {
      const size_t xs = static_cast<size_t>(s.n) * s.c * s.h * s.w,
                   ws = static_cast<size_t>(s.oc) * s.patch(),
                   ys = static_cast<size_t>(s.n) * s.oc * s.oh() * s.ow();
      auto x = tied_vec(xs, 4), w = random_vec(ws, 5), b = random_vec(static_cast<size_t>(s.oc), 6);
      auto dy = random_vec(ys, 7);
      const int chunk = k::conv2d_default_chunk(s);
      std::vector<float> y(ys), work(k::conv2d_workspace_floats(s, chunk)), dx(xs), dw(ws),
          db(static_cast<size_t>(s.oc));
      k::conv2d_forward(s, x.data(), w.data(), b.data(), y.data(), work.data(), chunk);
      k::conv2d_backward(s, x.data(), w.data(), dy.data(), dx.data(), dw.data(), db.data(),
                         work.data(), chunk);
      std::vector<float> col(s.col_floats()), back(xs);
      k::im2col(s, x.data(), col.data());
      k::col2im(s, col.data(), back.data());
      std::vector<uint8_t> out;
      for (const auto* v : {&y, &dx, &dw, &db, &col, &back}) append(out, *v);
      return out;
    });
  }
  for (const auto& shape : {std::array<int, 3>{6, 24, 24}, {3, 7, 9}, {16, 8, 8}}) {
    const int planes = shape[0], h = shape[1], w = shape[2];  // clang 14 cannot capture bindings
    same_bits_in_every_build("max_pool2d " + std::to_string(h) + "x" + std::to_string(w), [&] {
      k::PoolShape s;
      s.planes = planes, s.h = h, s.w = w;
      auto x = tied_vec(static_cast<size_t>(planes) * h * w, 8);
      const size_t ys = static_cast<size_t>(planes) * s.oh() * s.ow();
      auto dy = random_vec(ys, 9);
      std::vector<float> y(ys), dx(x.size());
      std::vector<uint8_t> idx(ys);
      k::max_pool2d_forward(s, x.data(), y.data(), idx.data());
      k::max_pool2d_backward(s, x.data(), y.data(), idx.data(), dy.data(), dx.data());
      std::vector<uint8_t> out;
      append(out, y);
      append(out, idx);
      append(out, dx);
      return out;
    });
  }
  for (auto ta : {k::Trans::kNo, k::Trans::kYes})
    for (auto tb : {k::Trans::kNo, k::Trans::kYes})
      same_bits_in_every_build("gemm_blocked", [&] {
        const int m = 33, n = 17, kk = 129;
        const int lda = ta == k::Trans::kNo ? kk : m, ldb = tb == k::Trans::kNo ? n : kk;
        auto a = random_vec(static_cast<size_t>(m) * kk, 1),
             b = random_vec(static_cast<size_t>(kk) * n, 2);
        auto c = random_vec(static_cast<size_t>(m) * n, 3);
        k::gemm_blocked(ta, tb, m, n, kk, 0.75f, a.data(), lda, b.data(), ldb, 0.5f, c.data(), n);
        std::vector<uint8_t> out;
        append(out, c);
        return out;
      });
}

TEST_CASE("streaming copy copies exactly, at every alignment, in every build", "[kernels][isa]") {
  std::vector<uint8_t> src(70000), dst(70100);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 131 + 7);
  for (Isa isa : isas()) {
    use(isa);
    for (size_t off : {0, 1, 13, 32, 63})
      for (size_t bytes : {0, 1, 255, 256, 1000, 65536 + 17}) {
        std::fill(dst.begin(), dst.end(), 0xee);
        chorus::kernels::copy_streaming(dst.data() + off, src.data() + 3, bytes);
        INFO(chorus::kernels::isa_name(isa) << " offset " << off << " bytes " << bytes);
        CHECK(std::equal(src.begin() + 3, src.begin() + 3 + static_cast<long>(bytes),
                         dst.begin() + static_cast<long>(off)));
        CHECK(dst[off + bytes] == 0xee);
        if (off) CHECK(dst[off - 1] == 0xee);
      }
  }
  use(chorus::kernels::best_isa());
}
