"""What ``invariant=True`` costs on the GPU, and whether it holds (issue 36, part 3).

    GIT_SHA=<sha> PYTHONPATH=.:bench python bench/invariance.py --out bench/results/invariance_<gpu>_<date>_<sha>.json

* layers: the model-layer corpus (bench/model_corpus.py: x @ W.T as ``torch.nn.Linear`` holds
  W, bfloat16, ten public model configurations, decode and prefill token counts; ``--limit``
  takes every n-th entry); steady GPU time (CUDA events around back-to-back calls) of
  ``matmul(x, w.T, invariant=True)`` against ``matmul(x, w.T)`` (auto) and the yardstick (the
  faster of ``cupy.matmul`` and ``torch.matmul`` on the same bytes); the issue's bar: invariant
  <= 1.10x auto (geomean, all entries and the held-out ones apart); and, per entry, the bits:
  rows 0, M/2 and M-1 alone and the first M/3 rows must equal their rows of the whole call;
* ``--families``: for one problem, every sliced-k configuration of the invariant plan's family
  (forced through ``PYBLASGEMM_CONFIG``) against the invariant plan's bits: which tile shapes
  give the same sums (docs/design/invariance.md: if all do, the invariant key can be the family
  and instruction rather than the whole configuration, and the cost falls).

Operands: ``numpy.random.default_rng([entry index, tokens])`` normal, scaled by 2**U(-6, 6) per
element (sums with terms of many magnitudes: a changed order shows in the last bits).
"""
from __future__ import annotations

import argparse
import os
import sys
import types

import numpy as np

sys.path.insert(0, __import__("pathlib").Path(__file__).resolve().parent.as_posix())
sys.path.insert(0, __import__("pathlib").Path(__file__).resolve().parents[1].as_posix())

from bench.heldout import geomean, meta, write_doc  # noqa: E402
from timing import event_median_s  # noqa: E402
from bench import model_corpus  # noqa: E402


def operands(cp, layer_index: int, tokens: int, k: int, n: int):
    import ml_dtypes

    rng = np.random.default_rng([layer_index, tokens])

    def draw(shape):
        return (rng.standard_normal(shape) * np.exp2(rng.integers(-6, 7, shape))).astype(ml_dtypes.bfloat16)
    return cp.asarray(draw((tokens, k))), cp.asarray(draw((n, k)))


def matmul_plan(n: int, m: int, k: int):
    """The plan ``matmul(x, w.T, invariant=True)`` runs for x (m, k) and W (n, k), both
    row-major: Cᵀ = W xᵀ, its rows along n (``plan()`` would describe the column-major BLAS
    form, whose rows are m)."""
    from pyblasgemm.planner import plan_for
    from pyblasgemm.planner.problem import make_desc

    return plan_for(make_desc(n, m, k, "bf16", transa="T")._replace(invariant="n"))


