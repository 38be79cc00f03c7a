// The Hopper GEMM kernel (sm_90a): TMA loads into a multi-stage shared-memory ring completed on
// mbarriers, one producer warp, two consumer warpgroups issuing wgmma, a persistent grid.
//
// Orientation. The BLAS problem is column-major C(m x n) = alpha * op(A) op(B) + beta * C. The
// kernel computes the same memory as a row-major D = P * Q^T with
//     D (Mt x Nt) = C viewed row-major: D(r, c) = C[c + r * ldc]   (Mt = n, Nt = m)
//     P (Mt x K)  = op(B)^T   (K-major when transb = 'N')
//     Q (Nt x K)  = op(A)     (K-major when transa = 'T')
// so that each thread's accumulator pairs (columns 2q, 2q+1) are adjacent in C's memory.
//
// CTA tile: BMT = 64 x CONSUMERS rows of D (64 per consumer warpgroup, wgmma M = 64; one or two
// consumer warpgroups) x BNT columns (the
// wgmma N). One stage holds 128 bytes of K for every row of P and Q (f16/bf16: 64 elements,
// s8: 128, tf32: 32), laid out as the TMA writes them with the 128-byte swizzle:
//     K-major operand:  row r of the tile at r * 128 bytes (one TMA box of BK x rows)
//     MN-major operand: 64-element MN blocks of 64 k-rows x 128 bytes (8 KB each, one box each)
// wgmma reads both through smem descriptors (ptx/sm90_tma.cuh) with the transpose bit for
// MN-major 16-bit operands; s8 wgmma has no transpose, so s8 needs both operands K-major
// ("TN"); the host routes other s8 layouts to the mma.sync kernel.
//
// Roles (warp-specialized): warpgroup 0 = producer (one thread issues every TMA; the warpgroup
// gives up registers with setmaxnreg), warpgroups 1..2 = consumers (wgmma + epilogue; with
// SYNC = true each consumer warp issues mma.sync instead, see Sm90SyncWarp).
// Both roles walk the same list of work units (Sm90Walker), so they agree on every stage.
//
// Decompositions on the persistent grid (template MODE, params.cuh's enum):
//   kSliced          each CTA takes output tiles cta, cta + G, ... (all of K each).
//   kSplitKParallel  units (tile, split) cta, cta + G, ...; each writes its fp32/s32 partial to
//                    workspace matrix `split`; sm90_splitk_reduce sums them in split order.
//   kStreamK         full waves of data-parallel tiles (dp_tiles, a multiple of G), then the
//                    MAC iterations of the remaining sk_tiles split evenly over the G CTAs; the
//                    CTA holding a tile's k-step 0 adds the other CTAs' partials in CTA order.
// Every decomposition is bitwise reproducible (partials are combined in a fixed order).
#pragma once
#include "../arch.cuh"
#include "../params.cuh"
#include "../ptx/sm70_sync.cuh"
#include "../ptx/sm90_tma.cuh"
#include "../ptx/sm90_wgmma.cuh"
#include "../ptx/sm75_ldmatrix.cuh"
#include "../mma/sm80_kinds.cuh"
#include "../epilogue/sm80_smem_epilogue.cuh"
#include "../epilogue/activation.cuh"
#include "sm90_tf32_prep.cuh"
#include "grouped_offsets.cuh"

namespace pyblasgemm {

// Element kinds on wgmma: storage/conversion traits shared with the mma.sync kinds.
// kSplit: operands arrive as big and small tf32 parts, one stage holds both (3xTF32, see
// Sm90KindTF32T). kRoundEvery > 0: wgmma chains of that many stages go into fresh registers
// that a round-to-nearest FADD adds to the accumulator (fp32 C, see Sm90KindF16Out32).
struct Sm90KindF16 : KindF16F32 {
  typedef KindF16F32 SyncKind;  // the mma.sync kind of the same element type (SYNC consumers)
  typedef float Acc;
  static constexpr int kBKE = 64;  // elements of K per stage (128 bytes)
  static constexpr bool kSplit = false;
  static constexpr int kRoundEvery = 0;
  template <int N, int TA, int TB>
  static PBG_DEVICE void mma(float (&d)[N / 2], u64 a, u64 b, int scale_d) {
    WgmmaF16<N, false, TA, TB>::mma(d, a, b, scale_d);
  }
};
struct Sm90KindBF16 : KindBF16F32 {
  typedef KindBF16F32 SyncKind;
  typedef float Acc;
  static constexpr int kBKE = 64;
  static constexpr bool kSplit = false;
  static constexpr int kRoundEvery = 0;
  template <int N, int TA, int TB>
  static PBG_DEVICE void mma(float (&d)[N / 2], u64 a, u64 b, int scale_d) {
    WgmmaF16<N, true, TA, TB>::mma(d, a, b, scale_d);
  }
};
// fp32 C from 16-bit operands (shgemm / sbgemm): the 16-bit mainloop, a 4-byte epilogue, and
// a rounding FADD every 4 stages (256 k). wgmma adds into its fp32 accumulator with truncation;
// a 16-bit C hides that under its own rounding, a float32 C does not: measured on an H100 at
// K = 1000, one chain over all of K gave 1.24e-6 relative error against cuBLAS's 1.6e-7.
// Chains of 2 stages ran at 0.61-0.70x cublasGemmEx, of 4 at 0.77x (both within 2x its error).
struct Sm90KindF16Out32 : KindOut32<Sm90KindF16> {
  static constexpr int kRoundEvery = 4;
};
struct Sm90KindBF16Out32 : KindOut32<Sm90KindBF16> {
  static constexpr int kRoundEvery = 4;
};
struct Sm90KindS8 : KindS8S32 {
  typedef int Acc;
  static constexpr int kBKE = 128;
  static constexpr bool kSplit = false;
  static constexpr int kRoundEvery = 0;
  template <int N, int TA, int TB>
  static PBG_DEVICE void mma(int (&d)[N / 2], u64 a, u64 b, int scale_d) {
    static_assert(TA == 0 && TB == 0, "s8 wgmma reads K-major operands only");
    WgmmaS8<N>::mma(d, a, b, scale_d);
  }
};

// float8 on wgmma (m64nNk32, sm_90a, K-major only; ATYPE / BTYPE of the kernel's A and B: 0
// e4m3, 1 e5m2). The wgmma's first operand is P = op(B)^T, so its type is BTYPE. Hopper's FP8
// tensor cores keep fewer accumulator bits than fp32 (DeepGEMM's finding), so every stage
// (128 k) runs in fresh registers that a round-to-nearest FADD adds to the accumulator: the
// kRoundEvery chain of one stage, DeepGEMM's promotion interval. Per-tensor and per-row /
// per-column scales are the fused store's (EPI & kEpiDequant); block scales stay on mma.sync.
template <int ATYPE, int BTYPE>
struct Sm90KindFp8 : KindFp8F32<ATYPE, BTYPE> {
  typedef float Acc;
  static constexpr int kBKE = 128;
  static constexpr bool kSplit = false;
  static constexpr int kRoundEvery = 1;
  template <int N, int TA, int TB>
  static PBG_DEVICE void mma(float (&d)[N / 2], u64 a, u64 b, int scale_d) {
    static_assert(TA == 0 && TB == 0, "float8 wgmma reads K-major operands only");
    WgmmaFp8<N, BTYPE, ATYPE>::mma(d, a, b, scale_d);
  }
};
struct Sm90KindE4M3 : Sm90KindFp8<0, 0> {};
struct Sm90KindE4M3E5M2 : Sm90KindFp8<0, 1> {};
struct Sm90KindE5M2E4M3 : Sm90KindFp8<1, 0> {};
struct Sm90KindE5M2 : Sm90KindFp8<1, 1> {};

// A dequantized product's accumulator register as the float it holds from the fused
// epilogue on: int8's carry the float's bits, float8's are floats already.
PBG_DEVICE float dq_read(int v) { return __int_as_float(v); }
PBG_DEVICE float dq_read(float v) { return v; }
PBG_DEVICE void dq_write(int& v, float x) { v = __float_as_int(x); }
PBG_DEVICE void dq_write(float& v, float x) { v = x; }

// fp32 operands on wgmma (tf32, m64nNk8, K-major only). The kernel reads operands that the
// prep kernel (impls/sm90_tf32_prep.cuh) already rounded to tf32 and laid out K-major:
//   tf32:   op(A), op(B) rounded to nearest tf32 (cvt.rna, as the mma.sync kind).
//   3xTF32: each row holds [big | small] halves of kpad columns (x = big + small, both tf32);
//           a stage loads 32 k of both halves of both operands and issues the three products
//           small(A)*big(B), big(A)*small(B), big(A)*big(B) (Ootomo & Yokota 2022): 4 tiles
//           of operand data feed 3 tiles' worth of MMAs.
// The tensor core adds into its fp32 accumulator with truncation, which over a long K biases
// the result by far more than fp32 rounding (measured on the mma.sync kind: 4e-6..7e-6
// relative at K = 1000, SGEMM 1.6e-7), so 3xTF32 sums each stage (small products first) in
// fresh registers and adds them to the accumulator with a round-to-nearest FADD.
template <bool SPLIT>
struct Sm90KindTF32T : KindTF32 {
  typedef float Acc;
  static constexpr int kBKE = 32;
  static constexpr bool kSplit = SPLIT;
  static constexpr int kRoundEvery = 0;   // 3xTF32 rounds every stage in its own loop
  template <int N, int TA, int TB>
  static PBG_DEVICE void mma(float (&d)[N / 2], u64 a, u64 b, int scale_d) {
    static_assert(TA == 0 && TB == 0, "tf32 wgmma reads K-major operands only");
    WgmmaTF32<N>::mma(d, a, b, scale_d);
  }
};
struct Sm90KindTF32 : Sm90KindTF32T<false> {};
struct Sm90Kind3xTF32 : Sm90KindTF32T<true> {};

// What a consumer does with a finished work unit.
enum Sm90Role : int {
  kStoreC = 0,    // the whole K range: alpha/beta epilogue into C
  kToSplitWs = 1, // split-k: raw partial into workspace matrix `split`
  kPublish = 2,   // stream-k, not the tile's first k-range: partial to this CTA's slot + flag
  kOwner = 3,     // stream-k, holds k-step 0: add peers cta+1..last_peer, then store C
};

struct Sm90Work {
  int tile, kb0, kb1, split, role, last_peer;
};

// The work list of one CTA; the producer and the consumers each walk their own copy.
template <int MODE>
struct Sm90Walker {
  int tiles, kt, G, cta, splits, kps, dp_tiles, u;
  i64 total, it, end;

