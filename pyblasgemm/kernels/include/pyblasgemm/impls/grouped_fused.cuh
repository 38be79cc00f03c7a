// The expert form with device-side group sizes in ONE launch: every CTA of the grouped GEMM
// scans the end offsets (contiguous layout) or the valid row counts (masked layout, group_rows >
// 0) itself (scan_groups, impls/grouped_offsets.cuh) into shared memory, then
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
// Same problems, same tiles, same per-tile arithmetic as the two-launch form, so the results
// are bitwise the same (tests/test_grouped_fused_gpu.py checks it).
#pragma once
#include "sm80_gemm.cuh"
#include "grouped_offsets.cuh"

namespace pyblasgemm {

// groups the fused form scans into shared memory (12 bytes each: 6 KB); a launch with more
// groups takes the two-launch form (kernels/grouped.py FUSED_MAX_GROUPS mirrors it)
constexpr int kFusedMaxGroups = 512;

// Launch bounds as gemm_kernel's grouped walk: 2 CTAs per SM for the 8-warp tiles of at most
// 128 x 64 (their 128-register budget), else 1. MASKED (the masked layout: `offsets` are valid
// row counts, group g's rows start at g * group_rows) is a template argument, not a runtime
// branch: the small tile with a fused epilogue sits at 128 registers on sm_80, and a runtime
// choice of the start cost it a spill (tests/test_grouped_fused_compile.py); group_rows is
// unused by the contiguous form.
template <class Kind, bool AK, bool BK, int BM, int BN, int BKB, int WM, int WN, int STAGES, bool VEC, int EPI,
          typename Off, bool MASKED>
__global__ void __launch_bounds__(WM * WN * 32, (WM * WN == 8 && BM * BN <= 128 * 64) ? 2 : 1)
    grouped_fused_kernel(const Off* offsets, const char* weights, const char* tokens, char* out, const char* bias,
                         const float* scale_w, const float* scale_x, long long w_group_bytes,
                         long long x_row_bytes, long long out_row_bytes, long long bias_group_bytes,
                         long long scale_w_group_bytes, long long lda, long long ldb, long long ldc,
                         long long rows, int groups, int m, int k, int tiles_m, int bn, int out_bytes, float alpha,
                         float beta, int ialpha, int ibeta, int bias_mode, long long group_rows, int group_m) {
  typedef GemmCore<Kind, AK, BK, BM, BN, BKB, WM, WN, STAGES, VEC> Core;
  constexpr int THREADS = WM * WN * 32;
  extern __shared__ __align__(128) char smem[];
  // each group's end row and first tile (its start: the previous group's end, or in the masked
  // layout its block's first row, g * group_rows)
  __shared__ long long group_end[kFusedMaxGroups];
  __shared__ int group_tile[kFusedMaxGroups];
  if (groups > kFusedMaxGroups) return;     // the host never launches this (grouped.py); no write past the arrays
  auto keep = [&](int g, long long, long long end, int tile_begin) {
    group_end[g] = end;
    group_tile[g] = tile_begin;
  };
  const int all_tiles = scan_groups<THREADS, Off, decltype(keep), MASKED>(
      offsets, groups, rows, MASKED ? group_rows : 0, m, tiles_m, bn, keep);
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
    const long long start = MASKED ? static_cast<long long>(lo) * group_rows : (lo ? group_end[lo - 1] : 0);
    return layout.problem(lo, start, group_end[lo] - start, group_tile[lo]);
  };
#pragma unroll 1
  for (int t = blockIdx.x; t < all_tiles; t += gridDim.x) {
    {
      const GroupedProblem g = problem_of(t);
      const GemmParams q = grouped_params(base, g);
      const typename Core::Sched gs(q);
      Core::template tile_to_smem<0, true>(smem, q, gs.coord(t - g.tile_begin, q.group_m), 0, gs.kt);
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
