// Epilogue staged through shared memory: accumulators -> smem tile (fp32/s32, column-major
// like C) -> coalesced 16-byte global stores with alpha/beta. The same smem tile form is used
// to publish/consume split-k and stream-k partials, so those paths are plain float4 copies.
#pragma once
#include "../arch.cuh"
#include "../params.cuh"
#include "../mma/sm80_kinds.cuh"

namespace pyblasgemm {

PBG_DEVICE float pick_scale(float*, float f, int) { return f; }
PBG_DEVICE int pick_scale(int*, float, int i) { return i; }
// alpha/beta in IEEE arithmetic, subnormals kept: CuPy compiles every RawModule with
// -ftz=true, which flushed alpha*acc and beta*c below FLT_MIN (1.18e-38) to zero (the GPU fuzz:
// bgemm with alpha = beta = FLT_MIN returned -0 for -1.7e-38). Inline PTX is not rewritten by
// -ftz; the instructions are the FMUL/FFMA that a*x + b*c compiles to, at the same speed.
PBG_DEVICE float mul_ieee(float a, float b) {
  float r;
  asm("mul.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
PBG_DEVICE float fma_ieee(float a, float b, float c) {
  float r;
  asm("fma.rn.f32 %0, %1, %2, %3;" : "=f"(r) : "f"(a), "f"(b), "f"(c));
  return r;
}
PBG_DEVICE float axpby(float a, float x, float b, float c) { return fma_ieee(a, x, mul_ieee(b, c)); }
PBG_DEVICE float ax(float a, float x) { return mul_ieee(a, x); }
// Integer epilogue wraps modulo 2^32 (as cuBLAS's int32 path does) without signed-overflow UB.
PBG_DEVICE int axpby(int a, int x, int b, int c) {
  return static_cast<int>(static_cast<u32>(a) * static_cast<u32>(x) + static_cast<u32>(b) * static_cast<u32>(c));
}
PBG_DEVICE int ax(int a, int x) { return static_cast<int>(static_cast<u32>(a) * static_cast<u32>(x)); }

template <class Kind, int BM, int BN, int WM, int WN>
struct SmemEpilogue {
  static constexpr int THREADS = WM * WN * 32;
  // Column stride BM+4 words: the 4 lanes t=0..3 of a fragment store hit columns 2t, i.e.
  // word offsets 8t apart, and g=0..7 fill the gaps: 32 distinct banks per store.
  static constexpr int LDS = BM + 4;
  static constexpr int SMEM_BYTES = BN * LDS * 4;
  static constexpr int MI = BM / WM / 16, NI = BN / WN / 8;
  typedef typename Kind::Stage Stage;
  typedef typename Kind::Scale Scale;
  typedef typename Kind::AccReg AccReg;
  static constexpr int CB = Kind::kCBytes;
  static constexpr int OV = 16 / CB;  // C elements per 16-byte store
  static_assert((BM * BN / 4) % THREADS == 0 && (BM * BN / OV) % THREADS == 0, "tile / threads");

  static PBG_DEVICE void stage_acc(Stage* s, const AccReg (&acc)[MI][NI][Kind::kAccRegs]) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int wm0 = (warp % WM) * (BM / WM), wn0 = (warp / WM) * (BN / WN);
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
      for (int j = 0; j < NI; ++j) {
        Stage v[4];
        Kind::acc_to_stage(acc[i][j], v);
        const int r = wm0 + 16 * i + g, c = wn0 + 8 * j + 2 * t;
        s[c * LDS + r] = v[0];
        s[(c + 1) * LDS + r] = v[1];
        s[c * LDS + r + 8] = v[2];
        s[(c + 1) * LDS + r + 8] = v[3];
      }
  }

  // Workspace slot = BN columns of BM contiguous values (no padding); .cg = via L2, so a
  // partial written on one SM is read coherently on another (L1 is not coherent).
  static PBG_DEVICE void smem_to_ws(const Stage* s, Stage* ws) {
#pragma unroll 4
    for (int id = threadIdx.x; id < BM * BN / 4; id += THREADS) {
      const int c = id / (BM / 4), r = (id % (BM / 4)) * 4;
      float4 v = *reinterpret_cast<const float4*>(s + c * LDS + r);
      __stcg(reinterpret_cast<float4*>(ws) + id, v);
    }
  }
  // s += ws, element-wise, in the stage type (fp32 add or s32 add).
  static PBG_DEVICE void smem_add_ws(Stage* s, const Stage* ws) {
#pragma unroll 4
    for (int id = threadIdx.x; id < BM * BN / 4; id += THREADS) {
      const int c = id / (BM / 4), r = (id % (BM / 4)) * 4;
      float4 w = __ldcg(reinterpret_cast<const float4*>(ws) + id);
      Stage* d = s + c * LDS + r;
      const Stage* wv = reinterpret_cast<const Stage*>(&w);
      d[0] += wv[0]; d[1] += wv[1]; d[2] += wv[2]; d[3] += wv[3];
    }
  }

  // C[m0:, n0:] = alpha * s + beta * C (C not read when beta == 0), edges predicated.
  static PBG_DEVICE void store_c(const Stage* s, const GemmParams& p, int b, int m0, int n0) {
    const Scale alpha = pick_scale(static_cast<Scale*>(nullptr), p.alpha, p.ialpha);
    const Scale beta = pick_scale(static_cast<Scale*>(nullptr), p.beta, p.ibeta);
    const bool read_c = beta != Scale(0);
    char* Cb = p.C + static_cast<i64>(b) * p.sc * CB;
#pragma unroll 2
    for (int id = threadIdx.x; id < BM * BN / OV; id += THREADS) {
      // A half-warp covers one 128..256-byte column run of the tile: coalesced stores.
      const int c = id / (BM / OV), r = (id % (BM / OV)) * OV;
      const int gm = m0 + r, gn = n0 + c;
      if (gn >= p.n || gm >= p.m) continue;
      char* cp = Cb + (static_cast<i64>(gn) * p.ldc + gm) * CB;
      const Stage* sv = s + c * LDS + r;
      if (p.c_vec && gm + OV <= p.m) {
        U32x4 old = {0u, 0u, 0u, 0u};
        if (read_c) old = *reinterpret_cast<const U32x4*>(cp);
        const u32* ow = reinterpret_cast<const u32*>(&old);
        u32 out[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          if constexpr (CB == 2) {
            // Two 16-bit outputs per word: low half = lower row index (little endian).
            Scale c0 = Kind::c_from_bits(ow[q] & 0xffffu), c1 = Kind::c_from_bits(ow[q] >> 16);
            Scale v0 = read_c ? axpby(alpha, sv[2 * q], beta, c0) : ax(alpha, sv[2 * q]);
            Scale v1 = read_c ? axpby(alpha, sv[2 * q + 1], beta, c1) : ax(alpha, sv[2 * q + 1]);
            out[q] = Kind::cvt_c(v0) | (Kind::cvt_c(v1) << 16);
          } else {
            Scale c0 = Kind::c_from_bits(ow[q]);
            Scale v0 = read_c ? axpby(alpha, sv[q], beta, c0) : ax(alpha, sv[q]);
            out[q] = Kind::cvt_c(v0);
          }
        }
        *reinterpret_cast<U32x4*>(cp) = U32x4{out[0], out[1], out[2], out[3]};
      } else {
        // Edge or unaligned C: element stores, each one bounds-checked.
#pragma unroll
        for (int e = 0; e < OV; ++e) {
          if (gm + e < p.m) {
            char* ep = cp + e * CB;
            Scale v = read_c ? axpby(alpha, sv[e], beta, Kind::load_c(ep)) : ax(alpha, sv[e]);
            if constexpr (CB == 2) *reinterpret_cast<u16*>(ep) = static_cast<u16>(Kind::cvt_c(v));
            else *reinterpret_cast<u32*>(ep) = Kind::cvt_c(v);
          }
        }
      }
    }
  }
};

}  // namespace pyblasgemm
