// The on-chip back-to-back MLP (sm_80+, mma.sync; builds for sm_90 / sm_90a too):
//   y = act(x @ w1 + b1) @ w2 + b2
// in one kernel, the intermediate h kept in shared memory. Everything is row-major
// (C-contiguous as NumPy sees it): x [M, K1], w1 [K1, N1], w2 [N1, N2], y [M, N2], b1 [N1],
// b2 [N2] (b1 / b2 may be null = no bias). 16-bit operands (fp16, or bf16 with BF16 = true),
// fp32 accumulation, ACT = the activation code of epilogue/activation.cuh (0 = none).
//
// Semantics, as pyblasgemm.fused_mlp documents them: h = act(x @ w1 + b1) is computed in fp32
// and rounded ONCE to the layer dtype (the 16-bit value the unfused sequence would store), and
// y = h @ w2 + b2 in fp32, rounded once. NaN / Inf propagate as in the unfused sequence: rows
// never mix (each mma row is one row of x), and h's padding columns (N1..HW, read by the second
// product against zero-filled rows of w2) are stored as exact zeros, not act(x @ 0), so an Inf
// in x cannot turn into Inf * 0 = NaN in columns the unfused product never had.
//
// One CTA owns kMlpBM = 64 rows of x and grid dimension y splits N2 (n2_splits):
//   stage 1: for each 128-wide chunk of N1, walk K1 in 32-deep steps through the cp.async ring
//            (x tile + w1 tile per step), ldmatrix + mma.sync m16n8k16; at the chunk's last step
//            add b1, activate, round, store the 16-bit chunk to the h buffer.
//   stage 2: for each of this CTA's 128-wide chunks of N2, walk N1 (= K) in 32-deep steps:
//            A fragments by ldmatrix from the h buffer, only the w2 tile streamed through the
//            ring; add b2, round, store y (rows >= M never stored).
// Both stages are one linear sequence of ring steps, so w2's first tiles are in flight while
// stage 1's last chunk is still being multiplied. CTA (i, j) recomputes h for its rows: n2_splits
// > 1 buys SMs for small M at the price of repeating stage 1 (the host decides).
//
// Requirements the host checks (pyblasgemm/kernels/mlp_kernel.py: fits()): K1, N1, N2
// multiples of 8 and 16-byte aligned x, w1, w2, y (every global row is whole 16-byte cp.async
// pieces, which are either wholly in bounds or zero-filled); shared memory = kMlpRingBytes +
// kMlpBM * (HW + kMlpPad) * 2 with HW = N1 rounded up to kMlpBK, at most the device's opt-in
// maximum (227 KB on sm_90: N1 <= 1472; 163 KB on sm_80: N1 <= 960). M is arbitrary.
#pragma once
#include "../arch.cuh"
#include "../ptx/sm75_ldmatrix.cuh"
#include "../ptx/sm80_cp_async.cuh"
#include "../ptx/sm80_cvt.cuh"
#include "../ptx/sm80_mma.cuh"
#include "../epilogue/activation.cuh"

