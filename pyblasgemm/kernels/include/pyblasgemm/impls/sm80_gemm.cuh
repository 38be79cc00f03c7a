// The sm_80 GEMM kernel (mma.sync + cp.async + ldmatrix), usable on sm_80..sm_90.
// Column-major BLAS convention: C(m x n) = alpha * op(A) * op(B) + beta * C.
//   AK = op(A) is K-contiguous (transa = 'T'), else M-contiguous ('N').
//   BK = op(B) is K-contiguous (transb = 'N'), else N-contiguous ('T').
// One template, four decompositions and the grouped launch (see params.cuh); determinism of each:
//   sliced, split-k serial/parallel, stream-k: all bitwise reproducible run to run (partials
//   are summed in a fixed order chosen on the host, never in arrival order); grouped: one CTA
//   per tile, as sliced.
// EPI (default 0: none) fuses bias / activation / pre-activation / int8 dequantization into the
// store (epilogue/sm80_smem_epilogue.cuh), applied once per element after every partial sum.
#pragma once
#include "../arch.cuh"
#include "../params.cuh"
#include "../ptx/sm70_sync.cuh"
#include "../pipeline/sm80_multistage.cuh"
#include "../scheduler/tile_scheduler.cuh"
#include "../epilogue/sm80_smem_epilogue.cuh"
#include "../epilogue/splitk_reduce.cuh"

namespace pyblasgemm {

template <class Kind, bool AK, bool BK, int BM, int BN, int BKB, int WM, int WN, int STAGES, bool VEC>
struct GemmCore {
  typedef Multistage<Kind, AK, BK, BM, BN, BKB, WM, WN, STAGES, VEC> Mainloop;
  typedef SmemEpilogue<Kind, BM, BN, WM, WN> Epi;
  typedef TileScheduler<BM, BN, BKB / Kind::kElemBytes> Sched;
  static constexpr int MI = Mainloop::WMma::MI, NI = Mainloop::WMma::NI, R = Kind::kAccRegs;
  static constexpr int SMEM_BYTES =
      Mainloop::SMEM_BYTES > Epi::SMEM_BYTES ? Mainloop::SMEM_BYTES : Epi::SMEM_BYTES;
  typedef typename Kind::AccReg AccReg;
  typedef typename Kind::Stage Stage;

