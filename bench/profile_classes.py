"""One call of pyblasgemm (our kernels forced, or the cuBLAS route forced) on one shape, inside
``cudaProfilerStart/Stop``, for Nsight Compute: where our kernels lose a shape class, what
limits them (DRAM or SM throughput, occupancy, the grid).

The shapes are representatives of the held-out corpus' classes, chosen by hand and NOT drawn
from the corpus (bench/corpus.py checks that none of these is in it).

Usage (on a GPU)::

    ncu --clock-control none --profile-from-start off --csv --metrics <list> \\
        python bench/profile_classes.py decode tensorcore
    python bench/profile_classes.py --run-all OUT_DIR    # every case under ncu, CSVs into OUT_DIR
    python bench/profile_classes.py --summarize OUT_DIR  # one line per kernel
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

#: class -> (m, n, k, dtype): numpy.matmul(A (m x k), B (k x n)), both C-contiguous
CASES = {
    "decode": (16, 8192, 8192, "float16"),
    "decode_m1": (1, 8192, 8192, "float16"),
    "longk": (128, 128, 65536, "float16"),
    "small_square": (384, 384, 384, "float16"),
    "odd": (1001, 1999, 3001, "float16"),
    "general": (2048, 64, 2048, "float16"),
}
METRICS = ("gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,"
           "sm__throughput.avg.pct_of_peak_sustained_elapsed,launch__grid_size,"
           "launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active,"
           "launch__occupancy_limit_registers,launch__occupancy_limit_shared_mem")


def run_one(case: str, backend: str) -> None:
    import cupy as cp
    import numpy as np

    import pyblasgemm

    m, n, k, dtype = CASES[case]
    rng = np.random.default_rng(0)
    a = cp.asarray(rng.standard_normal((m, k)).astype(dtype))
    b = cp.asarray(rng.standard_normal((k, n)).astype(dtype))
    for _ in range(3):                       # compile, plan, bind, warm the clocks
        pyblasgemm.matmul(a, b, backend=backend)
    cp.cuda.runtime.deviceSynchronize()
    cp.cuda.runtime.profilerStart()
    pyblasgemm.matmul(a, b, backend=backend)
    cp.cuda.runtime.deviceSynchronize()
    cp.cuda.runtime.profilerStop()
    p = pyblasgemm.plan(n, m, k, dtype, backend=backend)   # C^T = B^T A^T, column-major
    label = p.config.name + ("+pack_" + "".join(p.pack) if p.pack else "") if p.config else "cublas"
    print(f"PLAN {case} {backend} {label}", file=sys.stderr)


def run_all(out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    for case in CASES:
        for backend in ("tensorcore", "cublas"):
            cmd = ["ncu", "--clock-control", "none", "--profile-from-start", "off", "--csv",
                   "--metrics", METRICS, sys.executable, __file__, case, backend]
            res = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ))
            (out_dir / f"{case}_{backend}.csv").write_text(res.stdout)
            (out_dir / f"{case}_{backend}.err").write_text(res.stderr[-4000:])


def summarize(out_dir: Path) -> str:
    """One line per profiled kernel of every case: duration, DRAM and SM throughput (% of peak),
    grid, registers, active warps; then each case's total GPU time."""
    import csv

    lines = []
    for case in CASES:
        for backend in ("tensorcore", "cublas"):
            path = out_dir / f"{case}_{backend}.csv"
            if not path.exists():
                continue
            text = "\n".join(ln for ln in path.read_text().splitlines() if ln.startswith('"'))
            kernels: dict = {}
            for row in csv.DictReader(text.splitlines()):
                k = kernels.setdefault(row["ID"], {"name": row["Kernel Name"].split("(")[0][:60]})
                k[row["Metric Name"]] = row["Metric Value"].replace(",", "")
            total = 0.0
            for k in kernels.values():
                t = float(k.get("gpu__time_duration.sum", 0)) / 1e3
                total += t
                lines.append(f"{case:13} {backend:10} {k['name']:60} {t:9.1f} us  "
                             f"dram {k.get('dram__throughput.avg.pct_of_peak_sustained_elapsed', '?'):>6}%  "
                             f"sm {k.get('sm__throughput.avg.pct_of_peak_sustained_elapsed', '?'):>6}%  "
                             f"grid {k.get('launch__grid_size', '?'):>6}  "
                             f"regs {k.get('launch__registers_per_thread', '?'):>4}  "
                             f"warps {k.get('sm__warps_active.avg.pct_of_peak_sustained_active', '?'):>6}%")
            lines.append(f"{case:13} {backend:10} {'TOTAL':60} {total:9.1f} us")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("case", nargs="?", choices=tuple(CASES))
    ap.add_argument("backend", nargs="?", choices=("tensorcore", "cublas"))
    ap.add_argument("--run-all", metavar="OUT_DIR", type=Path)
    ap.add_argument("--summarize", metavar="OUT_DIR", type=Path)
    args = ap.parse_args(argv)
    if args.run_all:
        run_all(args.run_all)
        print(summarize(args.run_all))
    elif args.summarize:
        print(summarize(args.summarize))
    elif args.case and args.backend:
        run_one(args.case, args.backend)
    else:
        ap.error("give a case and a backend, or --run-all OUT_DIR")
    return 0


if __name__ == "__main__":
    sys.exit(main())