  // G workers (CTAs, or clusters of CTAs that share every unit), this one is `cta`.
  PBG_DEVICE Sm90Walker(int tiles_, int kt_, int splits_, int kps_, int dp_tiles_, int sk_tiles, int G_, int cta_) {
    tiles = tiles_; kt = kt_; G = G_; cta = cta_;
    splits = splits_; kps = kps_; dp_tiles = dp_tiles_; u = cta;
    total = static_cast<i64>(sk_tiles) * kt;
    it = total ? static_cast<i64>(cta) * total / G : 0;
    end = total ? static_cast<i64>(cta + 1) * total / G : 0;
  }

  PBG_DEVICE bool next(Sm90Work& w) {
    if constexpr (MODE == kSliced) {
      if (u >= tiles) return false;
      w.tile = u; w.kb0 = 0; w.kb1 = kt; w.split = 0; w.role = kStoreC; w.last_peer = 0;
      u += G;
      return true;
    } else if constexpr (MODE == kSplitKParallel) {
      if (u >= tiles * splits) return false;
      w.tile = u / splits;
      w.split = u - w.tile * splits;
      w.kb0 = w.split * kps;
      w.kb1 = w.kb0 + kps < kt ? w.kb0 + kps : kt;  // the host leaves no split empty
      w.role = kToSplitWs; w.last_peer = 0;
      u += G;
      return true;
    } else {
      if (u < dp_tiles) {
        w.tile = u; w.kb0 = 0; w.kb1 = kt; w.split = 0; w.role = kStoreC; w.last_peer = 0;
        u += G;
        return true;
      }
      if (it >= end) return false;
      const int local = static_cast<int>(it / kt);
      const int k0 = static_cast<int>(it - static_cast<i64>(local) * kt);
      const i64 tile_end = static_cast<i64>(local + 1) * kt;
      const i64 seg_end = tile_end < end ? tile_end : end;
      w.tile = dp_tiles + local; w.kb0 = k0; w.kb1 = k0 + static_cast<int>(seg_end - it); w.split = 0;
      if (k0 != 0) {
        w.role = kPublish; w.last_peer = 0;  // only a CTA's first segment can start mid-tile
      } else if (seg_end != tile_end) {
        w.role = kOwner;  // the CTA whose range holds the tile's last iteration
        w.last_peer = static_cast<int>(((tile_end - 1 + 1) * G + total - 1) / total) - 1;
      } else {
        w.role = kStoreC; w.last_peer = 0;
      }
      it = seg_end;
      return true;
    }
  }
};

// Output tile of a work unit: grouped raster (`group` tile rows walked down one tile column, so
// concurrently running units share operand panels in L2) over units of `unit_m` tile rows; a
// CTA of a cluster takes row `rank` of its unit.
struct Sm90Coord {
  int b, tm, tn;
};
PBG_DEVICE Sm90Coord sm90_coord(int unit, int units_m, int tiles_n, int group, int unit_m, int rank) {
  const int per_batch = units_m * tiles_n;
  Sm90Coord c;
  c.b = unit / per_batch;
  const int lin = unit - c.b * per_batch;
  const int width = group * tiles_n, gid = lin / width, first = gid * group;
  const int gsize = units_m - first < group ? units_m - first : group;
  c.tm = (first + (lin - gid * width) % gsize) * unit_m + rank;
  c.tn = (lin - gid * width) / gsize;
  return c;
}

// ---- the grouped walk (MODE == kGrouped) -------------------------------------------------
// Mixture-of-experts layers with device-side group sizes (torch._grouped_mm's `offs`: end rows,
// or the masked layout's valid row counts) in one persistent launch, read on the device only (a
// CUDA graph replays any sizes). The kernel's problem is the stacked one: D = C holds every
// group's rows stacked (mt = all rows), P = the tokens through one TMA map over all rows, Q = the
// weights as a batch of `batch` = groups matrices (its map's z coordinate is the group). Every CTA
// first scans the offsets into shared memory (scan_groups, impls/grouped_offsets.cuh): each
// group's end row and first tile, the tiles numbered group after group (ceil(rows / BMT) x
// tiles_n each); a unit's group is found by binary search (<= 9 shared loads for 512 groups).
// A tile reaching past its group's last row reads the next group's rows (past the matrix: TMA's
// zeros); each D row depends on its own P row only, and the store writes the group's rows alone
// (the register stores check every row; a TMA box is stored only when it lies inside the group).
constexpr int kSm90MaxGroups = 512;   // kernels/sm90.py SM90_MAX_GROUPS mirrors it

// int32 or int64 offsets (offsets_wide), read as long long: a runtime choice, so one
// instantiation serves both types
struct Sm90Offsets {
  const void* p;
  int wide;
  PBG_DEVICE long long operator[](int g) const {
    return wide ? static_cast<const long long*>(p)[g] : static_cast<long long>(static_cast<const int*>(p)[g]);
  }
};
// the scan's result, in dynamic shared memory after the barriers (families.py adds its bytes)
struct Sm90GroupTable {
  long long end[kSm90MaxGroups];      // group g's end row (the running maximum of the clamped offsets)
  int first_tile[kSm90MaxGroups];     // its first tile (an empty group shares its successor's)
  int tiles;                          // all groups' tiles
};
static_assert(sizeof(Sm90GroupTable) <= 6160, "kernels/families.py reserves 6160 bytes for the group table");

// A work unit's tile and where its data is: the P rows from p_row0 + tm * BMT (0: the plain
// problem), P's and Q's batch coordinates, C's batch b, the group (grouped walk), C's first row of
// the unit's problem (row_base) and how many D rows from there the store may write (rows).
struct Sm90Unit {
  int tm, tn, zp, zq, b, group, row_base, rows;
};
template <int MODE, int BMT, int CLUSTER>
PBG_DEVICE Sm90Unit sm90_unit(int tile, int units_m, int tiles_n, int group_m, int rank, int mt, int p_batched,
                              int q_batched, const Sm90GroupTable* gt, int groups, long long group_rows) {
  Sm90Unit u;
  if constexpr (MODE == kGrouped) {
    // the last group whose first tile is at or before `tile` (empty groups share their
    // successor's first tile and are passed over)
    int lo = 0, hi = groups - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) >> 1;
      if (gt->first_tile[mid] <= tile) lo = mid;
      else hi = mid - 1;
    }
    const long long start = group_rows > 0 ? lo * group_rows : (lo ? gt->end[lo - 1] : 0);
    const int rows = static_cast<int>(gt->end[lo] - start);
    const Sm90Coord c = sm90_coord(tile - gt->first_tile[lo], (rows + BMT - 1) / BMT, tiles_n, group_m, 1, 0);
    u.tm = c.tm; u.tn = c.tn; u.zp = 0; u.zq = lo; u.b = 0; u.group = lo;
    u.row_base = static_cast<int>(start); u.rows = rows;
  } else {
    const Sm90Coord c = sm90_coord(tile, units_m, tiles_n, group_m, CLUSTER, rank);
    u.tm = c.tm; u.tn = c.tn; u.zp = p_batched ? c.b : 0; u.zq = q_batched ? c.b : 0; u.b = c.b; u.group = 0;
    u.row_base = 0; u.rows = mt;
  }
  return u;
}

template <class Kind, bool PK, bool QK, int BNT, int STAGES, int CONSUMERS>
struct Sm90Tile {
  static constexpr int BMT = 64 * CONSUMERS;      // consumer warpgroups x 64 rows
  static constexpr int BKE = Kind::kBKE;          // K elements per stage (128 bytes)
  static constexpr int PARTS = Kind::kSplit ? 2 : 1;  // 3xTF32: big and small halves
  static constexpr int P_PART = BMT * 128;
  static constexpr int Q_PART = BNT * 128;
  static constexpr int P_BYTES = P_PART * PARTS;
  static constexpr int Q_BYTES = Q_PART * PARTS;
  static constexpr int STAGE_BYTES = P_BYTES + Q_BYTES;
  static constexpr int RING_BYTES = STAGES * STAGE_BYTES;
  // epilogue staging for the TMA store: per consumer warpgroup two 8 KB buffers, each a box of
  // 64 rows x 128 bytes (64 fp16 or 32 int32 columns), 128-byte swizzled like the operands
  static constexpr int EPI_BYTES = CONSUMERS * 2 * 8192;
  // dynamic smem = ring + epilogue buffers + full/empty barriers + slack to align to 1024 bytes
  static constexpr int SMEM_BYTES = RING_BYTES + EPI_BYTES + 16 * STAGES + 1024;
  static constexpr int ACC = BNT / 2;              // accumulators per consumer thread
  static constexpr int CONSUMER_THREADS = 128 * CONSUMERS;
  static constexpr int THREADS = CONSUMER_THREADS + 128;  // + the producer warpgroup
  static_assert(BNT % 64 == 0 && BNT <= 256, "BNT: 64, 128, 192 or 256");
  static_assert(STAGE_BYTES % 1024 == 0, "stages must keep 1024-byte swizzle alignment");
};

