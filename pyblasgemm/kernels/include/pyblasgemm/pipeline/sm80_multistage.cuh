// Multistage cp.async ring: STAGES shared-memory slots; tile kb+STAGES-1 is in flight while
// tile kb is multiplied, hiding ~STAGES-1 global-load latencies behind tensor-core work.
#pragma once
#include "../arch.cuh"
#include "../params.cuh"
#include "../ptx/sm80_cp_async.cuh"
#include "../copy/sm80_tile_copy.cuh"
#include "../mma/sm80_warp_mma.cuh"

namespace pyblasgemm {

template <class Kind, bool AK, bool BK, int BM, int BN, int BKB, int WM, int WN, int STAGES, bool VEC>
struct Multistage {
  static_assert(STAGES >= 2 && STAGES <= 5, "2..5 stages");
  static constexpr int THREADS = WM * WN * 32;
  static constexpr int EB = Kind::kElemBytes;
  static constexpr int BKE = BKB / EB;
  static constexpr int A_STAGE = BM * BKB;  // bytes per slot
  static constexpr int B_STAGE = BN * BKB;
  static constexpr int SMEM_BYTES = STAGES * (A_STAGE + B_STAGE);
  typedef WarpMma<Kind, AK, BK, BM, BN, BKB, WM, WN> WMma;
  typedef TileCopy<(AK ? BM : BKE), WMma::CPR_A, THREADS, EB, VEC> CopyA;
  typedef TileCopy<(BK ? BN : BKE), WMma::CPR_B, THREADS, EB, VEC> CopyB;
  typedef typename Kind::AccReg AccReg;

  // Issue the loads of BK step kb into ring slot `slot` (A, B: batch-adjusted base pointers):
  // A's tile, B's tile, or both.
  template <bool FULL>
  static PBG_DEVICE void load_a_t(char* smem, int slot, const GemmParams& p, const char* A, int m0, int k0, int tid) {
    char* sA = smem + slot * A_STAGE;
    if constexpr (AK) CopyA::template load<FULL>(sA, A + (static_cast<i64>(m0) * p.lda + k0) * EB, p.lda, p.m - m0, p.k - k0, tid);
    else CopyA::template load<FULL>(sA, A + (static_cast<i64>(k0) * p.lda + m0) * EB, p.lda, p.k - k0, p.m - m0, tid);
  }
  template <bool FULL>
  static PBG_DEVICE void load_b_t(char* smem, int slot, const GemmParams& p, const char* B, int n0, int k0, int tid) {
    char* sB = smem + STAGES * A_STAGE + slot * B_STAGE;
    if constexpr (BK) CopyB::template load<FULL>(sB, B + (static_cast<i64>(n0) * p.ldb + k0) * EB, p.ldb, p.n - n0, p.k - k0, tid);
    else CopyB::template load<FULL>(sB, B + (static_cast<i64>(k0) * p.ldb + n0) * EB, p.ldb, p.k - k0, p.n - n0, tid);
  }
  template <bool FULL>
  static PBG_DEVICE void load_stage_t(char* smem, int slot, const GemmParams& p, const char* A, const char* B,
                                      int m0, int n0, int k0, int tid) {
    load_a_t<FULL>(smem, slot, p, A, m0, k0, tid);
    load_b_t<FULL>(smem, slot, p, B, n0, k0, tid);
  }
  static PBG_DEVICE void load_stage(char* smem, int slot, const GemmParams& p, const char* A, const char* B,
                                    int m0, int n0, int kb, int tid) {
    const int k0 = kb * BKE;
    // Interior tiles (all but the M/N edge tiles and the last K step) skip every bound check.
    if (m0 + BM <= p.m && n0 + BN <= p.n && k0 + BKE <= p.k) load_stage_t<true>(smem, slot, p, A, B, m0, n0, k0, tid);
    else load_stage_t<false>(smem, slot, p, A, B, m0, n0, k0, tid);
  }

