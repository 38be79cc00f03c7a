"""The FP32 FMA kernel kind ('f32') against cuBLAS's SGEMM: GPU time per shape, the tile
efficiency the planner's model implies, and host µs per call (issue 31: float32 products from
PyTorch at torch.matmul's host cost).

* ``gpu``: per (m, n, k, layout), the GPU seconds of our f32 kernel with each shipped tile
  forced (``PYBLASGEMM_CONFIG``), of the planner's own choice (``backend='tensorcore'``) and of
  cuBLAS (``backend='cublas'``) on the same CuPy operands (event_median_s, same process); the
  ratio is cuBLAS's time over ours (> 1: ours faster).
* ``efficiency``: for the two shipped sliced tiles, the fraction of the FP32 FMA peak that the
  model's compute term implies at >= 2 waves (model compute time at efficiency 1 over the
  measured time, median over shapes and layouts): what ``planner.model.SIMT_ENTRY`` holds.
* ``host``: host µs per call at 64^3 float32 (paired rounds): ``pyblasgemm.matmul`` on torch
  tensors (plain and ``out=``) and on CuPy arrays, ``torch.matmul``, and the fused
  ``bias=`` + ``gelu`` call against ``torch.addmm`` + ``gelu``, with the route each took.

    GIT_SHA=<sha> PYTHONPATH=.:bench python bench/simt_f32.py --out bench/results/simt_f32_<gpu>_<date>_<sha>.json
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import types

import numpy as np

sys.path.insert(0, __import__("pathlib").Path(__file__).resolve().parent.as_posix())
sys.path.insert(0, __import__("pathlib").Path(__file__).resolve().parents[1].as_posix())

from bench.heldout import geomean, meta, write_doc  # noqa: E402
from timing import event_median_s, paired_host_us  # noqa: E402

SEED = 31
SHAPES = [(64, 64, 64), (128, 128, 128), (256, 256, 256), (512, 512, 512), (1024, 1024, 1024),
          (333, 4096, 1024), (2048, 2048, 2048), (4096, 4096, 4096)]
LAYOUTS = ("NN", "NT", "TN", "TT")


def _operands(cp, rng, m, n, k, layout):
    a = rng.standard_normal((k, m) if layout[0] == "T" else (m, k)).astype(np.float32)
    b = rng.standard_normal((n, k) if layout[1] == "T" else (k, n)).astype(np.float32)
    return cp.asarray(a), cp.asarray(b)


def gpu_rows(cp, pb, quick):
    from pyblasgemm.kernels.config import SHIPPED_CONFIGS

    rng = np.random.default_rng(SEED)
    tiles = {"128x128": SHIPPED_CONFIGS["f32"][0], "64x64": SHIPPED_CONFIGS["f32"][5]}
    rows = []
    for (m, n, k) in SHAPES[:5] if quick else SHAPES:
        for layout in LAYOUTS if (m, n, k) in ((1024, 1024, 1024), (4096, 4096, 4096)) else ("NN",):
            a, b = _operands(cp, rng, m, n, k, layout)
            ta, tb = layout[0], layout[1]
            row = {"m": m, "n": n, "k": k, "layout": layout}

            def call(backend):
                return lambda: pb.gemm(ta, tb, a, b, backend=backend)

            ref = pb.gemm(ta, tb, a, b, backend="cublas")
            row["cublas_s"] = event_median_s(call("cublas"))
            os.environ.pop("PYBLASGEMM_CONFIG", None)
            pb.clear_plan_cache()
            row["auto_backend"] = pb.plan(m, n, k, "f32", transa=ta, transb=tb).backend
            got = pb.gemm(ta, tb, a, b, backend="tensorcore")
            row["tensorcore_s"] = event_median_s(call("tensorcore"))
            row["tensorcore_rel_err_vs_cublas"] = float(cp.linalg.norm(got - ref) / cp.linalg.norm(ref))
            for name, cfg in tiles.items():
                os.environ["PYBLASGEMM_CONFIG"] = cfg.name
                pb.clear_plan_cache()
                try:
                    row[f"{name}_s"] = event_median_s(call("tensorcore"))
                except NotImplementedError as e:
                    row[f"{name}_s"] = None
                    row[f"{name}_refused"] = str(e)[:200]
            os.environ.pop("PYBLASGEMM_CONFIG", None)
            pb.clear_plan_cache()
            row["ratio_cublas_over_ours"] = row["cublas_s"] / row["tensorcore_s"]
            print(row, flush=True)
            rows.append(row)
    return rows


def efficiency(rows):
    """Implied fraction of the FP32 FMA peak per shipped sliced tile (see the docstring)."""
    from pyblasgemm.kernels.config import SHIPPED_CONFIGS
    from pyblasgemm.kernels.problem import KernelProblem
    from pyblasgemm.planner import model
    import pyblasgemm as pb

    arch = pb.plan(64, 64, 64, "f32").arch          # the device's, as the planner reads it
    cal = model.load_calibration()
    saved = dict(model.SIMT_ENTRY)
    model.SIMT_ENTRY.update(workhorse_eff=1.0, tiles={})
    out = {}
    try:
        for name, cfg in (("128x128", SHIPPED_CONFIGS["f32"][0]), ("64x64", SHIPPED_CONFIGS["f32"][5])):
            implied = []
            for r in rows:
                t = r.get(f"{name}_s")
                if not t:
                    continue
                ta, tb, m, n, k = r["layout"][0], r["layout"][1], r["m"], r["n"], r["k"]
                p = KernelProblem("f32", ta, tb, m, n, k, m if ta == "N" else k, k if tb == "N" else n, m,
                                  0, 0, 0)
                tiles = -(-r["m"] // cfg.bm) * -(-r["n"] // cfg.bn)
                if tiles < 2 * arch.sm_count:
                    continue
                implied.append(model.score_ours(cfg, p, arch, cal).compute / t)
            out[name] = {"tile_key": model.tile_key(cfg, "f32"), "points": len(implied),
                         "implied_eff": statistics.median(implied) if implied else None}
    finally:
        model.SIMT_ENTRY.clear()
        model.SIMT_ENTRY.update(saved)
    return out


def host_rows(cp, torch, pb):
    from pyblasgemm.epilogue import last_route

    torch.manual_seed(SEED)
    x = torch.randn(64, 64, device="cuda")
    w = torch.randn(64, 64, device="cuda")
    bias = torch.randn(64, device="cuda")
    out = torch.empty(64, 64, device="cuda")
    cx, cw, cb = cp.asarray(x), cp.asarray(w), cp.asarray(bias)
    gelu = torch.nn.functional.gelu
    fns = {
        "torch tensors": lambda: pb.matmul(x, w),
        "torch tensors out=": lambda: pb.matmul(x, w, out=out),
        "cupy arrays": lambda: pb.matmul(cx, cw),
        "torch.matmul": lambda: torch.matmul(x, w),
        "torch.matmul out=": lambda: torch.matmul(x, w, out=out),
        "torch tensors fused bias+gelu": lambda: pb.matmul(x, w, bias=bias, activation="gelu"),
        "cupy arrays fused bias+gelu": lambda: pb.matmul(cx, cw, bias=cb, activation="gelu"),
        "torch.addmm+gelu": lambda: gelu(torch.addmm(bias, x, w)),
        "torch tensors, our kernel": lambda: pb.matmul(x, w, backend="tensorcore"),
        "torch tensors fused bias+gelu, our kernel": lambda: pb.matmul(x, w, bias=bias, activation="gelu",
                                                                        backend="tensorcore"),
        "torch tensors, cuBLAS": lambda: pb.matmul(x, w, backend="cublas"),
    }
    us = paired_host_us(fns, calls=2000, rounds=7)
    ref = (x.double() @ w.double()).float()
    got = pb.matmul(x, w)
    pb.matmul(cx, cw, bias=cb, activation="gelu")
    route = last_route()
    return {"us": us, "fused_route": route, "plan": pb.plan(64, 64, 64, "f32").backend,
            "rel_err": float((got - ref).norm() / ref.norm()),
            "vs_torch": us["torch.matmul"] / us["torch tensors"],
            "vs_torch_out": us["torch.matmul out="] / us["torch tensors out="],
            "fused_vs_torch": us["torch.addmm+gelu"] / us["torch tensors fused bias+gelu"],
            "torch_vs_cupy": us["torch tensors"] / us["cupy arrays"],
            "ours_vs_torch": us["torch.matmul"] / us["torch tensors, our kernel"],
            "ours_fused_vs_torch": us["torch.addmm+gelu"] / us["torch tensors fused bias+gelu, our kernel"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true", help="the five smallest shapes only")
    args = ap.parse_args(argv)
    import cupy as cp
    import torch

    import pyblasgemm as pb

    doc = {"schema": "pyblasgemm-simt-f32/1",
           **meta(types.SimpleNamespace(torch=torch), seed=f"numpy default_rng({SEED}); torch.manual_seed({SEED})"),
           "method": __doc__}
    doc["host"] = host_rows(cp, torch, pb)
    print(doc["host"], flush=True)
    doc["gpu"] = gpu_rows(cp, pb, args.quick)
    doc["efficiency"] = efficiency(doc["gpu"])
    doc["summary"] = {"geomean_cublas_over_ours": geomean([r["ratio_cublas_over_ours"] for r in doc["gpu"]])}
    print(doc["efficiency"], doc["summary"], flush=True)
    write_doc(doc, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
