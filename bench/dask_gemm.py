"""pyblasgemm.dask against dask.array.matmul on the same arrays and cluster (issue: Dask).

    PYTHONPATH=. python bench/dask_gemm.py --out bench/results/dask_<gpu>_<date>_<sha>.json

* accuracy: float16 and bfloat16, m = n = 4096, k = 16384 in 8 and in 32 K chunks (row and
  column chunks 2048), CuPy chunks, on the LocalCUDACluster: the normwise error
  ||Z - Z64|| / ||Z64|| of pyblasgemm.dask.matmul, of one pyblasgemm.matmul call on the whole
  problem and of dask.array.matmul, against a float64 product of the same bytes (CuPy's
  DGEMM), every result in the operands' type (NumPy's, and so pyblasgemm's, result type of
  bfloat16 operands is float32: those results are rounded once to bfloat16); and the rounding floor: the error of Z64 rounded once to the result type, which no
  result in that type can beat;
* time: 16384³ float16 in 4096² chunks on one GPU, a dask_cuda.LocalCUDACluster with one
  worker: wall time of ``wait(client.persist(z))`` (z cloned to fresh keys each time) and then a
  device synchronize on the worker
  (a task ends when its launches are queued, not when the GPU is done), the operands persisted
  there first, median of 3 after a warm-up; the same for dask.array.matmul, and for
  pyblasgemm.dask.matmul with K in 2 tasks of 2 chunks a block (``k_group=2``). The default is
  all of K in one task per block (16 output blocks, at least ``MIN_TASKS``): the rows up to
  8bf323d called it ``k_group=all``, and their ``pyblasgemm.dask.matmul`` row was the old
  default, ``k_group=2``. (Runs up to eee2d20 timed ``client.compute(z).result()``, which also
  gathers the 512 MB result into the client process);
* determinism: the LocalCUDACluster's and the threaded scheduler's results, bitwise.

Ratios > 1: pyblasgemm faster.
"""
from __future__ import annotations

import argparse
import itertools
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


def _wide(z):
    """A CuPy array as float64 (bfloat16 through its bits: CuPy has no bfloat16 cast)."""
    import cupy as cp

    if z.dtype.itemsize == 2 and z.dtype.kind == "V":
        z = (z.view(cp.uint16).astype(cp.uint32) << 16).view(cp.float32)
    return z.astype(cp.float64)


def _norm_err(z, ref):
    import cupy as cp

    return float(cp.linalg.norm(_wide(z) - ref) / cp.linalg.norm(ref))


def _rounded(ref, dtype):
    """float64 -> dtype, rounded to nearest even (bfloat16 on the bits, as pyblasgemm.dask does)."""
    import cupy as cp

    if dtype == "bfloat16":
        from pyblasgemm.dask import _to_bfloat16

        return _to_bfloat16(ref.astype(cp.float32))   # float64 -> float32 -> bfloat16: double
        # rounding can differ from a direct rounding only on exact ties of the float32 value
    return ref.astype(cp.float16)