  // Accumulate tile `tc` over BK steps [kb0, kb1) and leave the sum in the smem stage tile.
  // Block-scaled float8 (EpiBlock<EPI>::kOn): DeepGEMM's promotion on mma.sync: the mainloop
  // sums each 128-wide K block into `acc`, and after its last BK step (or the range's last)
  // `main += (scale_m(row, q) * scale_n(col, q)) * acc` with a round-to-nearest FMA, acc = 0.
  // A K range split across CTAs (split-k, stream-k) promotes its part of a block with the
  // block's scales: the partials add up to the scaled block.
  // GROUPED: the grouped walk's mainloop (Multistage::run).
  template <int EPI = 0, bool GROUPED = false>
  static PBG_DEVICE void tile_to_smem(char* smem, const GemmParams& p, const TileCoord& tc, int kb0, int kb1) {
    AccReg acc[MI][NI][R];
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
      for (int j = 0; j < NI; ++j)
#pragma unroll
        for (int r = 0; r < R; ++r) acc[i][j][r] = AccReg(0);
    const char* A = p.A + static_cast<i64>(tc.b) * p.sa * Kind::kElemBytes;
    const char* B = p.B + static_cast<i64>(tc.b) * p.sb * Kind::kElemBytes;
    if constexpr (EpiBlock<EPI>::kOn) {
      static_assert(128 % (BKB / Kind::kElemBytes) == 0, "block scales: BK must divide 128");
      constexpr int BKE = BKB / Kind::kElemBytes;
      float main[MI][NI][R];
#pragma unroll
      for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < NI; ++j)
#pragma unroll
          for (int r = 0; r < R; ++r) main[i][j][r] = 0.f;
      const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
      const int g = lane >> 2, t = lane & 3;
      const int r0 = tc.tm * BM + (warp % WM) * (BM / WM) + g;   // this lane's first row, column
      const int c0 = tc.tn * BN + (warp / WM) * (BN / WN) + 2 * t;
      const int kbn = (p.k + 127) >> 7;
      auto promote = [&](int kb, bool last) {
        if (!last && ((kb + 1) * BKE) % 128 != 0) return;
        const int q = (kb * BKE) >> 7;
        float sm[MI][2], sn[NI][2];
#pragma unroll
        for (int i = 0; i < MI; ++i)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int row = r0 + 16 * i + 8 * h;
            sm[i][h] = row < p.m ? block_scale<EpiBlock<EPI>::kModeM>(p.scale_m, row, p.m, q, kbn) : 0.f;
          }
#pragma unroll
        for (int j = 0; j < NI; ++j)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int col = c0 + 8 * j + h;
            sn[j][h] = col < p.n ? block_scale<EpiBlock<EPI>::kModeN>(p.scale_n, col, p.n, q, kbn) : 0.f;
          }
#pragma unroll
        for (int i = 0; i < MI; ++i)
#pragma unroll
          for (int j = 0; j < NI; ++j)
#pragma unroll
            for (int r = 0; r < R; ++r) {
              // c0,c1 at (g, 2t..2t+1), c2,c3 at (g+8, ...): row half r >> 1, column r & 1
              main[i][j][r] = fma_ieee(mul_ieee(sm[i][r >> 1], sn[j][r & 1]), acc[i][j][r], main[i][j][r]);
              acc[i][j][r] = 0.f;
            }
      };
      Mainloop::run(smem, p, A, B, tc.tm * BM, tc.tn * BN, kb0, kb1, acc, promote);
      Epi::stage_acc(reinterpret_cast<Stage*>(smem), main);
    } else {
      Mainloop::template run<GROUPED>(smem, p, A, B, tc.tm * BM, tc.tn * BN, kb0, kb1, acc);
      Epi::stage_acc(reinterpret_cast<Stage*>(smem), acc);
    }
    __syncthreads();  // stage tile complete before any thread reads other warps' values
  }

  // Publish the CTA's smem partial and raise `flag` to `value` (release at GPU scope).
  static PBG_DEVICE void publish(char* smem, Stage* slot, int* flag, int value) {
    Epi::smem_to_ws(reinterpret_cast<const Stage*>(smem), slot);
    __threadfence();   // each thread's workspace stores are visible GPU-wide ...
    __syncthreads();   // ... before thread 0 (after this barrier) raises the flag
    if (threadIdx.x == 0) st_release_gpu(flag, value);
  }
  // Wait for `flag` >= value, then add that partial into the smem tile.
  static PBG_DEVICE void consume(char* smem, const Stage* slot, const int* flag, int value) {
    if (threadIdx.x == 0) spin_wait_geq(flag, value);
    __syncthreads();
    Epi::smem_add_ws(reinterpret_cast<Stage*>(smem), slot);
    __syncthreads();
  }
  template <int EPI>
  static PBG_DEVICE void finish(char* smem, const GemmParams& p, const TileCoord& tc) {
    Epi::template store_c<EPI>(reinterpret_cast<const Stage*>(smem), p, tc.b, tc.tm * BM, tc.tn * BN);
    __syncthreads();  // smem is reused by the next tile's mainloop
  }
};