// One stage's wgmmas (4 k-slices of the 128-byte rows) into `d`; `accumulate` = 0 overwrites d
// on the first slice. K-major: the ks-th 32-byte slice of each 128-byte row; MN-major (16-bit
// only, the transpose bit): k-rows 16ks.. of the 64-element MN blocks.
template <class Kind, bool PK, bool QK, int BNT>
PBG_DEVICE void sm90_stage_mma(typename Kind::Acc (&d)[BNT / 2], u32 ps, u32 qs, int accumulate) {
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) {
    const u64 da = PK ? smem_desc_sw128(ps + 32 * ks, 0, 1024) : smem_desc_sw128(ps + 2048 * ks, 8192, 1024);
    const u64 db = QK ? smem_desc_sw128(qs + 32 * ks, 0, 1024) : smem_desc_sw128(qs + 2048 * ks, 8192, 1024);
    Kind::template mma<BNT, PK ? 0 : 1, QK ? 0 : 1>(d, da, db, (accumulate || ks > 0) ? 1 : 0);
  }
}

// A chain's sums (fresh registers) into the accumulator: copied for a work unit's first chain,
// else added with a round-to-nearest FADD (3xTF32 and fp32-C kinds; see Sm90KindTF32T).
template <int ACC, class Acc>
PBG_DEVICE void sm90_fold_chain(Acc (&acc)[ACC], const Acc (&part)[ACC], bool first) {
  if (first) {
#pragma unroll
    for (int r = 0; r < ACC; ++r) acc[r] = part[r];
  } else {
#pragma unroll
    for (int r = 0; r < ACC; ++r) acc[r] += part[r];
  }
}

// A block-scaled float8 product's stage (one 128-wide K block q of kbn: float8's BKE is 128)
// into the accumulator (+0 at the work unit's start): acc = fma(scale_m(c, q) * scale_n(r, q),
// part, acc), DeepGEMM's promotion with the 1 x 128 / 128 x 128 scales, in the mma.sync kernel's arithmetic
// (GemmCore::tile_to_smem: one product of the two scales, one round-to-nearest FMA). D row r
// is C's n index (scale_n, extent mt), D column c its m index (scale_m, extent nt); this
// thread's fragment f holds rows row0 (+8) and columns col0 + 8f (+1). A 128 x 128 block scale
// (mode 4) of the m side is one value per stage: a tile of BNT <= 128 columns starting at a
// multiple of BNT lies inside one 128-column block. Outside C the scale is 0 (the TMA's zero
// fill: those sums are 0 and never stored).
template <int EPI, int BNT, int ACC>
PBG_DEVICE void sm90_fold_block_scaled(float (&acc)[ACC], const float (&part)[ACC], const float* scale_m,
                                       const float* scale_n, int q, int kbn, int mt, int nt, int row0, int col0,
                                       int tile_col0) {
  constexpr int MM = EpiBlock<EPI>::kModeM, MN = EpiBlock<EPI>::kModeN;
  static_assert(128 % BNT == 0 && ACC == BNT / 2, "block scales: tiles of at most 128 columns inside one block");
  float sr[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = row0 + 8 * h;
    sr[h] = r < mt ? block_scale<MN>(scale_n, r, mt, q, kbn) : 0.f;
  }
  if constexpr (MM == 1 || MM == 4) {
    // the tile's one scale of the m side: two products of scales a stage, then the FMAs
    const float sm = tile_col0 < nt ? block_scale<MM>(scale_m, tile_col0, nt, q, kbn) : 0.f;
    const float s0 = mul_ieee(sm, sr[0]), s1 = mul_ieee(sm, sr[1]);
#pragma unroll
    for (int i = 0; i < ACC; ++i) acc[i] = fma_ieee((i & 2) ? s1 : s0, part[i], acc[i]);
  } else {
#pragma unroll
    for (int f = 0; f < BNT / 8; ++f)
#pragma unroll
      for (int t = 0; t < 2; ++t) {
        const int c = col0 + 8 * f + t;
        const float sc = c < nt ? block_scale<MM>(scale_m, c, nt, q, kbn) : 0.f;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int i = 4 * f + 2 * h + t;
          acc[i] = fma_ieee(mul_ieee(sc, sr[h]), part[i], acc[i]);
        }
      }
  }
}

// ---- mma.sync consumers (SYNC = true) ---------------------------------------------------
// The same TMA ring, producer and epilogue, but each consumer warp issues mma.sync m16n8k16 on
// fragments it loads with ldmatrix from the 128-byte-swizzled stage: warp w of consumer
// warpgroup cw owns D rows 64cw..+63 (P) x columns (BNT/4)w..+BNT/4 (Q), a 64 x 64 (or 64 x 32)
// warp tile, the shape that keeps ldmatrix traffic lowest per MMA (NOTES.md, session 4). It
// measures what mma.sync reaches on Hopper when TMA feeds it (no cp.async, no CTA barrier).
// Both operands' 64-row slabs are one 8 KB block: K-major rows r at r * 128 bytes, MN-major
// k-rows kk at kk * 128 bytes, 16-byte chunks XOR-ed with (row % 8) by the TMA swizzle.
template <class Kind, bool PK, bool QK, int BNT>
struct Sm90SyncWarp {
  static constexpr int MI = 4;            // 16-row atoms over the warp's 64 P rows
  static constexpr int NI = BNT / 32;     // 8-column atoms over its BNT/4 Q rows
  static_assert(BNT == 128 || BNT == 256, "mma.sync consumers: BNT 128 or 256");
  typedef typename Kind::SyncKind SK;
  // per-lane offsets of k-step 0, atom 0 inside the P and Q blocks (see load())
  u32 p_off, q_off;
  PBG_DEVICE Sm90SyncWarp(int lane, int warp4) {
    const int r = lane & 7, j = lane >> 3;
    if constexpr (PK) p_off = (lane & 15) * 128 + (((lane >> 4) ^ r) << 4);
    else p_off = (r + 8 * (j >> 1)) * 128 + (((j & 1) ^ r) << 4);
    const int q_rows0 = (BNT / 4) * warp4;   // the warp's first Q row
    if constexpr (QK) {
      q_off = (q_rows0 + r + 8 * (j >> 1)) * 128 + (((j & 1) ^ r) << 4);
    } else {
      const int cq0 = (q_rows0 % 64) / 8;  // chunk of the warp's first Q row in its 64-block
      q_off = (q_rows0 / 64) * 8192 + (r + 8 * (j & 1)) * 128 + ((((j >> 1) ^ r) ^ cq0) << 4);
    }
  }
  // Fragments of k-step ks (16 k) of the stage whose P block is at ps and Q tile at qs. The
  // swizzle XOR is linear in the chunk index, so every other atom / k-step is the k-step-0
  // offset XOR-ed (chunk bits) and shifted (row bits) by compile-time constants.
  PBG_DEVICE void load(u32 ps, u32 qs, int ks, u32 (&fa)[MI][4], u32 (&fb)[NI][4]) const {
#pragma unroll
    for (int i = 0; i < MI; ++i) {
      if constexpr (PK) ldsm_x4(ps + ((p_off ^ (ks << 5)) + i * 2048), fa[i][0], fa[i][1], fa[i][2], fa[i][3]);
      else ldsm_x4_trans(ps + ((p_off ^ (i << 5)) + ks * 2048), fa[i][0], fa[i][1], fa[i][2], fa[i][3]);
    }
#pragma unroll
    for (int jj = 0; jj < NI / 2; ++jj) {
      if constexpr (QK) ldsm_x4(qs + ((q_off ^ (ks << 5)) + jj * 2048), fb[2 * jj][0], fb[2 * jj][1], fb[2 * jj + 1][0], fb[2 * jj + 1][1]);
      else ldsm_x4_trans(qs + ((q_off ^ (jj << 5)) + ks * 2048), fb[2 * jj][0], fb[2 * jj][1], fb[2 * jj + 1][0], fb[2 * jj + 1][1]);
    }
  }
  // MI x NI MMAs; accumulator fragment f = i * NI + j holds acc[4f .. 4f + 3] (serpentine over
  // j: consecutive MMAs share the A registers, the operand the reuse cache keeps)
  static PBG_DEVICE void mma(const u32 (&fa)[MI][4], const u32 (&fb)[NI][4], typename Kind::Acc (&acc)[BNT / 2]) {
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
      for (int j = 0; j < NI; ++j) {
        const int jj = (i & 1) ? NI - 1 - j : j;
        SK::mma(&acc[4 * (i * NI + jj)], &fa[i], &fb[jj]);
      }
  }
};

