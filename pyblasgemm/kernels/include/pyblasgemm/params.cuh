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
};

}  // namespace pyblasgemm
