// The expert form with device-side end offsets in ONE launch: every CTA of the grouped GEMM
// scans the offsets itself (scan_groups, impls/grouped_offsets.cuh) into shared memory, then
// walks the tiles as the table-driven grouped walk does (impls/sm80_gemm.cuh, kGrouped), with
// each tile's problem found by binary search over the shared tile numbering.
//
// Why: the two-launch form (table kernel, then the GEMM reading the table and its tile count
// from global memory) puts a one-CTA kernel, a kernel boundary, and ~log2(groups) dependent
// global loads per CTA between the call and the first weight byte; on a small-expert layer
// (64 experts of <= 64 tokens, k = n = 1024: ~70 µs, H100) that fixed cost is a sizeable part
// of the call (bench/grouped_fused.py measures both forms in one run). Here the first weight
// load waits only for one load of the offsets (256 threads, <= 2 each for 512 groups) and two
// shared-memory scans. The scan is repeated by every CTA: 512 offsets from L2 is ~2 KB per CTA.
//
// L2_AHEAD > 0: while it multiplies BK step i of a tile, the CTA asks the L2 for op(A)'s step
// i + STAGES - 1 + L2_AHEAD (prefetch.global.L2, one per 32-byte sector), past the cp.async
// ring's reach, and over the tile's last steps for the first steps of its next tile. A
// small-expert layer streams each expert's weights once (op(A), ~96 % of the bytes): the ring
// holds STAGES - 1 steps in flight per CTA, and it drains at every tile's end (the last steps,
// the store, the next tile's first loads) while the memory system idles; the prefetches keep
// L2_AHEAD more steps in flight (no shared memory, no register lives across the mainloop:
// the two tiles' operand slabs are in shared memory) and bridge the tile boundary.
// A prefetch is a hint: it changes no result.
//
// Same problems, same tiles, same per-tile arithmetic as the two-launch form, so the results
// are bitwise the same (tests/test_grouped_fused_gpu.py checks it).
#pragma once
#include "sm80_gemm.cuh"
#include "grouped_offsets.cuh"

namespace pyblasgemm {

// groups the fused form scans into shared memory (12 bytes each: 6 KB); a launch with more
// groups takes the two-launch form (kernels/grouped.py FUSED_MAX_GROUPS mirrors it)
constexpr int kFusedMaxGroups = 512;

// op(A)'s slab of one tile for the L2 prefetches: a == nullptr: no tile.
struct AheadSlab {
  const char* a;      // the problem's A
  long long lda;
  int m, k, m0, nk;   // the problem's m and k, the tile's first row, its BK steps
};

PBG_DEVICE void prefetch_l2(const char* p) {
#if defined(__CUDA_ARCH__)
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p));
#endif
}

// Prefetch BK step kb of `s` into L2: its BM x BKB bytes as 32-byte sectors over the CTA's
// threads, only those inside the matrix (AK: BM rows of BKB bytes; else BKE rows of BM
// elements).
template <bool AK, int BM, int BKB, int EB, int THREADS>
PBG_DEVICE void prefetch_step(const AheadSlab& s, int kb) {
  constexpr int BKE = BKB / EB;
  constexpr int SECTORS = BM * BKB / 32;
  constexpr int PER_ROW = AK ? BKB / 32 : BM * EB / 32;     // sectors per contiguous row
  const int k0 = kb * BKE;
#pragma unroll
  for (int j = threadIdx.x; j < SECTORS; j += THREADS) {
    const int r = j / PER_ROW, c = j % PER_ROW;
    if constexpr (AK) {
      if (s.m0 + r < s.m && k0 + c * (32 / EB) < s.k)
        prefetch_l2(s.a + (static_cast<long long>(s.m0 + r) * s.lda + k0) * EB + c * 32);
    } else {
      if (k0 + r < s.k && s.m0 + c * (32 / EB) < s.m)
        prefetch_l2(s.a + (static_cast<long long>(k0 + r) * s.lda + s.m0) * EB + c * 32);
    }
  }
}

// Launch bounds as gemm_kernel's grouped walk: 2 CTAs per SM for the 8-warp tiles of at most
// 128 x 64 (their 128-register budget), else 1.
template <class Kind, bool AK, bool BK, int BM, int BN, int BKB, int WM, int WN, int STAGES, bool VEC, int EPI,
          typename Off, int L2_AHEAD>