// ---- epilogue helpers ---------------------------------------------------------------------
// Two adjacent C elements (a thread's accumulator pair) in one 4- or 8-byte store.
template <class Kind, bool READ_C>
PBG_DEVICE void sm90_store_pair_fast(char* cp, typename Kind::Scale alpha, typename Kind::Scale beta,
                                     typename Kind::Acc v0, typename Kind::Acc v1) {
  if constexpr (Kind::kCBytes == 1) {   // the digit store: alpha 1, beta 0 (READ_C's branch never runs)
    *reinterpret_cast<u16*>(cp) = static_cast<u16>(Kind::cvt_c(ax(alpha, v0)) | (Kind::cvt_c(ax(alpha, v1)) << 8));
  } else if constexpr (Kind::kCBytes == 2) {
    u32 out;
    if constexpr (READ_C) {
      const u32 old = *reinterpret_cast<const u32*>(cp);
      out = Kind::cvt_c(axpby(alpha, v0, beta, Kind::c_from_bits(old & 0xffffu))) |
            (Kind::cvt_c(axpby(alpha, v1, beta, Kind::c_from_bits(old >> 16))) << 16);
    } else {
      out = Kind::cvt_c(ax(alpha, v0)) | (Kind::cvt_c(ax(alpha, v1)) << 16);
    }
    *reinterpret_cast<u32*>(cp) = out;
  } else {
    uint2 out;
    if constexpr (READ_C) {
      const uint2 old = *reinterpret_cast<const uint2*>(cp);
      out = make_uint2(Kind::cvt_c(axpby(alpha, v0, beta, Kind::c_from_bits(old.x))),
                       Kind::cvt_c(axpby(alpha, v1, beta, Kind::c_from_bits(old.y))));
    } else {
      out = make_uint2(Kind::cvt_c(ax(alpha, v0)), Kind::cvt_c(ax(alpha, v1)));
    }
    *reinterpret_cast<uint2*>(cp) = out;
  }
}

template <class Kind>
PBG_DEVICE void sm90_store_pair(char* cp, typename Kind::Scale alpha, typename Kind::Scale beta, bool read_c,
                                typename Kind::Acc v0, typename Kind::Acc v1, bool pair, bool second) {
  typedef typename Kind::Scale Scale;
  constexpr int CB = Kind::kCBytes;
  if constexpr (CB == 1) {   // (the digit store: alpha 1, C not read)
    if (pair) {
      *reinterpret_cast<u16*>(cp) = static_cast<u16>(Kind::cvt_c(ax(alpha, v0)) | (Kind::cvt_c(ax(alpha, v1)) << 8));
    } else {
      *reinterpret_cast<unsigned char*>(cp) = static_cast<unsigned char>(Kind::cvt_c(ax(alpha, v0)));
      if (second) *reinterpret_cast<unsigned char*>(cp + 1) = static_cast<unsigned char>(Kind::cvt_c(ax(alpha, v1)));
    }
    return;
  }
  if (pair) {
    if constexpr (CB == 2) {
      u32 old = read_c ? *reinterpret_cast<const u32*>(cp) : 0u;
      Scale r0 = read_c ? axpby(alpha, v0, beta, Kind::c_from_bits(old & 0xffffu)) : ax(alpha, v0);
      Scale r1 = read_c ? axpby(alpha, v1, beta, Kind::c_from_bits(old >> 16)) : ax(alpha, v1);
      *reinterpret_cast<u32*>(cp) = Kind::cvt_c(r0) | (Kind::cvt_c(r1) << 16);
    } else {
      uint2 old = read_c ? *reinterpret_cast<const uint2*>(cp) : make_uint2(0u, 0u);
      Scale r0 = read_c ? axpby(alpha, v0, beta, Kind::c_from_bits(old.x)) : ax(alpha, v0);
      Scale r1 = read_c ? axpby(alpha, v1, beta, Kind::c_from_bits(old.y)) : ax(alpha, v1);
      *reinterpret_cast<uint2*>(cp) = make_uint2(Kind::cvt_c(r0), Kind::cvt_c(r1));
    }
    return;
  }
  Scale r0 = read_c ? axpby(alpha, v0, beta, Kind::load_c(cp)) : ax(alpha, v0);
  if constexpr (CB == 2) *reinterpret_cast<u16*>(cp) = static_cast<u16>(Kind::cvt_c(r0));
  else *reinterpret_cast<u32*>(cp) = Kind::cvt_c(r0);
  if (second) {
    char* cq = cp + CB;
    Scale r1 = read_c ? axpby(alpha, v1, beta, Kind::load_c(cq)) : ax(alpha, v1);
    if constexpr (CB == 2) *reinterpret_cast<u16*>(cq) = static_cast<u16>(Kind::cvt_c(r1));
    else *reinterpret_cast<u32*>(cq) = Kind::cvt_c(r1);
  }
}

// ---- fused epilogue (template EPI; 0 = none: the plain GEMM's code, unchanged) ---------------
// EPI = kEpiOn | activation code (activation.cuh; kEpiOn alone: bias and/or pre-activation).
// The value v = alpha * acc + beta * c of D(r, c) becomes v + bias (one value per D column
// c = C's m index when bias_mode == 1, per D row r = C's n index when 2); v is written to the
// pre-activation array (C's layout, pre_off bytes from C) when has_pre; act(v) is the result.
// The GEMM kernel applies it to its accumulator registers before the store (one inlined
// activation per register: the store paths stay as they are, with alpha = 1 and C not read);
// the split-k reduction per element (sm90_epi). float Scale kinds only (16-bit and fp32 C).
// (kEpiOn: epilogue/activation.cuh; add_ieee: epilogue/sm80_smem_epilogue.cuh)
// the bits of two adjacent C elements (a bias pair)
template <int CB>
struct Sm90Pair { typedef u32 type; };
template <>
struct Sm90Pair<4> { typedef uint2 type; };
struct Sm90Epi {
  const char* bias;
  long long pre_off;
  int bias_mode;
  bool has_pre;
};
template <class Kind>
PBG_DEVICE void sm90_store_one(char* cp, typename Kind::Scale v) {
  if constexpr (Kind::kCBytes == 1) *reinterpret_cast<unsigned char*>(cp) = static_cast<unsigned char>(Kind::cvt_c(v));
  else if constexpr (Kind::kCBytes == 2) *reinterpret_cast<u16*>(cp) = static_cast<u16>(Kind::cvt_c(v));
  else *reinterpret_cast<u32*>(cp) = Kind::cvt_c(v);
}
// v (alpha * acc + beta * c of D(r, c), at cp in C; cp is used only when inside) -> act(v + bias)
template <class Kind, int EPI>
PBG_DEVICE typename Kind::Scale sm90_epi(typename Kind::Scale v, const Sm90Epi& e, char* cp, int r, int c,
                                         bool inside) {
  static_assert(EPI != 0 && sizeof(typename Kind::Scale) == 4 && static_cast<typename Kind::Scale>(0.5f) != 0,
                "fused epilogues: float accumulator kinds");
  if (e.bias_mode && inside)
    v = add_ieee(v, Kind::load_c(e.bias + static_cast<i64>(e.bias_mode == 1 ? c : r) * Kind::kCBytes));
  if (e.has_pre && inside) sm90_store_one<Kind>(cp + e.pre_off, v);
  return activate(v, EPI & 7);
}

// The persistent grid as both roles walk it. Each role computes it after its setmaxnreg: NVRTC
// 13.0's ptxas (the one PyTorch pins) spills values live across setmaxnreg to local memory
// (8-20 bytes at stream-k 256 x 128 mma.sync, cluster-2 256 x 128 mma.sync and the int8
// dequantizing stream-k 192 x 128); 13.5's kept them in registers.
struct Sm90Grid {
  int units_m, tiles_n, units, kt, rank, workers, worker;
};
template <int BMT, int BNT, int BKE, int CLUSTER>
PBG_DEVICE Sm90Grid sm90_grid(int mt, int nt, int k, int batch) {
  Sm90Grid g;
  const int tiles_m = (mt + BMT - 1) / BMT;
  g.tiles_n = (nt + BNT - 1) / BNT;
  g.units_m = (tiles_m + CLUSTER - 1) / CLUSTER;  // a unit = CLUSTER tile rows
  g.units = g.units_m * g.tiles_n * batch;
  g.kt = (k + BKE - 1) / BKE;
  g.rank = CLUSTER > 1 ? static_cast<int>(cluster_ctarank()) : 0;
  g.workers = gridDim.x / CLUSTER;
  g.worker = blockIdx.x / CLUSTER;
  return g;
}

// CLUSTER = 2 (data-parallel only): two CTAs on neighbouring SMs take the tiles (2u, tn) and
// (2u + 1, tn) of unit u: each loads its own P block and half of the shared Q block, which the
// TMA multicasts into both CTAs (a third less L2 traffic per CTA); a stage is refilled only
// after the consumers of both CTAs released it.
template <class Kind, bool PK, bool QK, int BNT, int STAGES, int MODE, int CLUSTER, int CONSUMERS, bool SYNC,
          int EPI = 0>