  // Pipelined mainloop (CUTLASS-style): fragments are double-buffered across k-steps, and
  // the stage barrier sits after the MMAs of the second-to-last k-step, so the tensor pipe
  // still holds that step's MMAs while warps meet at the barrier and the last step's MMAs
  // (fragments already in registers) issue right after it, beside the next stage's ldmatrix.
  // Slot hazards: slot (i-1)%S is overwritten at k-step 0 of iteration i; its last reader
  // (the fragment load of iteration i-1's last k-step) ran before iteration i-1's barrier.
  // Visibility: the barrier of iteration i-1 follows cp.async.wait_group(S-2), which leaves
  // stages 0..i complete, and stage i's first fragments are loaded only after it.
  // SPLIT (the grouped walk): A's and B's copies each take the fast interior path when their
  // own operand is whole (a group of few tokens has every B tile cut by n, never A's);
  // and `live` false (a warp whose warp tile lies wholly past the m or n edge: warp-uniform)
  // issues its copies and meets the barriers as every warp does, but loads no fragments and
  // runs no MMAs (its accumulators stay zero and are never stored). A predicate, not a second
  // copy of the loop: two loops cost the 8-warp 128x64 tile 20 registers (past the 128 that
  // two CTAs per SM allow).
  template <bool SPLIT, class Promote>
  static PBG_DEVICE void run_pipelined(char* smem, const GemmParams& p, const char* A, const char* B, int m0,
                                       int n0, int kb_begin, int nk, int tid, int lane, int wm0, int wn0,
                                       AccReg (&acc)[WMma::MI][WMma::NI][Kind::kAccRegs], Promote& promote,
                                       bool live = true) {
    static_assert(STAGES >= 3, "the pipelined mainloop needs >= 3 stages");
    constexpr int KS = WMma::KSTEPS;
    static_assert(KS >= 2 && KS % 2 == 0, "fragment double buffer needs an even number of k-steps");
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
      if (s < nk) load_stage(smem, s, p, A, B, m0, n0, kb_begin + s, tid);
      cp_async_commit();
    }
    cp_async_wait<STAGES - 2>();
    __syncthreads();
    u32 fa[2][WMma::MI][4], fb[2][WMma::NI][4];
    // smem is 128-byte aligned and slots are multiples of 128 bytes, so XOR-ing bits 5..6 of
    // an absolute address equals XOR-ing them in the slot offset.
    const u32 s_base = static_cast<u32>(__cvta_generic_to_shared(smem));
    const u32 aoff = s_base + WMma::a_off0(wm0, lane);
    const u32 boff_abs = s_base + STAGES * A_STAGE + WMma::b_off0(wn0, lane);
    int rd = 0;             // slot being read
    int wr = STAGES - 1;    // slot written next
    // Interior tiles: per-thread copy pointers advanced by a constant per BK step.
    constexpr bool kFast = CopyA::kFast && CopyB::kFast;
    const bool mn_full = m0 + BM <= p.m && n0 + BN <= p.n;
    const bool m_full = m0 + BM <= p.m, n_full = n0 + BN <= p.n;
    const char* ga = A;
    const char* gb = B;
    i64 a_pass = 0, b_pass = 0, a_step = 0, b_step = 0;
    int sa_off = 0, sb_off = 0;
    if constexpr (kFast) {
      ga = A + (AK ? static_cast<i64>(m0) * p.lda : static_cast<i64>(m0)) * EB + CopyA::thr_goff(p.lda, tid);
      gb = B + (BK ? static_cast<i64>(n0) * p.ldb : static_cast<i64>(n0)) * EB + CopyB::thr_goff(p.ldb, tid);
      a_pass = static_cast<i64>(CopyA::RS) * p.lda * EB;
      b_pass = static_cast<i64>(CopyB::RS) * p.ldb * EB;
      a_step = AK ? static_cast<i64>(BKB) : static_cast<i64>(BKE) * p.lda * EB;  // bytes per BK step
      b_step = BK ? static_cast<i64>(BKB) : static_cast<i64>(BKE) * p.ldb * EB;
      sa_off = CopyA::thr_soff(tid);
      sb_off = CopyB::thr_soff(tid);
      // ga/gb advance by one BK step per iteration; they start at the first stage the loop loads
      ga += (kb_begin + STAGES - 1) * a_step;
      gb += (kb_begin + STAGES - 1) * b_step;
    }
    if (!SPLIT || live) WMma::load_frag(0u, 0u, aoff, boff_abs, 0, wm0, wn0, lane, fa[0], fb[0]);
    for (int i = 0; i < nk; ++i) {
#pragma unroll
      for (int ks = 0; ks < KS; ++ks) {
        if (ks == KS - 1) rd = (rd + 1 == STAGES) ? 0 : rd + 1;
        // next k-step's fragments (the next stage's first step when ks is the last one;
        // after the last iteration that is a harmless in-bounds read of a stale slot)
        if (!SPLIT || live)
          WMma::load_frag(static_cast<u32>(rd * A_STAGE), static_cast<u32>(rd * B_STAGE), aoff, boff_abs,
                          (ks + 1) % KS, wm0, wn0, lane, fa[(ks + 1) & 1], fb[(ks + 1) & 1]);
        // MMAs first: the branchy copy issue below ends the basic block, and ptxas keeps
        // these MMAs ahead of it, so they are in the tensor pipe while warps meet at the barrier.
        if (!SPLIT || live) WMma::mma_frag(fa[ks & 1], fb[ks & 1], acc);
        if (ks == 0) {
          const int nxt = i + STAGES - 1;
          if (nxt < nk) {
            const int kb = kb_begin + nxt;
            if constexpr (kFast && SPLIT) {
              const bool k_full = (kb + 1) * BKE <= p.k;
              if (m_full && k_full) CopyA::load_fast(smem + wr * A_STAGE + sa_off, ga, a_pass);
              else load_a_t<false>(smem, wr, p, A, m0, kb * BKE, tid);
              if (n_full && k_full) CopyB::load_fast(smem + STAGES * A_STAGE + wr * B_STAGE + sb_off, gb, b_pass);
              else load_b_t<false>(smem, wr, p, B, n0, kb * BKE, tid);
            } else if constexpr (kFast) {
              if (mn_full && (kb + 1) * BKE <= p.k) {
                CopyA::load_fast(smem + wr * A_STAGE + sa_off, ga, a_pass);
                CopyB::load_fast(smem + STAGES * A_STAGE + wr * B_STAGE + sb_off, gb, b_pass);
              } else {
                load_stage_t<false>(smem, wr, p, A, B, m0, n0, kb * BKE, tid);
              }
            } else {
              load_stage(smem, wr, p, A, B, m0, n0, kb, tid);
            }
          }
          cp_async_commit();
          wr = (wr + 1 == STAGES) ? 0 : wr + 1;
          if constexpr (kFast) { ga += a_step; gb += b_step; }
        }
        if (ks == KS - 2) {
          cp_async_wait<STAGES - 2>();
          __syncthreads();
        }
      }
      promote(kb_begin + i, i == nk - 1);   // block scales: after BK step kb_begin + i
    }
    cp_async_wait<0>();
    __syncthreads();
  }