namespace pyblasgemm {

// The constants below are mirrored in mlp_kernel.py (a CPU test greps them to check).
// 64 rows per CTA: 64 x N1 x 2 B is the h buffer, the one thing that limits N1; 128 rows would
// cut the widest hidden size that fits to 672 on sm_90.
constexpr int kMlpBM = 64;
// 128-wide chunks of N1 (stage 1) and N2 (stage 2): one 64 x 128 fp32 tile in registers,
// 32 accumulators per thread over 8 warps.
constexpr int kMlpChunk = 128;
// 32 K per ring step: a 64 x 32 x tile (4 KB) + a 32 x 128 weight tile (8 KB); 3 stages are
// 40.5 KB with padding, the rest of the opt-in shared memory goes to h.
constexpr int kMlpBK = 32;
constexpr int kMlpStages = 3;
// 2 x 4 warps over the 64 x 128 tile: a 32 x 32 warp tile = 2 x 4 mma tiles, 16 mma.sync per
// warp per ring step, 2 + 2 ldmatrix.x4 per 16 of K.
constexpr int kMlpWarpsM = 2;
constexpr int kMlpWarpsN = 4;
constexpr int kMlpThreads = 32 * kMlpWarpsM * kMlpWarpsN;
// 8 halves (16 B) of padding per shared row: row strides of 80 B (x tile), 272 B (weight tile)
// and 16 * (HW / 8 + 1) B with HW / 8 a multiple of 4 (h buffer) are odd multiples of 16 B mod
// 128 B, so the 8 row addresses of each 8x8 ldmatrix land in 8 different 16-byte bank groups
// (conflict-free), and every row stays 16-byte aligned for cp.async.
constexpr int kMlpPad = 8;
constexpr int kMlpAStride = kMlpBK + kMlpPad;                 // halves per x-tile row (40)
constexpr int kMlpBStride = kMlpChunk + kMlpPad;              // halves per weight-tile row (136)
constexpr int kMlpATileBytes = kMlpBM * kMlpAStride * 2;      // 5120
constexpr int kMlpBTileBytes = kMlpBK * kMlpBStride * 2;      // 8704
constexpr int kMlpSlotBytes = kMlpATileBytes + kMlpBTileBytes;  // 13824
constexpr int kMlpRingBytes = kMlpStages * kMlpSlotBytes;     // 41472 (40.5 KB)

static_assert(kMlpBM == 32 * kMlpWarpsM, "each warp owns 32 rows (two m16 tiles)");
static_assert(kMlpChunk == 32 * kMlpWarpsN, "each warp owns 32 columns (four n8 tiles)");
static_assert(kMlpBM * kMlpBK / 8 == kMlpThreads, "one 16-byte x piece per thread per step");
static_assert(kMlpBK * kMlpChunk / 8 == 2 * kMlpThreads, "two 16-byte weight pieces per thread");
static_assert(kMlpSlotBytes % 128 == 0 && kMlpATileBytes % 16 == 0, "slots stay aligned");

// Columns of h the second product reads: N1 rounded up to its K step (the padding is zeros).
PBG_DEVICE int mlp_h_width(int n1) { return (n1 + kMlpBK - 1) / kMlpBK * kMlpBK; }

// A warp's 32 x 32 fp32 accumulator tile (2 x 4 m16n8 fragments of 4 values), zeroed.
PBG_DEVICE void mlp_zero(float (&acc)[2][4][4]) {
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[i][j][r] = 0.f;
}

template <bool BF16>
struct MlpTypes {
  typedef SM80_16x8x16_F32F16F16F32_TN Mma;
  static PBG_DEVICE float widen(u16 v) { return f16_to_f32(v); }
  static PBG_DEVICE u16 narrow(float v) { return f32_to_f16(v); }  // rn: NumPy's astype
};
template <>
struct MlpTypes<true> {
  typedef SM80_16x8x16_F32BF16BF16F32_TN Mma;
  static PBG_DEVICE float widen(u16 v) { return bf16_to_f32(v); }
  static PBG_DEVICE u16 narrow(float v) { return f32_to_bf16(v); }
};

template <bool BF16, int ACT>
__global__ void __launch_bounds__(kMlpThreads, 1)
    fused_mlp_kernel(const u16* __restrict__ x, const u16* __restrict__ w1, const u16* __restrict__ b1,
                     const u16* __restrict__ w2, const u16* __restrict__ b2, u16* __restrict__ y, int M,
                     int K1, int N1, int N2) {
  typedef MlpTypes<BF16> T;
  extern __shared__ __align__(128) char smem[];

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp / kMlpWarpsN, wn = warp % kMlpWarpsN;
  const int g = lane >> 2, t = lane & 3;  // mma fragment row / column pair
  const int m0 = blockIdx.x * kMlpBM;

  const int nk1 = (K1 + kMlpBK - 1) / kMlpBK;
  const int nc1 = (N1 + kMlpChunk - 1) / kMlpChunk;
  const int hw = mlp_h_width(N1);
  const int nk2 = hw / kMlpBK;
  const int hstride = hw + kMlpPad;  // halves per h-buffer row
  const int nc2 = (N2 + kMlpChunk - 1) / kMlpChunk;
  const int per = (nc2 + gridDim.y - 1) / gridDim.y;  // N2 chunks per split
  const int c2_begin = blockIdx.y * per;
  const int c2_end = c2_begin + per < nc2 ? c2_begin + per : nc2;
  if (c2_begin >= c2_end) return;  // the whole CTA leaves: no barrier is left waiting
  const int steps1 = nc1 * nk1;
  const int steps = steps1 + (c2_end - c2_begin) * nk2;

  char* const h_buf = smem + kMlpRingBytes;
  const u32 s_base = static_cast<u32>(__cvta_generic_to_shared(smem));
  const u32 h_base = s_base + kMlpRingBytes;

  // Issue the cp.async pieces of ring step s (x + w1 tiles in stage 1, the w2 tile in stage 2).
  // Out-of-bounds pieces read nothing and store 16 zero bytes (src-size 0; the address is
  // clamped to the array's start so that it is always a valid one).
  auto load = [&](int s) {
    char* const slot = smem + (s % kMlpStages) * kMlpSlotBytes;
    const u16* src;
    int row0, rows, col0, cols;
    if (s < steps1) {
      const int c = s / nk1, kb = s - c * nk1;
      const int r = tid >> 2, ch = (tid & 3) * 8;
      const int gr = m0 + r, gc = kb * kMlpBK + ch;
      const bool ok = gr < M && gc < K1;
      SM80_CP_ASYNC_CG_16B_ZFILL::copy(slot + (r * kMlpAStride + ch) * 2, ok ? x + (i64)gr * K1 + gc : x,
                                       ok ? 16 : 0);
      src = w1, row0 = kb * kMlpBK, rows = K1, col0 = c * kMlpChunk, cols = N1;
    } else {
      const int s2 = s - steps1, c = s2 / nk2, kb = s2 - c * nk2;
      src = w2, row0 = kb * kMlpBK, rows = N1, col0 = (c2_begin + c) * kMlpChunk, cols = N2;
    }
    char* const b_tile = slot + kMlpATileBytes;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int p = tid + i * kMlpThreads, r = p >> 4, ch = (p & 15) * 8;
      const int gr = row0 + r, gc = col0 + ch;
      const bool ok = gr < rows && gc < cols;
      SM80_CP_ASYNC_CG_16B_ZFILL::copy(b_tile + (r * kMlpBStride + ch) * 2,
                                       ok ? src + (i64)gr * cols + gc : src, ok ? 16 : 0);
    }
  };

