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
#pragma once

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

CHORUS_HD inline GemmSplit gemm_split(int m, int n, int k) {
  const long tiles = long((m + kGemmTile - 1) / kGemmTile) * ((n + kGemmTile - 1) / kGemmTile);
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

}  // namespace chorus::kernels::cuda::nn::body
