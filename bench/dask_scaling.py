"""pyblasgemm.dask on 1, 2 and 4 GPUs of one machine, TCP and UCX side by side (issue 32).

    GIT_SHA=<sha> PYTHONPATH=. python bench/dask_scaling.py --gpus 1,2,4 --protocols ucx,tcp \\
        --out bench/results/dask_scaling_<gpu>x<n>_<date>_<sha>.json

Method:

* a ``dask_cuda.LocalCUDACluster`` with one worker per GPU (``CUDA_VISIBLE_DEVICES`` the first
  n GPUs), CuPy chunks, the operands generated on the workers before any timing, each block
  from its own seed (the same bytes on any cluster and in this process), A's row panel i on
  worker i mod n and B's column panel j on worker j mod n (left to itself, Dask put every
  generated block on one worker, and then ran every product there: a smoke run on 2 GPUs
  received 0 bytes);
* time: ``wait(client.persist(z))``, then every worker's device synchronized (a task ends when
  its kernels are queued), inside the timing, each run on freshly generated operands (new
  keys; no worker holds another's blocks from an earlier run: with the same operands every
  run after the warm-up received 0 bytes), generated and waited for outside the timing;
  median of ``--reps`` after one warm-up; TFLOP/s = 2mnk / time;
* the baseline: one ``pyblasgemm.matmul`` call on one GPU in this process (CUDA events, median
  of 5 after a warm-up), on operands of the same shape and type; efficiency on n GPUs =
  speed / (n x the baseline's speed);
* the same arrays and cluster through ``dask.array.matmul``;
* error: the normwise relative error of sampled rows and columns (8 x 256) of the result against
  a float64 product of the same bytes (long double for float64 operands), on the host;
* bits: a digest of every output block (on the workers) from two runs, and
  for --threaded-check cases from the threaded scheduler in this process on the same recipe;
* where the time goes: bytes received by the workers over the timed runs (their transfer
  logs) and Dask's task stream of one run, summed per action (compute, transfer, ...).

Every case's row is written as it finishes (``--out`` is rewritten), so a run cut short keeps
what it measured; a failure is recorded in its row, never hidden.
"""
from __future__ import annotations

import argparse
import json
import logging
import pathlib
import statistics
import sys
import time
import types

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.heldout import meta, write_doc  # noqa: E402

#: (name, m, n, k, dtype, chunk, matmul keywords): the issue's cases
CASES = {
    "32768^3 float16": (32768, 32768, 32768, "float16", 8192, {}),
    "32768^3 bfloat16": (32768, 32768, 32768, "bfloat16", 8192, {}),
    "65536x65536x8192 float16": (65536, 65536, 8192, "float16", 8192, {}),
    "8192x8192x262144 float16": (8192, 8192, 262144, "float16", 8192, {}),
    "16384^3 float64": (16384, 16384, 16384, "float64", 4096, {}),
    "16384^3 float64 int8-ozaki": (16384, 16384, 16384, "float64", 4096, {"compute": "int8-ozaki"}),
    # the pipeline check (--smoke): seconds, not minutes
    "smoke 4096^3 float16": (4096, 4096, 4096, "float16", 1024, {}),
}
SAMPLE_ROWS, SAMPLE_COLS = 8, 256


def _dtype(name):
    import ml_dtypes

    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


SEED = 20261127


def _block(seed, shape, dtype):
    """One operand block: standard normal from its own seed, in ``dtype``."""
    import cupy as cp

    gen = cp.float64 if dtype == "float64" else cp.float32
    x = cp.random.RandomState(seed).standard_normal(shape, dtype=gen)
    if dtype == "bfloat16":             # on the bits (CuPy's astype gave '|V2' blocks Dask refused)
        from pyblasgemm.dask import _to_bfloat16

        return _to_bfloat16(x)
    return x if np.dtype(gen) == _dtype(dtype) else x.astype(_dtype(dtype))


def _seed(tag, i, j):
    return SEED + (1 if tag == "y" else 0) * 1_000_003 + i * 1009 + j