  // Per-lane ldmatrix offsets. A (non-transposed): lane l gives row l % 16, k half l / 16 of a
  // 16 x 16 tile -> a0..a3 of the m16n8k16 fragment. B (transposed, rows = k): lane l gives k row
  // (l % 8) + 8 * ((l / 8) % 2), n half l / 16 -> b0, b1 of two adjacent n8 tiles.
  const u32 a_ring_off = ((wm * 32 + (lane & 15)) * kMlpAStride + (lane >> 4) * 8) * 2;
  const u32 a_h_off = ((wm * 32 + (lane & 15)) * hstride + (lane >> 4) * 8) * 2;
  const u32 b_off = kMlpATileBytes + (((lane & 7) + ((lane >> 3) & 1) * 8) * kMlpBStride + wn * 32 + (lane >> 4) * 8) * 2;

  float acc[2][4][4];
  mlp_zero(acc);

#pragma unroll
  for (int s = 0; s < kMlpStages - 1; ++s) {
    if (s < steps) load(s);
    cp_async_commit();
  }

  int chunk = 0, kb = 0;  // position of step s within its stage
  for (int s = 0; s < steps; ++s) {
    const bool first = s < steps1;
    if (s == steps1) chunk = 0, kb = 0;
    cp_async_wait<kMlpStages - 2>();  // step s's pieces (this thread's) have landed
    // Everyone's pieces of step s are visible; every warp is done with step s - 1's slot (about
    // to be refilled) and with its h stores of the last stage-1 chunk (about to be read).
    __syncthreads();
    if (s + kMlpStages - 1 < steps) load(s + kMlpStages - 1);
    cp_async_commit();  // an empty group near the end keeps wait_group's count uniform

    const u32 slot = s_base + (s % kMlpStages) * kMlpSlotBytes;
    const u32 a_addr = first ? slot + a_ring_off : h_base + a_h_off + kb * kMlpBK * 2;
    const u32 a_row16 = first ? 16 * kMlpAStride * 2 : 16 * hstride * 2;
#pragma unroll
    for (int kk = 0; kk < kMlpBK / 16; ++kk) {
      u32 a[2][4], b[4][2];
#pragma unroll
      for (int i = 0; i < 2; ++i) ldsm_x4(a_addr + i * a_row16 + kk * 32, a[i][0], a[i][1], a[i][2], a[i][3]);
#pragma unroll
      for (int p = 0; p < 2; ++p)
        ldsm_x4_trans(slot + b_off + kk * 16 * kMlpBStride * 2 + p * 32, b[2 * p][0], b[2 * p][1],
                      b[2 * p + 1][0], b[2 * p + 1][1]);
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) T::Mma::fma(acc[i][j], a[i], b[j]);
    }

