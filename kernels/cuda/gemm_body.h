// The CUDA GEMM's tiling (nn.cu's gemm) as CHORUS_HD functions, so that the host runs the same
// lines, block by block and phase by phase, in tests/kernels/test_cuda_nn_host.cc.
//
// C (m, n) = alpha op(A) op(B) + beta C, row-major. A block of kTile x kTile threads computes a
// kTile x kTile tile of C over one range of k: the k range is split when the tiles alone would
// leave the GPU idle (the convolutions' weight gradients are 6 x 75 outputs over k = 784 x batch),
// and each split's partial tile is added, in split order, by a second kernel. The split depends
// on the shape only, never on the device, so every run and every GPU gives the same bits.
//
// Loads are coalesced for both layouts of each operand: consecutive threads (x) read consecutive
// addresses, so a transposed operand is read with x along its rows and stored transposed.
//
// With TF32 allowed (CHORUS_ALLOW_TF32=1, set_allow_tf32), a second tiling feeds the tensor cores:
// see "TF32" below.
#pragma once

#include <cstdint>

#include "kernels/cpu/half.h"
#include "kernels/hd.h"

namespace chorus::kernels::cuda::nn::body {

constexpr int kGemmTile = 16;
constexpr int kGemmTargetBlocks = 512;  // about 4 blocks per SM of an H100/H200
constexpr int kGemmMinSplitK = 256;     // k per split, at least (16 tile steps)

struct GemmArgs {
  bool ta, tb;
  int m, n, k;
  const float* a;
  int lda;
  const float* b;
  int ldb;
};

// How the k range is cut: `splits` ranges of `chunk` (a multiple of the tile; the last one
// shorter).
struct GemmSplit {
  int splits, chunk;
};

// `tile`: the side of the C tile one block computes (kGemmTile, or kTf32Tile below).
CHORUS_HD inline GemmSplit gemm_split(int m, int n, int k, int tile = kGemmTile) {
  const long tiles = long((m + tile - 1) / tile) * ((n + tile - 1) / tile);
  long splits = 1;
  if (tiles < kGemmTargetBlocks && k >= 2 * kGemmMinSplitK) {
    const long by_blocks = (kGemmTargetBlocks + tiles - 1) / tiles;
    const long by_k = k / kGemmMinSplitK;
    splits = by_blocks < by_k ? by_blocks : by_k;
  }
  long chunk = (k + splits - 1) / splits;
  chunk = (chunk + kGemmTile - 1) / kGemmTile * kGemmTile;
  if (chunk < kGemmTile) chunk = kGemmTile;
  splits = (k + chunk - 1) / chunk;  // no empty split after rounding the chunk up
  if (splits < 1) splits = 1;
  return GemmSplit{int(splits), int(chunk)};
}

using GemmTileBuf = float[kGemmTile][kGemmTile + 1];

// Thread (tx, ty) of the block of tile (bx, by): its element of the A tile (as[i][e]) and of the
// B tile (bs[e][j]) for k = t .. t + kTile, zero past kend or the matrix's edge.
CHORUS_HD inline void gemm_load(const GemmArgs& g, int bx, int by, int tx, int ty, int t, int kend,
                                GemmTileBuf& as, GemmTileBuf& bs) {
  const int row0 = by * kGemmTile, col0 = bx * kGemmTile;
  if (!g.ta) {  // A (m, k): x along k
    const int i = row0 + ty, e = t + tx;
    as[ty][tx] = i < g.m && e < kend ? g.a[long(i) * g.lda + e] : 0.0f;
  } else {  // A stored (k, m): x along m
    const int i = row0 + tx, e = t + ty;
    as[tx][ty] = i < g.m && e < kend ? g.a[long(e) * g.lda + i] : 0.0f;
  }
  if (!g.tb) {  // B (k, n): x along n
    const int e = t + ty, j = col0 + tx;
    bs[ty][tx] = e < kend && j < g.n ? g.b[long(e) * g.ldb + j] : 0.0f;
  } else {  // B stored (n, k): x along k
    const int e = t + tx, j = col0 + ty;
    bs[tx][ty] = e < kend && j < g.n ? g.b[long(j) * g.ldb + e] : 0.0f;
  }
}

// Thread (tx, ty)'s output after one loaded tile: the tile's k in order.
CHORUS_HD inline float gemm_fma(float acc, int tx, int ty, const GemmTileBuf& as,
                                const GemmTileBuf& bs) {
  for (int e = 0; e < kGemmTile; ++e) acc += as[ty][e] * bs[e][tx];
  return acc;
}

// C[i][j] from the splits' partial tiles (splits x m x n), added in split order.
CHORUS_HD inline float gemm_gather(const float* partial, int splits, long mn, long at) {
  float acc = partial[at];
  for (int z = 1; z < splits; ++z) acc += partial[z * mn + at];
  return acc;
}

// ---- TF32 ------------------------------------------------------------------------------------
// A block of kTf32Threads (4 warps) computes a kTf32Tile x kTf32Tile tile of C on the tensor
// cores (wmma m16n16k8: TF32 inputs, float accumulation), each warp one 16 x 16 quarter, k split
// as above (gemm_split with this tile). Both operands are rounded to TF32 as they are stored in
// shared memory, by tf32_round on the GPU as here, so the tensor cores multiply exactly the
// values the host test checks; only the order of a tensor core's float sums is the hardware's.
// Leading dimensions keep the fragments' first rows 32-byte aligned, as wmma requires.
constexpr int kTf32Tile = 32;
constexpr int kTf32K = 16;  // k per load into shared memory (two mma steps of 8)
constexpr int kTf32Threads = 128;
constexpr int kTf32LdA = kTf32K + 4;     // a: kTf32Tile rows (i) of kTf32K (k)
constexpr int kTf32LdB = kTf32Tile + 4;  // b: kTf32K rows (k) of kTf32Tile (j); also C's staging
static_assert(kTf32K % 8 == 0, "a load must hold whole mma steps (k = 8)");

struct Tf32Tiles {
  float a[kTf32Tile * kTf32LdA];
  float b[kTf32K * kTf32LdB];
};

// Round to TF32 (10 explicit mantissa bits) to nearest, ties away from zero: PTX's
// cvt.rna.tf32.f32. Infinities and NaNs pass unchanged; a value past TF32's largest rounds to
// infinity.
CHORUS_HD inline float tf32_round(float x) {
  uint32_t u = float_bits(x);
  if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0x1000u) & 0xffffe000u;
  return bits_float(u);
}

