// The expert form's problem table built on the device from device-side group sizes: no copy of
// the sizes to the host, so a grouped call whose group sizes change between replays of one CUDA
// graph stays correct. Two layouts of the tokens, one walk:
//
// * contiguous (group_rows == 0; the convention of torch._grouped_mm's `offs`): `offsets` are end
//   rows. Group g multiplies rows [start, end) of the tokens: end = the largest of
//   offsets[0..g], each clamped to [0, rows], start = the previous group's end (0 for g = 0).
//   Offsets as the host path requires them (non-decreasing, the last one the row count) mean
//   just that; any others never read or write outside the tokens, nor let two groups share a
//   row.
// * masked (group_rows > 0; DeepGEMM's masked layout, tokens [groups, group_rows, k] seen as
//   groups * group_rows rows): `offsets` are each group's valid row count (masked_m). Group g
//   multiplies rows [g * group_rows, g * group_rows + count), count = offsets[g] clamped to
//   [0, group_rows]: any values stay inside the group's own block, and the block's rows past
//   count are neither read into a result nor written.
//
// In the kernel's column-major terms (outᵀ = Wᵀ xᵀ, pyblasgemm/grouped.py) its problem is
// m = the output features, n = end - start:
//   A = weights + g * w_group_bytes, B = tokens + start * x_row_bytes,
//   C = out + start * out_row_bytes, bias / scale_m = base + g * their group bytes (0: none),
//   scale_n = token scales + 4 * start (0: none);
// tile_begin numbers the tiles group after group (an empty group shares its successor's, which
// the GEMM kernel's binary search skips), and *total receives all tiles: the grouped GEMM reads
// its tile count there (dp_tiles < 0), so one launch of each serves any sizes.
#pragma once
#include "../arch.cuh"
#include "../params.cuh"

namespace pyblasgemm {

PBG_DEVICE long long clamp_rows(long long v, long long rows) { return v < 0 ? 0 : (v > rows ? rows : v); }

// Inclusive scan over the THREADS threads of the block (warp shuffles, then the warp totals):
// ADD sums, else maxima. `scratch`: 32 shared words; every thread calls it.
template <bool ADD, typename T, int THREADS = 1024>
PBG_DEVICE T block_scan(T v, T* scratch) {
  static_assert(THREADS % 32 == 0 && THREADS <= 1024, "whole warps, at most 32");
  constexpr int WARPS = THREADS / 32;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const T y = __shfl_up_sync(0xffffffffu, v, d);
    if (lane >= d) v = ADD ? v + y : (y > v ? y : v);
  }
  if (lane == 31) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    // lanes past the warp count scan the identity (0 for sums; the ends are >= 0 for maxima)
    T s = lane < WARPS ? scratch[lane] : T(0);
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const T y = __shfl_up_sync(0xffffffffu, s, d);
      if (lane >= d) s = ADD ? s + y : (y > s ? y : s);
    }
    if (lane < WARPS) scratch[lane] = s;
  }
  __syncthreads();
  if (warp) {
    const T w = scratch[warp - 1];
    v = ADD ? v + w : (w > v ? w : v);
  }
  __syncthreads();      // scratch is free again
  return v;
}

// Where the expert form's operands are: the table kernel's and the fused GEMM's scalar
// arguments, and group g's problem from them (the derivation of the header comment).
struct ExpertLayout {
  const char* weights; const char* tokens; char* out; const char* bias; const float* scale_w; const float* scale_x;
  long long w_group_bytes, x_row_bytes, out_row_bytes, bias_group_bytes, scale_w_group_bytes, lda, ldb, ldc;
  int m, k, out_bytes;
  float alpha, beta;
  int ialpha, ibeta, bias_mode;

  PBG_DEVICE GroupedProblem problem(int g, long long start, long long n, int tile_begin) const {
    GroupedProblem q;
    q.A = weights + g * w_group_bytes;
    q.B = tokens + start * x_row_bytes;
    q.C = out + start * out_row_bytes;
    q.bias = bias != nullptr ? bias + g * bias_group_bytes : nullptr;
    q.pre = nullptr;
    q.scale_m = scale_w != nullptr
                    ? reinterpret_cast<const float*>(reinterpret_cast<const char*>(scale_w) + g * scale_w_group_bytes)
                    : nullptr;
    q.scale_n = scale_x != nullptr ? scale_x + start : nullptr;
    q.lda = lda; q.ldb = ldb; q.ldc = ldc;
    q.m = m; q.n = static_cast<int>(n); q.k = k;
    q.tile_begin = tile_begin;
    q.alpha = alpha; q.beta = beta; q.ialpha = ialpha; q.ibeta = ibeta;
    // 16-byte stores where C's address and its row stride allow them (grouped.py's pack_table)
    q.c_vec = (reinterpret_cast<unsigned long long>(q.C) % 16 == 0) && (ldc % (16 / out_bytes) == 0);
    q.bias_mode = bias_mode;
    q.reserved0 = q.reserved1 = 0;
    return q;
  }
};

