"""Accuracy of every compute= mode against float64, and bitwise reproducibility of every
decomposition of our kernels, measured on the GPU. Writes JSON (used by docs/guide/precision).

    python bench/precision.py [--out bench/results/precision_<device>_<date>.json]

Error: ||C - C64||_F / ||C64||_F, where C64 is the float64 product of the very inputs the GPU
saw (so the number is the GEMM's own error: accumulation, tf32 rounding inside the product,
and the rounding of C to its type), on uniform(-1, 1) data. Reproducibility: each
decomposition runs ``RUNS`` times on the same inputs and the outputs are compared bit for bit.
"""
from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import platform
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
if (ROOT / "pyblasgemm").is_dir() and str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

RUNS = 5
SHAPES = ((1024, 1024, 1024), (256, 256, 16384))
#: (label, routine, compute, backends)
MODES = (
    ("float32, compute='fp32'", "sgemm", "fp32", ("cublas",)),
    ("float32, compute='tf32'", "sgemm", "tf32", ("cublas", "tensorcore")),
    ("float32, compute='3xtf32'", "sgemm", "3xtf32", ("tensorcore",)),
    ("float16, compute='fp32'", "hgemm", "fp32", ("cublas", "tensorcore")),
    ("float16, compute='fp16'", "hgemm", "fp16", ("cublas", "tensorcore")),
    ("bfloat16, compute='fp32'", "bgemm", "fp32", ("cublas", "tensorcore")),
    ("int8, compute='int32'", "igemm", "int32", ("cublas", "tensorcore")),
    ("float64, compute='fp64'", "dgemm", "fp64", ("cublas",)),
)


def main(argv=None) -> int:
    import cupy as cp
    import ml_dtypes

    import pyblasgemm
    from pyblasgemm.benchmarks.suite import provenance
    from pyblasgemm.kernels import DECOMPOSITIONS, KernelConfig, KernelProblem, run

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    props = cp.cuda.runtime.getDeviceProperties(0)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    doc = {**provenance(0),
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "device": {"name": name}, "driver": cp.cuda.runtime.driverGetVersion(),
           "cuda_runtime": cp.cuda.runtime.runtimeGetVersion(),
           "versions": {"pyblasgemm": pyblasgemm.__version__, "cupy": cp.__version__,
                        "numpy": np.__version__, "python": platform.python_version()},
           "method": __doc__.split("\n\n")[1].replace("\n", " "), "errors": [],
           "determinism": []}
    rng = np.random.default_rng(0)
    types = {"sgemm": (np.float32, np.float32), "hgemm": (np.float16, np.float16),
             "bgemm": (ml_dtypes.bfloat16, ml_dtypes.bfloat16), "igemm": (np.int8, np.int32),
             "dgemm": (np.float64, np.float64)}
    for m, n, k in SHAPES:
        for label, routine, compute, backends in MODES:
            ab, cdt = types[routine]
            if routine == "igemm":
                a_h = rng.integers(-128, 128, m * k).astype(np.int8)
                b_h = rng.integers(-128, 128, k * n).astype(np.int8)
            else:
                a_h = rng.uniform(-1, 1, m * k).astype(ab)
                b_h = rng.uniform(-1, 1, k * n).astype(ab)
            ref = (a_h.astype(np.float64).reshape(k, m).T @ b_h.astype(np.float64).reshape(n, k).T)
            a, b = cp.asarray(a_h), cp.asarray(b_h)
            for backend in backends:
                c = cp.full(m * n, np.nan if routine != "igemm" else -1, dtype=cdt)
                one, zero = (1, 0) if routine == "igemm" else (1.0, 0.0)
                try:
                    getattr(pyblasgemm, routine)("N", "N", m, n, k, one, a, m, b, k, zero, c, m,
                                                 compute=compute, backend=backend)
                    got = c.get().astype(np.float64).reshape(n, m).T
                    err = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
                    row = {"mode": label, "backend": backend, "m": m, "n": n, "k": k,
                           "rel_error": err}
                except Exception as exc:
                    row = {"mode": label, "backend": backend, "m": m, "n": n, "k": k,
                           "rel_error": None, "error": f"{type(exc).__name__}: {exc}"[:200]}
                doc["errors"].append(row)
                print(row, flush=True)
    # bitwise reproducibility of each decomposition (our kernels, fp16, long K and a tail wave)
    for m, n, k in ((512, 512, 8192), (3072, 3072, 1024)):
        a = cp.asarray(rng.uniform(-1, 1, m * k).astype(np.float16))
        b = cp.asarray(rng.uniform(-1, 1, k * n).astype(np.float16))
        outs = {}
        for d in DECOMPOSITIONS:
            cfg = KernelConfig(decomposition=d, splits=8 if d.startswith("splitk") else 0)
            got = []
            for _ in range(RUNS):
                c = cp.full(m * n, np.nan, dtype=np.float16)
                p = KernelProblem("f16", "N", "N", m, n, k, m, k, m, a.data.ptr, b.data.ptr,
                                  c.data.ptr, 1.0, 0.0, "f32", 1, 0, 0, 0)
                run(p, cfg)
                got.append(c.get())
            same = all(np.array_equal(g.view(np.uint16), got[0].view(np.uint16)) for g in got)
            outs[d] = got[0]
            row = {"decomposition": d, "config": cfg.name, "m": m, "n": n, "k": k,
                   "runs": RUNS, "bitwise_identical": bool(same)}
            doc["determinism"].append(row)
            print(row, flush=True)
        base = outs["sliced"].view(np.uint16)
        doc["determinism"].append({"m": m, "n": n, "k": k, "note": "differing bits vs sliced",
                                   **{d: int((o.view(np.uint16) != base).sum())
                                      for d, o in outs.items()}})
    out = args.out
    if out is None:   # a free name: never overwrite a measurement
        base = ROOT / "bench" / "results" / f"precision_{name.split()[1].lower()}_{doc['date'][:10]}"
        out, n_run = f"{base}.json", 1
        while pathlib.Path(out).exists():
            n_run += 1
            out = f"{base}_run{n_run}.json"
    pathlib.Path(out).write_text(json.dumps(doc, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
