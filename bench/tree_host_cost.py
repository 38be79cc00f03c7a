"""Host µs per call of one source tree's pyblasgemm at 64³ float16, on each route, beside
``torch.matmul`` and ``cupy.matmul`` in the same process: run it once per tree, alternating the
trees, and compare the trees by their ratios to the yardsticks (and by µs, where the runs
alternate on one machine).

Issue 35's condition for moving the launches and the cuBLASLt calls onto the public CUDA
bindings: the host cost per call must be no worse than before the move. The old tree (before
the move, e.g. ``git worktree add /tmp/old 25a6ec1``) and the new one import the same package
name, so they cannot share a process; this file imports only the tree it is given.

    python bench/tree_host_cost.py --tree /tmp/old --label old --out old_1.json
    python bench/tree_host_cost.py --tree . --label new --out new_1.json
    python bench/tree_host_cost.py --combine old_1.json new_1.json ... --out both.json

Each row is bench/timing.py's ``paired_host_us``: the median of ``--rounds`` rounds of
``--calls`` back-to-back calls, every form and yardstick timed once a round (interleaved, so a
drift of the host's speed falls on all alike: this host's µs moved by up to ~40% between
processes), the device synchronized after each round (a round's time is the host's issue time
while the GPU keeps up: 64³ kernels take ~3-5 µs of GPU time). The run of 50c5b05 timed each
round with its synchronize inside (~0.01 µs a call at 1000 calls).
"""
from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import platform
import statistics
import sys

N = 64
SEED = 0            # the operands: cupy.random.default_rng(SEED)
FORMS = ("matmul", "matmul out=", "raw hgemm")
ROUTES = ("auto", "tensorcore", "cublas")


