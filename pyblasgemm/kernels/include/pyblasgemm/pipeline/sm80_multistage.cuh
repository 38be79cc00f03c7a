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

  // Issue the loads of BK step kb into ring slot `slot` (A, B: batch-adjusted base pointers).
  template <bool FULL>
  static PBG_DEVICE void load_stage_t(char* smem, int slot, const GemmParams& p, const char* A, const char* B,
                                      int m0, int n0, int k0, int tid) {
    char* sA = smem + slot * A_STAGE;
    char* sB = smem + STAGES * A_STAGE + slot * B_STAGE;
    if constexpr (AK) CopyA::template load<FULL>(sA, A + (static_cast<i64>(m0) * p.lda + k0) * EB, p.lda, p.m - m0, p.k - k0, tid);
    else CopyA::template load<FULL>(sA, A + (static_cast<i64>(k0) * p.lda + m0) * EB, p.lda, p.k - k0, p.m - m0, tid);
    if constexpr (BK) CopyB::template load<FULL>(sB, B + (static_cast<i64>(n0) * p.ldb + k0) * EB, p.ldb, p.n - n0, p.k - k0, tid);
    else CopyB::template load<FULL>(sB, B + (static_cast<i64>(k0) * p.ldb + n0) * EB, p.ldb, p.k - k0, p.n - n0, tid);
  }
  static PBG_DEVICE void load_stage(char* smem, int slot, const GemmParams& p, const char* A, const char* B,
                                    int m0, int n0, int kb, int tid) {
    const int k0 = kb * BKE;
    // Interior tiles (all but the M/N edge tiles and the last K step) skip every bound check.
    if (m0 + BM <= p.m && n0 + BN <= p.n && k0 + BKE <= p.k) load_stage_t<true>(smem, slot, p, A, B, m0, n0, k0, tid);
    else load_stage_t<false>(smem, slot, p, A, B, m0, n0, k0, tid);
  }

  // acc += A[m0:+BM, kb_begin*BK : kb_end*BK] * B[...]; acc is NOT zeroed here.
  // On return all cp.async groups are drained and the CTA is past a barrier, so the caller
  // may reuse the ring's shared memory (the epilogue stages through it).
  static PBG_DEVICE void run(char* smem, const GemmParams& p, const char* A, const char* B, int m0, int n0,
                             int kb_begin, int kb_end, AccReg (&acc)[WMma::MI][WMma::NI][Kind::kAccRegs]) {
    const int tid = threadIdx.x;
    const int lane = tid & 31, warp = tid >> 5;
    const int wm0 = (warp % WM) * WMma::WTM;
    const int wn0 = (warp / WM) * WMma::WTN;
    const int nk = kb_end - kb_begin;
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
    }
    cp_async_wait<0>();
    __syncthreads();
  }
};

}  // namespace pyblasgemm