def operands(client, m, n, k, dtype, chunk):
    """X (m x k) and Y (k x n) as Dask arrays of CuPy chunks, generated on the workers: X's row
    panel i on worker i mod n, Y's column panel j on worker j mod n."""
    import cupy as cp
    import dask
    import dask.array as da

    workers = sorted(client.scheduler_info()["workers"])
    want = _dtype(dtype)

    def make(tag, rows, cols, owner):
        out = []
        for i in range(rows // chunk):
            row = []
            for j in range(cols // chunk):
                f = client.submit(_block, _seed(tag, i, j), (chunk, chunk), dtype, pure=False,
                                  workers=[workers[owner(i, j) % len(workers)]], allow_other_workers=False)
                # bfloat16: a NumPy meta (a CuPy one reached Dask as '|V2': 'no common DType')
                meta = np.empty((0, 0), want) if want.name == "bfloat16" else cp.empty((0, 0), want)
                row.append(da.from_delayed(dask.delayed(f), (chunk, chunk), dtype=want, meta=meta))
            out.append(row)
        return da.block(out)

    return make("x", m, k, lambda i, j: i), make("y", k, n, lambda i, j: j)


def local_operands(m, n, k, dtype, chunk):
    """The same blocks in this process (GPU 0), as Dask arrays for the threaded scheduler."""
    import cupy as cp
    import dask.array as da

    def make(tag, rows, cols):
        whole = cp.concatenate([cp.concatenate([_block(_seed(tag, i, j), (chunk, chunk), dtype)
                                                for j in range(cols // chunk)], axis=1)
                                for i in range(rows // chunk)], axis=0)
        return da.from_array(whole, chunks=chunk, asarray=False)

    return make("x", m, k), make("y", k, n)


def _synchronize():
    import cupy as cp

    cp.cuda.Device().synchronize()


def _received_bytes(dask_worker=None):
    """Bytes this worker has received from other workers (its transfer log)."""
    log = getattr(dask_worker, "transfer_incoming_log", None)
    if log is None:
        log = getattr(getattr(dask_worker, "state", None), "transfer_incoming_log", None) or []
    return int(sum(e.get("total", 0) for e in log))


def _digest(block):
    """A 64-bit digest of a block's bits, on its GPU: sum of bits x odd weights mod 2^64 (any
    one changed element changes it; integer sums do not depend on their order)."""
    import cupy as cp

    bits = cp.ascontiguousarray(block).view({2: cp.uint16, 4: cp.uint32, 8: cp.uint64}[block.dtype.itemsize])
    bits = bits.ravel().astype(cp.uint64)
    weights = cp.arange(bits.size, dtype=cp.uint64) * cp.uint64(0x9E3779B97F4A7C15) | cp.uint64(1)
    return np.array([[int((bits * weights).sum())]], np.uint64)


def digests(z, **compute_kw):
    """One 64-bit digest per output block (computed where the block is)."""
    d = z.map_blocks(_digest, dtype=np.uint64, chunks=((1,) * len(z.chunks[0]), (1,) * len(z.chunks[1])),
                     meta=np.empty((0, 0), np.uint64))
    return d


def _wide_host(x):
    """A NumPy array of any of the cases' types as float64 (long double for float64)."""
    import cupy as cp

    x = cp.asnumpy(x) if not isinstance(x, np.ndarray) else x
    return x.astype(np.longdouble if x.dtype == np.float64 else np.float64)


def sampled_error(client, x, y, z, rng):
    m, n = z.shape
    rows = np.sort(rng.choice(m, min(SAMPLE_ROWS, m), replace=False))
    cols = np.sort(rng.choice(n, min(SAMPLE_COLS, n), replace=False))
    xr, yc, zs = client.compute([x[rows], y[:, cols], z[rows][:, cols]], sync=True)
    ref = _wide_host(xr) @ _wide_host(yc)
    got = _wide_host(zs)
    return float(np.linalg.norm((got - ref).astype(np.float64)) / np.linalg.norm(ref.astype(np.float64)))


def time_persist(client, make, reps, flops_label=""):
    """(median s, times, received bytes per run, task-stream summary) of ``make()``'s product:
    each run on freshly generated operands (generated and waited for outside the timing), so
    its keys are new and no worker holds a copy of another's blocks from an earlier run
    (after one warm-up on the same operands, every later run received 0 bytes)."""
    from distributed import get_task_stream, wait

    x, y, z = make()
    wait(client.persist(z))                                  # warm-up: kernels, plans, pools
    client.run(_synchronize)
    del x, y, z
    times, received = [], []
    summary = None
    for rep in range(reps + 1):
        x, y, z = make()
        wait([x, y])
        client.run(_synchronize)
        before = sum(client.run(_received_bytes).values())
        last = rep == reps
        stream = get_task_stream(client) if last else None
        if stream is not None:
            stream.__enter__()
        t0 = time.perf_counter()
        done = client.persist(z)
        wait(done)
        client.run(_synchronize)
        elapsed = time.perf_counter() - t0
        if stream is not None:
            stream.__exit__(None, None, None)
            summary = {}
            for task in stream.data:
                for ss in task.get("startstops", ()):
                    act = ss.get("action", "?")
                    summary[act] = summary.get(act, 0.0) + float(ss["stop"] - ss["start"])
            summary = {k: round(v, 4) for k, v in summary.items()}
            summary["tasks"] = len(stream.data)
            summary["run_s"] = round(elapsed, 4)
        else:
            times.append(elapsed)
            received.append(sum(client.run(_received_bytes).values()) - before)
        del done, x, y, z
    return statistics.median(times), times, statistics.median(received), summary


def baseline(m, n, k, dtype, kw):
    """One pyblasgemm.matmul call on one GPU, this process: (median s of 5 by CUDA events)."""
    import cupy as cp

    import pyblasgemm

    rs = cp.random.RandomState(1)
    gen = cp.float64 if dtype == "float64" else cp.float32
    x = rs.standard_normal((m, k), dtype=gen).astype(_dtype(dtype))
    y = rs.standard_normal((k, n), dtype=gen).astype(_dtype(dtype))
    out = pyblasgemm.matmul(x, y, **kw)
    times = []
    for _ in range(5):
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        pyblasgemm.matmul(x, y, out=out, **kw)
        stop.record()
        stop.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, stop) / 1e3)
    del x, y, out
    cp.get_default_memory_pool().free_all_blocks()
    return statistics.median(times)


def run_case(client, name, n_gpus, protocol, reps, base_s, digests_seen, with_dask=True):
    import dask.array as da
    from distributed import wait

    from pyblasgemm import dask as pbd

    m, n, k, dtype, chunk, kw = CASES[name]
    flops = 2.0 * m * n * k
    row = {"case": name, "gpus": n_gpus, "protocol": protocol, "m": m, "n": n, "k": k, "dtype": dtype,
           "chunk": chunk, "matmul_kw": kw, "baseline_one_call_s": base_s}
    products = {"pyblasgemm.dask.matmul": lambda x, y: pbd.matmul(x, y, **kw)}
    if with_dask and not kw:
        products["dask.array.matmul"] = da.matmul
    for label, product in products.items():
        def make():
            # persisted: the block assembly (da.block's tasks) runs before the timing, as
            # operands a user multiplies are in memory (un-persisted, it doubled 1 GPU's time)
            x, y = operands(client, m, n, k, dtype, chunk)
            x, y = client.persist(x), client.persist(y)
            return x, y, product(x, y)
        try:
            med, times, received, stream = time_persist(client, make, reps)
            res = {"median_s": med, "times_s": times, "tflops": flops / med / 1e12,
                   "received_bytes_per_run": received, "task_stream": stream}
            if base_s:
                res["efficiency"] = (flops / med) / (n_gpus * flops / base_s)
                res["speedup_vs_one_call"] = base_s / med
            x, y, z = make()
            res["tasks"] = len(z.__dask_graph__()) - len(x.__dask_graph__()) - len(y.__dask_graph__())
            zz = client.persist(z)
            wait(zz)
            res["error_sampled"] = sampled_error(client, x, y, zz, np.random.default_rng(7))
            if label == "pyblasgemm.dask.matmul":
                d1 = client.compute(digests(zz), sync=True)
                del zz
                zz2 = client.persist(product(x, y))           # the same operands, a second run
                wait(zz2)
                d2 = client.compute(digests(zz2), sync=True)
                res["bitwise_two_runs"] = bool(np.array_equal(d1, d2))
                digests_seen.setdefault(name, []).append({"gpus": n_gpus, "protocol": protocol, "digest": d1})
                del zz2
            del x, y, z
        except Exception as e:              # recorded, not hidden
            res = {"failure": f"{type(e).__name__}: {e}"[:400]}
        row[label] = res
        print(f"  {name} {n_gpus} GPU {protocol} {label}: "
              + (f"{res['median_s'] * 1e3:.1f} ms, {res['tflops']:.0f} TF/s, eff {res.get('efficiency', float('nan')):.2f}, "
                 f"recv {res['received_bytes_per_run'] / 2**30:.2f} GiB/run, err {res['error_sampled']:.2e}"
                 if "median_s" in res else res["failure"]), flush=True)
    if "dask.array.matmul" in row and "median_s" in row["dask.array.matmul"] and "median_s" in row["pyblasgemm.dask.matmul"]:
        row["ratio_vs_dask_array"] = row["dask.array.matmul"]["median_s"] / row["pyblasgemm.dask.matmul"]["median_s"]
    return row


def cluster(n_gpus, protocol):
    import dask_cuda

    kw = dict(CUDA_VISIBLE_DEVICES=",".join(str(i) for i in range(n_gpus)), n_workers=n_gpus,
              dashboard_address=None, silence_logs=logging.ERROR)
    if protocol != "tcp":
        kw.update(protocol=protocol, enable_nvlink=True, enable_tcp_over_ucx=True)
    return dask_cuda.LocalCUDACluster(**kw)


def threaded_digest(name):
    """The product's block digests from the threaded scheduler in this process (GPU 0)."""
    from pyblasgemm import dask as pbd

    m, n, k, dtype, chunk, kw = CASES[name]
    x, y = local_operands(m, n, k, dtype, chunk)
    return digests(pbd.matmul(x, y, **kw)).compute(scheduler="threads")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--plot", metavar="RESULTS", help="draw --out (a PNG) from a results file; no run")
    ap.add_argument("--gpus", default="1,2,4")
    ap.add_argument("--protocols", default="ucx,tcp")
    ap.add_argument("--cases", default=",".join(c for c in CASES if not c.startswith("smoke")))
    ap.add_argument("--tcp-cases", default="32768^3 float16", help="the cases also run over TCP")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threaded-check", default="32768^3 float16")
    ap.add_argument("--no-dask-array", action="store_true")
    args = ap.parse_args(argv)
    if args.plot:
        plot(args.plot, args.out)
        return 0
    gpus = [int(g) for g in args.gpus.split(",")]
    cases = [c for c in args.cases.split(",") if c]
    for c in cases + [c for c in args.tcp_cases.split(",") if c]:
        if c not in CASES:
            ap.error(f"--cases: unknown case {c!r}; known: {', '.join(CASES)}")
    import cupy as cp
    import dask
    import dask_cuda
    import distributed

    try:
        import torch
    except ImportError:
        torch = None
    doc = {"schema": "pyblasgemm-dask-scaling/1",
           **meta(types.SimpleNamespace(torch=torch),
                  seed="blocks: CuPy RandomState(_seed(tag, i, j)); one-GPU operands RandomState(1); "
                       "sampled check numpy default_rng(7)"),
           "method": __doc__,
           "gpu_count": cp.cuda.runtime.getDeviceCount(), "cases": [], "failures": []}
    doc["versions"].update({"dask": dask.__version__, "distributed": distributed.__version__,
                            "dask_cuda": dask_cuda.__version__})
    for mod in ("distributed_ucxx", "ucxx"):
        try:
            doc["versions"][mod] = __import__(mod).__version__
        except Exception as e:
            doc["versions"][mod] = f"unavailable: {type(e).__name__}"
    bases = {}
    for name in dict.fromkeys(cases + args.tcp_cases.split(",")):
        if not name:
            continue
        m, n, k, dtype, chunk, kw = CASES[name]
        try:
            bases[name] = baseline(m, n, k, dtype, kw)
            print(f"baseline {name}: {bases[name] * 1e3:.1f} ms, {2 * m * n * k / bases[name] / 1e12:.0f} TF/s", flush=True)
        except Exception as e:
            bases[name] = None
            doc["failures"].append({"baseline": name, "failure": f"{type(e).__name__}: {e}"[:400]})
    doc["baselines_s"] = bases
    seen = {}
    for protocol in args.protocols.split(","):
        todo = cases if protocol != "tcp" else [c for c in args.tcp_cases.split(",") if c]
        for n_gpus in gpus:
            if n_gpus > doc["gpu_count"]:
                continue
            t0 = time.perf_counter()
            try:
                with cluster(n_gpus, protocol) as cl, distributed.Client(cl) as client:
                    print(f"cluster: {n_gpus} GPU, {protocol}, up in {time.perf_counter() - t0:.1f} s", flush=True)
                    for name in todo:
                        try:
                            row = run_case(client, name, n_gpus, protocol, args.reps, bases.get(name), seen,
                                           with_dask=not args.no_dask_array)
                        except Exception as e:
                            row = {"case": name, "gpus": n_gpus, "protocol": protocol,
                                   "failure": f"{type(e).__name__}: {e}"[:400]}
                            print("  FAILED", row, flush=True)
                        doc["cases"].append(row)
                        write_doc(doc, args.out)
            except Exception as e:
                doc["failures"].append({"cluster": f"{n_gpus} GPU {protocol}", "failure": f"{type(e).__name__}: {e}"[:400]})
                print("cluster FAILED", doc["failures"][-1], flush=True)
                write_doc(doc, args.out)
    # bits: every run of a case against the first, and the threaded scheduler in this process
    bits = {}
    for name, runs in seen.items():
        first = runs[0]["digest"]
        bits[name] = {"runs": [f"{r['gpus']} GPU {r['protocol']}" for r in runs],
                      "all_runs_equal": all(np.array_equal(first, r["digest"]) for r in runs)}
        if name in args.threaded_check.split(","):
            try:
                bits[name]["threaded_equal"] = bool(np.array_equal(first, threaded_digest(name)))
            except Exception as e:
                bits[name]["threaded_equal"] = f"failed: {type(e).__name__}: {e}"[:300]
    doc["bitwise"] = bits
    print("bitwise:", json.dumps(bits), flush=True)
    write_doc(doc, args.out)
    return 0



def guide_rows(path) -> list:
    """(case, gpus, protocol, ours ms, speedup over one call, efficiency, GiB received,
    dask.array.matmul ms or None, ratio or None) per measured row of one results file."""
    doc = json.loads(pathlib.Path(path).read_text())
    rows = []
    for c in doc["cases"]:
        ours = c.get("pyblasgemm.dask.matmul", {})
        if "median_s" not in ours:
            continue
        theirs = c.get("dask.array.matmul", {})
        rows.append((c["case"], c["gpus"], c["protocol"], ours["median_s"] * 1e3, ours.get("speedup_vs_one_call"),
                     ours.get("efficiency"), ours["received_bytes_per_run"] / 2**30,
                     theirs["median_s"] * 1e3 if "median_s" in theirs else None, c.get("ratio_vs_dask_array")))
    return rows


def guide_table(path, protocol="ucx") -> str:
    """The guide's scaling table (reStructuredText list-table) of one results file.

    >>> print(guide_table(ROOT / "bench/results/dask_scaling_h200x4_2026-11-27_0a13fa0.json").splitlines()[0])
    .. list-table:: Scaling on 4 NVIDIA H200 (NVLink NV18), UCX, one worker per GPU (median of 3)
    """
    doc = json.loads(pathlib.Path(path).read_text())
    lines = [f".. list-table:: Scaling on {doc['gpu_count']} {doc['device']['name']} (NVLink NV18), "
             f"{protocol.upper()}, one worker per GPU (median of 3)",
             "   :header-rows: 1", "",
             "   * - product", "     - GPUs", "     - pyblasgemm.dask", "     - x one call (efficiency)",
             "     - received", "     - dask.array.matmul (ours faster by)"]
    for case, gpus, proto, ms, speed, eff, gib, theirs, ratio in guide_rows(path):
        if proto != protocol:
            continue
        lines += [f"   * - {case}", f"     - {gpus}", f"     - {ms:.1f} ms", f"     - {speed:.2f}x ({eff:.2f})",
                  f"     - {gib:.2f} GiB",
                  f"     - {theirs:.1f} ms ({ratio:.2f}x)" if theirs is not None else "     - (not run)"]
    return "\n".join(lines)


def plot(path, out) -> None:
    """Speed over one pyblasgemm call against GPUs, per product: ours and dask.array.matmul."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in guide_rows(path) if r[2] == "ucx"]
    doc = json.loads(pathlib.Path(path).read_text())
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for case in dict.fromkeys(r[0] for r in rows):
        mine = [r for r in rows if r[0] == case]
        gpus = [r[1] for r in mine]
        line, = ax.plot(gpus, [r[4] for r in mine], marker="o", label=f"{case}: pyblasgemm.dask")
        theirs = [(r[1], doc["baselines_s"][case] * 1e3 / r[7]) for r in mine if r[7]]
        if theirs:
            ax.plot(*zip(*theirs), marker="x", linestyle=":", color=line.get_color(),
                    label=f"{case}: dask.array.matmul")
    ax.plot([1, 4], [1, 4], color="grey", linewidth=0.8, label="ideal")
    ax.set_xticks([1, 2, 4])
    ax.set_xlabel("GPUs (one Dask worker each, UCX)")
    ax.set_ylabel("speed / one pyblasgemm call on one GPU")
    ax.set_title(f"pyblasgemm.dask scaling, {doc['device']['name']}, git {doc['git_sha']}", fontsize=9)
    ax.legend(fontsize=6, loc="upper left")
    fig.tight_layout()
    fig.savefig(out, dpi=130)


if __name__ == "__main__":
    sys.exit(main())
