"""pyblasgemm.dask on 1, 2 and 4 GPUs of one machine, over TCP, UCX and CUDA IPC (issue 32).

    GIT_SHA=<sha> PYTHONPATH=/tmp/site:. python bench/dask_scaling.py --gpus 1,2,4 \
        --probe tcp,ucx,ucx-nvlink,ucx-nvlink-nopool --transport best,tcp \
        --out bench/results/dask_scaling_<gpu>x<n>_<date>_<sha>.json
    PYTHONPATH=. python bench/dask_scaling.py --smoke --out /tmp/smoke.json   # CPU, NumPy chunks

``--quick``: one device command of at most 8 minutes on a 4-GPU machine, no UCX needed (the
128 MiB probe over tcp and ipc; 32768³ float16 and 16384³ float64 on 1, 2 and 4 GPUs over
ipc; dask.array.matmul once, 32768³ float16 on 4 GPUs; the threaded scheduler's bits of
32768³ float16), run from the repository root::

    mkdir -p $OUT && GIT_SHA=$(git rev-parse --short HEAD) PYTHONPATH=.:bench timeout 470 \
        python bench/dask_scaling.py --quick --out $OUT/dask_scaling_quick.json > $OUT/quick.log 2>&1; \
        tail -40 $OUT/quick.log

Method:

* transports (``TRANSPORTS``): Dask's default TCP; ``ipc``: TCP for Dask's messages and
  pyblasgemm.dask's CUDA IPC transport for the GPU blocks (``transport="ipc"``: an export task
  on the worker holding a block, a device-to-device copy by the worker that reads it; the
  other transports' rows pass ``transport="dask"``); UCX (dask-cuda ``protocol="ucx"``,
  distributed-ucxx) choosing its own transports; UCX told to use NVLink (``enable_nvlink``:
  ``UCX_TLS=tcp,cuda_copy,cuda_ipc``), each UCX cluster with an RMM pool that CuPy allocates
  from too (one CUDA IPC handle for the pool, not one a block) and the CUDA context created
  before UCX starts (dask-cuda's ``create-cuda-context``); and the 2026-11-27 run's UCX
  settings (no pool). Each transport runs in a process of its own (UCX is set up once a
  process), under a deadline (``--budget-s``): a transport that hangs costs its share only;
* the probe (``--probe``: on the largest cluster; with the cases, on each of 2 workers or
  more): a 128 MiB CuPy block generated on worker 0 and read by a task on worker 1 (median of
  5, after a warm-up: the wall time and the worker's own transfer log), 8 such blocks at once,
  and every worker reading one block from every other at once (GB/s = 1e9 bytes/s); what UCX
  reports it has (``ucxx.get_active_transports()``, its ``TLS``) and the allocators on each
  worker; and the protocols UCX chose: the probe's processes run with ``UCX_PROTO_INFO=y``,
  the lines of its report that name a transport (``cuda_ipc``: NVLink) are kept, the whole
  output is in ``<out>.probe-<transport>.log``. ``--transport best`` runs the cases on the
  probed transport with the most GB/s between workers;
* a ``dask_cuda.LocalCUDACluster`` with one worker per GPU (``CUDA_VISIBLE_DEVICES`` the first
  n GPUs), a worker fetching up to ``--message-bytes-limit`` (1 GiB) from another in one
  message (Dask's 50 MB is one block a message, and distributed-ucxx synchronizes both devices
  around every message that carries GPU memory), CuPy chunks, each operand block generated on a worker from its own seed (the same
  bytes on any cluster and in this process) and kept there: an operand with at least n row
  (column) panels is spread by them, A's row panel i (B's column panel j) on worker
  ``i * n // panels``, as a loader of row panels would; one with fewer (the long-K case's one
  row panel) is spread by its K chunks, chunk k on worker ``k * n // K chunks``;
* each timed run on fresh operands (new keys, the same bytes), generated and waited for
  outside the timing, the product's graph built on them (its time reported apart: for
  pyblasgemm.dask it includes asking the scheduler where the blocks are), then timed:
  ``wait(client.persist(z))`` and every worker's device synchronized (a task ends when its
  kernels are queued); median of ``--reps`` after one warm-up; TFLOP/s = 2mnk / time;
* the baseline: one ``pyblasgemm.matmul`` call on one GPU in this process (CUDA events, median
  of 5 after a warm-up), on operands of the same shape and type; efficiency on n GPUs =
  speed / (n x the baseline's speed); the same arrays and cluster through ``dask.array.matmul``;
* error: the normwise relative error of sampled rows and columns (8 x 256) of the result against
  a float64 product of the same bytes (long double for float64 operands), on the host;
* bits: a digest of every output block (on the workers) in every timed run, compared across
  runs, GPU counts and transports, and for --threaded-check cases with the threaded
  scheduler in this process on the same bytes;
* where the time goes, per timed run: bytes each worker received (its transfer log, cleared
  before the run), how many (worker, block) pairs were received more than once, where the
  output blocks ended up, tasks stolen by Dask's work stealing; and Dask's task stream of the
  last run summed per action (compute, transfer, ...) and per worker.

``--smoke`` runs all of it on the host: NumPy chunks, a ``distributed.LocalCluster`` of 1 and
2 single-thread worker processes (work stealing off: its blocks are a few KB), TCP, small cases
(``SMOKE_CASES``), about a minute.

Every row is written as it finishes (each transport's process writes its own file next to
``--out``, merged into ``--out`` as each ends), so a run cut short keeps what it measured; a
failure is recorded in its row, never hidden.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import pathlib
import signal
import statistics
import subprocess
import sys
import time
import types
import uuid

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.heldout import _git, meta, write_doc  # noqa: E402

#: name -> (m, n, k, dtype, chunk, matmul keywords): the issue's cases
CASES = {
    "32768^3 float16": (32768, 32768, 32768, "float16", 8192, {}),
    "32768^3 bfloat16": (32768, 32768, 32768, "bfloat16", 8192, {}),
    "65536x65536x8192 float16": (65536, 65536, 8192, "float16", 8192, {}),
    "8192x8192x262144 float16": (8192, 8192, 262144, "float16", 8192, {}),
    "16384^3 float64": (16384, 16384, 16384, "float64", 4096, {}),
    "16384^3 float64 int8-ozaki": (16384, 16384, 16384, "float64", 4096, {"compute": "int8-ozaki"}),
}
#: --smoke: the same kinds of case (square, bfloat16, wide, long K, float64 and Ozaki) in
#: NumPy chunks on the host, small enough for a test
SMOKE_CASES = {
    "smoke 128^3 float16": (128, 128, 128, "float16", 32, {}),
    "smoke 128^3 bfloat16": (128, 128, 128, "bfloat16", 32, {}),
    "smoke 128x128x32 float16": (128, 128, 32, "float16", 32, {}),
    "smoke 32x32x512 float16": (32, 32, 512, "float16", 32, {}),
    "smoke 64^3 float64 int8-ozaki": (64, 64, 64, "float64", 32, {"compute": "int8-ozaki"}),
}
SAMPLE_ROWS, SAMPLE_COLS = 8, 256
SEED = 20261127
PROBE_BYTES = 128 * 2**20
#: each UCX worker's RMM pool to start with (it grows on demand): the largest case holds ~12 GB
#: a worker (65536 x 65536 x 8192 on one GPU: 2 GB of operands, 8 GB of product, float32 sums)
RMM_POOL = "16GB"
NVLINK_TLS = "tcp,cuda_copy,cuda_ipc"

#: name -> (LocalCUDACluster keywords, what it is)
TRANSPORTS = {
    "tcp": ({"protocol": "tcp"},
            "TCP, Dask's default: each GPU block copied to host memory, sent over a socket, copied back"),
    "ipc": ({"protocol": "tcp"},
            "TCP for Dask's messages; GPU blocks between workers through CUDA IPC (pyblasgemm.dask "
            "transport='ipc': an IPC handle exported where the block is, a device-to-device copy where it is read)"),
    "ipc-2t": ({"protocol": "tcp", "threads_per_worker": 2},
               "as ipc, with two threads a worker: a fetch waiting for its copy leaves the other "
               "thread to queue the worker's products (one thread: the GPU runs only what was queued)"),
    "ucx": ({"protocol": "ucx", "rmm_pool_size": RMM_POOL, "rmm_allocator_external_lib_list": ["cupy"]},
            "UCX choosing its own transports (UCX_TLS unset: all), an RMM pool shared with CuPy"),
    "ucx-nvlink": ({"protocol": "ucx", "enable_tcp_over_ucx": True, "enable_nvlink": True, "enable_infiniband": False,
                    "rmm_pool_size": RMM_POOL, "rmm_allocator_external_lib_list": ["cupy"]},
                   f"UCX over NVLink (enable_nvlink: UCX_TLS={NVLINK_TLS}), an RMM pool shared with CuPy"),
    "ucx-nvlink-nopool": ({"protocol": "ucx", "enable_tcp_over_ucx": True, "enable_nvlink": True},
                          f"UCX over NVLink (UCX_TLS={NVLINK_TLS}) without an RMM pool: the 2026-11-27 run's "
                          "settings (CuPy's own pool: a CUDA IPC handle per block)"),
}


def _dtype(name):
    import ml_dtypes

    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


def _seed(tag, i, j):
    return SEED + (1 if tag == "y" else 0) * 1_000_003 + i * 1009 + j


# ---------------------------------------------------------------------------------------------
# Run on the workers (module level: pickled by reference or, run as a script, by value)
# ---------------------------------------------------------------------------------------------

def _block(seed, shape, dtype, device):
    """One operand block: standard normal from its own seed, in ``dtype`` (bfloat16 rounded on
    the bits: CuPy has no bfloat16 cast)."""
    from pyblasgemm.dask import _to_bfloat16

    wide = np.float64 if dtype == "float64" else np.float32
    if device:
        import cupy as cp

        x = cp.random.RandomState(seed).standard_normal(shape, dtype=wide)
    else:
        x = np.random.default_rng(seed).standard_normal(shape, dtype=wide)
    if dtype == "bfloat16":
        return _to_bfloat16(x)
    return x if x.dtype == _dtype(dtype) else x.astype(_dtype(dtype))


def _filled(nbytes, seed, device):
    """A block of ``nbytes`` bytes for the transfer probe."""
    if device:
        import cupy as cp

        return cp.full(nbytes, seed % 251, dtype=cp.uint8)
    return np.full(nbytes, seed % 251, dtype=np.uint8)


def _nbytes(*blocks):
    return int(sum(b.nbytes for b in blocks))


def _synchronize(device):
    if device:
        import cupy as cp

        cp.cuda.Device().synchronize()


def _clear_transfer_log(dask_worker=None):
    dask_worker.transfer_incoming_log.clear()


def _transfer_log(dask_worker=None):
    """This worker's received transfers since the log was cleared: (keys, bytes, seconds, from)."""
    return [([k for k in e["keys"]], int(e["total"]), float(e["duration"]), e["who"])
            for e in dask_worker.transfer_incoming_log]


