// Warp-level MMA over one shared-memory stage: load A/B fragments (ldmatrix for 16-bit and
// K-contiguous 8-bit operands, plain LDS otherwise) and issue MI x NI mma.sync atoms.
#pragma once
#include "../arch.cuh"
#include "../ptx/sm75_ldmatrix.cuh"
#include "../copy/smem_swizzle.cuh"
#include "sm80_kinds.cuh"

namespace pyblasgemm {

// AK/BK: operand is K-contiguous in global and therefore in shared memory (rows = M or N).
// Otherwise rows = K and the contiguous dimension is M (A) or N (B).
template <class Kind, bool AK, bool BK, int BM, int BN, int BKB, int WM, int WN>
struct WarpMma {
  static constexpr int EB = Kind::kElemBytes;
  static constexpr int BKE = BKB / EB;       // BK in elements
  static constexpr int WTM = BM / WM;        // warp tile
  static constexpr int WTN = BN / WN;
  static constexpr int MI = WTM / 16;        // 16x8 atoms per warp tile
  static constexpr int NI = WTN / 8;
  static constexpr int KSTEPS = BKB / 32;    // each atom eats 32 bytes of K
  static constexpr int KE = 32 / EB;         // K elements per atom
  static constexpr int CPR_A = AK ? BKB / 16 : BM * EB / 16;
  static constexpr int CPR_B = BK ? BKB / 16 : BN * EB / 16;
  static constexpr int P = Kind::kParts;
  static_assert(WTM % 16 == 0 && WTN % 16 == 0, "warp tile must be a multiple of 16x16");
  typedef typename Kind::AccReg AccReg;