def measure(tree: str, label: str, calls: int, rounds: int) -> dict:
    sys.path.insert(0, str(pathlib.Path(tree).resolve()))
    import cupy as cp
    import torch

    import pyblasgemm as pbg
    from timing import paired_host_us       # bench/timing.py, beside this file (not the tree's)

    where = pathlib.Path(pbg.__file__).resolve()
    if pathlib.Path(tree).resolve() not in where.parents:
        raise SystemExit(f"tree_host_cost: pyblasgemm came from {where}, not from --tree {tree}")
    rng = cp.random.default_rng(SEED)
    a = rng.standard_normal((N, N), dtype=cp.float32).astype(cp.float16)
    b = rng.standard_normal((N, N), dtype=cp.float32).astype(cp.float16)
    c = cp.empty((N, N), cp.float16)
    # the raw form takes column-major buffers (reference BLAS)
    fa, fb, fc = cp.asfortranarray(a), cp.asfortranarray(b), cp.empty((N, N), cp.float16, order="F")
    ta, tb = torch.as_tensor(a, device="cuda"), torch.as_tensor(b, device="cuda")
    tc = torch.empty((N, N), dtype=torch.float16, device="cuda")

    def form(name, route):
        kw = {} if route == "auto" else {"backend": route}
        if name == "matmul":
            return lambda: pbg.matmul(a, b, **kw)
        if name == "matmul out=":
            return lambda: pbg.matmul(a, b, out=c, **kw)
        return lambda: pbg.hgemm("N", "N", N, N, N, 1.0, fa, N, fb, N, 0.0, fc, N, **kw)

    fns = {"torch.matmul": lambda: torch.matmul(ta, tb),
           "torch.matmul(out=)": lambda: torch.matmul(ta, tb, out=tc),
           "cupy.matmul": lambda: cp.matmul(a, b),
           "cupy.matmul(out=)": lambda: cp.matmul(a, b, out=c)}
    for route in ROUTES:
        for name in FORMS:
            fns[f"{name} | {route}"] = form(name, route)
    us = paired_host_us(fns, calls, rounds)
    yard = {name: us[name] for name in list(fns)[:4]}
    rows = []
    for route in ROUTES:
        for name in FORMS:
            base = "(out=)" if name != "matmul" else ""
            host = us[f"{name} | {route}"]
            rows.append({"form": name, "route": route, "host_us": host,
                         "speedup_vs_torch": yard["torch.matmul" + base] / host})   # > 1: faster
    props = cp.cuda.runtime.getDeviceProperties(0)
    try:        # which cuBLASLt binding the tree's cuBLAS route called (trees that say)
        from pyblasgemm.backends import cublaslt
        lt = cublaslt.status().get("binding")
    except (ImportError, AttributeError):
        lt = None
    return {"label": label, "tree": str(pathlib.Path(tree).resolve()), "package_file": str(where),
            "version": getattr(pbg, "__version__", "?"), "rows": rows, "yardsticks_us": yard,
            "lt_binding": lt,
            "device": props["name"].decode(), "driver": cp.cuda.runtime.driverGetVersion(),
            "cupy": cp.__version__, "torch": torch.__version__, "python": platform.python_version(),
            "calls_per_round": calls, "rounds": rounds,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def combine(files: list[str]) -> dict:
    """The runs side by side: per (form, route) and label, the median over the runs of the
    host µs and of the speedup over torch.matmul (> 1: faster); ``new_over_old_speedup``: the new tree's
    speedup over torch.matmul over the old's (> 1: the new is faster; the comparison to trust),
    ``old_over_new_us``: the µs ratio (the host's speed drifts between processes)."""
    runs = [json.loads(pathlib.Path(f).read_text()) for f in files]
    table: dict = {}
    for run in runs:
        for r in run["rows"]:
            cell = table.setdefault(f"{r['form']} | {r['route']}", {}).setdefault(
                run["label"], {"us": [], "ratio": []})
            cell["us"].append(r["host_us"])
            cell["ratio"].append(r["speedup_vs_torch"])
    summary = {}
    for key, by_label in table.items():
        summary[key] = {label: {"host_us_median": statistics.median(v["us"]),
                                "speedup_vs_torch_median": statistics.median(v["ratio"]),
                                "host_us_runs": v["us"]} for label, v in by_label.items()}
        if {"old", "new"} <= by_label.keys():
            # by the ratio to torch.matmul in each process (the host's speed drifts between
            # processes; within one, the rounds interleave): > 1, the new tree is faster
            summary[key]["new_over_old_speedup"] = (summary[key]["new"]["speedup_vs_torch_median"]
                                                    / summary[key]["old"]["speedup_vs_torch_median"])
            summary[key]["old_over_new_us"] = (summary[key]["old"]["host_us_median"]
                                               / summary[key]["new"]["host_us_median"])
    first = runs[0]
    return {"schema": "tree_host_cost/1", "device_name": first["device"], "driver_version": first["driver"],
            "cupy": first["cupy"], "torch": first["torch"], "python": first["python"],
            "date": first["date"], "trees": {r["label"]: r["tree"] for r in runs},
            "run_order": [r["label"] for r in runs], "summary": summary, "runs": runs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tree")
    ap.add_argument("--label")
    ap.add_argument("--out", required=True)
    ap.add_argument("--calls", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--combine", nargs="+")
    args = ap.parse_args()
    if args.combine:
        # run from the new tree: its collector records device, driver, versions, settings,
        # NVRTC, date and commit (GIT_SHA where the tree's own git metadata is stale)
        sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
        from bench.heldout import Gpu, meta

        doc = {**meta(Gpu(), seed=SEED), **combine(args.combine)}
    else:
        if not (args.tree and args.label):
            ap.error("--tree and --label are needed (or --combine FILES)")
        doc = measure(args.tree, args.label, args.calls, args.rounds)
    pathlib.Path(args.out).write_text(json.dumps(doc, indent=1))
    print(json.dumps(doc.get("summary", doc.get("rows")), indent=1))


if __name__ == "__main__":
    main()
