"""The grouped launch's GPU time per tile config on mixture-of-experts layers (issue #36).

    PYTHONPATH=. python bench/grouped_tiles.py --out bench/results/grouped_tiles_<gpu>_<date>_<sha>.json

For each case (experts, most rows an expert gets, k = n; expert sizes drawn as
bench/fusion.py draws them: numpy default_rng(5), uniform in 0..most) and each config of
``CONFIGS`` (bfloat16): the expert form with the offsets on the GPU, launched directly
(:meth:`GroupedLaunch.launch_offsets <pyblasgemm.kernels.grouped.GroupedLaunch.launch_offsets>`:
the table kernel, then the grouped GEMM), timed with CUDA events around back-to-back launches
(bench/timing.py), so the host's Python never enters the number; and ``torch._grouped_mm``
on the same bytes as the yardstick. Each config's output is compared bitwise with the
first config's and with PyTorch's (max relative error) before it is timed. The report gives
µs per call, the weight bytes streamed per µs (every expert's k x n weight read once) and
the CTAs per SM the driver allows; the first case adds the host's µs to issue one full
``grouped_matmul`` call and one ``torch._grouped_mm`` call (bench/timing.py paired_host_us).
"""
from __future__ import annotations

import json
import pathlib
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.heldout import meta, write_doc  # noqa: E402
from bench.timing import event_median_s  # noqa: E402

#: (experts, most rows an expert gets, k = n)
CASES = ((64, 64, 1024), (128, 64, 2048), (64, 128, 1024))


def _configs():
    from pyblasgemm.kernels.config import KernelConfig

    g = dict(bk=64, decomposition="grouped")
    return [KernelConfig(bm=128, bn=128, warps_m=2, warps_n=4, stages=3, **g),     # the large-group tile
            KernelConfig(bm=128, bn=64, warps_m=4, warps_n=2, stages=4, **g),      # 8 warps, 2 CTAs/SM
            KernelConfig(bm=128, bn=64, warps_m=2, warps_n=2, stages=4, **g),      # 4 warps, 2 CTAs/SM
            KernelConfig(bm=256, bn=64, warps_m=4, warps_n=2, stages=4, **g),      # 8 warps, 1 CTA/SM
            KernelConfig(bm=64, bn=64, warps_m=2, warps_n=2, stages=4, **g)]       # 4 warps, 3 CTAs/SM


def moe_layer(experts: int, max_rows: int, k: int, n: int):
    """A bfloat16 mixture-of-experts layer of the grouped benches: token counts uniform in
    ``[0, max_rows]`` per expert (numpy seed 5), tokens uniform in [-1, 1], weights a 64th of
    that; ``(ends, rows, a, b, dev_ends, ta, tb, offs)``: host end offsets, the token count, the
    CuPy tokens and weights, the offsets on the GPU (int32), and the same bytes as torch tensors
    and ``offs``."""
    import cupy as cp
    import ml_dtypes
    import torch

    ends = np.cumsum(np.random.default_rng(5).integers(0, max_rows + 1, experts))
    rows = int(ends[-1])
    a = cp.random.uniform(-1, 1, (rows, k), dtype=cp.float32).astype(ml_dtypes.bfloat16)
    b = (cp.random.uniform(-1, 1, (experts, k, n), dtype=cp.float32) / 64).astype(ml_dtypes.bfloat16)
    dev_ends = cp.asarray(ends.astype(np.int32))
    ta = torch.as_tensor(a.view(cp.uint16), device="cuda").view(torch.bfloat16)
    tb = torch.as_tensor(b.view(cp.uint16), device="cuda").view(torch.bfloat16)
    offs = torch.as_tensor(ends.astype(np.int32), device="cuda")
    return ends, rows, a, b, dev_ends, ta, tb, offs


def case(experts, max_rows, width, configs) -> dict:
    import cupy as cp
    import ml_dtypes
    import torch

    from pyblasgemm.kernels.grouped import GroupedLaunch

    k = n = width
    ends, rows, a, b, dev_ends, ta, tb, offs = moe_layer(experts, max_rows, k, n)
    ref = torch._grouped_mm(ta, tb, offs=offs)
    row = {"experts": experts, "max_rows": max_rows, "width": width, "tokens": rows,
           "mean_rows": rows / experts, "weight_bytes": experts * k * n * 2, "configs": {}}
    row["torch._grouped_mm_us"] = event_median_s(lambda: torch._grouped_mm(ta, tb, offs=offs)) * 1e6
    first = None
    for cfg in configs:
        out = cp.full((rows, n), np.nan, ml_dtypes.bfloat16)
        launch = GroupedLaunch("bf16", "N", "N", True, (0, None), cfg)
        values = dict(weights=b.data.ptr, tokens=a.data.ptr, out=out.data.ptr, bias=0, scale_w=0, scale_x=0,
                      w_group_bytes=b.strides[0], x_row_bytes=a.strides[0], out_row_bytes=out.strides[0],
                      bias_group_bytes=0, scale_w_group_bytes=0, lda=n, ldb=k, ldc=n, rows=rows, m=n, k=k,
                      out_bytes=2, bias_mode=0, alpha=1.0, beta=0.0, ialpha=0, ibeta=0)

        def run(launch=launch, values=values):
            launch.launch_offsets(experts, dev_ends.data.ptr, 4, values)

        run()
        cp.cuda.Device().synchronize()
        got = torch.as_tensor(out.view(cp.uint16), device="cuda").view(torch.bfloat16).float()
        err = float((got - ref.float()).abs().max() / ref.float().abs().max())
        same = None if first is None else bool(cp.array_equal(out.view(cp.uint16), first.view(cp.uint16)))
        first = out if first is None else first
        us = event_median_s(run) * 1e6
        row["configs"][cfg.name] = {"us": us, "ctas_per_sm": launch.ctas // cp.cuda.Device().attributes[
            "MultiProcessorCount"], "GB_per_s_weights": row["weight_bytes"] / us / 1e3,
            "max_rel_err_vs_torch": err, "bits_equal_first_config": same,
            "ratio_vs_torch": row["torch._grouped_mm_us"] / us}
        print(experts, max_rows, width, cfg.name, f"{us:.1f} us", f"x{row['torch._grouped_mm_us'] / us:.3f}",
              f"ctas/SM {row['configs'][cfg.name]['ctas_per_sm']}", f"err {err:.2g}", same, flush=True)
    print(experts, max_rows, width, f"torch._grouped_mm {row['torch._grouped_mm_us']:.1f} us", flush=True)
    if (experts, max_rows, width) == CASES[0]:
        # the host's µs to issue one call (a steady-state floor where it exceeds the GPU time)
        import pyblasgemm as pb

        from bench.timing import paired_host_us

        row["host_us"] = paired_host_us({"pyblasgemm.grouped_matmul, offsets on the GPU":
                                         lambda: pb.grouped_matmul(a, b, offsets=dev_ends),
                                         "torch._grouped_mm": lambda: torch._grouped_mm(ta, tb, offs=offs)},
                                        calls=300, rounds=3, warmup=20)
        print("host us per call", row["host_us"], flush=True)
    return row


def main(argv=None) -> int:
    import argparse

    import cupy as cp

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    cp.random.seed(20261201)

    import types

    import torch

    doc = {"schema": "pyblasgemm-grouped-tiles/1",
           **meta(types.SimpleNamespace(torch=torch), seed="CuPy 20261201; sizes default_rng(5)"),
           "method": __doc__, "cases": []}
    configs = _configs()
    for experts, max_rows, width in CASES:
        doc["cases"].append(case(experts, max_rows, width, configs))
    write_doc(doc, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