  // One k-step: A fragments for MI atoms, B fragments for NI atoms (raw 32-bit registers).
  static PBG_DEVICE void load_a(const char* sA, int ks, int wm0, int lane, u32 (*ra)[4]) {
#pragma unroll
    for (int i = 0; i < MI; ++i) {
      const int mb = wm0 + 16 * i;
      if constexpr (EB == 2 || (EB == 1 && AK)) {
        if constexpr (AK) {
          // lanes 0-15 address rows mb+0..15 at k-chunk 2ks, lanes 16-31 the chunk after:
          // matrices (rows 0-7,k lo) (8-15,lo) (0-7,hi) (8-15,hi) = a0..a3.
          int row = mb + (lane & 15);
          int ch = 2 * ks + (lane >> 4);
          SM75_U32x4_LDSM_N::copy(sA + swz_chunk<CPR_A>(row, ch), ra[i][0], ra[i][1], ra[i][2], ra[i][3]);
        } else {
          // Rows are k: .trans hands each lane the (m, k..k+1) pair the A fragment wants.
          int j = lane >> 3, r = lane & 7;
          int krow = 16 * ks + r + 8 * (j >> 1);
          int ch = mb / 8 + (j & 1);
          SM75_U16x8_LDSM_T::copy(sA + swz_chunk<CPR_A>(krow, ch), ra[i][0], ra[i][1], ra[i][2], ra[i][3]);
        }
      } else if constexpr (EB == 4) {
        // tf32: ldmatrix has no 32-bit transpose, so each lane reads its 4 words directly.
        const int g = lane >> 2, t = lane & 3;
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          int m = mb + g + 8 * (q & 1);
          int kk = KE * ks + t + 4 * (q >> 1);
          int off = AK ? swz_elem<CPR_A, 4>(m, kk) : swz_elem<CPR_A, 4>(kk, m);
          ra[i][q] = *reinterpret_cast<const u32*>(sA + off);
        }
      } else {
        // s8 with M-contiguous rows: gather the four k-consecutive bytes of each register.
        const int g = lane >> 2, t = lane & 3;
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          int m = mb + g + 8 * (q & 1);
          int kk = KE * ks + 4 * t + 16 * (q >> 1);
          u32 v = 0;
#pragma unroll
          for (int e = 0; e < 4; ++e)
            v |= static_cast<u32>(*reinterpret_cast<const unsigned char*>(sA + swz_elem<CPR_A, 1>(kk + e, m))) << (8 * e);
          ra[i][q] = v;
        }
      }
    }
  }

  // s8, M-contiguous A: the fragment of the 16 rows starting at mb, one at a time.
  static PBG_DEVICE void load_a_one(const char* sA, int ks, int mb, int lane, u32* ra) {
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      int m = mb + g + 8 * (q & 1);
      int kk = KE * ks + 4 * t + 16 * (q >> 1);
      // Opaque copy: stops ptxas hoisting all 4*MI*KSTEPS byte addresses out of the k-loop
      // (they would pin ~100 registers); recomputing them is a few integer ops per LDS.
      asm volatile("" : "+r"(m));
      u32 v = 0;
#pragma unroll
      for (int e = 0; e < 4; ++e)
        v |= static_cast<u32>(*reinterpret_cast<const unsigned char*>(sA + swz_elem<CPR_A, 1>(kk + e, m))) << (8 * e);
      ra[q] = v;
    }
  }

  static PBG_DEVICE void load_b(const char* sB, int ks, int wn0, int lane, u32 (*rb)[4]) {
    if constexpr (EB == 2 || (EB == 1 && BK)) {
#pragma unroll
      for (int jj = 0; jj < NI / 2; ++jj) {
        // One x4 ldmatrix covers two n8 atoms: registers (b0,b1) of atom 2jj then of 2jj+1.
        const int nb = wn0 + 16 * jj;
        int j = lane >> 3, r = lane & 7;
        const char* addr;
        if constexpr (BK) addr = sB + swz_chunk<CPR_B>(nb + r + 8 * (j >> 1), 2 * ks + (j & 1));
        else addr = sB + swz_chunk<CPR_B>(16 * ks + r + 8 * (j & 1), nb / 8 + (j >> 1));
        if constexpr (BK) SM75_U32x4_LDSM_N::copy(addr, rb[2 * jj][0], rb[2 * jj][1], rb[2 * jj + 1][0], rb[2 * jj + 1][1]);
        else SM75_U16x8_LDSM_T::copy(addr, rb[2 * jj][0], rb[2 * jj][1], rb[2 * jj + 1][0], rb[2 * jj + 1][1]);
      }
    } else {
      const int g = lane >> 2, t = lane & 3;
#pragma unroll
      for (int j = 0; j < NI; ++j) {
        const int n = wn0 + 8 * j + g;
#pragma unroll
        for (int q = 0; q < 2; ++q) {
          if constexpr (EB == 4) {
            int kk = KE * ks + t + 4 * q;  // b0 = (k=t, n=g), b1 = (k=t+4, n=g)
            int off = BK ? swz_elem<CPR_B, 4>(n, kk) : swz_elem<CPR_B, 4>(kk, n);
            rb[j][q] = *reinterpret_cast<const u32*>(sB + off);
          } else {
            int kk = KE * ks + 4 * t + 16 * q;  // s8, N-contiguous rows: byte gather
            int nn = n;
            asm volatile("" : "+r"(nn));  // as in load_a_one: no hoisted address table
            u32 v = 0;
#pragma unroll
            for (int e = 0; e < 4; ++e)
              v |= static_cast<u32>(*reinterpret_cast<const unsigned char*>(sB + swz_elem<CPR_B, 1>(kk + e, nn))) << (8 * e);
            rb[j][q] = v;
          }
        }
      }
    }
  }

  // Software-pipelined path (ldmatrix kinds: 16-bit, and s8 with both operands K-contiguous):
  // the mainloop double-buffers fragments, loading step s+1's while step s's MMAs issue.
  // tf32/3xTF32 take the pipelined path too (plain 32/64-bit LDS fragments, see load_frag).
  static constexpr bool kPipelined =
      !Kind::kSimt && ((P == 1 && (EB == 2 || (EB == 1 && AK && BK))) || EB == 4) && (KSTEPS % 2 == 0);

  // tf32 fragments: hardware k index t + 4h (lane t = lane%4, h = 0/1) is read from tile column
  // tf32_k(ks, t, h). Any bijection works as long as A and B use the same one (the MMA sums
  // over k). (t, t+4) -> two adjacent words gives one 64-bit LDS per K-contiguous pair.
  // Both operands K-contiguous: step ks takes chunks ks and ks+KSTEPS (16 bytes each), which
  // keeps each 16-lane phase of a 64-bit load on 8 distinct bank groups under the swizzle.
  // Otherwise k = 8ks + 2t + h: conflict-free for the M/N-contiguous operand's 32-bit loads
  // (rows 2t+h hit distinct XOR slots); the K-contiguous one's 64-bit loads are 2-way, the
  // same wavefronts as the two 32-bit loads they replace.
  static PBG_DEVICE int tf32_k(int ks, int t, int h) {
    if constexpr (AK && BK) return 4 * (ks + KSTEPS * (t >> 1)) + 2 * (t & 1) + h;
    else return KE * ks + 2 * t + h;
  }
  static PBG_DEVICE u32 lds32(u32 a) {
    u32 v;
    asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(a));
    return v;
  }
  static PBG_DEVICE void lds64(u32 a, u32& x, u32& y) {
    asm volatile("ld.shared.v2.u32 {%0,%1}, [%2];\n" : "=r"(x), "=r"(y) : "r"(a));
  }
  static PBG_DEVICE void load_frag_tf32(u32 sa, u32 sb, int ks, int wm0, int wn0, int lane, u32 (&ra)[MI][4],
                                        u32 (&rb)[NI][4]) {
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        const int m = wm0 + 16 * i + g + 8 * q;  // a_q: row g (+8), k = t; a_{q+2}: k = t + 4
        if constexpr (AK) lds64(sa + swz_elem<CPR_A, 4>(m, tf32_k(ks, t, 0)), ra[i][q], ra[i][q + 2]);
        else {
          ra[i][q] = lds32(sa + swz_elem<CPR_A, 4>(tf32_k(ks, t, 0), m));
          ra[i][q + 2] = lds32(sa + swz_elem<CPR_A, 4>(tf32_k(ks, t, 1), m));
        }
      }
