"""One launch of pyblasgemm's Hopper int8 GEMM kernel or of its float8 GEMM kernel inside a
profiler range, for Nsight Compute: the profiles issues 34 (the int8 mainloop, 1,500 TOPS) and
36 (FP8 against ``torch._scaled_mm``) lacked.

    ncu --profile-from-start off --clock-control none -k regex:sm90_gemm_kernel -c 1 \\
        --section SpeedOfLight --section Occupancy --section WarpStateStats \\
        python bench/ncu_close.py int8

Cases: ``int8``: ``igemm('T', 'N', ...)`` at 8192³ (x @ w.T, both K-contiguous, as
bench/ozaki.py's igemm rows time it) forced onto our kernel (``backend='tensorcore'``), then
cuBLAS's (``backend='cublas'``, cublasGemmEx) on the same bytes; ``fp8``: 8192³ e4m3 x e4m3 -> bfloat16 with per-tensor
scales (bench/fp8.py's square row) forced onto our kernel (``backend='tensorcore'``), then
cuBLASLt's (``backend='cublas'``). Ours runs first in the range, so ``-k
regex:sm90_gemm_kernel -c 1`` (or ``-c 1`` alone) takes it; ``-c 2`` without the filter takes
cuBLAS's too. Every call runs 3 times before the range (NVRTC compile, cuBLAS's heuristics),
and each profiled call is followed by a synchronize. The plan (config) is printed first.

Expected time on one H200: ~10-20 s a case without ncu (a cold compile of one kernel and the
operands); under ncu with the three sections ~20-40 s (one kernel replayed per section pass).
"""
from __future__ import annotations

import sys

CASES = ("int8", "fp8")
#: the square size of both cases (the issues' 8192³ targets)
SIZE = 8192


def _int8(cp, pb, s):
    """(plan line, ours, cuBLAS's) for igemm 'T', 'N' at s³."""
    rs = cp.random.RandomState(34)
    x = rs.randint(-128, 128, size=(s, s), dtype=cp.int32).astype(cp.int8)
    w = rs.randint(-128, 128, size=(s, s), dtype=cp.int32).astype(cp.int8)
    x1, w1, c1 = x.ravel(), w.ravel(), cp.empty(s * s, cp.int32)

    def call(backend):
        return lambda: pb.igemm("T", "N", s, s, s, 1, x1, s, w1, s, 0, c1, s, backend=backend)

    # ours forced: on its own plan the call ran cuBLAS (its predicted 1.21x was inside the
    # planner's margin; the H200 closing run at f0ce588), and ncu found no kernel of ours
    plan = next(line for line in pb.plan(s, s, s, "int8", transa="T", backend="tensorcore").explain().splitlines()
                if line.startswith("plan:"))
    return plan, call("tensorcore"), call("cublas")


def _fp8(cp, pb, s):
    """(plan line, ours, cuBLASLt's) for e4m3 x e4m3 -> bfloat16 at s³, per-tensor scales."""
    import ml_dtypes
    import torch

    torch.manual_seed(36)
    x = (torch.randn(s, s, device="cuda") * 0.5).to(torch.float8_e4m3fn)
    w = (torch.randn(s, s, device="cuda") * 0.5).to(torch.float8_e4m3fn)
    e4m3 = ml_dtypes.float8_e4m3fn
    a = cp.from_dlpack(x.view(torch.uint8)).view(e4m3)
    b = cp.from_dlpack(w.view(torch.uint8)).view(e4m3).T             # K x N, column-major
    sa = cp.from_dlpack(torch.tensor(0.75, device="cuda"))
    sb = cp.from_dlpack(torch.tensor(1.25, device="cuda"))

    def call(backend):
        return lambda: pb.matmul(a, b, scale_a=sa, scale_b=sb, dtype=ml_dtypes.bfloat16, backend=backend)

    return f"float8 {s}^3 per-tensor scales forced onto backend='tensorcore' (Sm90KindFp8)", call("tensorcore"), \
        call("cublas")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or argv[0] not in CASES:
        raise SystemExit(f"usage: ncu_close.py CASE, CASE one of {', '.join(CASES)} (got {' '.join(argv) or 'none'})")
    import cupy as cp

    import pyblasgemm as pb

    plan, ours, theirs = (_int8 if argv[0] == "int8" else _fp8)(cp, pb, SIZE)
    print(argv[0], SIZE, plan, flush=True)
    for _ in range(3):
        ours()
        theirs()
    cp.cuda.Device().synchronize()
    cp.cuda.profiler.start()
    for who, fn in (("ours", ours), ("cuBLAS", theirs)):
        fn()
        cp.cuda.Device().synchronize()
        print("profiled:", argv[0], who, flush=True)
    cp.cuda.profiler.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
