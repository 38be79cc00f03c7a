// Epilogue staged through shared memory: accumulators -> smem tile (fp32/s32, column-major
// like C) -> coalesced 16-byte global stores with alpha/beta. The same smem tile form is used
// to publish/consume split-k and stream-k partials, so those paths are plain float4 copies.
#pragma once
#include "../arch.cuh"
#include "../params.cuh"
#include "../mma/sm80_kinds.cuh"
#include "activation.cuh"

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
PBG_DEVICE float add_ieee(float a, float b) {  // as mul_ieee: subnormal sums are not flushed
  float r;
  asm("add.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
PBG_DEVICE float axpby(float a, float x, float b, float c) { return fma_ieee(a, x, mul_ieee(b, c)); }
// Partial sums (split-k, stream-k): float partials added without flushing subnormals (the FP32
// FMA kind keeps them, as SGEMM does; a plain += is compiled FTZ), int32 ones modulo 2^32.
PBG_DEVICE float stage_add(float a, float b) { return add_ieee(a, b); }
PBG_DEVICE int stage_add(int a, int b) {
  return static_cast<int>(static_cast<u32>(a) + static_cast<u32>(b));
}
PBG_DEVICE float ax(float a, float x) { return mul_ieee(a, x); }
// Integer epilogue wraps modulo 2^32 (as cuBLAS's int32 path does) without signed-overflow UB.
PBG_DEVICE int axpby(int a, int x, int b, int c) {
  return static_cast<int>(static_cast<u32>(a) * static_cast<u32>(x) + static_cast<u32>(b) * static_cast<u32>(c));
}
PBG_DEVICE int ax(int a, int x) { return static_cast<int>(static_cast<u32>(a) * static_cast<u32>(x)); }

// ---- the fused epilogue of the mma.sync kernels (template EPI, activation.cuh) -----------------
// The output type of a dequantized int8 product (EPI & kEpiDequant): float32, float16, bfloat16.
template <int CODE>
struct DequantOut {
  static_assert(CODE >= 0 && CODE <= 2, "dequantized output: 0 float32, 1 float16, 2 bfloat16");
  typedef float Scale;
  typedef float Acc;      // (the Hopper kernel's store helpers take the output's Acc)
  static constexpr int kCBytes = CODE ? 2 : 4;
  static PBG_DEVICE float c_from_bits(u32 h) {
    return CODE == 0 ? __uint_as_float(h) : CODE == 1 ? f16_to_f32(static_cast<u16>(h)) : bf16_to_f32(static_cast<u16>(h));
  }
  static PBG_DEVICE float load_c(const char* p) {
    if constexpr (CODE == 0) return *reinterpret_cast<const float*>(p);
    else return c_from_bits(*reinterpret_cast<const u16*>(p));
  }
  static PBG_DEVICE u32 cvt_c(float v) {
    return CODE == 0 ? __float_as_uint(v) : CODE == 1 ? u32(f32_to_f16(v)) : u32(f32_to_bf16(v));
  }
};
// A dequantized product's scale of C row i / column j: one per row / column, or (per-tensor:
// kEpiScaleMOne / kEpiScaleNOne) the one value every element shares.
// (block-scaled: 1, the mainloop's promotion applied the scales)
template <int EPI>
PBG_DEVICE float scale_of_m(const float* s, int i) {
  if constexpr (EpiBlock<EPI>::kOn) return 1.f;
  else return s[(EPI & kEpiScaleMOne) ? 0 : i];
}
template <int EPI>
PBG_DEVICE float scale_of_n(const float* s, int j) {
  if constexpr (EpiBlock<EPI>::kOn) return 1.f;
  else return s[(EPI & kEpiScaleNOne) ? 0 : j];
}
// A block-scaled product's scale (EpiBlock's MODE) of row / column `idx` of a side whose extent
// is `dim`, in K block q of kbn.
template <int MODE>
PBG_DEVICE float block_scale(const float* s, int idx, int dim, int q, int kbn) {
  if constexpr (MODE == 1) return s[0];
  else if constexpr (MODE == 2) return s[idx];
  else if constexpr (MODE == 3) return s[static_cast<i64>(idx) * kbn + q];
  else return s[static_cast<i64>(q) * ((dim + 127) >> 7) + (idx >> 7)];
}
// The output of the Ozaki moduli GEMM's digit store (EPI & kEpiResidue): one unsigned byte, the
// CRT digit of the int32 product (residue_digit); alpha is 1 and C is never read.
struct ResidueOut {
  typedef int Scale;
  typedef int Acc;
  static constexpr int kCBytes = 1;
  static PBG_DEVICE int c_from_bits(u32 h) { return static_cast<int>(h & 0xffu); }
  static PBG_DEVICE int load_c(const char* p) { return *reinterpret_cast<const unsigned char*>(p); }
  static PBG_DEVICE u32 cvt_c(int v) { return static_cast<u32>(v) & 0xffu; }
};
// One modulus's digit constants, as the launch's table holds them (kResidueWords u32 per batch
// entry, 32 bytes: two aligned 16-byte loads): p, the Barrett magic ceil(2^38 / p), (2^16 y)
// mod p, y mod p and (-2^31 y) mod p for the CRT coefficient y of that modulus.
constexpr int kResidueWords = 8;
// u = (x * y) mod p for any int32 x in one Barrett step (ozaki.cuh's crt_digit with the
// constants passed in): x = (h - 2^15) 2^16 + lo with h = (x >> 16) + 2^15 and lo = x & 0xffff,
// so x y = h (2^16 y) + lo y - 2^31 y, a sum below 2 * 65535 * 255 + 255 < 2^25, where
// q = (s * magic) >> 38 is the exact quotient (s < 2^30; magic - 2^38 / p < 1).
PBG_DEVICE int residue_digit(int x, u32 p, u32 magic, u32 y16, u32 y, u32 yneg31) {
  const u32 h = (static_cast<u32>(x) >> 16) ^ 0x8000u;
  const u32 s = h * y16 + (static_cast<u32>(x) & 0xffffu) * y + yneg31;
  const u32 q = static_cast<u32>((static_cast<unsigned long long>(s) * magic) >> 38);
  return static_cast<int>(s - q * p);
}
// The type the store writes: the kind's C, the dequantized output, or the digit byte.
template <class Kind, int EPI, bool DQ = (EPI & kEpiDequant) != 0, bool RES = (EPI & kEpiResidue) != 0>
struct EpiOut { typedef Kind type; };
template <class Kind, int EPI>
struct EpiOut<Kind, EPI, true, false> { typedef DequantOut<(EPI >> kEpiOutShift) & 3> type; };
template <class Kind, int EPI>
struct EpiOut<Kind, EPI, false, true> { typedef ResidueOut type; };

// v = alpha * s + beta * c (float kinds: the plain store's arithmetic), or for a dequantized
// product alpha * ((scale_m * scale_n) * float(s)) + beta * c (pyblasgemm.epilogue's order);
// then v + bias (when has_bias: an absent bias leaves -0 as it is). Returns the pre-activation value.
template <class Kind, int EPI>
PBG_DEVICE float epi_value(typename Kind::Stage s, float alpha, float beta, bool read_c, float c_old,
                           float scale, bool has_bias, float bias) {
  constexpr bool DQ = (EPI & kEpiDequant) != 0;
  static_assert(DQ || (sizeof(typename Kind::Scale) == 4 && static_cast<typename Kind::Scale>(0.5f) != 0),
                "fused epilogues: float kinds, or int8 dequantized to float");
  float v;
  if constexpr (DQ) {
    v = mul_ieee(alpha, mul_ieee(scale, static_cast<float>(s)));
    if (read_c) v = add_ieee(v, mul_ieee(beta, c_old));
  } else {
    v = read_c ? axpby(alpha, s, beta, c_old) : ax(alpha, s);
  }
  return has_bias ? add_ieee(v, bias) : v;
}

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
  // s += ws, element-wise, in the stage type (fp32 add or s32 add: stage_add).
  static PBG_DEVICE void smem_add_ws(Stage* s, const Stage* ws) {
#pragma unroll 4
    for (int id = threadIdx.x; id < BM * BN / 4; id += THREADS) {
      const int c = id / (BM / 4), r = (id % (BM / 4)) * 4;
      float4 w = __ldcg(reinterpret_cast<const float4*>(ws) + id);
      Stage* d = s + c * LDS + r;
      const Stage* wv = reinterpret_cast<const Stage*>(&w);
      d[0] = stage_add(d[0], wv[0]); d[1] = stage_add(d[1], wv[1]);
      d[2] = stage_add(d[2], wv[2]); d[3] = stage_add(d[3], wv[3]);
    }
  }

  // C[m0:, n0:] = alpha * s + beta * C (C not read when beta == 0), edges predicated; with a
  // fused epilogue (EPI != 0) store_fused.
  template <int EPI = 0>
  static PBG_DEVICE void store_c(const Stage* s, const GemmParams& p, int b, int m0, int n0) {
    if constexpr (EPI != 0) {
      store_fused<EPI>(s, p, b, m0, n0);
      return;
    }
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

  // The fused store: out = act(v) with v = epi_value(...), the pre-activation v to p.pre (C's
  // layout and type, and C's alignment modulo 16 bytes: the host checks) when given; in the output type EpiOut (the kind's C, or the
  // dequantized float type). Same walk and 16-byte stores as store_c. The bias, the scales and
  // a column's values are read once per 16-byte chunk (<= 8 values), from L1/L2.
  template <int EPI>
  static PBG_DEVICE void store_fused(const Stage* s, const GemmParams& p, int b, int m0, int n0) {
    typedef typename EpiOut<Kind, EPI>::type Out;
    constexpr bool DQ = (EPI & kEpiDequant) != 0;
    constexpr int OCB = Out::kCBytes, OOV = 16 / OCB;
    static_assert((BM * BN / OOV) % THREADS == 0, "tile / threads");
    const float alpha = DQ ? p.alpha : static_cast<float>(pick_scale(static_cast<Scale*>(nullptr), p.alpha, p.ialpha));
    const float beta = DQ ? p.beta : static_cast<float>(pick_scale(static_cast<Scale*>(nullptr), p.beta, p.ibeta));
    const bool read_c = beta != 0.f;
    const i64 boff = static_cast<i64>(b) * p.sc * OCB;
    char* Cb = p.C + boff;
    char* Pb = p.pre != nullptr ? p.pre + boff : nullptr;
#pragma unroll 1
    for (int id = threadIdx.x; id < BM * BN / OOV; id += THREADS) {
      const int c = id / (BM / OOV), r = (id % (BM / OOV)) * OOV;
      const int gm = m0 + r, gn = n0 + c;
      if (gn >= p.n || gm >= p.m) continue;
      const i64 off = (static_cast<i64>(gn) * p.ldc + gm) * OCB;
      char* cp = Cb + off;
      const Stage* sv = s + c * LDS + r;
      const float sn = DQ && !EpiBlock<EPI>::kOn ? scale_of_n<EPI>(p.scale_n, gn) : 1.f;
      const float bn = p.bias_mode == 2 ? Out::load_c(p.bias + static_cast<i64>(gn) * OCB) : 0.f;
      const int cnt = p.m - gm < OOV ? p.m - gm : OOV;
      const bool vec = p.c_vec && cnt == OOV;
      U32x4 old = {0u, 0u, 0u, 0u};
      if (vec && read_c) old = *reinterpret_cast<const U32x4*>(cp);
      const u32* ow = reinterpret_cast<const u32*>(&old);
      u32 out[4] = {0u, 0u, 0u, 0u}, pv[4] = {0u, 0u, 0u, 0u};
#pragma unroll
      for (int e = 0; e < OOV; ++e) {
        if (e >= cnt) break;
        float c_old = 0.f;
        if (read_c) {
          if (vec) c_old = Out::c_from_bits(OCB == 2 ? (ow[e / 2] >> (16 * (e & 1))) & 0xffffu : ow[e]);
          else c_old = Out::load_c(cp + e * OCB);
        }
        const float scale = DQ && !EpiBlock<EPI>::kOn ? mul_ieee(scale_of_m<EPI>(p.scale_m, gm + e), sn) : 1.f;
        const float bias = p.bias_mode == 1 ? Out::load_c(p.bias + static_cast<i64>(gm + e) * OCB) : bn;
        const float v = epi_value<Kind, EPI>(sv[e], alpha, beta, read_c, c_old, scale, p.bias_mode != 0, bias);
        const u32 ov = Out::cvt_c(activate(v, EPI & 7)), pw = Out::cvt_c(v);
        if (vec) {
          const int sh = OCB == 2 ? 16 * (e & 1) : 0;
          out[OCB == 2 ? e / 2 : e] |= ov << sh;
          pv[OCB == 2 ? e / 2 : e] |= pw << sh;
        } else {
          if constexpr (OCB == 2) {
            *reinterpret_cast<u16*>(cp + e * OCB) = static_cast<u16>(ov);
            if (Pb) *reinterpret_cast<u16*>(Pb + off + e * OCB) = static_cast<u16>(pw);
          } else {
            *reinterpret_cast<u32*>(cp + e * OCB) = ov;
            if (Pb) *reinterpret_cast<u32*>(Pb + off + e * OCB) = pw;
          }
        }
      }
      if (vec) {
        *reinterpret_cast<U32x4*>(cp) = U32x4{out[0], out[1], out[2], out[3]};
        if (Pb) *reinterpret_cast<U32x4*>(Pb + off) = U32x4{pv[0], pv[1], pv[2], pv[3]};
      }
    }
  }
};

}  // namespace pyblasgemm
