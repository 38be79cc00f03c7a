// Problem description shared by every device piece (built inside the kernel from its arguments).
#pragma once
#include "arch.cuh"

namespace pyblasgemm {

// Decomposition of the MAC iteration space (M/BM x N/BN tiles x K/BK steps) over CTAs.
enum Decomposition : int {
  kSliced = 0,         // one CTA per output tile, full K (data-parallel)
  kSplitKSerial = 1,   // splits CTAs per tile; ordered fixup through a workspace + per-tile flag
  kSplitKParallel = 2, // splits CTAs per tile; fp32/s32 partials to workspace, separate reduce
  kStreamK = 3,        // persistent grid: data-parallel tiles first, then even MAC-iteration split
  kGrouped = 4,        // persistent grid over the tiles of a device-side table of problems
};

struct GemmParams {
  const char* A;  // byte pointers: offsets are computed in elements then scaled by sizeof
  const char* B;
  char* C;
  char* ws;       // split-k / stream-k partial tiles (fp32 or s32), BM*BN per slot
  int* flags;     // zeroed by the host before every launch that uses them
  int m, n, k;
  i64 lda, ldb, ldc;
  i64 sa, sb, sc;  // batch strides in elements (0 = broadcast)
  int batch;
  float alpha, beta;  // float kinds
  int ialpha, ibeta;  // s8 -> s32
  int c_vec;          // C pointer/ldc/stride allow 16-byte stores
  int group_m;        // grouped rasterization: tile rows per group
  int splits;         // split-k: CTAs per tile
  int kt_per_split;   // split-k: BK steps per split
  int dp_tiles;       // stream-k: tiles done data-parallel before the stream-k region
  int sk_tiles;       // stream-k: tiles shared by MAC iterations
  // fused epilogue (template EPI != 0; epilogue/sm80_smem_epilogue.cuh)
  const char* bias;   // one value per C row (bias_mode 1) or per C column (2), C's element type
  char* pre;          // pre-activation values in C's layout and type, or null
  int bias_mode;      // 0: none, 1: bias[m index], 2: bias[n index]
  const float* scale_m;  // int8 dequantization: one float per C row (m index) ...
  const float* scale_n;  // ... and one per C column (n index)
};

// One problem of a grouped launch (MODE kGrouped): the host writes a table of these (128 bytes
// each; pyblasgemm/kernels/grouped.py mirrors the layout) and every problem shares the
// kernel's kind, layout, operand path and epilogue. Tiles are numbered problem after problem:
// problem g owns tiles [tile_begin, tile_begin + tiles_m * tiles_n).
struct alignas(16) GroupedProblem {
  const char* A;
  const char* B;
  char* C;
  const char* bias;
  char* pre;
  const float* scale_m;
  const float* scale_n;
  i64 lda, ldb, ldc;
  int m, n, k, tile_begin;
  float alpha, beta;
  int ialpha, ibeta, c_vec, bias_mode, reserved0, reserved1;
};
static_assert(sizeof(GroupedProblem) == 128, "the host packs 128-byte rows");

}  // namespace pyblasgemm