__global__ void __launch_bounds__(128 * (1 + CONSUMERS), 1)
    sm90_gemm_kernel(const __grid_constant__ TmaDesc tma_p, const __grid_constant__ TmaDesc tma_q,
                     const __grid_constant__ TmaDesc tma_c, void* C, void* ws, int* flags, int mt, int nt, int k,
                     long long ldc, long long sc, int batch, int p_batched, int q_batched, float alpha, float beta,
                     int ialpha, int ibeta, int c_pair, int group_m, int splits, int kt_per_split, int dp_tiles,
                     int sk_tiles, const void* bias, void* pre, int bias_mode, const float* scale_m,
                     const float* scale_n, const void* offsets, int offsets_wide, long long group_rows,
                     long long bias_group_bytes) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  typedef Sm90Tile<Kind, PK, QK, BNT, STAGES, CONSUMERS> T;
  static_assert(!SYNC || EPI == 0, "fused epilogues: wgmma consumers");
  // block-scaled float8: the promotion scales every stage (sm90_fold_block_scaled), so the
  // rounding chain is one stage and the store (or the split-k sum) scales nothing
  static_assert(!EpiBlock<EPI>::kOn || (Kind::kRoundEvery == 1 && Kind::kBKE == 128 && !SYNC && CLUSTER == 1),
                "block scales: float8 kinds on wgmma consumers, one 128-wide K block a stage, no cluster");
  typedef typename Kind::Acc Acc;
  typedef typename Kind::Scale Scale;
  // What the store writes: the kind's C, or (int8 dequantized, EPI & kEpiDequant) a float type;
  // then the accumulator registers carry the dequantized float's bits from the EPI pass on.
  constexpr bool DQ = (EPI & kEpiDequant) != 0;
  // the Ozaki digit store (EPI == kEpiResidue): int8 products, whole tiles (no split-k or
  // stream-k partials to combine first)
  constexpr bool RES = (EPI & kEpiResidue) != 0;
  typedef typename EpiOut<Kind, EPI>::type OK;
  typedef typename OK::Scale OScale;
  typedef typename OK::Acc OAcc;
  static_assert(EPI == 0 || DQ || RES || (sizeof(Scale) == 4 && static_cast<Scale>(0.5f) != 0),
                "fused epilogues: float kinds, or int8 dequantized");
  static_assert(!RES || (EPI == kEpiResidue && MODE == kSliced && static_cast<Acc>(0.5f) == 0 && sizeof(Acc) == 4),
                "the digit store: int8 products on sliced tiles, nothing else fused");
  constexpr int BMT = T::BMT, BKE = T::BKE, CB = OK::kCBytes;
  extern __shared__ __align__(1024) char smem_raw[];
  // The 128-byte swizzle is a function of the address bits: every tile starts 1024-aligned.
  const u32 raw_base = smem_addr(smem_raw);
  const u32 ring = (raw_base + 1023u) & ~1023u;
  const u32 epi = ring + T::RING_BYTES;   // epilogue staging (TMA store)
  const u32 bars = epi + T::EPI_BYTES;    // full[s] at bars + 8s, empty[s] at bars + 8(STAGES + s)

  static_assert(CLUSTER == 1 || (CLUSTER == 2 && MODE == kSliced), "clusters: data-parallel only");
  // the grouped walk: wgmma consumers, the tokens (P) K-major, 16-bit and fp32 C with the
  // plain or bias/activation store (no dequantization, digits or block scales)
  static_assert(MODE != kGrouped || (PK && CLUSTER == 1 && !SYNC && !DQ && !RES && !EpiBlock<EPI>::kOn &&
                                     !Kind::kSplit),
                "the grouped walk: wgmma consumers, K-major tokens, no cluster, no dequantizing store");
  Sm90GroupTable* const gt = reinterpret_cast<Sm90GroupTable*>(smem_raw + (bars + 16 * STAGES - raw_base));
  if constexpr (MODE == kGrouped) {
    if (batch > kSm90MaxGroups) return;   // the host never launches this (sm90.py); no write past the table
  }

  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; ++s) {
      mbarrier_init(bars + 8 * s, 1);                        // the producer's arrive + TMA bytes
      mbarrier_init(bars + 8 * (STAGES + s), 4 * CONSUMERS * CLUSTER);  // one arrive per consumer warp
    }
    fence_mbarrier_init();
  }
  if constexpr (MODE == kGrouped) {
    // All threads scan the group sizes (batch = groups; mt = all rows; nt = the output features).
    // The tile count reaches the roles through shared memory: a value live across setmaxnreg
    // was spilled by NVRTC 13.0's ptxas (see Sm90Grid).
    auto keep = [&](int g, long long, long long end, int first) {
      gt->end[g] = end;
      gt->first_tile[g] = first;
    };
    const int tiles = scan_groups<T::THREADS, long long, decltype(keep), false, Sm90Offsets>(
        Sm90Offsets{offsets, offsets_wide}, batch, mt, group_rows, nt, (nt + BNT - 1) / BNT, BMT, keep);
    if (threadIdx.x == 0) gt->tiles = tiles;
  }
  if constexpr (CLUSTER > 1) cluster_sync();  // the peer's barriers exist before we signal them
  else __syncthreads();

  const int wg = threadIdx.x / 128;
  if (wg == 0) {
    // ---------------- producer warpgroup: one thread drives the TMA ----------------
    setmaxnreg_dec<40>();
    const Sm90Grid grid = sm90_grid<BMT, BNT, BKE, CLUSTER>(mt, nt, k, batch);
    const int units_m = grid.units_m, tiles_n = grid.tiles_n, units = grid.units, kt = grid.kt;
    const int rank = grid.rank, workers = grid.workers, worker = grid.worker;
    if (threadIdx.x == 0) {
      prefetch_tma_desc(&tma_p);
      prefetch_tma_desc(&tma_q);
      Sm90Walker<MODE == kGrouped ? kSliced : MODE> walk(MODE == kGrouped ? gt->tiles : units, kt, splits,
                                                          kt_per_split, dp_tiles, sk_tiles, workers, worker);
      Sm90Work w;
      int stage = 0;
      u32 phase = 0;
      while (walk.next(w)) {
        const Sm90Unit un = sm90_unit<MODE, BMT, CLUSTER>(w.tile, units_m, tiles_n, group_m, rank, mt, p_batched,
                                                          q_batched, gt, batch, group_rows);
        const int tm = un.tm, tn = un.tn, zp = un.zp, zq = un.zq;
        const int prow = un.row_base + tm * BMT;   // the tile's first row of P (grouped: of all tokens)
        for (int kb = w.kb0; kb < w.kb1; ++kb) {
          mbarrier_wait(bars + 8 * (STAGES + stage), phase ^ 1u);
          const u32 full = bars + 8 * stage;
          mbarrier_arrive_expect_tx(full, T::STAGE_BYTES);
          const u32 ps = ring + stage * T::STAGE_BYTES, qs = ps + T::P_BYTES;
          if constexpr (PK) {
            cp_async_bulk_tensor_3d(ps, &tma_p, full, kb * BKE, prow, zp);
            // 3xTF32: the small half of the same rows, k columns further
            if constexpr (Kind::kSplit) cp_async_bulk_tensor_3d(ps + T::P_PART, &tma_p, full, k + kb * BKE, prow, zp);
          } else {
#pragma unroll
            for (int i = 0; i < BMT / 64; ++i)
              cp_async_bulk_tensor_3d(ps + i * 8192, &tma_p, full, tm * BMT + 64 * i, kb * BKE, zp);
          }
          if constexpr (CLUSTER == 1) {
            if constexpr (QK) {
              cp_async_bulk_tensor_3d(qs, &tma_q, full, kb * BKE, tn * BNT, zq);
              if constexpr (Kind::kSplit) cp_async_bulk_tensor_3d(qs + T::Q_PART, &tma_q, full, k + kb * BKE, tn * BNT, zq);
            } else {
#pragma unroll
              for (int i = 0; i < BNT / 64; ++i)
                cp_async_bulk_tensor_3d(qs + i * 8192, &tma_q, full, tn * BNT + 64 * i, kb * BKE, zq);
            }
          } else if constexpr (QK) {
            // our half of the Q rows (the box is BNT/2 rows), into both CTAs
            constexpr int HALF = BNT / 2;
            cp_async_bulk_tensor_3d_multicast(qs + rank * HALF * 128, &tma_q, full, kb * BKE, tn * BNT + rank * HALF,
                                              zq, 0x3);
            if constexpr (Kind::kSplit)
              cp_async_bulk_tensor_3d_multicast(qs + T::Q_PART + rank * HALF * 128, &tma_q, full, k + kb * BKE,
                                                tn * BNT + rank * HALF, zq, 0x3);
          } else {
#pragma unroll
            for (int i = 0; i < BNT / 64; ++i)
              if (i % 2 == rank)  // BNT = 64: rank 0 loads the one box
                cp_async_bulk_tensor_3d_multicast(qs + i * 8192, &tma_q, full, tn * BNT + 64 * i, kb * BKE, zq, 0x3);
          }
          if (++stage == STAGES) { stage = 0; phase ^= 1u; }
        }
      }
      if constexpr (CLUSTER > 1) {
        // Stay until both CTAs' consumers have released every stage: the peer's multicast
        // writes into our shared memory and its consumers arrive on our barriers until then.
        for (int i = 0; i < STAGES; ++i) {
          mbarrier_wait(bars + 8 * (STAGES + stage), phase ^ 1u);
          if (++stage == STAGES) { stage = 0; phase ^= 1u; }
        }
      }
    }
  } else {
    // ---------------- consumer warpgroups: wgmma + epilogue ----------------
    setmaxnreg_inc<232>();
    const Sm90Grid grid = sm90_grid<BMT, BNT, BKE, CLUSTER>(mt, nt, k, batch);
    const int units_m = grid.units_m, tiles_n = grid.tiles_n, units = grid.units, kt = grid.kt;
    const int rank = grid.rank, workers = grid.workers, worker = grid.worker;
    const int cw = wg - 1;                       // consumer warpgroup 0/1: D rows 64*cw ..
    const int ct = threadIdx.x - 128;            // 0..255
    const int lane = threadIdx.x & 31, warp4 = (threadIdx.x / 32) & 3;
    const int g = lane >> 2, q = lane & 3;
    // with a fused epilogue the accumulators hold the final values when the store runs:
    // alpha = 1 (exact) and C is not read there
    const Scale e_alpha = pick_scale(static_cast<Scale*>(nullptr), alpha, ialpha);
    const Scale e_beta = pick_scale(static_cast<Scale*>(nullptr), beta, ibeta);
    const OScale s_alpha = EPI ? OScale(1) : OScale(e_alpha);
    const OScale s_beta = EPI ? OScale(0) : OScale(e_beta);
    const bool read_c = s_beta != OScale(0);
    // free a stage: in every CTA of the cluster (their producers multicast into ours)
    auto release = [](u32 bar) {
      if constexpr (CLUSTER == 1) {
        mbarrier_arrive(bar);
      } else {
#pragma unroll
        for (int c = 0; c < CLUSTER; ++c) mbarrier_arrive_cluster(bar, c);
      }
    };
    Sm90Walker<MODE == kGrouped ? kSliced : MODE> walk(MODE == kGrouped ? gt->tiles : units, kt, splits,
                                                        kt_per_split, dp_tiles, sk_tiles, workers, worker);
    Sm90Work w;
    int stage = 0;
    u32 phase = 0;
    // TMA-store epilogue: C allows 16-byte boxes and beta == 0 (C is not read); else direct stores
    const bool tma_epilogue = c_pair && !read_c;
    const int wt = threadIdx.x & 127;  // thread within the consumer warpgroup
    u32 echunk = 0;                    // staging buffers used so far (alternating pair)
    if (tma_epilogue && wt == 0) prefetch_tma_desc(&tma_c);
    Acc acc[T::ACC];
#pragma unroll
    for (int r = 0; r < T::ACC; ++r) acc[r] = Acc(0);
    while (walk.next(w)) {
      int prev = -1;
      if constexpr (SYNC) {
        // mma.sync consumers: fragments double-buffered across k-steps and stages; each warp
        // waits on the stage's full barrier itself and frees the stage once its MMAs are issued
        // (an MMA issues only after its ldmatrix results arrived: the stage is no longer read).
        static_assert(!Kind::kSplit && Kind::kRoundEvery == 0, "mma.sync consumers: 16-bit kinds");
        typedef Sm90SyncWarp<Kind, PK, QK, BNT> SW;
        const SW sw(lane, warp4);
        u32 fa[2][SW::MI][4], fb[2][SW::NI][4];
#pragma unroll
        for (int r = 0; r < T::ACC; ++r) acc[r] = Acc(0);
        const u32 pcw = cw * 8192;   // this warpgroup's 64 P rows
        u32 stg = ring + stage * T::STAGE_BYTES;
        if (w.kb0 < w.kb1) {
          mbarrier_wait(bars + 8 * stage, phase);
          sw.load(stg + pcw, stg + T::P_BYTES, 0, fa[0], fb[0]);
        }
        for (int kb = w.kb0; kb < w.kb1; ++kb) {
          const int cur = stage;
          const u32 cstg = stg;
#pragma unroll
          for (int ks = 0; ks < 4; ++ks) {
            if (ks < 3) {
              sw.load(cstg + pcw, cstg + T::P_BYTES, ks + 1, fa[(ks + 1) & 1], fb[(ks + 1) & 1]);
              SW::mma(fa[ks & 1], fb[ks & 1], acc);
            } else {
              // the last k-step's MMAs first: they keep the tensor pipe busy while this warp
              // waits for the next stage and loads its first fragments
              SW::mma(fa[1], fb[1], acc);
              __syncwarp();
              if (lane == 0) release(bars + 8 * (STAGES + cur));
              if (++stage == STAGES) { stage = 0; phase ^= 1u; }
              stg = ring + stage * T::STAGE_BYTES;
              if (kb + 1 < w.kb1) {
                mbarrier_wait(bars + 8 * stage, phase);
                sw.load(stg + pcw, stg + T::P_BYTES, 0, fa[0], fb[0]);
              }
            }
          }
        }
      } else if constexpr (Kind::kSplit) {
        // 3xTF32: per stage, the three products of big/small halves into fresh registers (small
        // terms first), then one rounding FADD into acc. Waiting for this warpgroup's wgmmas each
        // stage costs little: the other consumer warpgroup keeps the tensor cores busy meanwhile.
        static_assert(PK && QK, "3xTF32 reads its prepared K-major halves");
        for (int kb = w.kb0; kb < w.kb1; ++kb) {
          mbarrier_wait(bars + 8 * stage, phase);
          const u32 pb = ring + stage * T::STAGE_BYTES + cw * 8192, ps_ = pb + T::P_PART;
          const u32 qb = ring + stage * T::STAGE_BYTES + T::P_BYTES, qs_ = qb + T::Q_PART;
          Acc part[T::ACC];
#pragma unroll
          for (int r = 0; r < T::ACC; ++r) part[r] = Acc(0);
#pragma unroll
          for (int r = 0; r < T::ACC; ++r) reg_fence(part[r]);
          wgmma_fence();
          // D rows come from P = op(B)^T, columns from Q = op(A): (B big, A small),
          // (B small, A big), (B big, A big)
          sm90_stage_mma<Kind, true, true, BNT>(part, pb, qs_, 0);
          sm90_stage_mma<Kind, true, true, BNT>(part, ps_, qb, 1);
          sm90_stage_mma<Kind, true, true, BNT>(part, pb, qb, 1);
          wgmma_commit_group();
          wgmma_wait_group<0>();
#pragma unroll
          for (int r = 0; r < T::ACC; ++r) reg_fence(part[r]);
          if (lane == 0) release(bars + 8 * (STAGES + stage));
          sm90_fold_chain<T::ACC>(acc, part, kb == w.kb0);
          if (++stage == STAGES) { stage = 0; phase ^= 1u; }
        }
      } else if constexpr (Kind::kRoundEvery > 0) {
        // Chains of R stages into fresh registers, then a rounding FADD into acc; the chain's
        // stages are released once its wgmmas are done. (Two alternating register sets, so that
        // chain c + 1 runs while chain c is added, make ptxas serialize the wgmmas (C7515: the
        // FADDs define registers of an in-flight wgmma's operand set); the other consumer
        // warpgroup keeps the tensor cores busy while this one waits and adds.)
        constexpr int R = Kind::kRoundEvery;
        // a chain holds its R stages until it is added: more stages keep the producer ahead
        // (and fewer than R would deadlock it)
        static_assert(STAGES > R, "a rounding chain of R stages needs a ring of more than R");
        Acc part[T::ACC];
#pragma unroll
        for (int r = 0; r < T::ACC; ++r) part[r] = Acc(0);
        // the work unit's sum starts at +0 and every chain is added: no copy on the first chain
        // (sm90_fold_chain's select made ptxas move all 64 accumulators twice a stage: SASS,
        // 130 MOVs beside 64 FADDs a stage, float8 at 8192^3 half of cuBLASLt's rate)
#pragma unroll
        for (int r = 0; r < T::ACC; ++r) acc[r] = Acc(0);
        for (int kb = w.kb0; kb < w.kb1;) {
          const int n = w.kb1 - kb < R ? w.kb1 - kb : R;   // stages in this chain
          for (int i = 0; i < n; ++i) {
            mbarrier_wait(bars + 8 * stage, phase);
            const u32 ps = ring + stage * T::STAGE_BYTES + cw * 8192, qs = ring + stage * T::STAGE_BYTES + T::P_BYTES;
#pragma unroll
            for (int r = 0; r < T::ACC; ++r) reg_fence(part[r]);
            wgmma_fence();
            sm90_stage_mma<Kind, PK, QK, BNT>(part, ps, qs, i > 0);
            wgmma_commit_group();
            if (++stage == STAGES) { stage = 0; phase ^= 1u; }
          }
          wgmma_wait_group<0>();
#pragma unroll
          for (int r = 0; r < T::ACC; ++r) reg_fence(part[r]);
          if (lane == 0)
            for (int i = 1; i <= n; ++i) release(bars + 8 * (STAGES + (stage - i + STAGES) % STAGES));
          if constexpr (EpiBlock<EPI>::kOn) {
            const Sm90Coord bc = sm90_coord(w.tile, units_m, tiles_n, group_m, CLUSTER, rank);
            sm90_fold_block_scaled<EPI, BNT, T::ACC>(acc, part, scale_m, scale_n, kb, kt, mt, nt,
                                                     bc.tm * BMT + 64 * cw + 16 * warp4 + g,
                                                     bc.tn * BNT + 2 * q, bc.tn * BNT);
          } else {
#pragma unroll
            for (int r = 0; r < T::ACC; ++r) acc[r] += part[r];
          }
          kb += n;
        }
      } else {
        for (int kb = w.kb0; kb < w.kb1; ++kb) {
          mbarrier_wait(bars + 8 * stage, phase);
          const u32 ps = ring + stage * T::STAGE_BYTES + cw * 8192, qs = ring + stage * T::STAGE_BYTES + T::P_BYTES;
#pragma unroll
          for (int r = 0; r < T::ACC; ++r) reg_fence(acc[r]);
          wgmma_fence();
          sm90_stage_mma<Kind, PK, QK, BNT>(acc, ps, qs, kb > w.kb0);
          wgmma_commit_group();
#pragma unroll
          for (int r = 0; r < T::ACC; ++r) reg_fence(acc[r]);
          // The previous stage's MMAs are done once at most this group is in flight: free it.
          wgmma_wait_group<1>();
          if (prev >= 0 && lane == 0) release(bars + 8 * (STAGES + prev));
          prev = stage;
          if (++stage == STAGES) { stage = 0; phase ^= 1u; }
        }
        wgmma_wait_group<0>();
#pragma unroll
        for (int r = 0; r < T::ACC; ++r) reg_fence(acc[r]);
        if (prev >= 0 && lane == 0) release(bars + 8 * (STAGES + prev));
      }

      const Sm90Unit un = sm90_unit<MODE, BMT, CLUSTER>(w.tile, units_m, tiles_n, group_m, rank, mt, p_batched,
                                                        q_batched, gt, batch, group_rows);
      const int b = un.b, tm = un.tm, tn = un.tn;
      // the store's problem: C's rows from c_off (elements; grouped: the group's first row), D rows
      // below mt_store (grouped: the group's rows), this group's bias
      const int mt_store = un.rows;
      const i64 c_off = MODE == kGrouped ? static_cast<i64>(un.row_base) * ldc : static_cast<i64>(b) * sc;
      const char* const bias_u = MODE == kGrouped ? static_cast<const char*>(bias) + un.group * bias_group_bytes
                                                  : static_cast<const char*>(bias);
      constexpr i64 SLOT = static_cast<i64>(BMT) * BNT;
      Acc* wsA = static_cast<Acc*>(ws);

      if (w.role == kPublish) {
        // fragment order: register r of consumer thread ct at slot[r * threads + ct] (coalesced)
        Acc* slot = wsA + blockIdx.x * SLOT;
#pragma unroll
        for (int r = 0; r < T::ACC; ++r) __stcg(slot + r * T::CONSUMER_THREADS + ct, acc[r]);
        __threadfence();
        named_barrier_sync(1, T::CONSUMER_THREADS);
        if (ct == 0) st_release_gpu(flags + blockIdx.x, 1);
        continue;
      }
      if (w.role == kOwner) {
        for (int peer = blockIdx.x + 1; peer <= w.last_peer; ++peer) {
          if (ct == 0) spin_wait_geq(flags + peer, 1);
          named_barrier_sync(1, T::CONSUMER_THREADS);
          const Acc* slot = wsA + peer * SLOT;
#pragma unroll
          for (int r = 0; r < T::ACC; ++r) acc[r] += __ldcg(slot + r * T::CONSUMER_THREADS + ct);
        }
      }
      const int row0 = tm * BMT + 64 * cw + 16 * warp4 + g;  // D row = column of C (n index)
      const int col0 = tn * BNT + 2 * q;                      // D column = row of C (m index)
      // Accumulator fragment f (acc[4f..4f+3]: rows +0 / +8, a column pair) sits at D row
      // frow(f) (+8), column fcol(f): wgmma: warp rows 16 * warp4, fragment f = 8-column block
      // f; mma.sync consumers (Sm90SyncWarp): fragment f = atom (f / NI, f % NI) of the warp's
      // 64 x BNT/4 tile.
      constexpr int SNI = BNT / 32;
      auto frow = [&](int f) { return SYNC ? tm * BMT + 64 * cw + 16 * (f / SNI) + g : row0; };
      auto fcol = [&](int f) { return SYNC ? tn * BNT + (BNT / 4) * warp4 + 8 * (f % SNI) + 2 * q : col0 + 8 * f; };
      if (w.role == kToSplitWs) {
        Acc* wsm = wsA + (static_cast<i64>(w.split) * batch + b) * static_cast<i64>(mt) * nt;
#pragma unroll
        for (int j = 0; j < BNT / 8; ++j)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int r = frow(j) + 8 * h, c = fcol(j);
            if (r < mt_store && c < nt) {
              Acc* wp = wsm + static_cast<i64>(r) * nt + c;
              __stcg(wp, acc[4 * j + 2 * h]);
              if (c + 1 < nt) __stcg(wp + 1, acc[4 * j + 2 * h + 1]);
            }
          }
        continue;
      }
      const bool interior = (tm + 1) * BMT <= mt_store && (tn + 1) * BNT <= nt;
      // an accumulator register's value in the output's arithmetic (dequantized: a float's bits)
      auto value = [](Acc v) -> OAcc {
        if constexpr (DQ) return dq_read(v);
        else return v;
      };
      // the digit store's constants: this tile's modulus (batch entry b)
      uint4 dig0 = make_uint4(0u, 0u, 0u, 0u), dig1 = dig0;
      if constexpr (RES) {
        const uint4* tab = static_cast<const uint4*>(bias) + (kResidueWords / 4) * b;
        dig0 = __ldg(tab);
        dig1 = __ldg(tab + 1);
      }
      if constexpr (EPI != 0 && !RES) {
        // The fused epilogue on the registers, in passes: every load (bias; C when beta != 0)
        // is issued before the first pre-activation store. Interleaved, each load waited for
        // the store before it (H100, 8192^3, 256 x 128 tiles: bias alone +18 %, bias + GELU
        // +52 % over the plain kernel).
        const char* bias_c = bias_u;
        const char* Ce = static_cast<const char*>(C) + c_off * CB;
        const bool read_old = DQ ? beta != 0.f : e_beta != Scale(0);
        OScale brow[2] = {OScale(0), OScale(0)};   // bias per D row (bias_mode 2): rows row0, row0 + 8
        float srow[2] = {0.f, 0.f};                // dequantization: scale_n per D row (C's n index)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          if (row0 + 8 * h >= mt_store) continue;
          if (bias_mode == 2) brow[h] = OK::load_c(bias_c + static_cast<i64>(row0 + 8 * h) * CB);
          if constexpr (DQ) srow[h] = scale_of_n<EPI>(scale_n, row0 + 8 * h);
        }
        // Column chunks of 8 fragments: their bias pairs (8 registers of 16-bit pairs) in
        // flight at once; all of a 256-wide tile at once spilled (1.3 KB), one fragment at a
        // time waits out an L2 round trip 32 times per tile. The host passes a bias pointer
        // aligned to a pair (2 elements).
        // (dequantizing: 4, the scale pairs beside the bias pairs spilled 48 B at 256-wide tiles)
        constexpr int JC = DQ ? 4 : 8;
        static_assert((BNT / 8) % JC == 0, "fragment chunks");
        typedef typename Sm90Pair<CB>::type Pair;
#pragma unroll
        for (int j0 = 0; j0 < BNT / 8; j0 += JC) {
          Pair bcol[JC];   // bias per D column (bias_mode 1): the bits of columns c, c + 1
          float scol[DQ ? JC : 1][2];   // dequantization: scale_m of columns c, c + 1 (C's m index)
#pragma unroll
          for (int jj = 0; jj < JC; ++jj) {
            const int c = col0 + 8 * (j0 + jj);
            const char* bp = bias_c + static_cast<i64>(c) * CB;
            if (bias_mode != 1 || c >= nt) bcol[jj] = Pair{};
            else if (c + 1 < nt) bcol[jj] = *reinterpret_cast<const Pair*>(bp);
            else if constexpr (CB == 2) bcol[jj] = *reinterpret_cast<const u16*>(bp);
            else bcol[jj] = make_uint2(*reinterpret_cast<const u32*>(bp), 0u);
            if constexpr (DQ) {
              scol[jj][0] = c < nt ? scale_of_m<EPI>(scale_m, c) : 0.f;
              scol[jj][1] = c + 1 < nt ? scale_of_m<EPI>(scale_m, c + 1) : 0.f;
            }
          }
#pragma unroll
          for (int jj = 0; jj < JC; ++jj)
#pragma unroll
            for (int h = 0; h < 2; ++h)
#pragma unroll
              for (int t = 0; t < 2; ++t) {
                const int r = row0 + 8 * h, c = col0 + 8 * (j0 + jj) + t;
                Acc& v = acc[4 * (j0 + jj) + 2 * h + t];
                OScale bv;
                if constexpr (CB == 2) bv = OK::c_from_bits(t ? bcol[jj] >> 16 : bcol[jj] & 0xffffu);
                else bv = OK::c_from_bits(t ? bcol[jj].y : bcol[jj].x);
                if constexpr (DQ) {
                  // pyblasgemm.epilogue's order: alpha * ((scale_m * scale_n) * acc) + beta * c + bias
                  float x = mul_ieee(alpha, mul_ieee(mul_ieee(scol[jj][t], srow[h]), static_cast<float>(v)));
                  if (read_old && r < mt_store && c < nt)
                    x = add_ieee(x, mul_ieee(beta, OK::load_c(Ce + (static_cast<i64>(r) * ldc + c) * CB)));
                  if (bias_mode) x = add_ieee(x, bias_mode == 1 ? bv : brow[h]);
                  dq_write(v, x);   // (int8: the registers carry the float's bits from here on)
                } else {
                  v = read_old && r < mt_store && c < nt
                          ? axpby(e_alpha, v, e_beta, Kind::load_c(Ce + (static_cast<i64>(r) * ldc + c) * CB))
                          : ax(e_alpha, v);
                  if (bias_mode) v = add_ieee(v, bias_mode == 1 ? bv : brow[h]);
                }
              }
          asm volatile("" ::: "memory");   // the next chunk's loads start after this one's
        }
        if (pre != nullptr) {   // the pre-activation, at C's offsets in its own array
          char* Pe = static_cast<char*>(pre) + c_off * CB;
#pragma unroll
          for (int j = 0; j < BNT / 8; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h)
#pragma unroll
              for (int t = 0; t < 2; ++t) {
                const int r = row0 + 8 * h, c = col0 + 8 * j + t;
                if (r < mt_store && c < nt) sm90_store_one<OK>(Pe + (static_cast<i64>(r) * ldc + c) * CB, value(acc[4 * j + 2 * h + t]));
              }
        }
      }
      // the activation, applied as each value is stored: as a pass over all registers before
      // the store it spilled (1 KB at 256 x 128 tiles: the scheduler overlapped too many)
      // (the digit too: a pass over all 128 registers of a 256-wide tile first spilled 304 bytes)
      auto fin = [&](Acc v) -> OAcc {
        if constexpr (RES) return residue_digit(v, dig0.x, dig0.y, dig0.z, dig0.w, dig1.x);
        else if constexpr (DQ) return activate(dq_read(v), EPI & 7);
        else if constexpr (EPI != 0 && !RES) return activate(v, EPI & 7);
        else return v;
      };
      if (tma_epilogue && interior) {
        // Stage 64 rows x 128 bytes at a time (swizzled: conflict-free 4/8-byte writes), then
        // one thread hands the box to the TMA and the warpgroup moves on: the write-out overlaps
        // the next chunk and the next tile's mainloop. Interior tiles only: measured on an H100,
        // boxes reaching past m were written into C's ld padding (NOTES_SM90.md, step 6), so
        // edge tiles keep the bounds-checked stores below.
        constexpr int CCOLS = 128 / CB;  // columns of D per box (64 fp16, 32 int32, 128 digits)
        static_assert(BNT % CCOLS == 0, "whole boxes per tile");
        const u32 ebuf = epi + cw * 16384;
        // (alpha after the activation: either the activation is none or alpha is 1 here)
        auto stage_pair = [&](u32 buf, int row, int col_in_box, Acc v0, Acc v1) {
          const int byte = col_in_box * CB;
          const u32 addr = buf + row * 128 + ((((byte >> 4) ^ row) & 7) << 4) + (byte & 15);
          if constexpr (CB == 1) {
            st_shared_u16(addr, OK::cvt_c(ax(s_alpha, fin(v0))) | (OK::cvt_c(ax(s_alpha, fin(v1))) << 8));
          } else if constexpr (CB == 2) {
            st_shared_u32(addr, OK::cvt_c(ax(s_alpha, fin(v0))) | (OK::cvt_c(ax(s_alpha, fin(v1))) << 16));
          } else {
            st_shared_v2_u32(addr, OK::cvt_c(ax(s_alpha, fin(v0))), OK::cvt_c(ax(s_alpha, fin(v1))));
          }
        };
#pragma unroll
        for (int ch = 0; ch < BNT / CCOLS; ++ch) {
          const u32 buf = ebuf + (echunk & 1u) * 8192;
          ++echunk;
          if (wt == 0) cp_async_bulk_wait_group_read<1>();  // the box staged here 2 chunks ago is out
          named_barrier_sync(2 + cw, 128);
          if constexpr (SYNC) {
            // the box's columns belong to one warp (64 x 64 warp tiles) or two (64 x 32)
            constexpr int WCOLS = BNT / 4;
            if ((WCOLS * warp4) / CCOLS == ch) {
#pragma unroll
              for (int f = 0; f < BNT / 8; ++f)
#pragma unroll
                for (int h = 0; h < 2; ++h)
                  stage_pair(buf, 16 * (f / SNI) + g + 8 * h, WCOLS * warp4 - ch * CCOLS + 8 * (f % SNI) + 2 * q,
                             acc[4 * f + 2 * h], acc[4 * f + 2 * h + 1]);
            }
          } else {
#pragma unroll
            for (int jj = 0; jj < CCOLS / 8; ++jj)
#pragma unroll
              for (int h = 0; h < 2; ++h) {
                const int j = ch * (CCOLS / 8) + jj;
                stage_pair(buf, 16 * warp4 + g + 8 * h, 8 * jj + 2 * q, acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
              }
          }
          fence_proxy_async_shared();
          named_barrier_sync(2 + cw, 128);
          if (wt == 0) {
            cp_async_bulk_tensor_3d_store(&tma_c, buf, tn * BNT + ch * CCOLS, un.row_base + tm * BMT + 64 * cw, b);
            cp_async_bulk_commit_group();
          }
        }
        continue;
      }
      char* Cb = static_cast<char*>(C) + c_off * CB;
      if (SYNC && c_pair && interior) {
        // mma.sync layout, interior tile: one row pointer per fragment row, paired stores
#pragma unroll
        for (int f = 0; f < BNT / 8; ++f) {
          char* p0 = Cb + (static_cast<i64>(frow(f)) * ldc + fcol(f)) * CB;
          char* p1 = p0 + 8 * ldc * CB;
          if (read_c) {
            sm90_store_pair_fast<OK, true>(p0, s_alpha, s_beta, fin(acc[4 * f]), fin(acc[4 * f + 1]));
            sm90_store_pair_fast<OK, true>(p1, s_alpha, s_beta, fin(acc[4 * f + 2]), fin(acc[4 * f + 3]));
          } else {
            sm90_store_pair_fast<OK, false>(p0, s_alpha, s_beta, fin(acc[4 * f]), fin(acc[4 * f + 1]));
            sm90_store_pair_fast<OK, false>(p1, s_alpha, s_beta, fin(acc[4 * f + 2]), fin(acc[4 * f + 3]));
          }
        }
        continue;
      }
      if (c_pair && interior) {
        // Interior tile (the common case): no bounds checks, two row pointers, paired stores.
        // The consumers' tensor work stops while they store, so the epilogue's instruction
        // count is time (NOTES_SM90.md, step 5).
        char* p0 = Cb + (static_cast<i64>(row0) * ldc + col0) * CB;
        char* p1 = p0 + 8 * ldc * CB;
        if (read_c) {
#pragma unroll
          for (int j = 0; j < BNT / 8; ++j) {
            sm90_store_pair_fast<OK, true>(p0 + 8 * CB * j, s_alpha, s_beta, fin(acc[4 * j]), fin(acc[4 * j + 1]));
            sm90_store_pair_fast<OK, true>(p1 + 8 * CB * j, s_alpha, s_beta, fin(acc[4 * j + 2]), fin(acc[4 * j + 3]));
          }
        } else {
#pragma unroll
          for (int j = 0; j < BNT / 8; ++j) {
            sm90_store_pair_fast<OK, false>(p0 + 8 * CB * j, s_alpha, s_beta, fin(acc[4 * j]), fin(acc[4 * j + 1]));
            sm90_store_pair_fast<OK, false>(p1 + 8 * CB * j, s_alpha, s_beta, fin(acc[4 * j + 2]), fin(acc[4 * j + 3]));
          }
        }
        continue;
      }
#pragma unroll
      for (int j = 0; j < BNT / 8; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = frow(j) + 8 * h, c = fcol(j);
          if (r < mt_store && c < nt) {
            char* cp = Cb + (static_cast<i64>(r) * ldc + c) * CB;
            sm90_store_pair<OK>(cp, s_alpha, s_beta, read_c, fin(acc[4 * j + 2 * h]), fin(acc[4 * j + 2 * h + 1]),
                                  c_pair && c + 1 < nt, c + 1 < nt);
          }
        }
    }
    if (wt == 0) cp_async_bulk_wait_group<0>();  // our boxes are written before the CTA exits
  }
