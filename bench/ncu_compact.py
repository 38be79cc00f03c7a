"""Nsight Compute's raw CSV page (``ncu --import REP --csv --page raw``) as compact JSON: per kernel
its duration, DRAM and SM throughput, occupancy (theoretical and achieved), registers, grid, and
the top warp stall reasons (cycles per issued instruction).

    PYTHONPATH=. python bench/ncu_compact.py RAW.csv OUT.json     # on the GPU machine that ran ncu

The provenance is bench/targets33.py's (the profiled program): heldout.meta with its seed.
"""
from __future__ import annotations

import csv
import json
import sys

KEEP = {
    "gpu__time_duration.sum": "duration",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": "dram_pct_peak",
    "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed": "dram_pct_peak",
    "dram__cycles_active.avg.pct_of_peak_sustained_elapsed": "dram_active_pct",
    "dram__bytes_read.sum.per_second": "dram_read_per_s",
    "dram__bytes.sum.per_second": "dram_per_s",
    "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed": "memory_pct_peak",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": "sm_pct_peak",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "achieved_occupancy_pct",
    "sm__maximum_warps_per_active_cycle_pct": "theoretical_occupancy_pct",
    "launch__registers_per_thread": "registers",
    "launch__grid_size": "grid",
    "launch__block_size": "block",
    "launch__shared_mem_per_block_dynamic": "dyn_smem",
    "launch__occupancy_limit_registers": "occ_limit_registers",
    "launch__occupancy_limit_shared_mem": "occ_limit_smem",
    "launch__waves_per_multiprocessor": "waves",
    "smsp__average_warp_latency_per_inst_issued.ratio": "warp_cycles_per_issued_inst",
}
STALL = "smsp__average_warps_issue_stalled_"
STALL_TAIL = "_per_issue_active.ratio"


def compact(path: str) -> list:
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    start = next(i for i, r in enumerate(rows) if r and r[0] == "ID")
    head = rows[start]
    body = [r for r in rows[start + 1:] if r and r[0].strip().isdigit()]
    units = rows[start + 1] if len(rows) > start + 1 and not rows[start + 1][0].strip().isdigit() else [""] * len(head)
    col = {h: i for i, h in enumerate(head)}
    out = []
    for r in body:
        k = {"id": int(r[0]), "kernel": r[col["Kernel Name"]][:160] if "Kernel Name" in col else None}
        for metric, name in KEEP.items():
            if metric in col and r[col[metric]] not in ("", "n/a"):
                k[name] = _num(r[col[metric]])
                if units[col[metric]]:
                    k[name + "_unit"] = units[col[metric]]
        stalls = {}
        for h, i in col.items():
            if h.startswith(STALL) and h.endswith(STALL_TAIL) and "not_issued" not in h:
                v = _num(r[i])
                if isinstance(v, float):
                    stalls[h[len(STALL):-len(STALL_TAIL)]] = v
        k["top_stalls"] = dict(sorted(stalls.items(), key=lambda kv: -kv[1])[:4])
        out.append(k)
    return out


def _num(s: str):
    try:
        return float(s.replace(",", ""))
    except ValueError:
        return s


if __name__ == "__main__":
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))
    from bench import heldout, targets33

    doc = {"schema": "pyblasgemm-ncu-compact/1", "program": "bench/targets33.py --ncu",
           "meta": heldout.meta(heldout.Gpu(), seed=targets33.SEED), "kernels": compact(sys.argv[1])}
    json.dump(doc, open(sys.argv[2], "w"), indent=1, default=str)
    for k in doc["kernels"]:
        print(json.dumps(k)[:300])
