"""Mixture-of-experts layers (bfloat16, uneven token counts, offsets on the GPU): the Hopper
grouped walk (wgmma + TMA, impls/sm90_gemm.cuh MODE kGrouped) against our mma.sync grouped
launch, ``torch._grouped_mm`` and a loop of cuBLAS calls, on the same bytes (issue #36).

    GIT_SHA=<sha> PYTHONPATH=. python bench/grouped_sm90.py --out bench/results/grouped_sm90_<gpu>_<date>_<sha>.json

For each case (experts, most rows an expert gets, k, n; sizes numpy default_rng(5) uniform in
0..most, as bench/grouped_fused.py draws them), contenders timed in alternation (``--rounds``
rounds, each contender once a round with CUDA events around back-to-back calls, bench/timing.py;
the median over rounds is recorded, with every round's value):

* ``hopper <tile>``: Sm90GroupedLaunch.launch_offsets for each of the walk's tiles
  (kernels/config.py SM90_GROUPED_CONFIGS), directly;
* ``mma.sync``: the one-launch mma.sync grouped kernel (GroupedLaunch, fused=True) with the tile
  ``grouped_config`` picks;
* ``public call``: ``pyblasgemm.grouped_matmul(x, w, offsets=ends_on_gpu, out=y)``, the route
  the planner picks (its line is recorded);
* ``torch._grouped_mm(x, w, offs=ends)`` and a loop of ``torch.mm`` per expert (cuBLAS);
* the same captured 20 times (4 for the large layer) in one CUDA graph, per call (``graph``).

Checked before timing: each Hopper tile's output against ``torch._grouped_mm`` (max relative
error) and bitwise repeatable; rows of an all-empty call untouched. The document is written after
every case.
"""
from __future__ import annotations

import json
import pathlib
import statistics
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.grouped_fused import _graph_us, run_cases  # noqa: E402
from bench.grouped_tiles import moe_layer  # noqa: E402
from bench.timing import event_median_s  # noqa: E402

#: (experts, most rows an expert gets, k, n): the issue's small-expert layers (64 and 128
#: experts), 32 experts of up to 256 tokens, and a large layer (8 experts, ~2048 tokens each)
CASES = ((64, 64, 1024, 1024), (128, 64, 2048, 2048), (32, 256, 2048, 2048), (8, 4096, 4096, 4096))
ROUNDS = 3


