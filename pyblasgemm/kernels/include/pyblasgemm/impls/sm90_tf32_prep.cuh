// Operand preparation for the Hopper kernel's fp32 paths (tf32 and 3xTF32 on wgmma).
//
// tf32 wgmma reads K-major operands only and truncates the low mantissa bits it ignores. This
// kernel writes op(X) (rows x k, either stored layout, any leading dimension or alignment) as
// a K-major fp32 matrix of SECTIONS blocks of `kpad` columns each (kpad: k rounded up to a
// stage, 32, zero-filled), every value rounded to nearest tf32 (cvt.rna, as the mma.sync
// kinds round), so the GEMM sees exactly the operands the host reference rounds:
//     SECTIONS = 1 (tf32):    [ big ]
//     SECTIONS = 2 (3xTF32):  [ big | small ], big = tf32(x), small = tf32(x - big); section s
//                             holds `small` where bit s of `small_mask` is set (0b10).
// (The GEMM loads 32 k of both halves per stage and forms small*big + big*small + big*big.)
// A 32 x 32 tile goes through shared memory so that both the read (along the stored
// contiguous dimension) and the write (along K) are coalesced.
#pragma once
#include "../arch.cuh"
#include "../ptx/sm80_cvt.cuh"

namespace pyblasgemm {

// grid: (kpad / 32, ceil(rows / 32), batch); block: 32 x 8; SECTIONS: 1 (tf32) or 2 (3xTF32).
// x(r, p) = X[z * sx + r * ldx + p] when k_major, else X[z * sx + p * ldx + r].
template <int SECTIONS>
__global__ void __launch_bounds__(256)
    sm90_tf32_prep(const float* __restrict__ X, float* __restrict__ out, int rows, int k, long long ldx,
                   long long sx, int k_major, int kpad, int small_mask) {
  __shared__ float tile[32][33];  // +1 column: conflict-free transposed access
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int p0 = blockIdx.x * 32, r0 = blockIdx.y * 32, z = blockIdx.z;
  const float* Xz = X + static_cast<long long>(z) * sx;
#pragma unroll
  for (int i = 0; i < 32; i += 8) {
    if (k_major) {
      const int r = r0 + ty + i, p = p0 + tx;
      tile[ty + i][tx] = (r < rows && p < k) ? Xz[static_cast<long long>(r) * ldx + p] : 0.f;
    } else {
      const int r = r0 + tx, p = p0 + ty + i;
      tile[tx][ty + i] = (r < rows && p < k) ? Xz[static_cast<long long>(p) * ldx + r] : 0.f;
    }
  }
  __syncthreads();
  const long long ld_out = static_cast<long long>(SECTIONS) * kpad;
  float* outz = out + static_cast<long long>(z) * rows * ld_out;
#pragma unroll
  for (int i = 0; i < 32; i += 8) {
    const int r = r0 + ty + i, p = p0 + tx;
    if (r >= rows) continue;
    const float x = tile[ty + i][tx];
    const float big = __uint_as_float(f32_to_tf32(x));
    const float small = __uint_as_float(f32_to_tf32(x - big));  // x - big is exact in fp32
    float* row = outz + static_cast<long long>(r) * ld_out + p;
#pragma unroll
    for (int s = 0; s < SECTIONS; ++s) row[static_cast<long long>(s) * kpad] = ((small_mask >> s) & 1) ? small : big;
  }
}

}  // namespace pyblasgemm
