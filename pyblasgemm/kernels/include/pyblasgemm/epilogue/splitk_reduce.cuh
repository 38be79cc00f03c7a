// Parallel split-k reduction: C = alpha * sum_s partial[s] + beta * C, the sum taken in split
// order s = 0, 1, ... so the result is bitwise reproducible; a fused epilogue (EPI != 0) is
// applied once, after the sum.
#pragma once
#include "../arch.cuh"
#include "sm80_smem_epilogue.cuh"

namespace pyblasgemm {

// ws layout: [splits][batch * tiles_m * tiles_n][BN][BM] (the smem tile form, unpadded).
// One thread per 4 consecutive rows of one tile column: float4 workspace loads.
template <class Kind, int BM, int BN, int EPI = 0>
__global__ void __launch_bounds__(256) splitk_reduce_kernel(const void* ws_, void* C_, int m, int n, long long ldc,
                                                            long long sc, int batch, int splits, float alpha,
                                                            float beta, int ialpha, int ibeta, int group_m,
                                                            const void* bias_, void* pre_, int bias_mode,
                                                            const float* scale_m, const float* scale_n) {
  typedef typename Kind::Stage Stage;
  typedef typename Kind::Scale Scale;
  constexpr int CB = Kind::kCBytes;
  const int tiles_m = (m + BM - 1) / BM, tiles_n = (n + BN - 1) / BN;
  const long long tiles = static_cast<long long>(tiles_m) * tiles_n * batch;
  const long long slot = static_cast<long long>(BM) * BN;
  const long long vid = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (vid >= tiles * (slot / 4)) return;
  const long long tile = vid / (slot / 4);
  const int within = static_cast<int>(vid % (slot / 4));
  const int c = within / (BM / 4), r = (within % (BM / 4)) * 4;
  // Same grouped raster as the GEMM kernel, so tile -> (tm, tn) agrees with the writer.
  const int tpb = tiles_m * tiles_n;
  const int b = static_cast<int>(tile / tpb);
  const int lin = static_cast<int>(tile % tpb);
  const int width = group_m * tiles_n, gid = lin / width, first_m = gid * group_m;
  const int gsize = tiles_m - first_m < group_m ? tiles_m - first_m : group_m;
  const int tm = first_m + (lin - gid * width) % gsize, tn = (lin - gid * width) / gsize;
  const int gm = tm * BM + r, gn = tn * BN + c;
  if (gn >= n || gm >= m) return;
  const Stage* ws = static_cast<const Stage*>(ws_);
  Stage acc[4] = {Stage(0), Stage(0), Stage(0), Stage(0)};
  for (int s = 0; s < splits; ++s) {
    float4 w = __ldcg(reinterpret_cast<const float4*>(ws + (s * tiles + tile) * slot) + within);
    const Stage* wv = reinterpret_cast<const Stage*>(&w);
    acc[0] = stage_add(acc[0], wv[0]); acc[1] = stage_add(acc[1], wv[1]);
    acc[2] = stage_add(acc[2], wv[2]); acc[3] = stage_add(acc[3], wv[3]);
  }
  if constexpr (EPI != 0) {
    typedef typename EpiOut<Kind, EPI>::type Out;
    constexpr int OCB = Out::kCBytes;
    constexpr bool DQ = (EPI & kEpiDequant) != 0;
    const float fa = DQ ? alpha : static_cast<float>(pick_scale(static_cast<Scale*>(nullptr), alpha, ialpha));
    const float fb = DQ ? beta : static_cast<float>(pick_scale(static_cast<Scale*>(nullptr), beta, ibeta));
    const char* bias = static_cast<const char*>(bias_);
    const i64 off = (static_cast<i64>(b) * sc + static_cast<i64>(gn) * ldc + gm) * OCB;
    const float bn = bias_mode == 2 ? Out::load_c(bias + static_cast<i64>(gn) * OCB) : 0.f;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if (gm + e < m) {
        char* ep = static_cast<char*>(C_) + off + e * OCB;
        const float c_old = fb != 0.f ? Out::load_c(ep) : 0.f;
        const float scale = DQ && !EpiBlock<EPI>::kOn ? mul_ieee(scale_of_m<EPI>(scale_m, gm + e), scale_of_n<EPI>(scale_n, gn)) : 1.f;
        const float bv = bias_mode == 1 ? Out::load_c(bias + static_cast<i64>(gm + e) * OCB) : bn;
        const float v = epi_value<Kind, EPI>(acc[e], fa, fb, fb != 0.f, c_old, scale, bias_mode != 0, bv);
        const u32 ov = Out::cvt_c(activate(v, EPI & 7));
        if constexpr (OCB == 2) *reinterpret_cast<u16*>(ep) = static_cast<u16>(ov);
        else *reinterpret_cast<u32*>(ep) = ov;
        if (pre_ != nullptr) {
          char* pp = static_cast<char*>(pre_) + off + e * OCB;
          if constexpr (OCB == 2) *reinterpret_cast<u16*>(pp) = static_cast<u16>(Out::cvt_c(v));
          else *reinterpret_cast<u32*>(pp) = Out::cvt_c(v);
        }
      }
    }
    return;
  }
  const Scale a = pick_scale(static_cast<Scale*>(nullptr), alpha, ialpha);
  const Scale bt = pick_scale(static_cast<Scale*>(nullptr), beta, ibeta);
  char* cp = static_cast<char*>(C_) + (static_cast<long long>(b) * sc + static_cast<long long>(gn) * ldc + gm) * CB;
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    if (gm + e < m) {
      char* ep = cp + e * CB;
      Scale v = bt != Scale(0) ? axpby(a, acc[e], bt, Kind::load_c(ep)) : ax(a, acc[e]);
      if constexpr (CB == 2) *reinterpret_cast<u16*>(ep) = static_cast<u16>(Kind::cvt_c(v));
      else *reinterpret_cast<u32*>(ep) = Kind::cvt_c(v);
    }
  }
}

}  // namespace pyblasgemm
