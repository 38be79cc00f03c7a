"""Launch a few GEMV variants and torch.matmul once each inside a profiler range, for Nsight
Compute (``--profile-from-start off``): DRAM throughput, occupancy and warp stall reasons of our
kernel against cuBLAS's on the same layer.

    ncu --clock-control none --profile-from-start off --section SpeedOfLight \\
        --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy \\
        --section LaunchStats python bench/gemv_ncu.py --picks picks.json

Cases: Llama-3-8B gate/up (4096 -> 14336, bfloat16, x @ W.T) at M = 1 and 16: the shipped
tiles before the sweep (f58e290), the sweep's pick (``--picks``, bench/gemv_sweep.py), and
torch.matmul (cuBLAS). Each launch is preceded by a synchronize so ncu sees one kernel at a time.
"""
from __future__ import annotations

import argparse
import json
import sys

sys.path.insert(0, __import__("pathlib").Path(__file__).resolve().parent.as_posix())
sys.path.insert(0, __import__("pathlib").Path(__file__).resolve().parents[1].as_posix())

import gemv_bench as gb  # noqa: E402

BASE = {1: (2, 1, 1, 4, 0), 2: (2, 1, 2, 2, 0)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--picks", default=None)
    ap.add_argument("--layer", default="llama3-8b gate/up")
    args = ap.parse_args(argv)
    import torch

    from pyblasgemm.kernels import gemv

    picks = {}
    if args.picks:
        with open(args.picks) as f:
            picks = {int(g): v for g, v in json.load(f).items()}
    k, n = gb.LAYERS[args.layer]
    cases = []
    for m in (1, 16):
        g = gemv._token_groups(m)
        rot = gb.Rotation(torch, n, k, m, torch.bfloat16, 2, seed=m)
        desc = gb._desc(m, n, k, "bfloat16", (rot.w[0].data_ptr(), rot.x[0].data_ptr(), rot.y[0].data_ptr()))
        variants = [("base", BASE[g], None)]
        if g in picks:
            variants.append(("pick", tuple(picks[g][:5]), picks[g][5]))
        for name, tiles, occ in variants:
            launch = gemv.bind(desc, tiles=tiles, occupancy=occ)
            cases.append((f"m={m} {name} {launch.spec.kernel_name} ctas={launch.spec.ctas}",
                          lambda launch=launch, rot=rot: launch(rot.w[0].data_ptr(), rot.x[0].data_ptr(),
                                                                rot.y[0].data_ptr(), 1.0, 0.0,
                                                                torch.cuda.current_stream().cuda_stream)))
        cases.append((f"m={m} torch.matmul", lambda rot=rot: torch.matmul(rot.x[1], rot.w[1].T, out=rot.y[1])))
    for _, fn in cases:          # compile and warm outside the profiled range
        fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for label, fn in cases:
        print("profiled:", label, flush=True)
        fn()
        torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