def accuracy(client, dtype, parts, m=4096, k=16384, n=4096):
    import cupy as cp
    import dask.array as da
    import ml_dtypes

    import pyblasgemm
    from pyblasgemm import dask as pbd

    rs = cp.random.RandomState(11)
    x, y = (rs.standard_normal(shape, dtype=cp.float32) for shape in ((m, k), (k, n)))
    if dtype == "bfloat16":                 # rounded on the bits (CuPy has no bfloat16 astype)
        x, y = _rounded(x, dtype), _rounded(y, dtype)
    else:
        x, y = x.astype(cp.float16), y.astype(cp.float16)
    if x.dtype != np.dtype(getattr(ml_dtypes, dtype, dtype)):
        raise RuntimeError(f"the {dtype} operands came out {x.dtype}")
    ref = _wide(x) @ _wide(y)
    X = da.from_array(x, chunks=(m // 2, k // parts), asarray=False)
    Y = da.from_array(y, chunks=(k // parts, n // 2), asarray=False)
    # in the operands' type, as dask.array.matmul returns (NumPy's, and so pyblasgemm's, result
    # type of bfloat16 @ bfloat16 is float32, which is rounded once here)
    def in_operand_type(z):
        return z if z.dtype == x.dtype else _rounded(z, dtype)

    results = {"pyblasgemm.dask.matmul": in_operand_type(cp.asarray(client.compute(pbd.matmul(X, Y)).result())),
               "pyblasgemm.matmul (one call)": in_operand_type(pyblasgemm.matmul(x, y))}
    try:
        results["dask.array.matmul"] = cp.asarray(client.compute(da.matmul(X, Y)).result())
    except Exception as e:                  # recorded, not hidden: the row says what Dask did
        results["dask.array.matmul"] = None
        failure = f"{type(e).__name__}: {e}"[:300]
    else:
        failure = None
    results["rounding floor (float64 product rounded once)"] = _rounded(ref, dtype)
    out = {name: None if z is None else _norm_err(z, ref) for name, z in results.items()}
    result_dtypes = {name: None if z is None else str(z.dtype) for name, z in results.items()}
    return {"case": "accuracy", "dtype": dtype, "m": m, "k": k, "n": n, "k_chunks": parts, "errors": out,
            "result_dtypes": result_dtypes, "dask_failure": failure,
            "ratio_one_call": out["pyblasgemm.dask.matmul"] / out["pyblasgemm.matmul (one call)"],
            "ratio_dask": None if failure else out["dask.array.matmul"] / out["pyblasgemm.dask.matmul"],
            "ratio_floor": out["pyblasgemm.dask.matmul"] / out["rounding floor (float64 product rounded once)"]}


def _synchronize():
    """Run on each worker: wait for its GPU (a Dask task returns once its kernels are queued)."""
    import cupy as cp

    cp.cuda.Device().synchronize()


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
    from dask.graph_manipulation import clone
    from distributed import wait
    wait([X, Y])
    res = {}
    contenders = (("pyblasgemm.dask.matmul", pbd.matmul(X, Y)),      # all of K in one task a block
                  ("pyblasgemm.dask.matmul k_group=2", pbd.matmul(X, Y, k_group=2)),   # the old default
                  ("dask.array.matmul", da.matmul(X, Y)))
    for name, z in contenders:
        # the product stays on the worker (persist + wait): gathering 512 MB of result into this
        # process (device -> host -> TCP) would be most of what a compute().result() times
        wait(client.persist(z))                        # warm-up: kernels, plans, pools
        client.run(_synchronize)
        times = []
        for rep in range(reps):
            # fresh keys each time (the operands' kept): a graph whose keys a previous persist
            # still holds would be answered from memory (an H100 run timed 7.6 ms, 1150 TFLOP/s)
            fresh = clone(z, omit=(X, Y), seed=rep)
            t0 = time.perf_counter()
            done = client.persist(fresh)
            wait(done)
            client.run(_synchronize)
            times.append(time.perf_counter() - t0)
            del done
        res[name] = {"median_s": statistics.median(times), "times_s": times,
                     "tflops": 2 * s**3 / statistics.median(times) / 1e12,
                     "tasks": len(z.__dask_graph__())}
    res["ratio"] = res["dask.array.matmul"]["median_s"] / res["pyblasgemm.dask.matmul"]["median_s"]
    res["ratio_k_group_2"] = (res["dask.array.matmul"]["median_s"]
                              / res["pyblasgemm.dask.matmul k_group=2"]["median_s"])
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
    doc = {"schema": "pyblasgemm-dask/1",
           **meta(types.SimpleNamespace(torch=torch),
                  seed="operands: CuPy RandomState(11), RandomState(12); clones: the repetition"),
           "method": __doc__,
           "cases": []}
    import dask
    import distributed
    doc["versions"].update({"dask": dask.__version__, "distributed": distributed.__version__})
    import dask_cuda
    doc["versions"]["dask_cuda"] = dask_cuda.__version__
    with dask_cuda.LocalCUDACluster(n_workers=1, dashboard_address=None, silence_logs=logging.ERROR) as cluster, \
            distributed.Client(cluster) as client:
        for dtype, parts in itertools.product(("float16", "bfloat16"), (8, 32)):
            row = accuracy(client, dtype, parts)
            doc["cases"].append(row)
            print(json.dumps(row), flush=True)
        row = timing(client)
        doc["cases"].append(row)
        print(json.dumps(row), flush=True)
    write_doc(doc, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