  // acc += A[m0:+BM, kb_begin*BK : kb_end*BK] * B[...]; acc is NOT zeroed here.
  // On return all cp.async groups are drained and the CTA is past a barrier, so the caller
  // may reuse the ring's shared memory (the epilogue stages through it).
  // `promote(kb, last)` runs after every BK step kb (last: the range's final one): the block
  // scales' hook (GemmCore::tile_to_smem), a no-op that compiles to nothing otherwise.
  struct NoPromote {
    PBG_DEVICE void operator()(int, bool) const {}
  };
  // GROUPED: the grouped walk's mainloop (run_pipelined's SPLIT and `live`).
  template <bool GROUPED = false>
  static PBG_DEVICE void run(char* smem, const GemmParams& p, const char* A, const char* B, int m0, int n0,
                             int kb_begin, int kb_end, AccReg (&acc)[WMma::MI][WMma::NI][Kind::kAccRegs]) {
    NoPromote none;
    run<GROUPED>(smem, p, A, B, m0, n0, kb_begin, kb_end, acc, none);
  }
  template <bool GROUPED = false, class Promote>
  static PBG_DEVICE void run(char* smem, const GemmParams& p, const char* A, const char* B, int m0, int n0,
                             int kb_begin, int kb_end, AccReg (&acc)[WMma::MI][WMma::NI][Kind::kAccRegs],
                             Promote& promote) {
    const int tid = threadIdx.x;
    const int lane = tid & 31, warp = tid >> 5;
    const int wm0 = (warp % WM) * WMma::WTM;
    const int wn0 = (warp / WM) * WMma::WTN;
    const int nk = kb_end - kb_begin;
    if constexpr (WMma::kPipelined && GROUPED) {
      // (warp-uniform: warps on both sides meet the same barriers, the same number of times)
      run_pipelined<true>(smem, p, A, B, m0, n0, kb_begin, nk, tid, lane, wm0, wn0, acc, promote,
                          m0 + wm0 < p.m && n0 + wn0 < p.n);
    } else if constexpr (WMma::kPipelined) {
      run_pipelined<false>(smem, p, A, B, m0, n0, kb_begin, nk, tid, lane, wm0, wn0, acc, promote);
    } else {
      run_plain(smem, p, A, B, m0, n0, kb_begin, nk, tid, lane, wm0, wn0, acc, promote);
    }
  }
  // The plain mainloop (tf32/3xTF32 and the s8 byte-gather layouts): wait, barrier, issue the
  // next stage's copies, then all k-steps of the current stage.
  template <class Promote>
  static PBG_DEVICE void run_plain(char* smem, const GemmParams& p, const char* A, const char* B, int m0,
                                   int n0, int kb_begin, int nk, int tid, int lane, int wm0, int wn0,
                                   AccReg (&acc)[WMma::MI][WMma::NI][Kind::kAccRegs], Promote& promote) {
    // Prologue: fill STAGES-1 slots. Empty groups are still committed so that the group
    // count stays in step with the slot index in wait_group below.
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
      if (s < nk) load_stage(smem, s, p, A, B, m0, n0, kb_begin + s, tid);
      cp_async_commit();
    }
    for (int i = 0; i < nk; ++i) {
      // Step i's group is the oldest of STAGES-1 outstanding ones.
      cp_async_wait<STAGES - 2>();
      // Barrier: step i is visible to every warp, and every warp is done with slot (i-1),
      // which the load below overwrites.
      __syncthreads();
      const int nxt = i + STAGES - 1;
      if (nxt < nk) load_stage(smem, nxt % STAGES, p, A, B, m0, n0, kb_begin + nxt, tid);
      cp_async_commit();
      const int slot = i % STAGES;
      WMma::compute_stage(smem + slot * A_STAGE, smem + STAGES * A_STAGE + slot * B_STAGE, wm0, wn0, lane, acc);
      promote(kb_begin + i, i == nk - 1);
    }
    cp_async_wait<0>();
    __syncthreads();
  }
};

}  // namespace pyblasgemm