// Thread `tid` of the block of tile (bx, by): its elements of the A tile (i, kk) and the B tile
// (kk, j) for k = t .. t + kTf32K, rounded, zero past kend or the matrix's edge. Consecutive
// threads read consecutive addresses of either layout.
CHORUS_HD inline void gemm_tf32_load(const GemmArgs& g, int bx, int by, int tid, int t, int kend,
                                     Tf32Tiles& s) {
  const int row0 = by * kTf32Tile, col0 = bx * kTf32Tile;
  for (int e = tid; e < kTf32Tile * kTf32K; e += kTf32Threads) {
    const int ai = g.ta ? e % kTf32Tile : e / kTf32K, ak = g.ta ? e / kTf32Tile : e % kTf32K;
    const int i = row0 + ai, ka = t + ak;
    s.a[ai * kTf32LdA + ak] = i < g.m && ka < kend ? tf32_round(g.ta ? g.a[long(ka) * g.lda + i]
                                                                     : g.a[long(i) * g.lda + ka])
                                                   : 0.0f;
    const int bj = g.tb ? e / kTf32K : e % kTf32Tile, bk = g.tb ? e % kTf32K : e / kTf32Tile;
    const int j = col0 + bj, kb = t + bk;
    s.b[bk * kTf32LdB + bj] = kb < kend && j < g.n ? tf32_round(g.tb ? g.b[long(j) * g.ldb + kb]
                                                                     : g.b[long(kb) * g.ldb + j])
                                                   : 0.0f;
  }
}

// Thread `tid`'s outputs once the warps' accumulators are staged in `cs` (kTf32Tile rows of
// kTf32LdB): C = alpha acc + beta C (C not read when beta is 0), or the split's partial tile.
CHORUS_HD inline void gemm_tf32_store(const GemmArgs& g, int bx, int by, int z, int tid,
                                      const float* cs, float alpha, float beta, float* c, int ldc,
                                      float* partial) {
  for (int e = tid; e < kTf32Tile * kTf32Tile; e += kTf32Threads) {
    const int row = by * kTf32Tile + e / kTf32Tile, col = bx * kTf32Tile + e % kTf32Tile;
    if (row >= g.m || col >= g.n) continue;
    const float acc = cs[(e / kTf32Tile) * kTf32LdB + e % kTf32Tile];
    if (partial) {
      partial[long(z) * g.m * g.n + long(row) * g.n + col] = acc;
      continue;
    }
    float* out = c + long(row) * ldc + col;
    *out = beta == 0.0f ? alpha * acc : alpha * acc + beta * *out;
  }
}

}  // namespace chorus::kernels::cuda::nn::body