#pragma unroll
    for (int j = 0; j < NI; ++j) {
      const int n = wn0 + 8 * j + g;  // b0: k = t, b1: k = t + 4
      if constexpr (BK) lds64(sb + swz_elem<CPR_B, 4>(n, tf32_k(ks, t, 0)), rb[j][0], rb[j][1]);
      else {
        rb[j][0] = lds32(sb + swz_elem<CPR_B, 4>(tf32_k(ks, t, 0), n));
        rb[j][1] = lds32(sb + swz_elem<CPR_B, 4>(tf32_k(ks, t, 1), n));
      }
    }
  }

  // Per-lane byte offsets of the first (atom 0, k-step 0) ldmatrix of A and B in a stage.
  // Every other one is derived with compile-time constants (verified for every legal
  // tile/warp/BK shape against swz_chunk, see NOTES.md): K-contiguous rows:
  //   off(idx, ks) = (off0 ^ (ks << 5)) + idx * 16 * row_bytes,
  // M/N-contiguous rows (.trans): off(idx, ks) = (off0 ^ (idx << 5)) + ks * 16 * row_bytes.
  static PBG_DEVICE u32 a_off0(int wm0, int lane) {
    if constexpr (EB == 4) return 0;  // tf32: load_frag_tf32 addresses from lane itself
    const int j = lane >> 3, r = lane & 7;
    if constexpr (AK) return swz_chunk<CPR_A>(wm0 + (lane & 15), lane >> 4);
    else return swz_chunk<CPR_A>(r + 8 * (j >> 1), wm0 / 8 + (j & 1));
  }
  static PBG_DEVICE u32 b_off0(int wn0, int lane) {
    if constexpr (EB == 4) return 0;
    const int j = lane >> 3, r = lane & 7;
    if constexpr (BK) return swz_chunk<CPR_B>(wn0 + r + 8 * (j >> 1), j & 1);
    else return swz_chunk<CPR_B>(r + 8 * (j & 1), wn0 / 8 + (j >> 1));
  }
  // Fragments of k-step `ks` (a compile-time constant after unrolling) from shared addresses
  // sa = A slot + a_off0, sb = B slot + b_off0 (A: MI x4 ldmatrix, B: NI/2 x4 ldmatrix).
  static PBG_DEVICE void load_frag(u32 sa_slot, u32 sb_slot, u32 aoff, u32 boff, int ks, int wm0, int wn0,
                                   int lane, u32 (&ra)[MI][4], u32 (&rb)[NI][4]) {
    if constexpr (EB == 4) {
      load_frag_tf32(sa_slot + aoff, sb_slot + boff, ks, wm0, wn0, lane, ra, rb);
      return;
    }
    constexpr int RBA = CPR_A * 16, RBB = CPR_B * 16;  // bytes per smem row
#pragma unroll
    for (int i = 0; i < MI; ++i) {
      if constexpr (AK) ldsm_x4(sa_slot + ((aoff ^ (ks << 5)) + i * 16 * RBA), ra[i][0], ra[i][1], ra[i][2], ra[i][3]);
      else ldsm_x4_trans(sa_slot + ((aoff ^ (i << 5)) + ks * 16 * RBA), ra[i][0], ra[i][1], ra[i][2], ra[i][3]);
    }
#pragma unroll
    for (int jj = 0; jj < NI / 2; ++jj) {
      if constexpr (BK) ldsm_x4(sb_slot + ((boff ^ (ks << 5)) + jj * 16 * RBB), rb[2 * jj][0], rb[2 * jj][1], rb[2 * jj + 1][0], rb[2 * jj + 1][1]);
      else ldsm_x4_trans(sb_slot + ((boff ^ (jj << 5)) + ks * 16 * RBB), rb[2 * jj][0], rb[2 * jj][1], rb[2 * jj + 1][0], rb[2 * jj + 1][1]);
    }
  }
  // MI x NI MMAs of one k-step from loaded fragments (serpentine over j for B reuse).
  static PBG_DEVICE void mma_frag(const u32 (&ra)[MI][4], const u32 (&rb)[NI][4],
                                  AccReg (&acc)[MI][NI][Kind::kAccRegs]) {
    if constexpr (EB == 4) {
      // tf32 rounding / 3xTF32 big+small split once per fragment register, then the MMAs.
      u32 fb[NI][P][4];
#pragma unroll
      for (int j = 0; j < NI; ++j) Kind::prep(rb[j], fb[j], 2);
#pragma unroll
      for (int i = 0; i < MI; ++i) {
        u32 fa[P][4];
        Kind::prep(ra[i], fa, 4);
#pragma unroll
        for (int j = 0; j < NI; ++j) {
          const int jj = (i & 1) ? (NI - 1 - j) : j;
          Kind::mma(acc[i][jj], fa, fb[jj]);
        }
      }
      return;
    }
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
      for (int j = 0; j < NI; ++j) {
        const int jj = (i & 1) ? (NI - 1 - j) : j;
        Kind::mma(acc[i][jj], &ra[i], &rb[jj]);
      }
  }

  // FP32 FMAs over one stage (Kind::kSimt). Lane (g = lane/4, t = lane%4) owns rows
  // 16i + g and 16i + g + 8 and columns 8j + 2t and 8j + 2t + 1 of the warp tile, the elements
  // of the m16n8 accumulator layout that stage_acc stores. Operands are read 4 k at a time, in
  // the stage's swizzled layout: a K-contiguous row as one 16-byte LDS, an M-contiguous A
  // element by a 32-bit LDS (the 8 g-lanes read 8 adjacent words, the t-lanes the same ones:
  // one wavefront), an N-contiguous B column pair by a 64-bit LDS. A 64x32 warp tile issues
  // 256 FFMAs per 16..48 LDS: above the 4 FFMA : 1 LDS issue ratio of an SM (4 x 32 FP32 lanes,
  // one 128-byte shared-memory wavefront a clock), so the FMA pipes set the pace.
  static PBG_DEVICE void compute_stage_simt(const char* sA, const char* sB, int wm0, int wn0, int lane,
                                            AccReg (&acc)[MI][NI][Kind::kAccRegs]) {
    static_assert(EB == 4 && Kind::kAccRegs == 4, "the FMA kind: 4-byte operands, m16n8 accumulators");
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int k4 = 0; k4 < BKE; k4 += 4) {
      float a[MI][2][4], b[NI][2][4];
#pragma unroll
      for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int m = wm0 + 16 * i + g + 8 * h;
          if constexpr (AK) {
            const float4 v = *reinterpret_cast<const float4*>(sA + swz_chunk<CPR_A>(m, k4 >> 2));
            a[i][h][0] = v.x; a[i][h][1] = v.y; a[i][h][2] = v.z; a[i][h][3] = v.w;
          } else {
#pragma unroll
            for (int e = 0; e < 4; ++e) a[i][h][e] = *reinterpret_cast<const float*>(sA + swz_elem<CPR_A, 4>(k4 + e, m));
          }
        }
