"""What ``invariant=True`` costs on the GPU, and whether it holds (issue 36, part 3).

    GIT_SHA=<sha> PYTHONPATH=.:bench python bench/invariance.py --out bench/results/invariance_<gpu>_<date>_<sha>.json

* layers: the model-layer corpus (bench/model_corpus.py: x @ W.T as ``torch.nn.Linear`` holds
  W, bfloat16, ten public model configurations, decode and prefill token counts; ``--limit``
  takes every n-th entry); steady GPU time (CUDA events around back-to-back calls) of
  ``matmul(x, w.T, invariant=True)`` against ``matmul(x, w.T)`` (auto) and the yardstick (the
  faster of ``cupy.matmul`` and ``torch.matmul`` on the same bytes); the issue's bar: invariant
  <= 1.10x auto (geomean, all entries and the held-out ones apart); and, per entry, the bits:
  rows 0, M/2 and M-1 alone and the first M/3 rows must equal their rows of the whole call;
* ``--families``: for each problem of ``FAMILY_PROBLEMS``, every sliced-k configuration of each
  kernel family (forced through ``PYBLASGEMM_CONFIG``) against the family's first one's bits and
  the invariant plan's: which tile shapes give the same sums (docs/design/invariance.md: if all do, the invariant key can be the family
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
    return plan_for_invariant(n, m, k, "bf16")


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


#: (n, m, k, dtype) of the tile-shape experiment: a prefill and a small row count, a K that is
#: a multiple of every k-step and one that is not, both 16-bit types
FAMILY_PROBLEMS = ((4096, 512, 4096, "bfloat16"), (4096, 37, 4096, "float16"),
                   (2048, 300, 3000, "bfloat16"))


def family_rows(cp, pb, problems=FAMILY_PROBLEMS) -> list:
    """For each problem and each kernel family: every sliced configuration of the family, and
    whether its bits equal the family's first configuration's (and the invariant plan's, where
    the plan runs that family)."""
    from pyblasgemm.planner import model
    from pyblasgemm.planner.arch import arch_for_device
    from pyblasgemm.planner.candidates import enumerate_candidates
    from pyblasgemm.planner.problem import make_desc

    rows = []
    for index, (n, m, k, dtype) in enumerate(problems):
        x, w = operands(cp, 99 + index, m, k, n)
        if dtype != "bfloat16":
            x, w = x.astype(np.float32).astype(dtype), w.astype(np.float32).astype(dtype)
        short = "bf16" if dtype == "bfloat16" else "f16"
        plan_want = pb.matmul(x, w.T, invariant=True)
        chosen = plan_for_invariant(n, m, k, short).config
        desc = make_desc(n, m, k, short, transa="T")
        configs = sorted({c.config for c in enumerate_candidates(desc, arch_for_device(0), model.load_calibration())
                          if c.score is not None and c.config.decomposition == "sliced" and not c.pack},
                         key=lambda c: (c.family, c.name))
        first: dict = {}
        for config in configs:
            row = {"problem": f"{n}x{m}x{k} {dtype}", "family": config.family, "config": config.name,
                   "is_invariant_plans": config == chosen}
            os.environ["PYBLASGEMM_CONFIG"] = config.name
            pb.clear_plan_cache()
            try:
                got = pb.matmul(x, w.T, backend="tensorcore")
                ran = pb.plan(n, m, k, short, transa="T", backend="tensorcore").config.name
                ref = first.setdefault(config.family, got)
                row.update(ran=ran, same_bits=bool((got == ref).all()), differing=int((got != ref).sum()))
                if config.family == chosen.family:
                    row["same_bits_as_invariant_plan"] = bool((got == plan_want).all())
            except Exception as e:
                row["failure"] = f"{type(e).__name__}: {e}"[:300]
            finally:
                del os.environ["PYBLASGEMM_CONFIG"]
                pb.clear_plan_cache()
            rows.append(row)
            print(row, flush=True)
    return rows


def plan_for_invariant(n: int, m: int, k: int, dtype: str):
    from pyblasgemm.planner import plan_for
    from pyblasgemm.planner.problem import make_desc

    return plan_for(make_desc(n, m, k, dtype, transa="T")._replace(invariant="n"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--families", action="store_true", help="only the tile-shape experiment")
    ap.add_argument("--limit", type=int, default=1, help="every n-th corpus entry")
    ap.add_argument("--invariance-class", choices=("config", "family"), default=None,
                    help="planner.invariant.INVARIANCE_CLASS for this run (default: the package's)")
    ap.add_argument("--no-families", action="store_true", help="skip the tile-shape experiment")
    args = ap.parse_args(argv)
    import cupy as cp
    import torch

    import pyblasgemm as pb
    from pyblasgemm.planner import invariant

    if args.invariance_class is not None:
        invariant.INVARIANCE_CLASS = args.invariance_class
    doc = {"schema": "pyblasgemm-invariance/1",
           **meta(types.SimpleNamespace(torch=torch), seed="numpy.random.default_rng([layer, tokens])"),
           "method": __doc__, "invariance_class": invariant.INVARIANCE_CLASS}
    if not args.no_families:
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
