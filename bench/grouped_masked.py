"""The masked layout of ``grouped_matmul`` (DeepGEMM's ``m_grouped_*_masked``; bfloat16) against
``torch._grouped_mm`` on the same bytes (issue #36).

    PYTHONPATH=. python bench/grouped_masked.py --out bench/results/grouped_masked_<gpu>_<date>_<sha>.json

torch has no masked form, so the yardstick is ``torch._grouped_mm(x, w, offs=ends)`` over the
valid rows packed expert after expert (the same weights, the same valid tokens, the same
products and outputs: the masked call reads and writes no padding row). For each case
(experts, max_m, k, n; counts numpy default_rng(5) uniform in 0..most, as bench/grouped_fused.py
draws them; ``expected_m`` their mean, rounded):

* ``pyblasgemm masked``: ``grouped_matmul(x3, w, masked_m=counts_on_gpu, expected_m=..., out=y3)``,
  the public call (its call-signature replay after the first);
* ``pyblasgemm contiguous``: ``grouped_matmul(x, w, offsets=ends_on_gpu, out=y)`` on the packed rows;
* ``torch._grouped_mm`` on the packed rows;
* the masked call and ``torch._grouped_mm`` captured 20 times in one CUDA graph, per call.

Times: CUDA events around back-to-back calls (bench/timing.py). Checked before timing: the
masked call's valid rows against ``torch._grouped_mm`` (max relative error) and its padding
rows still NaN.
"""
from __future__ import annotations

import json
import pathlib
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.grouped_fused import _graph_us, run_cases  # noqa: E402
from bench.timing import event_median_s  # noqa: E402

#: (experts, max_m, most rows an expert gets, k, n): the two small-expert layers of
#: bench/grouped_fused.py in the masked layout (blocks of 64 rows), and a 32-expert layer of up
#: to 256 tokens an expert in blocks of 256
CASES = ((64, 64, 64, 1024, 1024), (128, 64, 64, 2048, 2048), (32, 256, 256, 2048, 2048))


def case(experts, max_m, most, k, n) -> dict:
    import cupy as cp
    import ml_dtypes
    import torch

    import pyblasgemm as pb
    from pyblasgemm.epilogue import last_route

    counts = np.random.default_rng(5).integers(0, most + 1, experts)
    ends = np.cumsum(counts)
    rows = int(ends[-1])
    expected = int(round(counts.mean()))
    x3 = cp.random.uniform(-1, 1, (experts, max_m, k), dtype=cp.float32).astype(ml_dtypes.bfloat16)
    w = (cp.random.uniform(-1, 1, (experts, k, n), dtype=cp.float32) / 64).astype(ml_dtypes.bfloat16)
    x = cp.concatenate([x3[g, :c] for g, c in enumerate(counts.tolist())])
    dev_counts = cp.asarray(counts.astype(np.int32))
    dev_ends = cp.asarray(ends.astype(np.int32))
    y3 = cp.full((experts, max_m, n), np.nan, ml_dtypes.bfloat16)
    y = cp.empty((rows, n), ml_dtypes.bfloat16)

    def as_torch(v):
        return torch.as_tensor(v.view(cp.uint16), device="cuda").view(torch.bfloat16)

    tx, tw = as_torch(x), as_torch(w)
    offs = torch.as_tensor(ends.astype(np.int32), device="cuda")
    ref = torch._grouped_mm(tx, tw, offs=offs).float()

    def masked():
        pb.grouped_matmul(x3, w, masked_m=dev_counts, expected_m=expected, out=y3)

    def contiguous():
        pb.grouped_matmul(x, w, offsets=dev_ends, out=y)

    masked()
    cp.cuda.Device().synchronize()
    route = last_route()
    got = torch.cat([as_torch(y3)[g, :c] for g, c in enumerate(counts.tolist())]).float()
    pad_nan = all(bool(cp.isnan(y3[g, c:].astype(cp.float32)).all()) for g, c in enumerate(counts.tolist()))
    row = {"experts": experts, "max_m": max_m, "most_rows": most, "k": k, "n": n, "valid_rows": rows,
           "expected_m": expected, "empty_experts": int((counts == 0).sum()), "route": str(route),
           "max_rel_err_vs_torch_grouped_mm": float((got - ref).abs().max() / ref.abs().max()),
           "padding_rows_untouched": pad_nan,
           "bytes": experts * k * n * 2 + rows * k * 2 + rows * n * 2, "flops": 2.0 * rows * k * n, "us": {}}
    us = row["us"]
    us["pyblasgemm masked (public call, masked_m on the GPU)"] = event_median_s(masked) * 1e6
    us["pyblasgemm contiguous on the packed rows (offsets on the GPU)"] = event_median_s(contiguous) * 1e6
    us["torch._grouped_mm on the packed rows"] = event_median_s(lambda: torch._grouped_mm(tx, tw, offs=offs)) * 1e6
    us["pyblasgemm masked, graph"] = _graph_us(masked, False, False)
    us["torch._grouped_mm on the packed rows, graph"] = _graph_us(lambda: torch._grouped_mm(tx, tw, offs=offs),
                                                                  False, True)
    m = us["pyblasgemm masked (public call, masked_m on the GPU)"]
    row["ratios"] = {"masked vs torch._grouped_mm (packed rows)": us["torch._grouped_mm on the packed rows"] / m,
                     "masked vs torch._grouped_mm, both in CUDA graphs":
                         us["torch._grouped_mm on the packed rows, graph"] / us["pyblasgemm masked, graph"],
                     "masked vs our contiguous call": us["pyblasgemm contiguous on the packed rows (offsets on the GPU)"]
                     / m}
    print(json.dumps(row, indent=1), flush=True)
    return row


def main(argv=None) -> int:
    return run_cases(argv, __doc__, "pyblasgemm-grouped-masked/1", 20261128, CASES, case)


if __name__ == "__main__":
    sys.exit(main())