#pragma unroll
      for (int j = 0; j < NI; ++j) {
        const int n = wn0 + 8 * j + 2 * t;
        if constexpr (BK) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const float4 v = *reinterpret_cast<const float4*>(sB + swz_chunk<CPR_B>(n + h, k4 >> 2));
            b[j][h][0] = v.x; b[j][h][1] = v.y; b[j][h][2] = v.z; b[j][h][3] = v.w;
          }
        } else {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float2 v = *reinterpret_cast<const float2*>(sB + swz_elem<CPR_B, 4>(k4 + e, n));
            b[j][0][e] = v.x; b[j][1][e] = v.y;
          }
        }
      }
#pragma unroll
      for (int e = 0; e < 4; ++e)
#pragma unroll
        for (int i = 0; i < MI; ++i)
#pragma unroll
          for (int j = 0; j < NI; ++j) {
            acc[i][j][0] = Kind::fma(a[i][0][e], b[j][0][e], acc[i][j][0]);
            acc[i][j][1] = Kind::fma(a[i][0][e], b[j][1][e], acc[i][j][1]);
            acc[i][j][2] = Kind::fma(a[i][1][e], b[j][0][e], acc[i][j][2]);
            acc[i][j][3] = Kind::fma(a[i][1][e], b[j][1][e], acc[i][j][3]);
          }
    }
  }

  // All k-steps of one stage; the whole stage is unrolled so the compiler can hoist the
  // next step's shared-memory loads above the current step's MMAs.
  static PBG_DEVICE void compute_stage(const char* sA, const char* sB, int wm0, int wn0, int lane,
                                       AccReg (&acc)[MI][NI][Kind::kAccRegs]) {
    if constexpr (Kind::kSimt) compute_stage_simt(sA, sB, wm0, wn0, lane, acc);
    else compute_stage_mma(sA, sB, wm0, wn0, lane, acc);
  }
  static PBG_DEVICE void compute_stage_mma(const char* sA, const char* sB, int wm0, int wn0, int lane,
                                           AccReg (&acc)[MI][NI][Kind::kAccRegs]) {
    // s8 with M-contiguous A gathers bytes: keep one A fragment live at a time (4 instead of
    // 4*MI registers) or the 64x64 warp tile runs out of the 255-register budget.
    constexpr bool kAOneAtATime = (EB == 1 && !AK);
    // Byte gathers: unrolled k-steps let ptxas put every LDS.U8 of the stage in flight at
    // once (one register each); one k-step at a time keeps the s8 N/T layouts spill-free.
    // 3xTF32 (P == 2) likewise: big+small fragments and per-step accumulators of every
    // unrolled k-step would be live together and spill.
    constexpr bool kGather = (EB == 1 && (!AK || !BK)) || P == 2;
#pragma unroll (kGather ? 1 : KSTEPS)
    for (int ks = 0; ks < KSTEPS; ++ks) {
      u32 ra[MI][4], rb[NI][4];
      if constexpr (!kAOneAtATime) load_a(sA, ks, wm0, lane, ra);
      load_b(sB, ks, wn0, lane, rb);
      u32 fb[NI][P][4];
#pragma unroll
      for (int j = 0; j < NI; ++j) Kind::prep(rb[j], fb[j], 2);
#pragma unroll
      for (int i = 0; i < MI; ++i) {
        u32 fa[P][4];
        if constexpr (kAOneAtATime) {
          u32 one[1][4];
          load_a_one(sA, ks, wm0 + 16 * i, lane, one[0]);
          Kind::prep(one[0], fa, 4);
        } else {
          Kind::prep(ra[i], fa, 4);
        }
#pragma unroll
        for (int j = 0; j < NI; ++j) {
          // Serpentine over j: consecutive MMAs reuse the B registers just used.
          int jj = (i & 1) ? (NI - 1 - j) : j;
          Kind::mma(acc[i][jj], fa, fb[jj]);
        }
      }
    }
  }
};

}  // namespace pyblasgemm