// The grouped launch's problem g as GemmParams (the launch-wide fields from p).
PBG_DEVICE GemmParams grouped_params(const GemmParams& p, const GroupedProblem& g) {
  GemmParams q = p;
  q.A = g.A; q.B = g.B; q.C = g.C; q.bias = g.bias; q.pre = g.pre; q.scale_m = g.scale_m; q.scale_n = g.scale_n;
  q.lda = g.lda; q.ldb = g.ldb; q.ldc = g.ldc; q.m = g.m; q.n = g.n; q.k = g.k;
  q.alpha = g.alpha; q.beta = g.beta; q.ialpha = g.ialpha; q.ibeta = g.ibeta; q.c_vec = g.c_vec;
  q.bias_mode = g.bias_mode; q.batch = 1; q.sa = q.sb = q.sc = 0;
  return q;
}
// The problem owning `tile`: the last g with tile_begin <= tile (binary search over the table;
// tile_begin does not decrease; problems without tiles share their successor's tile_begin).
PBG_DEVICE int grouped_find(const GroupedProblem* table, int count, int tile) {
  int lo = 0, hi = count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (__ldg(&table[mid].tile_begin) <= tile) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

// Launch bounds: 1 CTA per SM (up to 255 registers), except the grouped walk's 8-warp tiles of
// at most 128 x 64 (kernels/grouped.py GROUPED_SMALL_CONFIGS): 2, so that two CTAs fit the
// register file beside their 2 x 96 KB of shared memory.
template <class Kind, bool AK, bool BK, int BM, int BN, int BKB, int WM, int WN, int STAGES, int MODE, bool VEC,
          int EPI = 0>
__global__ void __launch_bounds__(WM * WN * 32, (MODE == kGrouped && WM * WN == 8 && BM * BN <= 128 * 64) ? 2 : 1)
    gemm_kernel(const void* A, const void* B, void* C, void* ws, int* flags, int m, int n, int k, long long lda,
                long long ldb, long long ldc, long long sa, long long sb, long long sc, int batch, float alpha,
                float beta, int ialpha, int ibeta, int c_vec, int group_m, int splits, int kt_per_split,
                int dp_tiles, int sk_tiles, const void* bias, void* pre, int bias_mode, const float* scale_m,
                const float* scale_n) {
  typedef GemmCore<Kind, AK, BK, BM, BN, BKB, WM, WN, STAGES, VEC> Core;
  typedef typename Core::Stage Stage;
  extern __shared__ __align__(128) char smem[];
  GemmParams p;
  p.A = static_cast<const char*>(A); p.B = static_cast<const char*>(B); p.C = static_cast<char*>(C);
  p.ws = static_cast<char*>(ws); p.flags = flags;
  p.m = m; p.n = n; p.k = k; p.lda = lda; p.ldb = ldb; p.ldc = ldc; p.sa = sa; p.sb = sb; p.sc = sc;
  p.batch = batch; p.alpha = alpha; p.beta = beta; p.ialpha = ialpha; p.ibeta = ibeta; p.c_vec = c_vec;
  p.group_m = group_m; p.splits = splits; p.kt_per_split = kt_per_split; p.dp_tiles = dp_tiles;
  p.sk_tiles = sk_tiles;
  p.bias = static_cast<const char*>(bias); p.pre = static_cast<char*>(pre); p.bias_mode = bias_mode;
  p.scale_m = scale_m; p.scale_n = scale_n;
  if constexpr (MODE == kGrouped) {
    // Persistent grid over the tiles of the problem table (A: the table, m: its row count,
    // dp_tiles: the tiles of all problems). The grid is <= the tile count, so no CTA idles
    // while another has two tiles left; a tile's problem is found by binary search (~log2 of
    // the problem count loads, from L1 after the first tiles).
    const GroupedProblem* table = static_cast<const GroupedProblem*>(A);
    const int count = m;
    // dp_tiles < 0: the tile count is on the device, where the kernel that built the table from
    // device-side sizes wrote it (impls/grouped_offsets.cuh; the grid is a bound)
    const int all_tiles = dp_tiles >= 0 ? dp_tiles : *flags;
    // Only t lives across the mainloop: the problem is looked up again for the store (the
    // mainloop needs nearly all 255 registers; keeping the problem's fields spilled 36 B).
#pragma unroll 1
    for (int t = blockIdx.x; t < all_tiles; t += gridDim.x) {
      {
        const int g = grouped_find(table, count, t);
        const GemmParams q = grouped_params(p, table[g]);
        const typename Core::Sched gs(q);
        Core::template tile_to_smem<0, true>(smem, q, gs.coord(t - table[g].tile_begin, q.group_m), 0, gs.kt);
      }
      asm volatile("" : "+r"(t));
      const int g = grouped_find(table, count, t);
      const GemmParams q = grouped_params(p, table[g]);
      const typename Core::Sched gs(q);
      Core::template finish<EPI>(smem, q, gs.coord(t - table[g].tile_begin, q.group_m));
    }
    return;
  }
  const typename Core::Sched sched(p);
  Stage* wsS = reinterpret_cast<Stage*>(p.ws);
  constexpr i64 SLOT = static_cast<i64>(BM) * BN;

  if constexpr (MODE == kSliced || MODE == kSplitKSerial || MODE == kSplitKParallel) {
    // grid = (tiles per batch, splits, batch); split index in y so that lower splits are
    // dispatched first (the serial chain waits on split s-1 only).
    const int tile = blockIdx.z * sched.tiles_per_batch + blockIdx.x;
    const TileCoord tc = sched.coord(tile, p.group_m);
    const int s = blockIdx.y;
    int kb0 = 0, kb1 = sched.kt;
    if constexpr (MODE != kSliced) {
      kb0 = s * p.kt_per_split;
      kb1 = kb0 + p.kt_per_split < sched.kt ? kb0 + p.kt_per_split : sched.kt;
      if (kb0 > kb1) kb0 = kb1;  // an empty split still takes part (adds zero)
    }
    Core::template tile_to_smem<EPI>(smem, p, tc, kb0, kb1);
    if constexpr (MODE == kSliced) {
      Core::template finish<EPI>(smem, p, tc);
    } else if constexpr (MODE == kSplitKSerial) {
      // Ordered fixup: split s adds the running sum of splits 0..s-1, then passes it on;
      // the last split applies alpha/beta. Fixed order -> reproducible bits.
      Stage* slot = wsS + tile * SLOT;
      if (s > 0) Core::consume(smem, slot, p.flags + tile, s);
      if (s < p.splits - 1) {
        __syncthreads();  // all reads of slot done before anyone overwrites it
        Core::publish(smem, slot, p.flags + tile, s + 1);
      } else {
        Core::template finish<EPI>(smem, p, tc);
      }
    } else {
      const i64 tiles = static_cast<i64>(sched.tiles_per_batch) * p.batch;
      Core::Epi::smem_to_ws(reinterpret_cast<const Stage*>(smem), wsS + (s * tiles + tile) * SLOT);
    }
  } else if constexpr (MODE == kStreamK) {
    // Stream-k (persistent grid of G CTAs, all co-resident: G <= SMs x occupancy).
    const int G = gridDim.x, cta = blockIdx.x;
    // 1) Data-parallel full waves: dp_tiles is a multiple of G, each CTA takes every G-th.
    // 2) The remaining sk_tiles: their MAC iterations are split evenly over the G CTAs.
    // One loop and one mainloop call site for both; only (t, it) live across the mainloop,
    // everything else is recomputed from opaque copies afterwards (registers: the mainloop
    // needs nearly all 255).
    const i64 total = static_cast<i64>(p.sk_tiles) * sched.kt;
    int t = cta;
    i64 it = total ? Core::Sched::sk_begin(cta, total, G) : 0;
    while (true) {
      int tile, kb0, kb1;
      if (t < p.dp_tiles) {
        tile = t; kb0 = 0; kb1 = sched.kt;
      } else {
        if (total == 0) break;
        const i64 end = Core::Sched::sk_begin(cta + 1, total, G);
        if (it >= end) break;
        const int local = static_cast<int>(it / sched.kt);
        kb0 = static_cast<int>(it - static_cast<i64>(local) * sched.kt);
        const i64 tile_end = static_cast<i64>(local + 1) * sched.kt;
        kb1 = kb0 + static_cast<int>((tile_end < end ? tile_end : end) - it);
        tile = p.dp_tiles + local;
      }
      Core::template tile_to_smem<EPI>(smem, p, sched.coord(tile, p.group_m), kb0, kb1);
      asm volatile("" : "+r"(t), "+l"(it));
      if (t < p.dp_tiles) {
        Core::template finish<EPI>(smem, p, sched.coord(t, p.group_m));
        t += G;
        continue;
      }
      const i64 end = Core::Sched::sk_begin(cta + 1, total, G);
      const int local = static_cast<int>(it / sched.kt);
      const int k0 = static_cast<int>(it - static_cast<i64>(local) * sched.kt);
      const i64 tile_end = static_cast<i64>(local + 1) * sched.kt;
      const i64 seg_end = tile_end < end ? tile_end : end;
      if (k0 != 0) {
        // Not the tile's first k-range: only the first segment of a CTA can start mid-tile,
        // so each CTA publishes at most once, into its own slot.
        Core::publish(smem, wsS + cta * SLOT, p.flags + cta, 1);
        __syncthreads();
      } else {
        if (seg_end != tile_end) {
          // Owner (holds k-step 0): add the later k-ranges in CTA order, a fixed order.
          const int last = Core::Sched::sk_cta_of(tile_end - 1, total, G);
          for (int q = cta + 1; q <= last; ++q) Core::consume(smem, wsS + q * SLOT, p.flags + q, 1);
        }
        Core::template finish<EPI>(smem, p, sched.coord(p.dp_tiles + local, p.group_m));
      }
      it = seg_end;
    }
  }
}

}  // namespace pyblasgemm
