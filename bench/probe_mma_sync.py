"""Where does mma.sync fp16 top out on this GPU, before any global memory traffic?

One persistent CTA per SM (or several) runs a warp tile's worth of mma.sync m16n8k16 (fp32
accumulators) per k-step, in three modes:

- mode 0: fragments stay in registers (the tensor pipe's rate for an HMMA stream);
- mode 1: every k-step's fragments are loaded by ldmatrix from shared memory first (double
  buffered, as the GEMM mainloop does), conflict-free addresses;
- mode 2: mode 1 plus a CTA barrier every 4 k-steps (the cp.async ring's stage barrier).

Warp tiles 64x64 (MI=4, NI=8: the GEMM's), 64x32, 32x64 and 32x32, at 4..16 warps per SM.

    PYTHONPATH=. python bench/probe_mma_sync.py --out bench/results/mma_probe_h100_$(date +%F).json
"""
import argparse
import json
import os

import cupy as cp
import numpy as np

SRC = r'''
#include <pyblasgemm/ptx/sm80_mma.cuh>
#include <pyblasgemm/ptx/sm75_ldmatrix.cuh>
using namespace pyblasgemm;
// MODE 0: fragments stay in registers; 1: fragments from smem by ldmatrix each k-step (double
// buffered); 2: as 1 plus a CTA barrier every KS k-steps.
template <int MI, int NI, int KS, int MODE>
__global__ void probe(float* out, int iters) {
  extern __shared__ __align__(128) char smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int i = threadIdx.x; i < 49152 / 4; i += blockDim.x) reinterpret_cast<u32*>(smem)[i] = 0x3c003c00u ^ (i * 2654435761u & 0x00ff00ffu);
  __syncthreads();
  float acc[MI][NI][4];
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int j = 0; j < NI; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[i][j][r] = 0.f;
  u32 fa[2][MI][4], fb[2][NI][2];
  const u32 sbase = static_cast<u32>(__cvta_generic_to_shared(smem));
  // per-warp window (wrapped in 48 KB): A fragments from its first 4 KB, B from the next 2 KB
  // (512 contiguous bytes per ldmatrix x4: conflict-free; the values do not matter)
  const u32 wa = sbase + ((warp * 6144) % 43008) + lane * 16;
  auto load = [&](int ks, int buf) {
#pragma unroll
    for (int i = 0; i < MI; ++i) ldsm_x4(wa + ((i * KS + ks) * 512) % 4096, fa[buf][i][0], fa[buf][i][1], fa[buf][i][2], fa[buf][i][3]);
#pragma unroll
    for (int j = 0; j < NI / 2; ++j) ldsm_x4(wa + 4096 + ((j * KS + ks) * 512) % 2048, fb[buf][2 * j][0], fb[buf][2 * j][1], fb[buf][2 * j + 1][0], fb[buf][2 * j + 1][1]);
  };
  load(0, 0);
  if (MODE == 0) load(1, 1);
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
      if (MODE != 0) load((ks + 1) % KS, (ks + 1) & 1);
#pragma unroll
      for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < NI; ++j) {
          const int jj = (i & 1) ? NI - 1 - j : j;
          SM80_16x8x16_F32F16F16F32_TN::fma(acc[i][jj], fa[ks & 1][i], fb[ks & 1][jj]);
        }
      if (MODE == 2 && ks == KS - 2) __syncthreads();
    }
  }
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int j = 0; j < NI; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) s += acc[i][j][r];
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}
'''
ap = argparse.ArgumentParser()
ap.add_argument("--out", default=None)
args = ap.parse_args()
inc = os.path.join(os.path.dirname(__file__), "..", "pyblasgemm", "kernels", "include")
cases = []
for (mi, ni) in ((4, 8), (4, 4), (2, 8), (2, 4)):
    for mode in (0, 1, 2):
        cases.append((mi, ni, 4, mode))
names = [f"probe<{a},{b},{c},{d}>" for a, b, c, d in cases]
mod = cp.RawModule(code=SRC, options=("-std=c++17", "-I" + os.path.abspath(inc)), name_expressions=names)
sms = cp.cuda.Device().attributes["MultiProcessorCount"]
res = []
for (mi, ni, ks, mode), nm in zip(cases, names):
    k = mod.get_function(nm)
    k.max_dynamic_shared_size_bytes = 49152
    regs = k.num_regs
    for warps_per_sm in (4, 8, 12, 16):
        for wpc in (4, 8, 16):   # warps per CTA
            if warps_per_sm % wpc or wpc > warps_per_sm:
                continue
            ctas_per_sm = warps_per_sm // wpc
            if regs * 32 * warps_per_sm > 65536 or ctas_per_sm * 49152 > 227 * 1024:
                continue
            grid = sms * ctas_per_sm
            out = cp.empty(grid * wpc * 32, cp.float32)
            iters = 4000
            kargs = (out, np.int32(iters))
            k((grid,), (wpc * 32,), kargs, shared_mem=49152)
            cp.cuda.Device().synchronize()
            ts = []
            for _ in range(5):
                e0, e1 = cp.cuda.Event(), cp.cuda.Event()
                e0.record(); k((grid,), (wpc * 32,), kargs, shared_mem=49152); e1.record(); e1.synchronize()
                ts.append(cp.cuda.get_elapsed_time(e0, e1) * 1e-3)
            t = float(np.median(ts))
            flops = 2.0 * 16 * 8 * 16 * mi * ni * ks * iters * grid * wpc
            r = dict(mi=mi, ni=ni, ks=ks, mode=mode, regs=regs, warps_per_sm=warps_per_sm, warps_per_cta=wpc, tflops=flops / t / 1e12)
            res.append(r)
            print(json.dumps(r), flush=True)
if args.out:
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    with open(args.out, "w") as f:
        from pyblasgemm.benchmarks.suite import provenance   # (no operands: registers only)
        json.dump({**provenance(None), "device": props["name"].decode(), "sm_count": sms,
                   "results": res}, f, indent=1)