def case(experts, max_rows, k, n) -> dict:
    import cupy as cp
    import ml_dtypes
    import torch

    import pyblasgemm as pb
    from pyblasgemm.epilogue import last_route, note_route
    from pyblasgemm.kernels.config import SM90_GROUPED_CONFIGS
    from pyblasgemm.kernels.grouped import GroupedLaunch, grouped_config
    from pyblasgemm.kernels.sm90 import Sm90GroupedLaunch

    ends, rows, a, b, dev_ends, ta, tb, offs = moe_layer(experts, max_rows, k, n)
    big = 2.0 * rows * k * n > 1e11
    ref = torch._grouped_mm(ta, tb, offs=offs).float()
    flops = 2.0 * rows * k * n
    layer_bytes = experts * k * n * 2 + rows * k * 2 + rows * n * 2
    row = {"experts": experts, "max_rows": max_rows, "k": k, "n": n, "tokens": rows, "mean_rows": rows / experts,
           "empty_experts": int((np.diff(ends, prepend=0) == 0).sum()), "layer_bytes": layer_bytes, "flops": flops, "checks": {}}

    def values(out):
        return dict(weights=b.data.ptr, tokens=a.data.ptr, out=out.data.ptr, bias=0, scale_w=0, scale_x=0,
                    w_group_bytes=b.strides[0], x_row_bytes=a.strides[0], out_row_bytes=out.strides[0],
                    bias_group_bytes=0, scale_w_group_bytes=0, lda=n, ldb=k, ldc=n, rows=rows, m=n, k=k,
                    out_bytes=2, bias_mode=0, alpha=1.0, beta=0.0, ialpha=0, ibeta=0)

    def rel_err(out):
        got = torch.as_tensor(out.view(cp.uint16), device="cuda").view(torch.bfloat16).float()
        return float((got - ref).abs().max() / ref.abs().max())

    steady, graphs = {}, {}
    for name, cfg in SM90_GROUPED_CONFIGS["bf16"].items():
        launch = Sm90GroupedLaunch("bf16", cfg)
        out = cp.full((rows, n), np.nan, ml_dtypes.bfloat16)
        v = values(out)
        fn = (lambda launch=launch, v=v: launch.launch_offsets(experts, dev_ends.data.ptr, 4, v))
        fn()
        first = out.copy()
        fn()
        cp.cuda.Device().synchronize()
        row["checks"][f"hopper {cfg.name}"] = {"max_rel_err_vs_torch": rel_err(out),
                                               "bits_repeat": bool(cp.array_equal(first.view(cp.uint16),
                                                                                  out.view(cp.uint16)))}
        steady[f"hopper {name} ({cfg.name})"] = fn
    mma_cfg = grouped_config("bf16", rows / experts)
    mma = GroupedLaunch("bf16", "N", "N", True, (0, None), mma_cfg)
    mout = cp.full((rows, n), np.nan, ml_dtypes.bfloat16)
    mv = values(mout)
    steady[f"mma.sync ({mma_cfg.name})"] = lambda: mma.launch_offsets(experts, dev_ends.data.ptr, 4, mv, fused=True)
    pub = cp.empty((rows, n), ml_dtypes.bfloat16)
    note_route(None)        # (what this call records, not a line left by the previous case)
    pb.grouped_matmul(a, b, offsets=dev_ends, out=pub)
    row["public_route"] = last_route()
    steady["public call (grouped_matmul)"] = lambda: pb.grouped_matmul(a, b, offsets=dev_ends, out=pub)
    steady["torch._grouped_mm"] = lambda: torch._grouped_mm(ta, tb, offs=offs)
    tout = torch.empty(rows, n, dtype=torch.bfloat16, device="cuda")
    pieces = [(ta[s:e], tb[g], tout[s:e]) for g, (s, e) in enumerate(zip([0, *ends[:-1]], ends)) if e > s]

    def cublas_loop():
        for x, w, o in pieces:
            torch.mm(x, w, out=o)

    steady["cuBLAS loop (torch.mm per expert)"] = cublas_loop
    for fn in steady.values():
        fn()
    cp.cuda.Device().synchronize()
    row["checks"]["mma.sync max_rel_err_vs_torch"] = rel_err(mout)
    row["checks"]["public call max_rel_err_vs_torch"] = rel_err(pub)

    rounds = {name: [] for name in steady}
    for _ in range(ROUNDS):
        for name, fn in steady.items():
            t = event_median_s(fn, inner=3, samples=7) if big else event_median_s(fn, inner=10, samples=10)
            rounds[name].append(t * 1e6)
    us = {name: statistics.median(ts) for name, ts in rounds.items()}
    best_hopper = min((name for name in us if name.startswith("hopper")), key=us.get)
    row["best_hopper_tile"] = best_hopper
    captured = [best_hopper, f"mma.sync ({mma_cfg.name})"]
    if "one persistent launch" in row["public_route"]:
        captured.append("public call (grouped_matmul)")
    else:       # the planner's loop reads the sizes back to the host: it cannot be captured
        row["public_call_graph"] = "not captured: the route is the loop (a device-to-host read of the sizes)"
    for name in captured:
        graphs[name + ", graph"] = _graph_us(steady[name], big, False)
    graphs["torch._grouped_mm, graph"] = _graph_us(steady["torch._grouped_mm"], big, True)
    graphs["cuBLAS loop (torch.mm per expert), graph"] = _graph_us(cublas_loop, big, True)
    row["us"], row["us_rounds"], row["us_graph"] = us, rounds, graphs
    pub_us = us["public call (grouped_matmul)"]
    row["ratios"] = {
        "best hopper tile vs torch._grouped_mm": us["torch._grouped_mm"] / us[best_hopper],
        "best hopper tile vs cuBLAS loop": us["cuBLAS loop (torch.mm per expert)"] / us[best_hopper],
        "best hopper tile vs mma.sync": us[f"mma.sync ({mma_cfg.name})"] / us[best_hopper],
        "public call vs torch._grouped_mm": us["torch._grouped_mm"] / pub_us,
        "public call vs cuBLAS loop": us["cuBLAS loop (torch.mm per expert)"] / pub_us,
        "graph: best hopper tile vs torch._grouped_mm": graphs["torch._grouped_mm, graph"]
        / graphs[best_hopper + ", graph"],
        "graph: best hopper tile vs cuBLAS loop": graphs["cuBLAS loop (torch.mm per expert), graph"]
        / graphs[best_hopper + ", graph"],
        "graph: public call vs torch._grouped_mm": graphs["torch._grouped_mm, graph"]
        / graphs.get("public call (grouped_matmul), graph", float("nan")),
        "graph: mma.sync vs torch._grouped_mm": graphs["torch._grouped_mm, graph"]
        / graphs[f"mma.sync ({mma_cfg.name}), graph"],
    }
    row["achieved_TF_per_s"] = {name: flops / t / 1e6 for name, t in us.items()}
    print(json.dumps({key: row[key] for key in ("experts", "max_rows", "k", "n", "tokens", "us", "us_graph",
                                                "ratios", "checks", "public_route")}, indent=1), flush=True)
    del a, b, ta, tb, ref, tout, pub, pieces, steady
    cp.get_default_memory_pool().free_all_blocks()
    torch.cuda.empty_cache()
    return row


def main(argv=None) -> int:
    return run_cases(argv, __doc__, "pyblasgemm-grouped-sm90/1", 20261129, CASES, case)


if __name__ == "__main__":
    sys.exit(main())
