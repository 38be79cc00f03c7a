// Global -> shared copy of one operand tile (ROWS strided rows x CPR 16-byte chunks), with
// edge predication: nothing outside [rows_valid) x [cols_valid) is ever read.
#pragma once
#include "../arch.cuh"
#include "../ptx/sm80_cp_async.cuh"
#include "smem_swizzle.cuh"

namespace pyblasgemm {

template <int ROWS, int CPR, int THREADS, int EB, bool VEC>
struct TileCopy {
  static constexpr int VE = 16 / EB;  // elements per 16-byte chunk
  static constexpr int CHUNKS = ROWS * CPR;
  static_assert(CHUNKS % THREADS == 0, "tile chunks must divide evenly over the CTA's threads");
  static constexpr int ITERS = CHUNKS / THREADS;

  // Fast interior path: thread tid copies chunks (r0 + it*RS, c) for it < ITERS, so its global
  // addresses are one per-thread offset plus it * (RS rows), and its smem addresses one
  // per-thread offset plus it * RS*CPR*16 whenever the swizzle pattern repeats every RS rows
  // (the XOR term depends on row % 8 for long rows, on the 128-byte line % 8 for short ones).
  static constexpr int RS = THREADS / CPR;
  static constexpr bool kFast = VEC && (THREADS % CPR == 0) &&
                                (CPR >= 8 ? (RS % 8 == 0) : ((RS * CPR) % 64 == 0));
  // Byte offset of this thread's first chunk from the tile origin (global; ld in elements).
  static PBG_DEVICE i64 thr_goff(i64 ld, int tid) {
    return (static_cast<i64>(tid / CPR) * ld + (tid % CPR) * VE) * EB;
  }
  static PBG_DEVICE int thr_soff(int tid) { return swz_chunk<CPR>(tid / CPR, tid % CPR); }
  // src: tile origin + thr_goff; pass_bytes: RS * ld * EB; dst: slot base + thr_soff.
  static PBG_DEVICE void load_fast(char* dst, const char* src, i64 pass_bytes) {
    static_assert(kFast, "load_fast needs the repeating-swizzle layout");
#pragma unroll
    for (int it = 0; it < ITERS; ++it)
      SM80_CP_ASYNC_CG_16B_ZFILL::copy(dst + it * RS * CPR * 16, src + it * pass_bytes, 16);
  }

  // origin: byte address of tile element (0,0), always in bounds; ld in elements.
  // FULL: the caller proved the whole tile is in bounds, so the clamps fold away (fewer
  // integer ops per chunk in the steady-state mainloop, where issue slots are shared with HMMA).
  template <bool FULL = false>
  static PBG_DEVICE void load(char* smem, const char* origin, i64 ld, int rows_valid, int cols_valid,
                              int tid) {
    // Edge path: an opaque copy of tid keeps ptxas from hoisting this path's per-chunk
    // addresses out of the mainloop (they would pin registers the interior path needs).
    if constexpr (!FULL) asm volatile("" : "+r"(tid));
    // The scalar path holds loaded words in registers: do one chunk at a time there.
#pragma unroll ((VEC && FULL) ? ITERS : 1)
    for (int it = 0; it < ITERS; ++it) {
      // Consecutive threads take consecutive chunks of a row: 16 B x 32 lanes per warp
      // = fully coalesced 128 B segments when the global row is contiguous.
      int id = tid + it * THREADS;
      int r = id / CPR;
      int c = id % CPR;
      int e0 = c * VE;
      int valid = VE;
      if constexpr (!FULL) {
        valid = cols_valid - e0;
        valid = valid < 0 ? 0 : (valid > VE ? VE : valid);
        if (r >= rows_valid) valid = 0;
      }
      const char* src = valid > 0 ? origin + (static_cast<i64>(r) * ld + e0) * EB : origin;
      char* dst = smem + swz_chunk<CPR>(r, c);
      if constexpr (VEC) {
        // 16-byte aligned source (checked on the host): async copy, zero-fill past the edge.
        SM80_CP_ASYNC_CG_16B_ZFILL::copy(dst, src, valid * EB);
      } else {
        // Unaligned pointer/ld: element loads through registers, same zero fill.
        u32 w[4] = {0u, 0u, 0u, 0u};
#pragma unroll
        for (int e = 0; e < VE; ++e) {
          if (e < valid) {
            u32 v;
            if constexpr (EB == 1) v = *reinterpret_cast<const unsigned char*>(src + e);
            else if constexpr (EB == 2) v = *reinterpret_cast<const u16*>(src + 2 * e);
            else v = *reinterpret_cast<const u32*>(src + 4 * e);
            w[(e * EB) / 4] |= v << (((e * EB) % 4) * 8);
          }
        }
        *reinterpret_cast<U32x4*>(dst) = U32x4{w[0], w[1], w[2], w[3]};
      }
    }
  }
};

}  // namespace pyblasgemm
