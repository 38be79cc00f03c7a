"""The Ozaki scheme's 'fast' scaling on the GPU (issue 34, 1c): one dgemm timed with the default
scaling (``compute='int8-ozaki'``), the 'fast' one (``'int8-ozaki-fast'``, the same moduli: its
count comes from the least bits) and CuPy's native product (cuBLAS DGEMM), interleaved
(``bench/timing.py``), on the same random normal operands; with each route's record
(``last_route()``: the moduli, the scaling, the least bits, the bound) and the largest
difference between the two scalings' results relative to ``|A| @ |B|``.

Run (on a GPU)::

    GIT_SHA=$(git rev-parse HEAD) python bench/ozaki_fast_timing.py --out ozaki_fast_timing.json

Expected time on one H200: ~5 s of timing at 8192³ (3 contenders x ~62 calls of ~16-20 ms),
~20 s more on a cold kernel cache.
"""
from __future__ import annotations

import argparse
import datetime
import pathlib
import sys
import types

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from bench.heldout import meta, write_doc  # noqa: E402
from bench.timing import interleaved_median_s  # noqa: E402

#: the contenders: name -> compute= of pyblasgemm.matmul (None: CuPy's native product)
CONTENDERS = {"pyblasgemm int8-ozaki (default 'max' scaling)": "int8-ozaki",
              "pyblasgemm int8-ozaki-fast": "int8-ozaki-fast", "cupy.matmul (cuBLAS DGEMM)": None}


def run(size: int, seed: int = 20261129) -> dict:
    import cupy as cp

    import pyblasgemm
    from pyblasgemm.composite import last_route

    rs = cp.random.RandomState(seed)
    a, b = rs.standard_normal((size, size)), rs.standard_normal((size, size))

    def call(compute):
        if compute is None:
            return lambda: a @ b
        return lambda: pyblasgemm.matmul(a, b, compute=compute, backend="tensorcore")

    routes, results = {}, {}
    for name, compute in CONTENDERS.items():
        results[name] = call(compute)()
        if compute is not None:
            routes[name] = last_route()
    cp.cuda.Device().synchronize()
    scale = cp.abs(a) @ cp.abs(b)
    default, fast = (results[n] for n in list(CONTENDERS)[:2])
    diff = float(cp.max(cp.abs(default - fast) / scale))
    del results, default, fast, scale
    times = interleaved_median_s({name: call(compute) for name, compute in CONTENDERS.items()})
    native = times["cupy.matmul (cuBLAS DGEMM)"]
    return {"m": size, "n": size, "k": size, "dtype": "float64", "operands": "standard normal (CuPy RandomState)",
            "seed": seed, "median_s": times, "ratio_vs_cupy": {n: native / t for n, t in times.items()},
            "routes": routes, "max_diff_default_vs_fast_over_absab": diff}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int, default=8192, help="m = n = k (default 8192)")
    ap.add_argument("--out", required=True, help="the results JSON")
    args = ap.parse_args(argv)
    doc = {"schema": "pyblasgemm-ozaki-fast-timing/1", **meta(types.SimpleNamespace(torch=None), seed=20261129),
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "method": "bench/timing.py interleaved_median_s (CUDA events, 10 rounds of 5 calls, order rotated)",
           "results": [run(args.size)]}
    write_doc(doc, args.out)


if __name__ == "__main__":
    main()