def bits_hold(cp, pb, x, w) -> bool:
    whole = pb.matmul(x, w.T, invariant=True)
    m = x.shape[0]
    parts = [(i, i + 1) for i in sorted({0, m // 2, m - 1})] + [(0, max(1, m // 3))]
    return all(bool((pb.matmul(x[i:j].copy(), w.T, invariant=True) == whole[i:j]).all()) for i, j in parts)


def layer_rows(cp, torch, pb, every: int = 1) -> list:
    rows = []
    for index, entry in enumerate(model_corpus.load()["entries"][::every]):
        m, n, k = entry["m"], entry["n"], entry["k"]
        row = {"id": entry["id"], "m": m, "n": n, "k": k, "dtype": "bfloat16",
               "held_out": not entry["in_planner_data"]}
        try:
            x, w = operands(cp, index, m, k, n)
            wt = w.T
            tx = torch.as_tensor(x.view(np.int16), device="cuda").view(torch.bfloat16)
            tw = torch.as_tensor(w.view(np.int16), device="cuda").view(torch.bfloat16)
            row["plan"] = matmul_plan(n, m, k).config.name
            row["bits_hold"] = bits_hold(cp, pb, x, w)
            t = {"invariant": event_median_s(lambda: pb.matmul(x, wt, invariant=True)),
                 "auto": event_median_s(lambda: pb.matmul(x, wt)),
                 "cupy.matmul": event_median_s(lambda: cp.matmul(x, wt)),
                 "torch.matmul": event_median_s(lambda: torch.matmul(tx, tw.T))}
            row.update({f"{key}_s": v for key, v in t.items()})
            yard = min(t["cupy.matmul"], t["torch.matmul"])
            row["invariant_vs_auto"] = t["invariant"] / t["auto"]          # the bar: <= 1.10
            row["speedup_vs_yardstick_invariant"] = yard / t["invariant"]
            row["speedup_vs_yardstick_auto"] = yard / t["auto"]
        except Exception as exc:
            row["failure"] = f"{type(exc).__name__}: {exc}"[:300]
        rows.append(row)
        print(row, flush=True)
    return rows


def family_rows(cp, pb, n=4096, m=512, k=4096) -> list:
    """Every sliced configuration of the invariant plan's family on one problem, and whether
    its bits equal the invariant plan's."""
    from pyblasgemm.planner import model
    from pyblasgemm.planner.arch import arch_for_device
    from pyblasgemm.planner.candidates import enumerate_candidates
    from pyblasgemm.planner.problem import make_desc

    x, w = operands(cp, 99, m, k, n)
    want = pb.matmul(x, w.T, invariant=True)
    chosen = matmul_plan(n, m, k).config
    desc = make_desc(n, m, k, "bf16", transa="T")
    configs = sorted({c.config for c in enumerate_candidates(desc, arch_for_device(0), model.load_calibration())
                      if c.score is not None and c.config.decomposition == "sliced" and not c.pack
                      and c.config.family == chosen.family}, key=lambda c: c.name)
    rows = []
    for config in configs:
        row = {"config": config.name, "is_invariant_plans": config == chosen}
        os.environ["PYBLASGEMM_CONFIG"] = config.name
        pb.clear_plan_cache()
        try:
            got = pb.matmul(x, w.T, backend="tensorcore")
            ran = pb.plan(n, m, k, "bf16", transa="T", backend="tensorcore").config.name
            row.update(ran=ran, same_bits=bool((got == want).all()),
                       differing=int((got != want).sum()))
        except Exception as e:
            row["failure"] = f"{type(e).__name__}: {e}"[:300]
        finally:
            del os.environ["PYBLASGEMM_CONFIG"]
            pb.clear_plan_cache()
        rows.append(row)
        print(row, flush=True)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--families", action="store_true", help="only the tile-shape experiment")
    ap.add_argument("--limit", type=int, default=1, help="every n-th corpus entry")
    args = ap.parse_args(argv)
    import cupy as cp
    import torch

    import pyblasgemm as pb

    doc = {"schema": "pyblasgemm-invariance/1",
           **meta(types.SimpleNamespace(torch=torch), seed="numpy.random.default_rng([layer, tokens])"),
           "method": __doc__}
    doc["families"] = family_rows(cp, pb)
    if not args.families:
        doc["layers"] = layer_rows(cp, torch, pb, args.limit)
        ok = [r for r in doc["layers"] if "failure" not in r]
        doc["summary"] = {
            "geomean_invariant_vs_auto": geomean([r["invariant_vs_auto"] for r in ok]),
            "geomean_invariant_vs_auto_held_out": geomean([r["invariant_vs_auto"] for r in ok if r["held_out"]]),
            "geomean_speedup_vs_yardstick_invariant": geomean([r["speedup_vs_yardstick_invariant"] for r in ok]),
            "bits_hold_everywhere": all(r["bits_hold"] for r in ok) and bool(ok)}
        print(doc["summary"], flush=True)
    write_doc(doc, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