def _digest(block):
    """A 64-bit digest of a block's bits, where the block is: sum of bits x odd weights mod 2^64
    (any one changed element changes it; integer sums do not depend on their order)."""
    xp = np
    if hasattr(block, "__cuda_array_interface__"):
        import cupy as xp
    bits = xp.ascontiguousarray(block).view({2: xp.uint16, 4: xp.uint32, 8: xp.uint64}[block.dtype.itemsize])
    bits = bits.ravel().astype(xp.uint64)
    weights = xp.arange(bits.size, dtype=xp.uint64) * xp.uint64(0x9E3779B97F4A7C15) | xp.uint64(1)
    return np.array([[int((bits * weights).sum())]], np.uint64)


def _ipc_read(handles):
    """The probe's reader over CUDA IPC: the blocks of an export in this worker's memory, the
    bytes and the seconds the fetch took here (opening the handles, the copy, its
    synchronization)."""
    from pyblasgemm import _dask_ipc

    t0 = time.perf_counter()
    got = _dask_ipc.fetch(handles)
    return _nbytes(*got), time.perf_counter() - t0


def _ipc_stats(dask_worker=None):
    from pyblasgemm import dask as pbd

    return pbd.ipc_stats(reset=True)


def _close_ipc(dask_worker=None):
    from pyblasgemm import dask as pbd

    return pbd.close_ipc_handles()


#: pyblasgemm.dask's ``transport`` keyword on each cluster transport's rows
DATA_PATH = {"ipc": "ipc", "ipc-2t": "ipc"}


def _worker_info(dask_worker=None):
    """What this worker's comms and allocators are: UCX's active transports and TLS (if UCX is
    up in it), CuPy's allocator, RMM's memory resource, dask-cuda's UCX configuration."""
    import dask

    info = {"ucx_config": dask.config.get("distributed.comm.ucx", None),
            "message_bytes_limit": dask_worker.state.transfer_message_bytes_limit if dask_worker else None}
    ucxx = sys.modules.get("ucxx")
    if ucxx is not None:
        try:
            info["ucx_active_transports"] = sorted(ucxx.get_active_transports())
            info["ucx_tls"] = ucxx.get_config().get("TLS")
        except Exception as e:              # UCX imported but not started in this process
            info["ucx"] = f"{type(e).__name__}: {e}"[:200]
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        info["cupy_allocator"] = repr(cupy.cuda.get_allocator())[:120]
    rmm = sys.modules.get("rmm")
    if rmm is not None:
        try:
            info["rmm_resource"] = type(rmm.mr.get_current_device_resource()).__name__
        except Exception as e:
            info["rmm_resource"] = f"{type(e).__name__}: {e}"[:200]
    return info


