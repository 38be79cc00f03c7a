"""pyblasgemm.dask against dask.array.matmul on the same arrays and cluster (issue: Dask).

    PYTHONPATH=. python bench/dask_gemm.py --out bench/results/dask_<gpu>_<date>_<sha>.json

* accuracy: float16 and bfloat16, m = n = 4096, k = 16384 in 8 K chunks (chunks 2048 x 2048),
  CuPy chunks, on the LocalCUDACluster: the normwise error ||Z - Z64|| / ||Z64|| of pyblasgemm.dask.matmul, of one
  pyblasgemm.matmul call on the whole problem and of dask.array.matmul, against a float64
  product of the same bytes (CuPy's DGEMM);
* time: 16384³ float16 in 4096² chunks on one GPU, a dask_cuda.LocalCUDACluster with one
  worker: wall time of ``wait(client.persist(z))`` (the product computed and kept on the
  worker) with the operands persisted there first, median of 3 after a warm-up; the same for
  dask.array.matmul. (Runs up to eee2d20 timed ``client.compute(z).result()``, which also
  gathers the 512 MB result into the client process);
* determinism: the LocalCUDACluster's and the threaded scheduler's results, bitwise.

Ratios > 1: pyblasgemm faster.
"""
from __future__ import annotations

import argparse
import json
import logging
import pathlib
import statistics
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.heldout import meta, write_doc  # noqa: E402


def _norm_err(z, ref):
    import cupy as cp

    if z.dtype.itemsize == 2 and z.dtype.kind == "V":        # bfloat16: CuPy casts it through its bits
        z = (z.view(cp.uint16).astype(cp.uint32) << 16).view(cp.float32)
    z = z.astype(cp.float64)
    return float(cp.linalg.norm(z - ref) / cp.linalg.norm(ref))


def accuracy(client, dtype, m=4096, k=16384, n=4096, parts=8):
    import cupy as cp
    import dask.array as da
    import ml_dtypes

    import pyblasgemm
    from pyblasgemm import dask as pbd

    dt = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16}[dtype]
    rs = cp.random.RandomState(11)
    x = rs.standard_normal((m, k), dtype=cp.float32).astype(dt)
    y = rs.standard_normal((k, n), dtype=cp.float32).astype(dt)
    ref = x.astype(cp.float64) @ y.astype(cp.float64)
    X = da.from_array(x, chunks=(m // 2, k // parts), asarray=False)
    Y = da.from_array(y, chunks=(k // parts, n // 2), asarray=False)
    out = {"pyblasgemm.dask.matmul": _norm_err(cp.asarray(client.compute(pbd.matmul(X, Y)).result()), ref),
           "pyblasgemm.matmul (one call)": _norm_err(pyblasgemm.matmul(x, y), ref),
           "dask.array.matmul": _norm_err(cp.asarray(client.compute(da.matmul(X, Y)).result()), ref)}
    return {"case": "accuracy", "dtype": dtype, "m": m, "k": k, "n": n, "k_chunks": parts, "errors": out,
            "ratio_one_call": out["pyblasgemm.dask.matmul"] / out["pyblasgemm.matmul (one call)"],
            "ratio_dask": out["dask.array.matmul"] / out["pyblasgemm.dask.matmul"]}


def timing(client, s=16384, chunk=4096, reps=3):
    import cupy as cp
    import dask.array as da

    from pyblasgemm import dask as pbd

    rs = cp.random.RandomState(12)
    x = rs.standard_normal((s, s), dtype=cp.float32).astype(cp.float16)
    y = rs.standard_normal((s, s), dtype=cp.float32).astype(cp.float16)
    X = da.from_array(x, chunks=chunk, asarray=False)
    Y = da.from_array(y, chunks=chunk, asarray=False)
    X, Y = client.persist(X), client.persist(Y)
    from distributed import wait
    wait([X, Y])
    res = {}
    for name, z in (("pyblasgemm.dask.matmul", pbd.matmul(X, Y)), ("dask.array.matmul", da.matmul(X, Y))):
        # the product stays on the worker (persist + wait): gathering 512 MB of result into this
        # process (device -> host -> TCP) would be most of what a compute().result() times
        wait(client.persist(z))                        # warm-up: kernels, plans, pools
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            done = client.persist(z)
            wait(done)
            times.append(time.perf_counter() - t0)
            del done
        res[name] = {"median_s": statistics.median(times), "times_s": times,
                     "tflops": 2 * s**3 / statistics.median(times) / 1e12,
                     "tasks": len(z.__dask_graph__())}
    res["ratio"] = res["dask.array.matmul"]["median_s"] / res["pyblasgemm.dask.matmul"]["median_s"]
    # determinism: the cluster's bits and the threaded scheduler's
    z = pbd.matmul(X, Y)
    on_cluster = client.compute(z).result()
    threaded = pbd.matmul(da.from_array(x, chunks=chunk, asarray=False),
                          da.from_array(y, chunks=chunk, asarray=False)).compute(scheduler="threads")
    res["bitwise_equal_cluster_vs_threaded"] = bool(cp.array_equal(on_cluster.view(cp.uint16), threaded.view(cp.uint16)))
    return {"case": "time 16384^3 float16, 4096^2 chunks, one GPU", **res}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    import types

    import torch
    doc = {"schema": "pyblasgemm-dask/1", **meta(types.SimpleNamespace(torch=torch)), "method": __doc__,
           "cases": []}
    import dask
    import distributed
    doc["versions"].update({"dask": dask.__version__, "distributed": distributed.__version__})
    import dask_cuda
    doc["versions"]["dask_cuda"] = dask_cuda.__version__
    with dask_cuda.LocalCUDACluster(n_workers=1, dashboard_address=None, silence_logs=logging.ERROR) as cluster, \
            distributed.Client(cluster) as client:
        for dtype in ("float16", "bfloat16"):
            row = accuracy(client, dtype)
            doc["cases"].append(row)
            print(json.dumps(row), flush=True)
        row = timing(client)
        doc["cases"].append(row)
        print(json.dumps(row), flush=True)
    write_doc(doc, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