#endif
}

// Parallel split-k on Hopper: C = alpha * sum_s ws[s] + beta * C, summed in split order, then
// the fused epilogue EPI (once, after the sum: deterministic).
// ws[s] is the partial of split s as [batch][mt][nt] (row-major D = column-major C, ld = nt).
template <class Kind, int EPI = 0>
__global__ void __launch_bounds__(256)
    sm90_splitk_reduce(const void* ws_, void* C_, int mt, int nt, long long ldc, long long sc, int batch, int splits,
                       float alpha, float beta, int ialpha, int ibeta, const void* bias, void* pre, int bias_mode,
                       const float* scale_m, const float* scale_n) {
  typedef typename Kind::Acc Acc;
  typedef typename Kind::Scale Scale;
  typedef typename EpiOut<Kind, EPI>::type OK;
  static_assert((EPI & kEpiResidue) == 0, "the digit store runs on sliced tiles only");
  constexpr int CB = OK::kCBytes;
  const i64 per = static_cast<i64>(mt) * nt, all = per * batch;
  const i64 id = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (id >= all) return;
  const Acc* ws = static_cast<const Acc*>(ws_);
  Acc sum = __ldcg(ws + id);
  for (int s = 1; s < splits; ++s) sum += __ldcg(ws + s * all + id);
  const int b = static_cast<int>(id / per);
  const i64 rc = id - b * per;
  const int r = static_cast<int>(rc / nt), c = static_cast<int>(rc - static_cast<i64>(r) * nt);
  char* cp = static_cast<char*>(C_) + (static_cast<i64>(b) * sc + static_cast<i64>(r) * ldc + c) * CB;
  if constexpr ((EPI & kEpiDequant) != 0) {
    // the summed int32 / float8 product, dequantized in pyblasgemm.epilogue's order, then the epilogue
    float x = mul_ieee(alpha, mul_ieee(mul_ieee(scale_of_m<EPI>(scale_m, c), scale_of_n<EPI>(scale_n, r)),
                                       static_cast<float>(sum)));
    if (beta != 0.f) x = add_ieee(x, mul_ieee(beta, OK::load_c(cp)));
    const Sm90Epi e{static_cast<const char*>(bias),
                    pre != nullptr ? static_cast<char*>(pre) - static_cast<char*>(C_) : 0, bias_mode, pre != nullptr};
    sm90_store_one<OK>(cp, sm90_epi<OK, EPI>(x, e, cp, r, c, true));
  } else {
    const Scale a = pick_scale(static_cast<Scale*>(nullptr), alpha, ialpha);
    const Scale bt = pick_scale(static_cast<Scale*>(nullptr), beta, ibeta);
    Scale v = bt != Scale(0) ? axpby(a, sum, bt, Kind::load_c(cp)) : ax(a, sum);
    if constexpr (EPI != 0) {
      const Sm90Epi e{static_cast<const char*>(bias),
                      pre != nullptr ? static_cast<char*>(pre) - static_cast<char*>(C_) : 0, bias_mode, pre != nullptr};
      v = sm90_epi<Kind, EPI>(v, e, cp, r, c, true);
    }
    sm90_store_one<Kind>(cp, v);
  }
}

}  // namespace pyblasgemm