__global__ void __launch_bounds__(WM * WN * 32, (WM * WN == 8 && BM * BN <= 128 * 64) ? 2 : 1)
    grouped_fused_kernel(const Off* offsets, const char* weights, const char* tokens, char* out, const char* bias,
                         const float* scale_w, const float* scale_x, long long w_group_bytes,
                         long long x_row_bytes, long long out_row_bytes, long long bias_group_bytes,
                         long long scale_w_group_bytes, long long lda, long long ldb, long long ldc,
                         long long rows, int groups, int m, int k, int tiles_m, int bn, int out_bytes, float alpha,
                         float beta, int ialpha, int ibeta, int bias_mode, int group_m) {
  typedef GemmCore<Kind, AK, BK, BM, BN, BKB, WM, WN, STAGES, VEC> Core;
  constexpr int THREADS = WM * WN * 32;
  extern __shared__ __align__(128) char smem[];
  __shared__ long long group_end[kFusedMaxGroups];
  __shared__ int group_tile[kFusedMaxGroups];
  if (groups > kFusedMaxGroups) return;     // the host never launches this (grouped.py); no write past the arrays
  auto keep = [&](int g, long long, long long end, int tile_begin) {
    group_end[g] = end;
    group_tile[g] = tile_begin;
  };
  const int all_tiles = scan_groups<THREADS>(offsets, groups, rows, m, tiles_m, bn, keep);
  // (scan_groups ends at a barrier: every group's entries are visible)
  const ExpertLayout layout{weights, tokens, out, bias, scale_w, scale_x, w_group_bytes, x_row_bytes,
                            out_row_bytes, bias_group_bytes, scale_w_group_bytes, lda, ldb, ldc, m, k, out_bytes,
                            alpha, beta, ialpha, ibeta, bias_mode};
  GemmParams base = {};
  base.group_m = group_m;
  base.batch = 1;
  // The last group whose tile numbering starts at or before `tile` (empty groups share their
  // successor's start and are passed over), and its problem.
  auto problem_of = [&](int tile) {
    int lo = 0, hi = groups - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) >> 1;
      if (group_tile[mid] <= tile) lo = mid;
      else hi = mid - 1;
    }
    const long long start = lo ? group_end[lo - 1] : 0;
    return layout.problem(lo, start, group_end[lo] - start, group_tile[lo]);
  };
  typedef typename Core::Mainloop Mainloop;
  typedef typename Core::AccReg AccReg;
  constexpr int EB = Kind::kElemBytes;
  // [0]: the tile in progress, [1]: the CTA's next tile (thread 0 writes both before a tile's
  // mainloop; the previous tile's readers are past its store's barrier)
  __shared__ AheadSlab slab[2];
  auto slab_of = [&](int tile) {
    AheadSlab s = {};
    if (tile < all_tiles) {
      const GroupedProblem g = problem_of(tile);
      const GemmParams q = grouped_params(base, g);
      const typename Core::Sched gs(q);
      s.a = q.A; s.lda = q.lda; s.m = q.m; s.k = q.k; s.nk = gs.kt;
      s.m0 = gs.coord(tile - g.tile_begin, q.group_m).tm * BM;
    }
    return s;
  };
  // after BK step kb of the tile in progress: step kb + STAGES - 1 + L2_AHEAD, of this tile or
  // (past its end) of the next one
  auto ahead = [&](int kb, bool) {
    if constexpr (L2_AHEAD > 0) {
      const int want = kb + STAGES - 1 + L2_AHEAD;
      const int nk = slab[0].nk;
      if (want < nk) prefetch_step<AK, BM, BKB, EB, THREADS>(slab[0], want);
      else if (slab[1].a != nullptr && want - nk < slab[1].nk) prefetch_step<AK, BM, BKB, EB, THREADS>(slab[1], want - nk);
    }
  };
  if constexpr (L2_AHEAD > 0) {
    // the first tile's steps the ring does not load and no earlier tile prefetched
    if (blockIdx.x < all_tiles) {
      const AheadSlab first = slab_of(blockIdx.x);
      for (int kb = STAGES - 1; kb < STAGES - 1 + L2_AHEAD && kb < first.nk; ++kb)
        prefetch_step<AK, BM, BKB, EB, THREADS>(first, kb);
    }
  }
#pragma unroll 1
  for (int t = blockIdx.x; t < all_tiles; t += gridDim.x) {
    if constexpr (L2_AHEAD > 0) {
      if (threadIdx.x == 0) {
        slab[0] = slab_of(t);
        slab[1] = slab_of(t + gridDim.x);
      }
      // (visible to the hook: Mainloop::run meets a barrier before its first step ends)
    }
    {
      const GroupedProblem g = problem_of(t);
      const GemmParams q = grouped_params(base, g);
      const typename Core::Sched gs(q);
      const TileCoord tc = gs.coord(t - g.tile_begin, q.group_m);
      // GemmCore::tile_to_smem's grouped mainloop, with the prefetch hook
      AccReg acc[Core::MI][Core::NI][Core::R];
#pragma unroll
      for (int i = 0; i < Core::MI; ++i)
#pragma unroll
        for (int j = 0; j < Core::NI; ++j)
#pragma unroll
          for (int r = 0; r < Core::R; ++r) acc[i][j][r] = AccReg(0);
      Mainloop::template run<true>(smem, q, q.A, q.B, tc.tm * BM, tc.tn * BN, 0, gs.kt, acc, ahead);
      Core::Epi::stage_acc(reinterpret_cast<typename Core::Stage*>(smem), acc);
      __syncthreads();  // stage tile complete before any thread reads other warps' values
    }
    // only t lives across the mainloop (its registers: see gemm_kernel's grouped walk)
    asm volatile("" : "+r"(t));
    const GroupedProblem g = problem_of(t);
    const GemmParams q = grouped_params(base, g);
    const typename Core::Sched gs(q);
    Core::template finish<EPI>(smem, q, gs.coord(t - g.tile_begin, q.group_m));
  }
}

}  // namespace pyblasgemm