    const bool last_k = kb == (first ? nk1 : nk2) - 1;
    if (last_k) {
      if (first) {
        // h chunk: + b1, activate, round once, store 16-bit pairs (the 8 rows x 4 pairs of a
        // quad-row land in 32 different banks: row stride 4 * odd words mod 32).
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int col = chunk * kMlpChunk + wn * 32 + j * 8 + 2 * t;
          if (col >= hw) continue;
          const bool in = col < N1;  // N1 % 8 == 0: both columns of the pair are in, or neither
          const float c0 = (b1 != nullptr && in) ? T::widen(b1[col]) : 0.f;
          const float c1 = (b1 != nullptr && in) ? T::widen(b1[col + 1]) : 0.f;
#pragma unroll
          for (int i = 0; i < 2; ++i)
#pragma unroll
            for (int hf = 0; hf < 2; ++hf) {
              const int row = wm * 32 + i * 16 + g + hf * 8;
              u32 packed = 0;  // padding columns: exact zeros
              if (in) {
                const u16 lo = T::narrow(activate<float>(acc[i][j][2 * hf] + c0, ACT));
                const u16 hi = T::narrow(activate<float>(acc[i][j][2 * hf + 1] + c1, ACT));
                packed = static_cast<u32>(lo) | (static_cast<u32>(hi) << 16);
              }
              *reinterpret_cast<u32*>(h_buf + (row * hstride + col) * 2) = packed;
            }
        }
      } else {
        // y tile: + b2, round once, store (rows >= M and columns >= N2 never written).
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int col = (c2_begin + chunk) * kMlpChunk + wn * 32 + j * 8 + 2 * t;
          if (col >= N2) continue;
          const float c0 = b2 != nullptr ? T::widen(b2[col]) : 0.f;
          const float c1 = b2 != nullptr ? T::widen(b2[col + 1]) : 0.f;
#pragma unroll
          for (int i = 0; i < 2; ++i)
#pragma unroll
            for (int hf = 0; hf < 2; ++hf) {
              const int row = m0 + wm * 32 + i * 16 + g + hf * 8;
              if (row >= M) continue;
              const u32 packed = static_cast<u32>(T::narrow(acc[i][j][2 * hf] + c0)) |
                                 (static_cast<u32>(T::narrow(acc[i][j][2 * hf + 1] + c1)) << 16);
              *reinterpret_cast<u32*>(y + (i64)row * N2 + col) = packed;
            }
        }
      }
      mlp_zero(acc);
      ++chunk, kb = 0;
    } else {
      ++kb;
    }
  }
  cp_async_wait<0>();  // leave no copy in flight into shared memory the next CTA may own
}

}  // namespace pyblasgemm