# ---------------------------------------------------------------------------------------------
# Operands, cluster, probe
# ---------------------------------------------------------------------------------------------

def _meta(dtype, device):
    """A 0 x 0 block of the chunks' type (bfloat16 CuPy through a uint16 view, the path that
    keeps ml_dtypes' type)."""
    want = _dtype(dtype)
    if not device:
        return np.empty((0, 0), want)
    import cupy as cp

    meta = cp.empty((0, 0), cp.uint16).view(want) if want.itemsize == 2 and want.kind == "V" else cp.empty((0, 0), want)
    return meta if meta.dtype == want else np.empty((0, 0), want)


def owners(rows, cols, n, by_rows):
    """The worker index of block (i, j) of an operand of rows x cols blocks on n workers: by
    its panels along the first axis (``by_rows``) or the second, in contiguous ranges."""
    if by_rows:
        return lambda i, j: i * n // rows
    return lambda i, j: j * n // cols


def operand_layout(m, n, k, chunk, workers):
    """(owner of A's block (i, k), owner of B's block (k, j), description): operands with at
    least one panel a worker spread by their panels (A by rows, B by columns), others by K."""
    mb, nb, kb = m // chunk, n // chunk, k // chunk
    a_rows, b_cols = mb >= workers, nb >= workers
    return (owners(mb, kb, workers, a_rows), owners(kb, nb, workers, not b_cols),
            f"A by {'row panels' if a_rows else 'K chunks'}, B by {'column panels' if b_cols else 'K chunks'}")