// The groups' row ranges and tile numbering, THREADS groups at a time. Contiguous layout
// (group_rows == 0): a group's end is the running maximum of the clamped offsets (so a
// decreasing offset gives an empty group and no two groups share a row, as grouped.py's host
// path refuses such offsets), its start the previous group's end. Masked layout (group_rows >
// 0): group g starts at g * group_rows and holds its clamped count (no scan of the ends). The
// tile counts are summed by a second scan; the running values carry from chunk to chunk.
// emit(g, start, end, tile_begin) runs once per group (on the thread g % THREADS); returns the
// tile count of all groups (to every thread). Every thread calls it. MASKED: the layout is
// known at compile time (the one-launch kernel: a runtime branch here cost its 128-register
// small tile a spill on sm_80); else group_rows > 0 picks it. Offsets: what `offsets[g]` reads
// (default a pointer to Off; the Hopper walk passes a reader of int32 or int64 offsets).
template <int THREADS, typename Off, class Emit, bool MASKED = false, class Offsets = const Off*>
PBG_DEVICE int scan_groups(Offsets offsets, int groups, long long rows, long long group_rows, int m, int tiles_m,
                           int bn, Emit& emit) {
  __shared__ long long scratch_ends[32];
  __shared__ long long chunk_ends[THREADS];
  __shared__ int scratch_tiles[32];
  __shared__ long long carry_end;
  __shared__ int carry_tiles;
  if (threadIdx.x == 0) { carry_end = 0; carry_tiles = 0; }
  __syncthreads();
  for (int base = 0; base < groups; base += THREADS) {
    const int g = base + static_cast<int>(threadIdx.x);
    const long long before_end = carry_end;
    const int before_tiles = carry_tiles;
    long long start, end;
    if (MASKED || group_rows > 0) {
      start = static_cast<long long>(g) * group_rows;
      end = start + (g < groups ? clamp_rows(static_cast<long long>(offsets[g]), group_rows) : 0);
    } else {
      end = g < groups ? clamp_rows(static_cast<long long>(offsets[g]), rows) : 0;
      end = block_scan<false, long long, THREADS>(end, scratch_ends);
      if (end < before_end) end = before_end;
      // the previous group's end: the thread before's (the previous chunk's last for thread 0)
      chunk_ends[threadIdx.x] = end;
      __syncthreads();
      start = threadIdx.x ? chunk_ends[threadIdx.x - 1] : before_end;
    }
    const long long n = end - start;
    const int tiles = (g < groups && n > 0 && m > 0) ? tiles_m * static_cast<int>((n + bn - 1) / bn) : 0;
    const int incl = block_scan<true, int, THREADS>(tiles, scratch_tiles);
    if (g < groups) emit(g, start, end, before_tiles + incl - tiles);
    if (threadIdx.x == THREADS - 1) { carry_end = end; carry_tiles = before_tiles + incl; }
    __syncthreads();
  }
  return carry_tiles;
}

// One CTA of 1024 threads writes every group's problem row (scan_groups) and *total.
template <typename Off>
__global__ void __launch_bounds__(1024) grouped_offsets_kernel(
    GroupedProblem* table, int* total, const Off* offsets, const char* weights, const char* tokens, char* out,
    const char* bias, const float* scale_w, const float* scale_x, long long w_group_bytes, long long x_row_bytes,
    long long out_row_bytes, long long bias_group_bytes, long long scale_w_group_bytes, long long lda,
    long long ldb, long long ldc, long long rows, int groups, int m, int k, int tiles_m, int bn, int out_bytes,
    float alpha, float beta, int ialpha, int ibeta, int bias_mode, long long group_rows) {
  const ExpertLayout layout{weights, tokens, out, bias, scale_w, scale_x, w_group_bytes, x_row_bytes,
                            out_row_bytes, bias_group_bytes, scale_w_group_bytes, lda, ldb, ldc, m, k, out_bytes,
                            alpha, beta, ialpha, ibeta, bias_mode};
  auto write_row = [&](int g, long long start, long long end, int tile_begin) {
    table[g] = layout.problem(g, start, end - start, tile_begin);
  };
  const int tiles = scan_groups<1024, Off>(offsets, groups, rows, group_rows, m, tiles_m, bn, write_row);
  if (threadIdx.x == 0) *total = tiles;
}

}  // namespace pyblasgemm
