"""How many moduli the Ozaki scheme's 'fast' scaling saves at equal accuracy (issue #34, 1c): host only.

    PYTHONPATH=. python bench/ozaki_fast_study.py --out bench/results/ozaki_fast_study_host_<date>_<sha>.json

For each inner dimension k of KS and each input kind of KINDS (A and B both of that kind: the
rows of A, the columns of B), m = n = 48: the default scaling ('max') at the default moduli count
(``setting(k).count``: 15-16 for float64), then the 'fast' scaling (:func:`pyblasgemm.ozaki.split_fast`)
from that count down, one modulus at a time, until its error exceeds the default's; the answer
per case is the fewest count that still met it (``saved`` = default count minus it), for each of
METRICS; the same scan with the default scaling gives ``saved_over_max``, what the 2-norm itself
buys (where the default's error is the final rounding's, either scaling ties it with fewer). float32
(:func:`sgemm_ozaki`, rounded to float32 as the caller gets it) at k = 1024 likewise from its
default (8 moduli).

Both modes run the scheme alone (``fallback=False``): with the fallbacks on, the graded rows (a
60-binade range per row) run natively in both modes and the guard sends elements natively, which
would hide the scaling's difference; the guarded default's error is recorded beside it.

Error: the max over the 48 x 48 elements and SEEDS draws of ``|c - exact| / |exact|`` (also
``|c - exact| / (|A| @ |B|)``), against the exact product: each row and column as Python
integers (a power of two apart from the floats), their dot products exact, the difference taken
in fractions. Native float64 (NumPy's BLAS) on the same bytes for scale.

Expected time on 2 shared cores: ~2-4 min (55 s with two draws) (the exact references, Python integers, are most of it:
48 x 48 x k products per case and draw).
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import subprocess
import sys
import time
from fractions import Fraction

import numpy as np

from pyblasgemm import ozaki
from pyblasgemm.benchmarks.suite import provenance

#: the inner dimensions of the issue's question (float64's default is 16 moduli up to 8192)
KS = (256, 1024, 4096, 8192)
#: float32's default point (8 moduli at k = 1024)
KS_FP32 = (1024,)
M = N = 48
SEEDS = (0, 1, 2, 3)
#: the two errors compared: max |c - exact| / |exact| (the issue's), and max |c - exact| / (|A| @ |B|)
#: (what native arithmetic's bound scales with; the first is set by the few elements that cancel)
METRICS = ("rel", "over_absab")


def _kind(name: str, rng, lines: int, k: int) -> np.ndarray:
    """``lines`` x ``k`` values of one input kind, one line per row (A's rows, B's columns)."""
    if name == "normal":
        return rng.standard_normal((lines, k))
    if name == "uniform":
        return rng.uniform(-1.0, 1.0, (lines, k))
    if name == "graded":                        # 2^U(-30, 30) per element: a 60-binade range per row
        return rng.standard_normal((lines, k)) * np.exp2(rng.uniform(-30, 30, (lines, k)))
    if name == "onehot":                        # one element ~1 per row, the others ~2^-20 of it
        x = rng.standard_normal((lines, k)) * 2.0**-20
        x[np.arange(lines), rng.integers(0, k, lines)] = rng.uniform(1, 2, lines) * rng.choice([-1, 1], lines)
        return x
    raise ValueError(f"kind={name!r}")


KINDS = ("normal", "uniform", "graded", "onehot")


def _exact_lines(x: np.ndarray):
    """Each row of ``x`` as Python integers times 2^-shift (exact: every float64 is an integer
    times 2^-1074): (object array of ints, shifts)."""
    _, ex = np.frexp(x)
    lowest = np.where(x != 0, ex - 53, 0).min(axis=1)               # the least ulp of each row
    ints = np.empty(x.shape, dtype=object)
    for i, row in enumerate(x):
        s = -int(lowest[i])
        ints[i] = [int(v) for v in np.ldexp(row, s)] if s <= 1000 else [int(Fraction(v) * 2**s) for v in row]
    return ints, -lowest.astype(np.int64)


def exact_product(a: np.ndarray, b: np.ndarray):
    """(numerators, shifts_a, shifts_b): a @ b exactly, ``C_ij = num_ij / 2^(sa_i + sb_j)``."""
    ai, sa = _exact_lines(a.astype(np.float64))
    bi, sb = _exact_lines(b.T.astype(np.float64))
    return ai.dot(bi.T), sa, sb


def errors(c: np.ndarray, exact) -> tuple:
    """(``|c - exact|``, ``|exact|``) per element, each as float64 (the difference taken exactly)."""
    num, sa, sb = exact
    diff = np.empty(c.shape)
    mag = np.empty(c.shape)
    for i in range(c.shape[0]):
        for j in range(c.shape[1]):
            e = Fraction(int(num[i, j]), 2 ** int(sa[i] + sb[j]))
            diff[i, j] = float(abs(Fraction(float(c[i, j])) - e))
            mag[i, j] = float(abs(e))
    return diff, mag


def measure(fn, a, b, exact, absab):
    t = time.perf_counter()
    c, how = fn(a, b)
    dt = time.perf_counter() - t
    diff, mag = errors(np.asarray(c, np.float64), exact)
    rel = float(np.max(np.where(mag > 0, diff / np.where(mag > 0, mag, 1), 0)))
    return {"rel": rel, "over_absab": float(np.max(diff / absab)), "seconds": round(dt, 4),
            "bits": None if how is None else how.bits}


def study_case(kind: str, k: int, precision: str) -> dict:
    dtype = np.float64 if precision == "float64" else np.float32
    call = ozaki.dgemm_ozaki if precision == "float64" else ozaki.sgemm_ozaki
    default = ozaki.setting(k, precision=precision)
    draws = []
    for seed in SEEDS:
        rng = np.random.default_rng([seed, k, KINDS.index(kind), int(precision == "float32")])
        a = _kind(kind, rng, M, k).astype(dtype)
        b = _kind(kind, rng, N, k).T.astype(dtype).copy()
        exact = exact_product(a, b)
        absab = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))
        draws.append((a, b, exact, absab))

    def worst(fn):
        runs = [measure(fn, a, b, ex, ab) for a, b, ex, ab in draws]
        return {"rel": max(r["rel"] for r in runs), "over_absab": max(r["over_absab"] for r in runs),
                "seconds": round(sum(r["seconds"] for r in runs), 4), "bits": runs[0]["bits"]}

    out = {"kind": kind, "k": k, "precision": precision, "m": M, "n": N, "seeds": list(SEEDS),
           "default_count": default.count, "default_bits": default.bits}
    out["native"] = worst(lambda a, b: (a @ b, None))
    out["default"] = worst(lambda a, b: call(a, b, count=default.count, fallback=False))
    out["default_guarded"] = worst(lambda a, b: call(a, b))
    for scaling in ("fast", "max"):
        runs = []
        fewest = {metric: default.count for metric in METRICS}
        going = set(METRICS)
        for count in range(default.count, 0, -1):
            try:
                ozaki.bits_for(count, k)
            except ValueError:
                break
            r = worst(lambda a, b, c=count: call(a, b, count=c, fallback=False, scaling=scaling))
            r["count"] = count
            runs.append(r)
            for metric in list(going):          # the first count above the default's error ends it
                if r[metric] > out["default"][metric]:
                    going.discard(metric)
                else:
                    fewest[metric] = count
            if not going:
                break
        out[scaling] = runs
        out[f"{scaling}_fewest_count"] = fewest
    out["saved"] = {metric: default.count - c for metric, c in out["fast_fewest_count"].items()}
    # what the 2-norm itself buys: the same scan with the default scaling (where the default's
    # error is the final rounding's, fewer moduli tie it with either scaling)
    out["saved_over_max"] = {metric: out["max_fewest_count"][metric] - c
                             for metric, c in out["fast_fewest_count"].items()}
    return out


def _sha() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--ks", default=",".join(map(str, KS)))
    ap.add_argument("--kinds", default=",".join(KINDS))
    args = ap.parse_args(argv)
    ks = [int(v) for v in args.ks.split(",")]
    kinds = args.kinds.split(",")
    record = {"study": "ozaki_fast_study", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
              "git_sha": _sha(), "numpy": np.__version__, "python": sys.version.split()[0], "cpu": _cpu(),
              "m": M, "n": N, "seeds": list(SEEDS), "cases": [],
              # the seed, the PYBLASGEMM_* settings and NVRTC, as every results JSON records them
              **provenance(f"numpy default_rng([seed in {list(SEEDS)}, k, kind's index, float32 or not])")}
    t0 = time.perf_counter()
    plan = [(kind, k, "float64") for k in ks for kind in kinds]
    plan += [(kind, k, "float32") for k in KS_FP32 if k in ks for kind in kinds]
    for kind, k, precision in plan:
        case = study_case(kind, k, precision)
        record["cases"].append(case)
        record["seconds"] = round(time.perf_counter() - t0, 1)
        with open(args.out, "w") as f:
            json.dump(record, f, indent=1)
        print(f"{precision} k={k:5d} {kind:8s} default {case['default_count']} moduli rel "
              f"{case['default']['rel']:.2e} / {case['default']['over_absab']:.2e} | fast fewest "
              f"{case['fast_fewest_count']} (saved {case['saved']}), max fewest {case['max_fewest_count']} | "
              f"native {case['native']['rel']:.2e} "
              f"[{record['seconds']} s]", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
