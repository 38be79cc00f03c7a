"""The raw BLAS form's host cost at 4x4 against SciPy's call (issue 35, item 6), and matmul's.

For each of s, d, c, z: a repeated ``pyblasgemm.<x>gemm('N', 'N', 4, 4, 4, 1.0, a, 4, b, 4,
0.0, c, 4)`` on F-ordered 2-D arrays and on 1-D buffers (the reference-BLAS caller's), over
``scipy.linalg.blas.<x>gemm(1.0, a, b)`` on the same arrays; also the 'T' flag on A, other
scalars (alpha 2 and beta 0.5 on 2-D arrays and 1-D buffers, alpha 2, beta 1), padded 1-D
buffers (leading dimensions 5), SciPy's own alpha 2, beta 0.5 call (``<x>gemm(2.0, a, b, 0.5,
c)``), and ``pyblasgemm.matmul`` and ``numpy.matmul`` on C-ordered 4x4 float32. Rounds with
the contenders interleaved, each the best of 5 runs of ``calls`` calls, less an empty call's
cost; the ratio taken within each round (its neighbours share the round's load), the median
over rounds. CPU only (NumPy arrays).

    python bench/raw_host_ratio.py [out.json] [--rounds N] [--prefixes sdcz]
"""
import argparse
import json
import platform
import statistics
import sys
import timeit

import numpy as np
import scipy
import scipy.linalg.blas as sblas

import pyblasgemm
from pyblasgemm.benchmarks.suite import provenance


def ratios(fns: dict, against: str, rounds: int, calls: int = 200, repeat: int = 5) -> dict:
    fns = dict(fns, loop=lambda: None)
    times: dict = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            times[name].append(min(timeit.repeat(fn, number=calls, repeat=repeat)) / calls)
    loop, base = times.pop("loop"), times.pop(against)
    out = {against: {"ratio": 1.0, "us": statistics.median(y - l for y, l in zip(base, loop)) * 1e6}}
    for name, t in times.items():
        out[name] = {"ratio": statistics.median((x - l) / (y - l) for x, y, l in zip(t, base, loop)),
                     "us": statistics.median(x - l for x, l in zip(t, loop)) * 1e6}
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out", nargs="?")
    p.add_argument("--rounds", type=int, default=31)
    p.add_argument("--prefixes", default="sdcz")
    args = p.parse_args()
    rng = np.random.default_rng(5)
    results = {}
    for prefix in args.prefixes:
        dtype = {"s": np.float32, "d": np.float64, "c": np.complex64, "z": np.complex128}[prefix]
        a = np.asfortranarray(rng.standard_normal((4, 4)).astype(dtype))
        b = np.asfortranarray(rng.standard_normal((4, 4)).astype(dtype))
        c = np.zeros((4, 4), dtype, order="F")
        a1, b1, c1 = a.ravel("F"), b.ravel("F"), np.zeros(16, dtype)
        # the reference-BLAS caller's padded buffers: leading dimensions 5, not 4
        a5, b5, c5 = (np.zeros(20, dtype) for _ in range(3))
        a5.reshape(4, 5)[:, :4] = a.T
        b5.reshape(4, 5)[:, :4] = b.T
        f, g = getattr(pyblasgemm, prefix + "gemm"), getattr(sblas, prefix + "gemm")
        fns = {"2-D": lambda: f("N", "N", 4, 4, 4, 1.0, a, 4, b, 4, 0.0, c, 4),
               "1-D": lambda: f("N", "N", 4, 4, 4, 1.0, a1, 4, b1, 4, 0.0, c1, 4),
               "1-D T,N": lambda: f("T", "N", 4, 4, 4, 1.0, a1, 4, b1, 4, 0.0, c1, 4),
               "2-D alpha 2 beta 0.5": lambda: f("N", "N", 4, 4, 4, 2.0, a, 4, b, 4, 0.5, c, 4),
               "2-D alpha 2": lambda: f("N", "N", 4, 4, 4, 2.0, a, 4, b, 4, 0.0, c, 4),
               "2-D beta 1": lambda: f("N", "N", 4, 4, 4, 1.0, a, 4, b, 4, 1.0, c, 4),
               "1-D alpha 2 beta 0.5": lambda: f("N", "N", 4, 4, 4, 2.0, a1, 4, b1, 4, 0.5, c1, 4),
               "1-D padded": lambda: f("N", "N", 4, 4, 4, 1.0, a5, 5, b5, 5, 0.0, c5, 5),
               "scipy alpha 2 beta 0.5": lambda: g(2.0, a, b, 0.5, c),
               "scipy": lambda: g(1.0, a, b)}
        if prefix == "s":
            ac, bc = np.ascontiguousarray(a), np.ascontiguousarray(b)
            fns["pyblasgemm.matmul"] = lambda: pyblasgemm.matmul(ac, bc)
            fns["numpy.matmul"] = lambda: np.matmul(ac, bc)
        for fn in fns.values():          # described, then hits
            fn(), fn()
        results[prefix] = ratios(fns, "scipy", args.rounds)
        for name, r in results[prefix].items():
            print(f"{prefix}gemm {name:22s} {r['ratio']:6.2f}x  {r['us']:6.2f} us", flush=True)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({**provenance(5), "numpy": np.__version__, "scipy": scipy.__version__,
                       "python": platform.python_version(), "machine": platform.machine(),
                       "rounds": args.rounds, "results": results}, fh, indent=1)


if __name__ == "__main__":
    sys.exit(main())