def operands(client, case, device):
    """X (m x k) and Y (k x n) as Dask arrays whose blocks are generated on, and kept by, the
    workers of ``operand_layout``; fresh keys, the same bytes every time."""
    import dask.array as da

    m, n, k, dtype, chunk, _ = case
    workers = sorted(client.nthreads())
    own_x, own_y, _ = operand_layout(m, n, k, chunk, len(workers))
    token = uuid.uuid4().hex[:12]

    def make(tag, rows, cols, owner):
        name = f"operand-{tag}-{token}"
        futures = {}
        for i in range(rows):
            for j in range(cols):
                key = (name, i, j)
                futures[key] = client.submit(_block, _seed(tag, i, j), (chunk, chunk), dtype, device, key=key,
                                             workers=[workers[owner(i, j)]], allow_other_workers=False, pure=False)
        return da.Array(futures, name, ((chunk,) * rows, (chunk,) * cols), meta=_meta(dtype, device))

    return make("x", m // chunk, k // chunk, own_x), make("y", k // chunk, n // chunk, own_y)


def local_operands(case, device):
    """The same blocks in this process (GPU 0, or the host), as Dask arrays for the threaded
    scheduler (assembled on uint16 views: CuPy's concatenate has no bfloat16 kernel)."""
    import dask.array as da

    m, n, k, dtype, chunk, _ = case
    xp = np
    if device:
        import cupy as xp

    def make(tag, rows, cols):
        def bits(b):
            return b.view(np.uint16) if b.dtype.itemsize == 2 else b

        whole = xp.concatenate([xp.concatenate([bits(_block(_seed(tag, i, j), (chunk, chunk), dtype, device))
                                                for j in range(cols)], axis=1) for i in range(rows)], axis=0)
        return da.from_array(whole.view(_dtype(dtype)), chunks=chunk, asarray=False)

    return make("x", m // chunk, k // chunk), make("y", k // chunk, n // chunk)


def cluster(transport, n, device, message_bytes):
    """The cluster of n workers (GPUs) for ``transport``; a worker fetches up to
    ``message_bytes`` from another in one message (Dask's default: 50 MB, one 128 MiB block a
    message): distributed-ucxx synchronizes the whole device before it sends CUDA frames and
    after it receives them, so every message waits for both GPUs' queued kernels, and a
    panel in one message waits once instead of once a block. The workers take this process's
    Dask configuration (the Nanny passes it on)."""
    import dask

    settings = {"distributed.worker.transfer.message-bytes-limit": message_bytes}
    if not device:
        import distributed

        if transport not in ("tcp", "ipc", "ipc-2t"):
            raise ValueError(f"--smoke runs over tcp (or ipc: NumPy blocks fall back to it) only, not {transport!r}")
        # work stealing off: the smoke's blocks are a few KB, which Dask may move at will (it
        # leaves alone tasks whose inputs take longer to move than to compute)
        with dask.config.set({**settings, "distributed.scheduler.work-stealing": False}):
            return distributed.LocalCluster(n_workers=n, threads_per_worker=1, processes=True,
                                            dashboard_address=None, silence_logs=logging.CRITICAL)
    import dask_cuda

    with dask.config.set(settings):
        return dask_cuda.LocalCUDACluster(CUDA_VISIBLE_DEVICES=",".join(str(i) for i in range(n)), n_workers=n,
                                          dashboard_address=None, silence_logs=logging.CRITICAL,
                                          **TRANSPORTS[transport][0])


def _size(nbytes):
    return f"{nbytes / 2**30:.2f} GiB" if nbytes >= 2**28 else f"{nbytes / 2**20:.2f} MiB"


def _gbps(nbytes, seconds):
    return round(nbytes / seconds / 1e9, 3) if seconds > 0 else None


def probe(client, device, nbytes, reps=5, transport="tcp"):
    """Worker-to-worker transfer speed of blocks of ``nbytes`` (see the module docstring). Over
    ``ipc`` a reader fetches an export of the blocks (:func:`_ipc_read`); its ``transfer_s`` is
    the fetch task's own time."""
    from distributed import wait

    if DATA_PATH.get(transport) == "ipc":
        return _probe_ipc(client, device, nbytes, reps)
    workers = sorted(client.nthreads())
    a, b = workers[0], workers[1]
    out = {"block_bytes": nbytes, "workers": len(workers)}
    walls, logged = [], []
    for rep in range(reps + 1):
        src = client.submit(_filled, nbytes, rep, device, workers=[a], allow_other_workers=False, pure=False)
        wait(src)
        client.run(_synchronize, device)
        client.run(_clear_transfer_log)
        t0 = time.perf_counter()
        client.submit(_nbytes, src, workers=[b], allow_other_workers=False, pure=False).result()
        wall = time.perf_counter() - t0
        log = client.run(_transfer_log, workers=[b])[b]
        if rep:                         # the first: connections, handles, pools
            walls.append(wall)
            logged.append(sum(e[2] for e in log))
        del src
    out["one_block"] = {"wall_s": walls, "transfer_s": logged,
                        "GBps_wall": _gbps(nbytes, statistics.median(walls)),
                        "GBps_transfer_log": _gbps(nbytes, statistics.median(logged))}
    many = 8
    srcs = [client.submit(_filled, nbytes, 100 + r, device, workers=[a], allow_other_workers=False, pure=False)
            for r in range(many)]
    wait(srcs)
    client.run(_clear_transfer_log)
    t0 = time.perf_counter()
    client.submit(_nbytes, *srcs, workers=[b], allow_other_workers=False, pure=False).result()
    wall = time.perf_counter() - t0
    log = client.run(_transfer_log, workers=[b])[b]
    out["eight_blocks"] = {"wall_s": wall, "transfers": len(log), "GBps_wall": _gbps(many * nbytes, wall),
                           "GBps_transfer_log_each": [_gbps(e[1], e[2]) for e in log]}
    del srcs
    held = {w: client.submit(_filled, nbytes, 200 + n, device, workers=[w], allow_other_workers=False, pure=False)
            for n, w in enumerate(workers)}
    wait(list(held.values()))
    client.run(_clear_transfer_log)
    t0 = time.perf_counter()
    reads = [client.submit(_nbytes, *[f for v, f in held.items() if v != w], workers=[w], allow_other_workers=False,
                           pure=False) for w in workers]
    wait(reads)
    wall = time.perf_counter() - t0
    moved = len(workers) * (len(workers) - 1) * nbytes
    out["all_to_all"] = {"wall_s": wall, "bytes": moved, "GBps_wall": _gbps(moved, wall)}
    out["workers_info"] = client.run(_worker_info)
    return out


def _probe_ipc(client, device, nbytes, reps):
    """:func:`probe` over CUDA IPC: the same three measures, each read an export task on the
    holder and a fetch task on the reader, timed from the export's submission."""
    from distributed import wait

    from pyblasgemm import _dask_ipc

    workers = sorted(client.nthreads())
    a, b = workers[0], workers[1]
    out = {"block_bytes": nbytes, "workers": len(workers), "transport": "ipc"}

    def read(srcs, holder, reader):
        handle = client.submit(_dask_ipc.export, *srcs, workers=[holder], allow_other_workers=False, pure=False)
        return client.submit(_ipc_read, handle, workers=[reader], allow_other_workers=False, pure=False)

    walls, inside = [], []
    for rep in range(reps + 1):
        src = client.submit(_filled, nbytes, rep, device, workers=[a], allow_other_workers=False, pure=False)
        wait(src)
        client.run(_synchronize, device)
        t0 = time.perf_counter()
        moved, seconds = read([src], a, b).result()
        wall = time.perf_counter() - t0
        if rep:
            walls.append(wall)
            inside.append(seconds)
        del src
    out["one_block"] = {"wall_s": walls, "transfer_s": inside, "GBps_wall": _gbps(nbytes, statistics.median(walls)),
                        "GBps_transfer_log": _gbps(nbytes, statistics.median(inside))}
    many = 8
    srcs = [client.submit(_filled, nbytes, 100 + r, device, workers=[a], allow_other_workers=False, pure=False)
            for r in range(many)]
    wait(srcs)
    client.run(_synchronize, device)
    t0 = time.perf_counter()
    moved, seconds = read(srcs, a, b).result()
    wall = time.perf_counter() - t0
    out["eight_blocks"] = {"wall_s": wall, "transfers": 1, "GBps_wall": _gbps(many * nbytes, wall),
                           "GBps_transfer_log_each": [_gbps(moved, seconds)]}
    del srcs
    held = {w: client.submit(_filled, nbytes, 200 + n, device, workers=[w], allow_other_workers=False, pure=False)
            for n, w in enumerate(workers)}
    wait(list(held.values()))
    client.run(_synchronize, device)
    t0 = time.perf_counter()
    reads = [read([f], v, w) for w in workers for v, f in held.items() if v != w]
    wait(reads)
    wall = time.perf_counter() - t0
    moved = len(workers) * (len(workers) - 1) * nbytes
    out["all_to_all"] = {"wall_s": wall, "bytes": moved, "GBps_wall": _gbps(moved, wall)}
    out["ipc_stats"] = client.run(_ipc_stats)
    out["closed_handles"] = client.run(_close_ipc)
    out["workers_info"] = client.run(_worker_info)
    return out


# ---------------------------------------------------------------------------------------------
# A case on a cluster
# ---------------------------------------------------------------------------------------------

def digests(z):
    """One 64-bit digest per output block (computed where the block is)."""
    return z.map_blocks(_digest, dtype=np.uint64, chunks=((1,) * len(z.chunks[0]), (1,) * len(z.chunks[1])),
                        meta=np.empty((0, 0), np.uint64))


def _as_uint16(block):
    return block.view(np.uint16)


def _bits(a):
    """A bfloat16 Dask array as its uint16 bits (CuPy has no bfloat16 kernels to index with);
    any other as it is."""
    if a.dtype.itemsize == 2 and a.dtype.kind == "V":
        return a.map_blocks(_as_uint16, dtype=np.uint16, meta=np.empty((0, 0), np.uint16))
    return a


def _wide_host(x, dtype):
    """A NumPy array of any of the cases' types as float64 (long double for float64); bits of
    a bfloat16 (uint16, or '|V2' as Dask's CuPy serializer delivers it) read as ``dtype``."""
    if not isinstance(x, np.ndarray):
        import cupy as cp

        x = cp.asnumpy(x)
    if x.dtype != _dtype(dtype) and x.dtype.itemsize == _dtype(dtype).itemsize and x.dtype.kind in "uV":
        x = x.view(_dtype(dtype))
    return x.astype(np.longdouble if x.dtype == np.float64 else np.float64)


def sampled_error(client, x, y, z, rng, dtype, out_dtype):
    m, n = z.shape
    rows = np.sort(rng.choice(m, min(SAMPLE_ROWS, m), replace=False))
    cols = np.sort(rng.choice(n, min(SAMPLE_COLS, n), replace=False))
    xr, yc, zs = client.compute([_bits(x)[rows], _bits(y)[:, cols], _bits(z)[rows][:, cols]], sync=True)
    ref = _wide_host(xr, dtype) @ _wide_host(yc, dtype)
    got = _wide_host(zs, out_dtype)
    return float(np.linalg.norm((got - ref).astype(np.float64)) / np.linalg.norm(ref.astype(np.float64)))


def _steals(client, since):
    try:
        return sum(1 for t, msg in client.get_events("stealing") if t >= since and msg and msg[0] == "confirm")
    except Exception:                   # no stealing extension: nothing was stolen
        return 0


def timed_runs(client, case, product, reps, device, with_bits):
    """Warm-up, ``reps`` timed runs and one more under Dask's task stream, each on fresh
    operands (module docstring); per run: seconds, bytes received, repeated (worker, block)
    receipts, output blocks per worker, tasks stolen; the last run's product kept for the
    error."""
    from distributed import get_task_stream, wait

    runs = []
    stream_summary = None
    keep = None
    for rep in range(reps + 2):
        x, y = operands(client, case, device)
        wait([x, y])
        client.run(_synchronize, device)
        t0 = time.perf_counter()
        z = product(x, y)
        graph_s = time.perf_counter() - t0
        tasks = len(dict(z.__dask_graph__())) - len(dict(x.__dask_graph__())) - len(dict(y.__dask_graph__()))
        client.run(_clear_transfer_log)
        client.run(_ipc_stats)              # reset: the counts below are this run's
        last = rep == reps + 1
        stream = get_task_stream(client) if last else None
        if stream is not None:
            stream.__enter__()
        since = time.time()
        t0 = time.perf_counter()
        done = client.persist(z)
        wait(done)
        client.run(_synchronize, device)
        elapsed = time.perf_counter() - t0
        if stream is not None:
            stream.__exit__(None, None, None)
            stream_summary = {"run_s": round(elapsed, 4), "tasks": len(stream.data), "per_worker": {}}
            for task in stream.data:
                per = stream_summary["per_worker"].setdefault(task.get("worker", "?"), {})
                for ss in task.get("startstops", ()):
                    act = ss.get("action", "?")
                    span = float(ss["stop"] - ss["start"])
                    stream_summary[act] = round(stream_summary.get(act, 0.0) + span, 4)
                    per[act] = round(per.get(act, 0.0) + span, 4)
        logs = client.run(_transfer_log)
        ipc = client.run(_ipc_stats)
        got = [(w, tuple(key) if isinstance(key, list) else key) for w, log in logs.items() for e in log for key in e[0]]
        who = client.who_has(done)
        out_blocks = {}
        for holders in who.values():
            for w in holders:
                out_blocks[w] = out_blocks.get(w, 0) + 1
        run = {"s": elapsed, "graph_s": graph_s, "tasks": tasks, "placed": type(z).__name__ == "PlacedArray",
               "received_bytes": sum(e[1] for log in logs.values() for e in log),
               "received_by_worker": {w: sum(e[1] for e in log) for w, log in logs.items()},
               "transfers": sum(len(log) for log in logs.values()),
               "repeated_receipts": len(got) - len(set(got)), "output_blocks_by_worker": out_blocks,
               "stolen": _steals(client, since), "data_path": _data_path(z),
               "ipc_bytes": sum(v["ipc_bytes"] for v in ipc.values()),
               "ipc_blocks": sum(v["ipc_blocks"] for v in ipc.values()),
               "ipc_fallback_blocks": sum(v["fallback_blocks"] for v in ipc.values()),
               "ipc_fallback_reasons": sorted({r for v in ipc.values() for r in v["fallback_reasons"]})}
        if with_bits:
            run["digest"] = client.compute(digests(done), sync=True).tolist()
        if rep:
            runs.append(run)
        if last:
            keep = (x, y, done)
        del x, y, z, done
    return runs, stream_summary, keep


def _data_path(z):
    from pyblasgemm import dask as pbd

    return pbd.transport_of(z)


def run_case(client, name, case, n_gpus, transport, reps, base_s, device, with_dask=True):
    import dask.array as da

    from pyblasgemm import dask as pbd

    m, n, k, dtype, chunk, kw = case
    flops = 2.0 * m * n * k
    row = {"case": name, "gpus": n_gpus, "protocol": transport, "transport": transport, "m": m, "n": n, "k": k,
           "dtype": dtype, "chunk": chunk, "matmul_kw": kw, "baseline_one_call_s": base_s,
           "layout": operand_layout(m, n, k, chunk, n_gpus)[2]}
    path = DATA_PATH.get(transport, "dask")
    row["pyblasgemm_transport"] = path
    products = {"pyblasgemm.dask.matmul": lambda x, y: pbd.matmul(x, y, transport=path, **kw)}
    if with_dask and not kw:
        products["dask.array.matmul"] = da.matmul
    for label, product in products.items():
        ours = label == "pyblasgemm.dask.matmul"
        try:
            runs, stream, (x, y, z) = timed_runs(client, case, product, reps, device, with_bits=ours)
            timed = runs[:-1]
            med = statistics.median(r["s"] for r in timed)
            res = {"median_s": med, "times_s": [r["s"] for r in timed], "tflops": flops / med / 1e12,
                   "graph_s": statistics.median(r["graph_s"] for r in runs),
                   "received_bytes_per_run": statistics.median(r["received_bytes"] for r in timed),
                   "received_by_worker": timed[-1]["received_by_worker"],
                   "transfers_per_run": statistics.median(r["transfers"] for r in timed),
                   "repeated_receipts": max(r["repeated_receipts"] for r in runs),
                   "output_blocks_by_worker": runs[-1]["output_blocks_by_worker"],
                   "stolen": sum(r["stolen"] for r in runs), "task_stream": stream, "tasks": runs[0]["tasks"],
                   "placed": all(r["placed"] for r in runs),
                   "data_path": sorted({r["data_path"] for r in runs}),
                   "ipc_bytes_per_run": statistics.median(r["ipc_bytes"] for r in timed),
                   "ipc_blocks_per_run": statistics.median(r["ipc_blocks"] for r in timed),
                   "ipc_fallback_blocks": sum(r["ipc_fallback_blocks"] for r in runs),
                   "ipc_fallback_reasons": sorted({x for r in runs for x in r["ipc_fallback_reasons"]})}
            if base_s:
                res["efficiency"] = (flops / med) / (n_gpus * flops / base_s)
                res["speedup_vs_one_call"] = base_s / med
            try:                            # a failure here keeps the timing
                res["error_sampled"] = sampled_error(client, x, y, z, np.random.default_rng(7), dtype, str(z.dtype))
            except Exception as e:
                res["error_sampled"] = float("nan")
                res["error_failure"] = f"{type(e).__name__}: {e}"[:300]
            if ours:
                res["digest"] = runs[0]["digest"]
                res["bitwise_all_runs"] = all(r["digest"] == runs[0]["digest"] for r in runs)
            del x, y, z
        except Exception as e:              # recorded, not hidden
            res = {"failure": f"{type(e).__name__}: {e}"[:400]}
        row[label] = res
        print(f"  {name} {n_gpus} {'GPU' if device else 'worker'} {transport} {label}: "
              + (f"{res['median_s'] * 1e3:.1f} ms, {res['tflops']:.1f} TF/s, eff {res.get('efficiency', float('nan')):.2f}, "
                 f"recv {_size(res['received_bytes_per_run'])}/run ({res['transfers_per_run']:.0f} transfers, "
                 f"{res['repeated_receipts']} repeated), graph {res['graph_s'] * 1e3:.0f} ms, "
                 f"err {res['error_sampled']:.2e}" + (f", bits same {res['bitwise_all_runs']}" if ours else "")
                 + (f", ipc {_size(res['ipc_bytes_per_run'])}/run ({res['ipc_fallback_blocks']} fell back)"
                    if res["ipc_bytes_per_run"] or res["ipc_fallback_blocks"] else "")
                 if "median_s" in res else res["failure"]), flush=True)
    theirs, ours = row.get("dask.array.matmul", {}), row["pyblasgemm.dask.matmul"]
    if "median_s" in theirs and "median_s" in ours:
        row["ratio_vs_dask_array"] = theirs["median_s"] / ours["median_s"]
    return row


# ---------------------------------------------------------------------------------------------
# This process: baselines and the threaded scheduler's bits; one process per transport
# ---------------------------------------------------------------------------------------------

def baseline(case, device):
    """One pyblasgemm.matmul call on one GPU (or the host), this process: median s of 5."""
    import pyblasgemm

    m, n, k, dtype, _, kw = case
    if not device:
        x, y = (_block(s, shape, dtype, False) for s, shape in ((1, (m, k)), (2, (k, n))))
        out = pyblasgemm.matmul(x, y, **kw)
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            pyblasgemm.matmul(x, y, out=out, **kw)
            times.append(time.perf_counter() - t0)
        return statistics.median(times)
    import cupy as cp

    x, y = (_block(s, shape, dtype, True) for s, shape in ((1, (m, k)), (2, (k, n))))
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


def threaded_digest(case, device):
    """The product's block digests from the threaded scheduler in this process."""
    from pyblasgemm import dask as pbd

    x, y = local_operands(case, device)
    got = digests(pbd.matmul(x, y, **case[5])).compute(scheduler="threads").tolist()
    if device:
        import cupy as cp

        cp.get_default_memory_pool().free_all_blocks()
    return got


def child(args, cases) -> int:
    """One transport, in this process: a cluster per GPU count, the probe and/or the cases;
    rows written to ``--out`` as they finish."""
    import distributed

    device = not args.smoke
    transport = args.child
    bases = json.loads(pathlib.Path(args.baselines).read_text()) if args.baselines else {}
    doc = {"transport": transport, "config": {"cluster": TRANSPORTS[transport][0], "doc": TRANSPORTS[transport][1],
                                              "message_bytes_limit": args.message_bytes_limit},
           "probes": {}, "cases": [], "failures": []}
    write_doc(doc, args.out)
    counts = [int(g) for g in args.gpus.split(",")]
    for n_gpus in counts:
        if args.probe_only and n_gpus != max(counts):
            continue                    # the probe alone: on the largest cluster
        t0 = time.perf_counter()
        try:
            with cluster(transport, n_gpus, device, args.message_bytes_limit) as cl, distributed.Client(cl) as client:
                print(f"cluster: {n_gpus} {'GPU' if device else 'worker'}, {transport}, up in "
                      f"{time.perf_counter() - t0:.1f} s", flush=True)
                if n_gpus >= 2 and (args.probe_only or args.probe_here):
                    try:
                        p = probe(client, device, PROBE_BYTES if device else 2**20, reps=5 if device else 2,
                                  transport=transport)
                        doc["probes"][str(n_gpus)] = p
                        print(f"  probe {transport} {n_gpus}: one block {p['one_block']['GBps_wall']} GB/s "
                              f"(log {p['one_block']['GBps_transfer_log']}), 8 blocks {p['eight_blocks']['GBps_wall']}"
                              f" GB/s, all-to-all {p['all_to_all']['GBps_wall']} GB/s", flush=True)
                    except Exception as e:
                        doc["failures"].append({"probe": n_gpus, "failure": f"{type(e).__name__}: {e}"[:400]})
                    write_doc(doc, args.out)
                if args.probe_only:
                    continue
                for name in cases:
                    try:
                        theirs = not args.no_dask_array and _listed(args.dask_array_gpus, str(n_gpus)) \
                            and _listed(args.dask_array_cases, name)
                        row = run_case(client, name, ALL_CASES[name], n_gpus, transport, args.reps, bases.get(name),
                                       device, with_dask=theirs)
                        try:                # the handles this case's fetches opened (bounded, but give them back)
                            row["ipc_handles_closed"] = sum(client.run(_close_ipc).values())
                        except Exception as e:
                            row["ipc_handles_closed"] = f"{type(e).__name__}: {e}"[:200]
                    except Exception as e:
                        row = {"case": name, "gpus": n_gpus, "protocol": transport, "transport": transport,
                               "failure": f"{type(e).__name__}: {e}"[:400]}
                        print("  FAILED", row, flush=True)
                    doc["cases"].append(row)
                    write_doc(doc, args.out)
        except Exception as e:
            doc["failures"].append({"cluster": f"{n_gpus} {transport}", "failure": f"{type(e).__name__}: {e}"[:400]})
            print("cluster FAILED", doc["failures"][-1], flush=True)
            write_doc(doc, args.out)
    return 0


ALL_CASES = {**CASES, **SMOKE_CASES}


def _listed(spec, item) -> bool:
    """Whether ``item`` is in the comma-separated ``spec`` (None or 'all': everything)."""
    return spec in (None, "all") or item in spec.split(",")


#: --quick: one device command of at most 8 minutes on 4 GPUs, no UCX (module docstring)
QUICK = {"gpus": "1,2,4", "probe": "tcp,ipc", "transport": "ipc", "cases": "32768^3 float16,16384^3 float64",
         "reps": 3, "threaded_check": "32768^3 float16", "dask_array_gpus": "4", "dask_array_cases": "32768^3 float16",
         "budget_s": 440.0}


def _run_child(argv, out, seconds, log=None):
    """This script for one transport in a process of its own (and its own process group, with
    the cluster it starts), stopped at ``seconds``; what it wrote to ``out``, or None. With
    ``log``: its output and its workers' (UCX's protocol report among it: UCX_PROTO_INFO=y) go
    to that file."""
    if seconds < 20:
        return None, f"skipped: {seconds:.0f} s of the budget left"
    env = dict(os.environ, UCX_PROTO_INFO="y") if log else None
    sink = open(log, "w") if log else None
    try:
        proc = subprocess.Popen([sys.executable, str(pathlib.Path(__file__).resolve()), *argv, "--out", str(out)],
                                start_new_session=True, env=env, stdout=sink, stderr=subprocess.STDOUT if sink else None)
    finally:
        if sink:
            sink.close()
    try:
        proc.wait(timeout=seconds)
        why = None if proc.returncode == 0 else f"exit status {proc.returncode}"
    except subprocess.TimeoutExpired:
        why = f"stopped after {seconds:.0f} s (--budget-s)"
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
                proc.wait(timeout=10)
                break
            except (subprocess.TimeoutExpired, ProcessLookupError):
                continue
    try:
        return json.loads(pathlib.Path(out).read_text()), why
    except (OSError, ValueError):
        return None, why or "wrote nothing"


def _read_probe_log(path, keep=60):
    """(this script's own lines, UCX's protocol lines that name a transport) of a probe's log,
    each at most ``keep``, UCX's without repeats."""
    try:
        lines = pathlib.Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return [], []
    ours = [ln for ln in lines if ln.startswith(("cluster", "  probe", "wrote", "Traceback")) or "Error" in ln]
    ucx = []
    for ln in lines:
        text = " ".join(ln[ln.find("|"):].split())[:220]       # without UCX's time and host prefix
        if "|" in ln and any(w in ln for w in ("cuda", "tcp", "sysv", "posix", "cma", "rndv", "rendezvous",
                                                "zero-copy", "copy", "pipeline")) and text not in ucx:
            ucx.append(text)
    return ours[-keep:], ucx[:keep]


#: how the operands are seeded (the results' provenance)
SEEDS = (f"blocks: CuPy RandomState / NumPy default_rng(_seed(tag, i, j)) from {SEED}, the same "
         f"bytes on any cluster; sampled check numpy default_rng(7)")


def _metadata(device) -> dict:
    if device:
        try:
            import torch
        except ImportError:
            torch = None
        return meta(types.SimpleNamespace(torch=torch), seed=SEEDS)
    from pyblasgemm.benchmarks.suite import _Env, provenance

    info = _Env("host").info()
    info["git_sha"] = os.environ.get("GIT_SHA") or _git("rev-parse", "HEAD") or None
    info["python"] = sys.version.split()[0]
    info.update(provenance(SEEDS))
    return info


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="the results file (JSON), or the figure (PNG) with --plot")
    ap.add_argument("--plot", metavar="RESULTS", help="draw --out (a PNG) from a results file; no run")
    ap.add_argument("--plot-transport", default="ucx", help="the transport whose rows --plot draws")
    ap.add_argument("--smoke", action="store_true", help="on the host: NumPy chunks, LocalCluster, SMOKE_CASES")
    ap.add_argument("--gpus", default=None, help="GPU (worker) counts, e.g. 1,2,4 (default 1,2,4; --smoke 1,2)")
    ap.add_argument("--probe", default=None,
                    help=f"transports to probe first, comma-separated: {', '.join(TRANSPORTS)} (default: none)")
    ap.add_argument("--transport", default=None,
                    help="transports to run the cases on; 'best': the probed one with the most GB/s "
                         "(default: best with --probe, else ucx-nvlink; --smoke: tcp)")
    ap.add_argument("--cases", default=None, help="comma-separated case names, or 'all' (default all)")
    ap.add_argument("--tcp-cases", default="32768^3 float16", help="the cases run over tcp ('all': every case)")
    ap.add_argument("--reps", type=int, default=None, help="timed runs a product (default 3; --smoke 1)")
    ap.add_argument("--threaded-check", default=None,
                    help="cases whose bits are compared with the threaded scheduler (default 32768^3 float16; "
                         "--smoke all)")
    ap.add_argument("--no-dask-array", action="store_true", help="skip dask.array.matmul")
    ap.add_argument("--dask-array-gpus", default=None, help="GPU counts dask.array.matmul runs on (default all)")
    ap.add_argument("--dask-array-cases", default=None, help="cases dask.array.matmul runs on (default all)")
    ap.add_argument("--quick", action="store_true",
                    help="the 8-minute plan on 4 GPUs: " + "; ".join(f"{k}={v}" for k, v in QUICK.items()))
    ap.add_argument("--message-bytes-limit", default="1GiB",
                    help="distributed.worker.transfer.message-bytes-limit of the clusters (Dask's default: 50MB)")
    ap.add_argument("--budget-s", type=float, default=None, help="stop every transport's process by then (default 560)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--probe-only", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--probe-here", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--baselines", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.quick:                      # the preset fills what the command line left unset
        for key, value in QUICK.items():
            if getattr(args, key) is None:
                setattr(args, key, value)
    args.budget_s = 560.0 if args.budget_s is None else args.budget_s
    if args.plot:
        plot(args.plot, args.out, args.plot_transport)
        return 0
    device = not args.smoke
    table = CASES if device else SMOKE_CASES
    args.gpus = args.gpus or ("1,2,4" if device else "1,2")
    args.reps = args.reps or (3 if device else 1)
    cases = list(table) if args.cases in (None, "all") else [c for c in args.cases.split(",") if c]
    for c in cases:
        if c not in table:
            ap.error(f"--cases: unknown case {c!r}; known: {', '.join(table)}")
    if args.child:
        return child(args, cases)
    started = time.perf_counter()
    probes = [t for t in (args.probe or "").split(",") if t]
    transports = [t for t in (args.transport or ("best" if probes else "ucx-nvlink" if device else "tcp")).split(",")]
    for t in probes + transports:
        if t not in TRANSPORTS and t != "best":
            ap.error(f"unknown transport {t!r}; known: {', '.join(TRANSPORTS)}, best")
    if "best" in transports and not probes:
        ap.error("--transport best needs --probe")
    tcp_cases = cases if args.tcp_cases == "all" else [c for c in args.tcp_cases.split(",") if c in cases]
    checked = list(table) if args.threaded_check is None and not device else \
        [c for c in (args.threaded_check or "32768^3 float16").split(",") if c in cases]
    out = pathlib.Path(args.out)
    doc = {"schema": "pyblasgemm-dask-scaling/2", **_metadata(device), "method": __doc__, "smoke": not device,
           "cases": [], "failures": [], "transports": {}, "argv": sys.argv[1:] if argv is None else list(argv),
           "message_bytes_limit": args.message_bytes_limit}
    import dask
    import distributed

    doc["versions"].update({"dask": dask.__version__, "distributed": distributed.__version__})
    for mod in ("dask_cuda", "distributed_ucxx", "ucxx", "rmm", "cupy"):
        try:
            doc["versions"][mod] = __import__(mod).__version__
        except Exception as e:
            doc["versions"][mod] = f"unavailable: {type(e).__name__}"
    doc["gpu_count"] = 0
    if device:
        import cupy as cp

        doc["gpu_count"] = cp.cuda.runtime.getDeviceCount()
    bases = {}
    for name in cases:
        try:
            bases[name] = baseline(table[name], device)
            m, n, k = table[name][:3]
            print(f"baseline {name}: {bases[name] * 1e3:.2f} ms, {2 * m * n * k / bases[name] / 1e12:.1f} TF/s",
                  flush=True)
        except Exception as e:
            bases[name] = None
            doc["failures"].append({"baseline": name, "failure": f"{type(e).__name__}: {e}"[:400]})
    doc["baselines_s"] = bases
    threaded = {}
    for name in checked:
        try:
            threaded[name] = threaded_digest(table[name], device)
        except Exception as e:
            threaded[name] = f"failed: {type(e).__name__}: {e}"[:300]
    base_file = out.with_name(out.stem + ".baselines.json")
    base_file.parent.mkdir(parents=True, exist_ok=True)
    base_file.write_text(json.dumps(bases))
    write_doc(doc, out)
    common = ["--gpus", args.gpus, "--reps", str(args.reps), "--baselines", str(base_file),
              "--message-bytes-limit", args.message_bytes_limit] + \
        sum((["--" + k.replace("_", "-"), v] for k in ("dask_array_gpus", "dask_array_cases")
             if (v := getattr(args, k)) is not None), []) + \
        (["--smoke"] if args.smoke else []) + (["--no-dask-array"] if args.no_dask_array else [])

    def left():
        return args.budget_s - (time.perf_counter() - started) - 10

    for t in probes:
        log = out.with_name(f"{out.stem}.probe-{t}.log")
        got, why = _run_child(["--child", t, "--probe-only", *common], out.with_name(f"{out.stem}.probe-{t}.json"),
                              left(), log=log)
        ours, ucx = _read_probe_log(log)
        print("\n".join(ours), flush=True)
        doc["transports"][t] = {"config": TRANSPORTS[t][0], "doc": TRANSPORTS[t][1], "probes": (got or {}).get("probes"),
                                "ucx_protocols": ucx, "log": log.name}
        doc["failures"] += [{"transport": t, **f} for f in (got or {}).get("failures", [])]
        if why:
            doc["failures"].append({"transport": t, "probe": why})
        write_doc(doc, out)

    def speed(t):
        ps = (doc["transports"].get(t) or {}).get("probes") or {}
        return max([p["one_block"]["GBps_wall"] or 0 for p in ps.values()] or [0])

    if "best" in transports:
        best = max(probes, key=speed)
        doc["best_transport"] = {"name": best, "GBps_one_block": speed(best)}
        print(f"best transport: {best} ({speed(best)} GB/s a block)", flush=True)
        transports = list(dict.fromkeys(best if t == "best" else t for t in transports))
    for t in transports:
        todo = tcp_cases if t == "tcp" and device else cases
        if not todo:
            continue
        got, why = _run_child(["--child", t, "--cases", ",".join(todo),
                               *(["--probe-here"] if t not in probes else []), *common],
                              out.with_name(f"{out.stem}.cases-{t}.json"), left())
        got = got or {}
        doc["cases"] += got.get("cases", [])
        doc["failures"] += [{"transport": t, **f} for f in got.get("failures", [])]
        entry = doc["transports"].setdefault(t, {"config": TRANSPORTS[t][0], "doc": TRANSPORTS[t][1]})
        if got.get("probes"):
            entry["probes"] = got["probes"]
        if why:
            doc["failures"].append({"transport": t, "cases": why})
        write_doc(doc, out)
    # bits: every run of a product against the first, and the threaded scheduler in this process
    bits = {}
    for row in doc["cases"]:
        ours = row.get("pyblasgemm.dask.matmul") or {}
        if "digest" not in ours:
            continue
        entry = bits.setdefault(row["case"], {"runs": [], "first": ours["digest"], "all_runs_equal": True})
        entry["runs"].append(f"{row['gpus']} GPU {row['transport']}")
        entry["all_runs_equal"] &= ours["digest"] == entry["first"] and bool(ours["bitwise_all_runs"])
    for name, entry in bits.items():
        if name in threaded:
            got = threaded[name]
            entry["threaded_equal"] = got == entry["first"] if isinstance(got, list) else got
        del entry["first"]
    doc["bitwise"] = bits
    print("bitwise:", json.dumps(bits), flush=True)
    doc["wall_s"] = round(time.perf_counter() - started, 1)
    write_doc(doc, out)
    summary(doc)
    return 0


def summary(doc) -> None:
    """A few lines a person reads first: the probe's GB/s and each product's time and efficiency."""
    for t, entry in doc["transports"].items():
        for n, p in sorted((entry.get("probes") or {}).items()):
            print(f"probe {t:18s} {n} workers: {p['one_block']['GBps_wall']} GB/s a block, "
                  f"{p['all_to_all']['GBps_wall']} GB/s all-to-all")
        lines = entry.get("ucx_protocols") or []
        used = sorted({w for ln in lines for w in ("cuda_ipc", "cuda_copy", "tcp") if w in ln})
        if lines:
            print(f"UCX protocols {t}: {len(lines)} lines naming {', '.join(used) or 'no transport'} (JSON: ucx_protocols)")
    for row in doc["cases"]:
        ours, theirs = row.get("pyblasgemm.dask.matmul") or {}, row.get("dask.array.matmul") or {}
        if "median_s" in ours:
            print(f"{row['case']:30s} {row['gpus']} {row['transport']:18s} {ours['median_s'] * 1e3:8.1f} ms "
                  f"eff {ours.get('efficiency') or float('nan'):.2f}  recv {_size(ours['received_bytes_per_run'])}"
                  + (f"  ipc {_size(ours['ipc_bytes_per_run'])} ({ours['ipc_fallback_blocks']} fell back)"
                     if ours.get("ipc_bytes_per_run") or ours.get("ipc_fallback_blocks") else "")
                  + (f"  dask.array {theirs['median_s'] * 1e3:.1f} ms" if "median_s" in theirs else ""))
        else:
            print(f"{row['case']:30s} {row['gpus']} {row.get('transport')}: "
                  f"{ours.get('failure') or row.get('failure')}")
    for f in doc["failures"]:
        print("failure:", json.dumps(f)[:300])


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


def plot(path, out, protocol="ucx") -> None:
    """Speed over one pyblasgemm call against GPUs, per product: ours and dask.array.matmul,
    the rows of one transport."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in guide_rows(path) if r[2] == protocol]
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
    ax.set_xlabel(f"GPUs (one Dask worker each, {protocol})")
    ax.set_ylabel("speed / one pyblasgemm call on one GPU")
    ax.set_title(f"pyblasgemm.dask scaling, {doc['device']['name']}, git {doc['git_sha']}", fontsize=9)
    ax.legend(fontsize=6, loc="upper left")
    fig.tight_layout()
    fig.savefig(out, dpi=130)


if __name__ == "__main__":
    sys.exit(main())
