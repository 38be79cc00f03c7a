"""pyblasgemm.dask on 1, 2 and 4 GPUs of one machine, over TCP, UCX and CUDA IPC (issue 32).

    GIT_SHA=<sha> PYTHONPATH=/tmp/site:. python bench/dask_scaling.py --gpus 1,2,4 \
        --probe tcp,ucx,ucx-nvlink,ucx-nvlink-nopool --transport best,tcp \
        --out bench/results/dask_scaling_<gpu>x<n>_<date>_<sha>.json
    PYTHONPATH=. python bench/dask_scaling.py --smoke --out /tmp/smoke.json   # CPU, NumPy chunks

``--quick``: one device command of at most 8 minutes on a 4-GPU machine, no UCX needed (the
128 MiB probe over tcp and ipc; 32768³ float16 and 16384³ float64 on 1, 2 and 4 GPUs over
ipc, traced; the block products alone; dask.array.matmul once, 32768³ float16 on 4 GPUs; the
threaded scheduler's bits of 32768³ float16), run from the repository root (``--gpus 1,2``
on a 2-GPU machine; ``--transport ipc,ipc-sync@2`` adds the transport without IPC events on
2 GPUs, to compare)::

    mkdir -p $OUT && GIT_SHA=$(git rev-parse --short HEAD) PYTHONPATH=.:bench timeout 470 \
        python bench/dask_scaling.py --quick --out $OUT/dask_scaling_quick.json > $OUT/quick.log 2>&1; \
        tail -40 $OUT/quick.log

Method:

* transports (``TRANSPORTS``): Dask's default TCP; ``ipc`` (``ucx-ipc``: UCX over NVLink, as
  ``ucx-nvlink`` below): TCP for Dask's messages and
  pyblasgemm.dask's CUDA IPC transport for the GPU blocks (``transport="ipc"``: an export task
  on the worker holding a block, a device-to-device copy by the worker that reads it, ordered
  by CUDA IPC events on the GPUs; ``ipc-sync``: the same without events, each export
  synchronizing its device and each fetch waiting for its copy; the other transports' rows
  pass ``transport="dask"``); UCX (dask-cuda ``protocol="ucx"``,
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
  last run summed per action (compute, transfer, ...) and per worker. A task ends when its
  kernels are queued, so the task stream says little of a GPU: ``--trace`` wraps the task
  functions on the workers and records, per timed run and worker, each task's key, host start
  and end and a timing event on its stream before and after it, and timing events where the
  CUDA IPC transport records an export's ready event and where a fetch's copies start (after
  that event) and end (``pyblasgemm._dask_ipc.TRACE``; None, a global read, when not
  tracing), all on the host's clock; every entry goes into the results (``trace.timed[*].entries``)
  with a summary per worker (:func:`trace_summary`: when the first task began, the GPU's first
  start and last end, its busy and idle ms between products, each product's and each copy's ms,
  when each ready event passed);
* schedules (``--schedule start,client,runs,blocks``): each case on each cluster with each
  worker's own work started through its engine at persist (``pyblasgemm.dask.START``, the
  default since 2026-11-28; the timed call is ``z.persist()``, for every product), the same
  timed as ``client.persist(z)`` (``client``: the work handed out by the product's
  ``__dask_postpersist__`` once the graph is queued), in run tasks through the
  scheduler alone (``RUNS`` without ``START``) and in one task an output block (neither), one
  after the other, each row tagged with its ``schedule`` and each run's engine counts
  (``engine_per_run``: work started, taken by its task, computed by its task); the client's batched
  stream's wait at each ``persist`` (``pending_send_ms``: it sends one batch every 10 ms at
  most); ``--latency``: on each cluster, Dask's own time from a call to its one task's start
  on a worker, for ``persist`` of a one-task array and for ``client.submit`` (:func:`latency_probe`);
* the block products alone (``--blocks-alone``): each case's output-block tasks called in turn
  in this process on one GPU, without Dask, and each block as one GEMM over the whole of K
  (:func:`blocks_alone`): how much of the gap to one call is in the blocks, how much in Dask.

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
import threading
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
    "ipc-sync": ({"protocol": "tcp"},
                 "as ipc, without CUDA IPC events (pyblasgemm._dask_ipc.EVENTS = False on the workers): each "
                 "export synchronizes its device and each fetch waits for its copy on the host, as before 2026-11-28"),
    "ipc-2t": ({"protocol": "tcp", "threads_per_worker": 2},
               "as ipc, with two threads a worker: a fetch waiting for its copy leaves the other "
               "thread to queue the worker's products (one thread: the GPU runs only what was queued)"),
    "ucx": ({"protocol": "ucx", "rmm_pool_size": RMM_POOL, "rmm_allocator_external_lib_list": ["cupy"]},
            "UCX choosing its own transports (UCX_TLS unset: all), an RMM pool shared with CuPy"),
    "ucx-nvlink": ({"protocol": "ucx", "enable_tcp_over_ucx": True, "enable_nvlink": True, "enable_infiniband": False,
                    "rmm_pool_size": RMM_POOL, "rmm_allocator_external_lib_list": ["cupy"]},
                   f"UCX over NVLink (enable_nvlink: UCX_TLS={NVLINK_TLS}), an RMM pool shared with CuPy"),
    "ucx-ipc": ({"protocol": "ucx", "enable_tcp_over_ucx": True, "enable_nvlink": True, "enable_infiniband": False,
                 "rmm_pool_size": RMM_POOL, "rmm_allocator_external_lib_list": ["cupy"]},
                f"UCX over NVLink for Dask's messages (as ucx-nvlink: UCX_TLS={NVLINK_TLS}, an RMM pool shared "
                "with CuPy); GPU blocks between workers through CUDA IPC (pyblasgemm.dask transport='ipc', as ipc)"),
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
    bytes and the seconds the fetch took here until its copy had landed (opening the handles,
    the copy; a fetch returns once its copy is queued, so the device is synchronized here)."""
    from pyblasgemm import _dask_ipc

    t0 = time.perf_counter()
    got = _dask_ipc.fetch(handles)
    if any(hasattr(b, "__cuda_array_interface__") for b in got):
        import cupy as cp

        cp.cuda.Device().synchronize()
    return _nbytes(*got), time.perf_counter() - t0


#: pyblasgemm.dask.engine_stats's counts a run records (summed over the workers)
ENGINE_COUNTS = ("started", "taken", "computed_in_task", "skipped", "dropped", "failed", "held")


def _engine_stats(dask_worker=None):
    """This worker's started-work counts since the last call (pyblasgemm.dask.engine_stats)."""
    from pyblasgemm import dask as pbd

    return pbd.engine_stats(reset=True)


def _ipc_stats(dask_worker=None):
    from pyblasgemm import dask as pbd

    return pbd.ipc_stats(reset=True)


def _close_ipc(dask_worker=None):
    from pyblasgemm import dask as pbd

    return pbd.close_ipc_handles()


# ---------------------------------------------------------------------------------------------
# Where the time goes (--trace): each worker's tasks on the host and on its GPU, one clock
# ---------------------------------------------------------------------------------------------

#: the task functions the trace wraps on the workers: (module, name, kind)
TRACED = (("pyblasgemm.dask", "_product_finish", "product"), ("pyblasgemm.dask", "_product", "product"),
          ("pyblasgemm.dask", "_sum_finish", "add"), ("pyblasgemm.dask", "_add", "add"),
          ("pyblasgemm._dask_ipc", "export", "export"), ("pyblasgemm._dask_ipc", "fetch", "fetch"))
_TRACE_MODULE = "_pyblasgemm_bench_trace"


def _trace_state():
    """This worker's trace, kept in a module of sys.modules (run as a script, this file's
    functions reach the workers pickled by value: a global of theirs would not last between
    calls)."""
    mod = sys.modules.get(_TRACE_MODULE)
    if mod is None:
        mod = sys.modules[_TRACE_MODULE] = types.ModuleType(_TRACE_MODULE)
        mod.entries, mod.ref, mod.gpu, mod.local, mod.installed = [], None, False, threading.local(), False
        mod.thread_state = None
    return mod


def _traced(fn, kind, state):
    """``fn`` recording, while a run is traced, its host start and end (time.time(): one clock
    for every process of the host) and, on a GPU, a timing event before and after it on the
    stream its GPU work goes to (a fetch: pyblasgemm._dask_ipc's copy stream; else CuPy's
    current stream), with the Dask key of the task it runs in. A call inside a traced call
    (_product_finish calls _product) counts once."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        local = state.local
        if state.ref is None or getattr(local, "depth", 0):
            return fn(*args, **kwargs)
        local.depth = 1
        try:
            stream = ev0 = ev1 = None
            if state.gpu:
                import cupy as cp

                if kind == "fetch":
                    from pyblasgemm import _dask_ipc

                    stream = _dask_ipc._copy_stream(cp.cuda.Device().id)
                else:
                    stream = cp.cuda.get_current_stream()
                ev0 = cp.cuda.Event()
                ev0.record(stream)
            t0 = time.time()
            out = fn(*args, **kwargs)
            t1 = time.time()
            if ev0 is not None:
                ev1 = cp.cuda.Event()
                ev1.record(stream)
            state.entries.append((kind, t0, t1, ev0, ev1, _task_key(state)))
            return out
        finally:
            local.depth = 0
    return wrapper


def _task_key(state):
    """The Dask key of the task running on this thread (a string), or None."""
    key = getattr(state.thread_state, "key", None) if state.thread_state is not None else None
    return None if key is None else str(key)


def _ipc_hook(state):
    """pyblasgemm._dask_ipc.TRACE while this worker is traced: a timing event where the
    transport queues its GPU work (``ready``: an export's ready event, on the exporting stream;
    ``copy_start``: a fetch's copy stream once it waits for the producer's ready event;
    ``copy_end``: after its copies), as an entry of the run with the same host time twice."""
    def hook(what, device, stream_handle):
        if state.ref is None or not state.gpu:
            return
        import cupy as cp

        from pyblasgemm.streams import cupy_stream

        stream = cp.cuda.Stream.null if stream_handle in (0, 1) else cupy_stream(stream_handle)
        ev = cp.cuda.Event()
        ev.record(stream)
        now = time.time()
        state.entries.append((what, now, now, ev, ev, _task_key(state)))
    return hook


def _install_trace(dask_worker=None):
    """Wrap the task functions of TRACED on this worker and set pyblasgemm._dask_ipc.TRACE
    (once; before its first task: Dask resolves a task's function by name when the task
    arrives). Nothing is recorded outside a traced run (:func:`_trace_begin`)."""
    import importlib

    state = _trace_state()
    if not state.installed:
        try:
            from distributed.worker import thread_state
        except ImportError:             # no distributed: no task keys
            thread_state = None
        state.thread_state = thread_state
        for modname, name, kind in TRACED:
            mod = importlib.import_module(modname)
            setattr(mod, name, _traced(getattr(mod, name), kind, state))
        importlib.import_module("pyblasgemm._dask_ipc").TRACE = _ipc_hook(state)
        state.installed = True
    return True


def _trace_begin(device, dask_worker=None):
    """Start tracing a run: a reference event on this worker's GPU, passed before the host clock
    is read (the GPU's times are put on the host's clock through it)."""
    state = _trace_state()
    state.entries, state.gpu = [], bool(device)
    if device:
        import cupy as cp

        ev = cp.cuda.Event()
        ev.record()
        ev.synchronize()
        state.ref = (ev, time.time())
    else:
        state.ref = (None, time.time())
    return True


def _trace_end(dask_worker=None):
    """The traced run's entries, (kind, host start, host end, GPU start, GPU end, task key) in
    seconds of the host clock (GPU times None on the host); tracing stops. With them, one
    ``arrive`` entry a task: when the scheduler's compute-task message for it reached this
    worker (its state machine's log), to tell Dask's latency from the worker's."""
    state = _trace_state()
    if state.ref is None:
        return []
    ref, ref_t = state.ref
    out = []
    log = getattr(getattr(dask_worker, "state", None), "log", None) or ()
    for rec in list(log):
        if len(rec) >= 5 and rec[1] == "compute-task" and isinstance(rec[-1], float) and rec[-1] >= ref_t:
            out.append(("arrive", rec[-1], rec[-1], None, None, str(rec[0])))
    if state.gpu:
        import cupy as cp

        cp.cuda.Device().synchronize()
    for kind, t0, t1, e0, e1, key in state.entries:
        g0 = g1 = None
        if e0 is not None:
            g0 = ref_t + cp.cuda.get_elapsed_time(ref, e0) / 1e3
            g1 = ref_t + cp.cuda.get_elapsed_time(ref, e1) / 1e3
        out.append((kind, t0, t1, g0, g1, key))
    state.entries, state.ref = [], None
    return out


#: trace entries that mark a point of the IPC transport's GPU work (pyblasgemm._dask_ipc.TRACE),
#: not a task
IPC_MARKS = ("ready", "copy_start", "copy_end")


def trace_summary(entries, t0) -> dict:
    """One worker's traced run, in ms after ``t0`` (the client's persist): its tasks by kind
    (count, host ms), when its first task began and its last ended on the host; on a GPU, its
    products and adds on the compute stream (one after the other: a gap between two is the GPU
    idle, waiting for the host or a copy): first start, last end, busy, idle between them,
    each product's ms; each fetch's copy stream interval (from its queueing, so it includes
    the wait for the producer's ready event); and, from the transport's own marks, when each
    export's ready event passed on the GPU (``ready_ms``) and each fetch's copies ran
    (``copies_ms``: [start, end], from the ready event's passing to the last copy's end).
    Entries: (kind, host start, host end, GPU start, GPU end[, task key]).

    >>> s = trace_summary([("product", 1.0, 1.001, 1.0005, 1.0105), ("product", 1.002, 1.003, 1.0125, 1.0225),
    ...                    ("fetch", 1.0, 1.0001, 1.0, 1.002), ("copy_start", 1.0, 1.0, 1.0004, 1.0004),
    ...                    ("copy_end", 1.0, 1.0, 1.002, 1.002), ("ready", 1.0, 1.0, 1.0001, 1.0001)], 1.0)
    >>> s["tasks"], s["gpu_busy_ms"], s["gpu_idle_ms"], s["gpu_last_ms"], s["copy_ms"]
    ({'product': 2, 'fetch': 1}, 20.0, 2.0, 22.5, [2.0])
    >>> s["ready_ms"], s["copies_ms"]
    ([0.1], [[0.4, 2.0]])
    """
    def ms(t):
        return round((t - t0) * 1e3, 3)

    marks = [e for e in entries if e[0] in IPC_MARKS]
    arrivals = [e for e in entries if e[0] == "arrive"]
    entries = [e for e in entries if e[0] not in IPC_MARKS and e[0] != "arrive"]
    out = {"tasks": {}, "host_ms": {}}
    if arrivals:                        # [first, last] compute-task message received, by kind
        by = {}
        for e in arrivals:
            key = e[5] if len(e) > 5 else ""
            kind = "export" if "ipc-export" in key else "fetch" if "ipc-fetch" in key else \
                "run" if "pyblasgemm-run-" in key else "product"
            by.setdefault(kind, []).append(e[1])
        out["arrive_ms"] = {k: [ms(min(v)), ms(max(v))] for k, v in sorted(by.items())}
    for kind, a, b, *_ in entries:
        out["tasks"][kind] = out["tasks"].get(kind, 0) + 1
        out["host_ms"][kind] = round(out["host_ms"].get(kind, 0.0) + (b - a) * 1e3, 3)
    if not entries:
        return out
    out["first_task_ms"] = ms(min(e[1] for e in entries))
    out["last_task_end_ms"] = ms(max(e[2] for e in entries))
    compute = sorted((e for e in entries if e[0] in ("product", "add") and e[3] is not None), key=lambda e: e[3])
    if compute:
        out["gpu_first_ms"] = ms(compute[0][3])
        out["gpu_last_ms"] = ms(max(e[4] for e in compute))
        out["gpu_busy_ms"] = round(sum(e[4] - e[3] for e in compute) * 1e3, 3)
        out["gpu_idle_ms"] = round(sum(max(0.0, b[3] - a[4]) for a, b in zip(compute, compute[1:])) * 1e3, 3)
        out["product_ms"] = [round((e[4] - e[3]) * 1e3, 3) for e in compute]
    copies = [e for e in entries if e[0] == "fetch" and e[3] is not None]
    if copies:
        out["copy_ms"] = [round((e[4] - e[3]) * 1e3, 3) for e in copies]
        out["copy_end_ms"] = [ms(e[4]) for e in copies]
    timed = [e for e in marks if e[3] is not None]
    if timed:
        out["ready_ms"] = [ms(e[3]) for e in timed if e[0] == "ready"]
        starts = [e[3] for e in timed if e[0] == "copy_start"]
        ends = [e[3] for e in timed if e[0] == "copy_end"]      # one thread: each start, then its end
        out["copies_ms"] = [[ms(a), ms(b)] for a, b in zip(starts, ends)]
    return out


#: --schedule: name -> (pyblasgemm.dask.RUNS, pyblasgemm.dask.START) while the product's graph is
#: built and persisted (in this process): "start" the default since 2026-11-28 (each worker's own
#: work handed to its engine at persist, off the scheduler's path), "runs" the graph alone (the
#: default before), "blocks" one task an output block (before that); "client" as "start", the
#: timed call ``client.persist(z)`` (Dask's own; the engines' work handed out by the product's
#: ``__dask_postpersist__`` once the graph is queued) where the others time ``z.persist()``
SCHEDULES = {"start": (True, True), "runs": (True, False), "blocks": (False, False), "client": (True, True)}


def _stamp_block():
    return np.full((1, 1), time.time())


def _stamp(_=None):
    return time.time()


def latency_probe(client, reps=9):
    """Dask's own time from a call on the client to its one task's start on a worker (the task
    returns time.time(): one clock for the host's processes), median of ``reps`` after one
    warm-up, each after 30 ms of an idle client: ``persist`` of a one-task Dask array (the path
    of a product's persist, with the least graph) and ``client.submit`` of one task (no
    expression, no ordering on the scheduler); and the client's batched stream's wait, if any,
    when the call was made (it sends at most one message every 10 ms)."""
    import dask.array as da
    from dask.task_spec import Task
    from distributed import wait

    got = {"persist_one_task": [], "submit_one_task": []}
    for rep in range(reps + 1):
        for kind in got:
            time.sleep(0.03)
            name = f"latency-{uuid.uuid4().hex[:12]}"
            pending = _pending_send_ms(client)
            t0 = time.time()
            if kind == "persist_one_task":
                z = da.Array({(name, 0, 0): Task((name, 0, 0), _stamp_block)}, name, ((1,), (1,)), dtype=float)
                done = client.persist(z)
                wait(done)
                start = float(done.compute()[0, 0])
            else:
                start = client.submit(_stamp, 0, key=name, pure=False).result()
            if rep:
                got[kind].append(((start - t0) * 1e3, pending))
    return {k: {"start_ms": round(statistics.median(a for a, _ in v), 3), "runs_ms": [round(a, 3) for a, _ in v],
                "pending_send_ms": [p for _, p in v]} for k, v in got.items()}


def _pending_send_ms(client):
    """How long the client's batched stream to the scheduler would hold a message sent now (it
    sends at most one batch every 10 ms), ms; 0 when it would go at once."""
    deadline = getattr(getattr(client, "scheduler_comm", None), "next_deadline", None)
    return 0.0 if deadline is None else round(max(0.0, (deadline - time.time()) * 1e3), 3)


#: pyblasgemm.dask's ``transport`` keyword on each cluster transport's rows
DATA_PATH = {"ipc": "ipc", "ipc-sync": "ipc", "ipc-2t": "ipc", "ucx-ipc": "ipc"}
#: pyblasgemm._dask_ipc.EVENTS on each cluster transport's workers (the default elsewhere)
IPC_EVENTS = {"ipc-sync": False}


def _set_ipc_events(on, dask_worker=None):
    from pyblasgemm import _dask_ipc

    _dask_ipc.EVENTS = bool(on)
    return _dask_ipc.EVENTS


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

        if transport not in ("tcp", "ipc", "ipc-sync", "ipc-2t"):
            raise ValueError(f"--smoke runs over tcp (or ipc: NumPy blocks fall back to it) only, not {transport!r}")
        # work stealing off: the smoke's blocks are a few KB, which Dask may move at will (it
        # leaves alone tasks whose inputs take longer to move than to compute)
        with dask.config.set({**settings, "distributed.scheduler.work-stealing": False}):
            return distributed.LocalCluster(n_workers=n, threads_per_worker=1, processes=True,
                                            dashboard_address=None, silence_logs=logging.CRITICAL)
    import dask_cuda

    # the first n of this process's GPUs: dask-cuda sets each worker's CUDA_VISIBLE_DEVICES to
    # the list it is given, so a limit of the caller's (CUDA_VISIBLE_DEVICES=2,3) is passed on
    visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    if visible and len(visible) < n:
        raise ValueError(f"--gpus: a cluster of n={n} GPUs, but CUDA_VISIBLE_DEVICES={','.join(visible)!r} "
                         f"shows {len(visible)}")
    devices = visible[:n] if visible else [str(i) for i in range(n)]
    with dask.config.set(settings):
        return dask_cuda.LocalCUDACluster(CUDA_VISIBLE_DEVICES=",".join(devices), n_workers=n,
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


def timed_runs(client, case, product, reps, device, with_bits, trace=False, client_persist=False):
    """Warm-up, ``reps`` timed runs and one more under Dask's task stream, each on fresh
    operands (module docstring); per run: seconds, bytes received, repeated (worker, block)
    receipts, output blocks per worker, tasks stolen, and with ``trace`` each worker's
    timeline (:func:`trace_summary`; the last run's entries in full); the last run's product
    kept for the error. The timed call is ``z.persist()``, or ``client.persist(z)`` with
    ``client_persist`` (schedule "client")."""
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
        client.run(_engine_stats)
        last = rep == reps + 1
        stream = get_task_stream(client) if last else None
        if stream is not None:
            stream.__enter__()
        if trace:
            client.run(_trace_begin, device)
        pending = _pending_send_ms(client)
        since = time.time()
        t0 = time.perf_counter()
        # pyblasgemm.dask.START: z.persist starts the engines' work before the graph is sent,
        # client.persist(z) once it is queued (the product's __dask_postpersist__)
        done = client.persist(z) if client_persist else z.persist()
        wait(done)
        waited = time.perf_counter() - t0
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
        engine = client.run(_engine_stats)
        got = [(w, tuple(key) if isinstance(key, list) else key) for w, log in logs.items() for e in log for key in e[0]]
        who = client.who_has(done)
        out_blocks = {}
        for holders in who.values():
            for w in holders:
                out_blocks[w] = out_blocks.get(w, 0) + 1
        run = {"s": elapsed, "graph_s": graph_s, "tasks": tasks, "pending_send_ms": pending, "placed": type(z).__name__ == "PlacedArray",
               "received_bytes": sum(e[1] for log in logs.values() for e in log),
               "received_by_worker": {w: sum(e[1] for e in log) for w, log in logs.items()},
               "transfers": sum(len(log) for log in logs.values()),
               "repeated_receipts": len(got) - len(set(got)), "output_blocks_by_worker": out_blocks,
               "stolen": _steals(client, since), "data_path": _data_path(z),
               "ipc_bytes": sum(v["ipc_bytes"] for v in ipc.values()),
               "ipc_blocks": sum(v["ipc_blocks"] for v in ipc.values()),
               "ipc_fallback_blocks": sum(v["fallback_blocks"] for v in ipc.values()),
               "ipc_fallback_reasons": sorted({r for v in ipc.values() for r in v["fallback_reasons"]}),
               "engine": {k: sum(v[k] for v in engine.values()) for k in ENGINE_COUNTS}}
        if trace:
            entries = client.run(_trace_end)
            run["trace"] = {"wait_ms": round(waited * 1e3, 3), "elapsed_ms": round(elapsed * 1e3, 3),
                            "workers": {w: trace_summary(e, since) for w, e in entries.items()}}
            # every entry, per worker: (kind, host start, host end, GPU start, GPU end) in ms after
            # persist, and the task's key (kinds IPC_MARKS: a point of the transport's GPU work)
            run["trace"]["entries"] = {w: [(k, round((a - since) * 1e3, 3), round((b - since) * 1e3, 3),
                                            None if g0 is None else round((g0 - since) * 1e3, 3),
                                            None if g1 is None else round((g1 - since) * 1e3, 3), key)
                                           for k, a, b, g0, g1, key in e] for w, e in entries.items()}
        if with_bits:
            run["digest"] = client.compute(digests(done), sync=True).tolist()
        if rep:
            runs.append(run)
        if last:
            keep = (x, y, done)
        del x, y, z, done
    return runs, stream_summary, keep


def _print_trace(trace) -> None:
    """One line a worker: where its time went in a traced run."""
    for w, t in trace["workers"].items():
        print(f"    trace {w[-5:]}: first task {t.get('first_task_ms')} ms, GPU {t.get('gpu_first_ms')}-"
              f"{t.get('gpu_last_ms')} ms busy {t.get('gpu_busy_ms')} idle {t.get('gpu_idle_ms')}, tasks {t['tasks']}, "
              f"host {t['host_ms']}, copies {t.get('copy_ms')} ending {t.get('copy_end_ms')}, "
              f"ready at {t.get('ready_ms')}, copying {t.get('copies_ms')}; "
              f"wait {trace['wait_ms']} ms, elapsed {trace['elapsed_ms']} ms", flush=True)


def _data_path(z):
    from pyblasgemm import dask as pbd

    return pbd.transport_of(z)


def run_case(client, name, case, n_gpus, transport, reps, base_s, device, with_dask=True, trace=False,
             client_persist=False):
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
            runs, stream, (x, y, z) = timed_runs(client, case, product, reps, device, with_bits=ours,
                                                 trace=trace and ours, client_persist=client_persist)
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
                   "pending_send_ms": [r["pending_send_ms"] for r in runs],
                   "data_path": sorted({r["data_path"] for r in runs}),
                   "ipc_bytes_per_run": statistics.median(r["ipc_bytes"] for r in timed),
                   "ipc_blocks_per_run": statistics.median(r["ipc_blocks"] for r in timed),
                   "ipc_fallback_blocks": sum(r["ipc_fallback_blocks"] for r in runs),
                   "ipc_fallback_reasons": sorted({x for r in runs for x in r["ipc_fallback_reasons"]}),
                   "engine_per_run": [r["engine"] for r in timed]}
            if runs[0].get("trace"):
                res["trace"] = {"timed": [r["trace"] for r in timed], "task_stream_run": runs[-1]["trace"]}
                _print_trace(runs[-2]["trace"])
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


def blocks_alone(case, reps=3):
    """pyblasgemm.dask's block products of ``case`` without Dask, on one GPU in this process
    (CUDA events, median of ``reps`` after a warm-up): ``chain_s``, every output block's task
    function in turn (``_product_finish``: its K chunks chained into float32 sums, cast once:
    what each task of the default graph runs), and the host's time to queue them
    (``chain_queue_s``); ``whole_k_s``, every output block as one GEMM over the whole of K (its
    row panel of A and column panel of B made contiguous first, untimed: another order of sums,
    to see what the chain costs). None for cases whose default graph splits K or that pass
    keywords. Against one call: is the gap to it in the blocks or in Dask?"""
    import cupy as cp

    import pyblasgemm
    from pyblasgemm import dask as pbd

    m, n, k, dtype, chunk, kw = case
    mb, nb, kb = m // chunk, n // chunk, k // chunk
    if kw or pbd.k_group_for(kb, mb * nb) != kb:
        return None
    a = [[_block(_seed("x", i, q), (chunk, chunk), dtype, True) for q in range(kb)] for i in range(mb)]
    b = [[_block(_seed("y", q, j), (chunk, chunk), dtype, True) for j in range(nb)] for q in range(kb)]
    want = _dtype(dtype)
    out_dtype = pbd._result_dtype(want, want, None, None)
    acc = pbd.accumulation_dtype(out_dtype)

    def chain():
        return [pbd._product_finish(a[i], [b[q][j] for q in range(kb)], (want, want), acc, None, None, out_dtype,
                                    1, 0, None, None) for i in range(mb) for j in range(nb)]

    def bits(x):
        return x.view(cp.uint16) if x.dtype.itemsize == 2 else x

    rows = [cp.concatenate([bits(x) for x in a[i]], axis=1).view(want) for i in range(mb)]
    cols = [cp.concatenate([bits(b[q][j]) for q in range(kb)], axis=0).view(want) for j in range(nb)]

    def whole():
        return [pyblasgemm.matmul(rows[i], cols[j]) for i in range(mb) for j in range(nb)]

    def timed(fn):
        fn()
        cp.cuda.Device().synchronize()
        gpu, host = [], []
        for _ in range(reps):
            start, stop = cp.cuda.Event(), cp.cuda.Event()
            start.record()
            h0 = time.perf_counter()
            got = fn()
            host.append(time.perf_counter() - h0)
            stop.record()
            stop.synchronize()
            gpu.append(cp.cuda.get_elapsed_time(start, stop) / 1e3)
            del got
        return statistics.median(gpu), statistics.median(host)

    out = {"blocks": mb * nb, "k_chunks": kb}
    out["chain_s"], out["chain_queue_s"] = timed(chain)
    out["whole_k_s"], out["whole_k_queue_s"] = timed(whole)
    del a, b, rows, cols
    cp.get_default_memory_pool().free_all_blocks()
    return out


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
                events = sorted(set(client.run(_set_ipc_events, IPC_EVENTS.get(transport, True)).values()))
                if args.switch_interval:    # the GIL's switch interval on the workers and the scheduler
                    client.run(sys.setswitchinterval, args.switch_interval)
                    client.run_on_scheduler(sys.setswitchinterval, args.switch_interval)
                    doc["config"]["switch_interval_s"] = args.switch_interval
                if args.trace:              # before any task: a worker resolves a task's function when it arrives
                    client.run(_install_trace)
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
                if args.latency:
                    try:
                        doc.setdefault("latency", {})[str(n_gpus)] = lat = latency_probe(client)
                        print(f"  latency {n_gpus}: " + ", ".join(f"{k} {v['start_ms']} ms" for k, v in lat.items()),
                              flush=True)
                    except Exception as e:
                        doc["failures"].append({"latency": n_gpus, "failure": f"{type(e).__name__}: {e}"[:400]})
                scheds = args.schedule.split(",")
                for name, sched in [(c, sc) for c in cases for sc in scheds]:
                    from pyblasgemm import dask as pbd

                    pbd.RUNS, pbd.START = SCHEDULES[sched]
                    print(f"  schedule {sched} (pyblasgemm.dask.RUNS = {pbd.RUNS}, START = {pbd.START}):", flush=True)
                    try:                    # dask.array.matmul once a case and cluster (no schedule of ours)
                        theirs = not args.no_dask_array and _listed(args.dask_array_gpus, str(n_gpus), transport) \
                            and _listed(args.dask_array_cases, name) and sched == scheds[0]
                        row = run_case(client, name, ALL_CASES[name], n_gpus, transport, args.reps, bases.get(name),
                                       device, with_dask=theirs, trace=args.trace, client_persist=sched == "client")
                        row["ipc_events"] = events
                        row["schedule"] = sched
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


def _listed(spec, item, transport=None) -> bool:
    """Whether ``item`` is in the comma-separated ``spec`` (None or 'all': everything), where an
    entry ``TRANSPORT@ITEM`` lists the item for that transport alone.

    >>> _listed("1,ucx-nvlink@2", "2", "ipc"), _listed("1,ucx-nvlink@2", "2", "ucx-nvlink"), _listed(None, "4")
    (False, True, True)
    """
    if spec in (None, "all"):
        return True
    return any(e == item or e == f"{transport}@{item}" for e in spec.split(","))


#: --quick: one device command of at most 8 minutes on 4 GPUs, no UCX (module docstring)
QUICK = {"gpus": "1,2,4", "probe": "tcp,ipc", "transport": "ipc", "cases": "32768^3 float16,16384^3 float64",
         "reps": 3, "threaded_check": "32768^3 float16", "dask_array_gpus": "4", "dask_array_cases": "32768^3 float16",
         "budget_s": 440.0, "trace": True, "blocks_alone": True}


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


def _nvidia_smi() -> dict:
    """What nvidia-smi says of the GPUs (name, driver, memory, PCI bus) and how they are linked
    (``topo -m``: NV# is NVLink, PIX/PXB/PHB/SYS PCIe paths), or why it could not say."""
    out = {}
    for key, cmd in (("gpus", ["nvidia-smi", "--query-gpu=index,name,driver_version,memory.total,pci.bus_id",
                               "--format=csv,noheader"]), ("topology", ["nvidia-smi", "topo", "-m"])):
        try:
            out[key] = subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip()
        except Exception as e:
            out[key] = f"unavailable: {type(e).__name__}: {e}"[:200]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="the results file (JSON), or the figure (PNG) with --plot")
    ap.add_argument("--plot", metavar="RESULTS", help="draw --out (a PNG) from a results file; no run")
    ap.add_argument("--plot-transport", default="ucx", help="the transport whose rows --plot draws")
    ap.add_argument("--plot-schedule", default=None, help="the schedule whose rows --plot draws (default all)")
    ap.add_argument("--plot-kind", default="scaling", choices=("scaling", "transports"),
                    help="--plot's figure: speed against GPUs for one transport (scaling), or every transport's "
                         "speed on the most GPUs side by side, per product (transports: plot_transports)")
    ap.add_argument("--plot-gpus", type=int, default=None, help="--plot-kind transports: the GPU count drawn")
    ap.add_argument("--device-kind", default=None, help="the machine's kind, as the device tool names it (recorded)")
    ap.add_argument("--note", default=None, help="a line on why this run was made (recorded)")
    ap.add_argument("--smoke", action="store_true", help="on the host: NumPy chunks, LocalCluster, SMOKE_CASES")
    ap.add_argument("--gpus", default=None, help="GPU (worker) counts, e.g. 1,2,4 (default 1,2,4; --smoke 1,2)")
    ap.add_argument("--probe", default=None,
                    help=f"transports to probe first, comma-separated: {', '.join(TRANSPORTS)} (default: none)")
    ap.add_argument("--transport", default=None,
                    help="transports to run the cases on, NAME or NAME@GPUS (GPU counts joined by '+': that "
                         "transport on those clusters only, and no probe of its own); 'best': the probed one "
                         "with the most GB/s "
                         "(default: best with --probe, else ucx-nvlink; --smoke: tcp)")
    ap.add_argument("--cases", default=None, help="comma-separated case names, or 'all' (default all)")
    ap.add_argument("--tcp-cases", default="32768^3 float16", help="the cases run over tcp ('all': every case)")
    ap.add_argument("--reps", type=int, default=None, help="timed runs a product (default 3; --smoke 1)")
    ap.add_argument("--threaded-check", default=None,
                    help="cases whose bits are compared with the threaded scheduler (default 32768^3 float16; "
                         "--smoke all)")
    ap.add_argument("--no-dask-array", action="store_true", help="skip dask.array.matmul")
    ap.add_argument("--dask-array-gpus", default=None,
                    help="GPU counts dask.array.matmul runs on, N or TRANSPORT@N (that transport's only; default all)")
    ap.add_argument("--dask-array-cases", default=None, help="cases dask.array.matmul runs on (default all)")
    ap.add_argument("--trace", action="store_true", default=None,
                    help="each worker's tasks on the host and its GPU, per timed run (trace_summary; --quick: on)")
    ap.add_argument("--blocks-alone", action="store_true", default=None,
                    help="time each case's block products without Dask on one GPU, and one GEMM a block over "
                         "the whole of K (blocks_alone; --quick: on)")
    ap.add_argument("--quick", action="store_true",
                    help="the 8-minute plan on 4 GPUs: " + "; ".join(f"{k}={v}" for k, v in QUICK.items()))
    ap.add_argument("--message-bytes-limit", default="1GiB",
                    help="distributed.worker.transfer.message-bytes-limit of the clusters (Dask's default: 50MB)")
    ap.add_argument("--budget-s", type=float, default=None, help="stop every transport's process by then (default 560)")
    ap.add_argument("--child-budget-s", type=float, default=None,
                    help="stop each transport's process (probe or cases) after this long, so that one that hangs "
                         "(UCX starting) leaves the others their time (default: no limit but --budget-s)")
    ap.add_argument("--switch-interval", type=float, default=None,
                    help="sys.setswitchinterval on each cluster's workers and scheduler (the scheduler of a "
                         "LocalCUDACluster runs in the transport's process: its client too); Python's default "
                         "0.005 s lets a thread that wants the GIL wait that long behind a busy event loop "
                         "(bench/dask_overhead.py)")
    ap.add_argument("--schedule", default="start",
                    help="pyblasgemm.dask's schedules to run each case on, comma-separated, alternating: start "
                         "(pyblasgemm.dask.START and RUNS: each worker's own runs and exports started through its "
                         "engine at persist), client (as start, timed as client.persist(z): the work started "
                         "once the graph is queued), runs (RUNS alone: a worker's block products that read the same "
                         "workers' blocks in one task, all through the scheduler), blocks (neither: one task an "
                         "output block)")
    ap.add_argument("--latency", action="store_true",
                    help="on each cluster, Dask's own time from a call to its task's start on a worker: "
                         "persist of a one-task array, client.submit of one task (latency_probe)")
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
    args.trace, args.blocks_alone = bool(args.trace), bool(args.blocks_alone)
    if args.plot:
        if args.plot_kind == "transports":
            plot_transports(args.plot, args.out, args.plot_schedule or "start", args.plot_gpus)
        else:
            plot(args.plot, args.out, args.plot_transport, args.plot_schedule)
        return 0
    device = not args.smoke
    table = CASES if device else SMOKE_CASES
    args.gpus = args.gpus or ("1,2,4" if device else "1,2")
    args.reps = args.reps or (3 if device else 1)
    cases = list(table) if args.cases in (None, "all") else [c for c in args.cases.split(",") if c]
    for c in cases:
        if c not in table:
            ap.error(f"--cases: unknown case {c!r}; known: {', '.join(table)}")
    for sched in args.schedule.split(","):
        if sched not in SCHEDULES:
            ap.error(f"--schedule: unknown schedule {sched!r}; known: {', '.join(SCHEDULES)}")
    if args.child:
        return child(args, cases)
    started = time.perf_counter()
    probes = [t for t in (args.probe or "").split(",") if t]
    transports = [t for t in (args.transport or ("best" if probes else "ucx-nvlink" if device else "tcp")).split(",")]
    gpus_of = {}                        # transport -> its GPU counts, where NAME@GPUS limits them
    for n, t in enumerate(transports):
        name, _, only = t.partition("@")
        if only:
            if not all(g.isdigit() for g in only.split("+")):
                ap.error(f"--transport {t!r}: GPU counts after '@' are integers joined by '+', e.g. ipc-sync@2+4")
            gpus_of[name] = only.replace("+", ",")
        transports[n] = name
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
           "message_bytes_limit": args.message_bytes_limit, "switch_interval_s": args.switch_interval,
           "device_kind": args.device_kind, "note": args.note}
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
        doc["nvidia_smi"] = _nvidia_smi()
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
    if args.blocks_alone and device:
        doc["blocks_alone"] = {}
        for name in cases:
            try:
                got = blocks_alone(table[name])
            except Exception as e:
                got = {"failure": f"{type(e).__name__}: {e}"[:300]}
            if got is not None:
                doc["blocks_alone"][name] = got
                print(f"blocks alone {name}: {json.dumps(got)}", flush=True)
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
        (["--smoke"] if args.smoke else []) + (["--no-dask-array"] if args.no_dask_array else []) + \
        (["--trace"] if args.trace else []) + (["--latency"] if args.latency else []) + \
        ["--schedule", args.schedule] + \
        (["--switch-interval", str(args.switch_interval)] if args.switch_interval else [])

    def gpus(t):
        return ["--gpus", gpus_of.get(t, args.gpus)]

    def left():
        return args.budget_s - (time.perf_counter() - started) - 10

    def share():                        # one transport's process: what is left, at most --child-budget-s
        return min(left(), args.child_budget_s or left())

    for t in probes:
        log = out.with_name(f"{out.stem}.probe-{t}.log")
        got, why = _run_child(["--child", t, "--probe-only", *common], out.with_name(f"{out.stem}.probe-{t}.json"),
                              share(), log=log)
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
                               *(["--probe-here"] if t not in probes and t not in gpus_of else []), *common, *gpus(t)],
                              out.with_name(f"{out.stem}.cases-{t}.json"), share())
        got = got or {}
        doc["cases"] += got.get("cases", [])
        doc["failures"] += [{"transport": t, **f} for f in got.get("failures", [])]
        entry = doc["transports"].setdefault(t, {"config": TRANSPORTS[t][0], "doc": TRANSPORTS[t][1]})
        if got.get("probes"):
            entry["probes"] = got["probes"]
        if got.get("latency"):
            entry["latency"] = got["latency"]
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
        entry["runs"].append(f"{row['gpus']} GPU {row['transport']} {row.get('schedule', 'blocks')}")
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


def guide_rows(path, schedule=None) -> list:
    """(case, gpus, protocol, ours ms, speedup over one call, efficiency, GiB received,
    dask.array.matmul ms or None, ratio or None) per measured row of one results file (of one
    ``schedule``, if given: dask.array.matmul's time from the case's row that has it)."""
    doc = json.loads(pathlib.Path(path).read_text())
    rows = []
    theirs_of = {(c["case"], c["gpus"], c["protocol"]): c for c in doc["cases"] if "dask.array.matmul" in c}
    for c in doc["cases"]:
        ours = c.get("pyblasgemm.dask.matmul", {})
        if "median_s" not in ours or schedule is not None and c.get("schedule") != schedule:
            continue
        other = theirs_of.get((c["case"], c["gpus"], c["protocol"]))
        if other is not None and "median_s" in other["dask.array.matmul"] and "dask.array.matmul" not in c:
            c = dict(c, **{"dask.array.matmul": other["dask.array.matmul"],
                           "ratio_vs_dask_array": other["dask.array.matmul"]["median_s"] / ours["median_s"]})
        theirs = c.get("dask.array.matmul", {})
        rows.append((c["case"], c["gpus"], c["protocol"], ours["median_s"] * 1e3, ours.get("speedup_vs_one_call"),
                     ours.get("efficiency"), ours["received_bytes_per_run"] / 2**30,
                     theirs["median_s"] * 1e3 if "median_s" in theirs else None, c.get("ratio_vs_dask_array")))
    return rows


def guide_table(path, protocol="ucx", schedule=None) -> str:
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
    for case, gpus, proto, ms, speed, eff, gib, theirs, ratio in guide_rows(path, schedule):
        if proto != protocol:
            continue
        lines += [f"   * - {case}", f"     - {gpus}", f"     - {ms:.1f} ms", f"     - {speed:.2f}x ({eff:.2f})",
                  f"     - {gib:.2f} GiB",
                  f"     - {theirs:.1f} ms ({ratio:.2f}x)" if theirs is not None else "     - (not run)"]
    return "\n".join(lines)


#: each transport's (what carries Dask's messages, what carries the blocks) in the guide's table
COMM = {"ipc": ("TCP", "CUDA IPC"), "ucx-ipc": ("UCX", "CUDA IPC"), "ucx-nvlink": ("UCX", "UCX (NVLink)"),
        "tcp": ("TCP", "TCP")}
#: each schedule's timed call in the guide's table
CALLS = {"start": "z.persist()", "client": "client.persist(z)", "runs": "z.persist(), graph alone",
         "blocks": "z.persist(), a task a block"}


def transport_table(path) -> str:
    """The guide's table of one run over several transports (reStructuredText list-table): per
    product, GPU count, transport (:data:`COMM`) and schedule (:data:`CALLS`), in that order:
    the median time, the speed over one call (efficiency), when the GPUs start (the median over
    timed runs and workers of the trace's first GPU work, ms after the call; "-" untraced) and
    dask.array.matmul's time on that cluster where it ran.

    >>> print(transport_table(ROOT / "bench/results/dask_scaling_h200x2_2026-11-28_ef0b596_start.json").splitlines()[0])
    .. list-table:: pyblasgemm.dask over each transport, 2 NVIDIA H200, one run (median of 5)
    """
    doc = json.loads(pathlib.Path(path).read_text())
    reps = {len(c["pyblasgemm.dask.matmul"]["times_s"]) for c in doc["cases"] if "median_s" in
            c.get("pyblasgemm.dask.matmul", {})}
    order = list(COMM)
    rows = sorted(doc["cases"], key=lambda c: (list(CASES).index(c["case"]) if c["case"] in CASES else 99, c["gpus"],
                                               order.index(c["transport"]) if c["transport"] in order else 99,
                                               list(CALLS).index(c.get("schedule", "blocks"))))
    lines = [f".. list-table:: pyblasgemm.dask over each transport, {doc['gpu_count']} {doc['device']['name']}, "
             f"one run (median of {'/'.join(str(r) for r in sorted(reps))})", "   :header-rows: 1", "",
             "   * - product", "     - GPUs", "     - Dask's messages", "     - blocks", "     - timed call",
             "     - pyblasgemm.dask", "     - x one call (efficiency)", "     - GPUs start (ms)",
             "     - dask.array.matmul (ours faster by)"]
    for c in rows:
        ours, theirs = c.get("pyblasgemm.dask.matmul", {}), c.get("dask.array.matmul", {})
        comm, blocks = COMM.get(c["transport"], (c["transport"], "?"))
        head = [f"   * - {c['case']}", f"     - {c['gpus']}", f"     - {comm}", f"     - {blocks}",
                f"     - ``{CALLS.get(c.get('schedule', 'blocks'))}``"]
        if "median_s" not in ours:
            lines += head + [f"     - failed: {ours.get('failure') or c.get('failure')}", "     -", "     -", "     -"]
            continue
        timed = (ours.get("trace") or {}).get("timed") or []
        firsts = [w["gpu_first_ms"] for r in timed for w in r["workers"].values() if w.get("gpu_first_ms") is not None]
        lines += head + [f"     - {ours['median_s'] * 1e3:.1f} ms",
                         f"     - {ours['speedup_vs_one_call']:.3f}x ({ours['efficiency']:.3f})",
                         f"     - {statistics.median(firsts):.2f}" if firsts else "     - -",
                         f"     - {theirs['median_s'] * 1e3:.1f} ms ({c['ratio_vs_dask_array']:.2f}x)"
                         if "median_s" in theirs else "     - not run"]
    return "\n".join(lines)


def plot(path, out, protocol="ucx", schedule=None) -> None:
    """Speed over one pyblasgemm call against GPUs, per product: ours and dask.array.matmul,
    the rows of one transport (and one schedule, if given)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in guide_rows(path, schedule) if r[2] == protocol]
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
    top = max([r[1] for r in rows] or [4])      # the GPU counts measured (a 2-GPU run: 1 and 2)
    ax.plot([1, top], [1, top], color="grey", linewidth=0.8, label="ideal")
    ax.set_xticks([g for g in (1, 2, 4, 8) if g <= top])
    ax.set_xlabel(f"GPUs (one Dask worker each, {protocol})")
    ax.set_ylabel("speed / one pyblasgemm call on one GPU")
    ax.set_title(f"pyblasgemm.dask scaling, {doc['device']['name']}, git {doc['git_sha']}", fontsize=9)
    ax.legend(fontsize=6, loc="upper left")
    fig.tight_layout()
    fig.savefig(out, dpi=130)



#: how each transport's rows are labelled in figures: what carries Dask's messages, what the blocks
TRANSPORT_LABELS = {"ipc": "TCP messages, blocks by CUDA IPC (default)",
                    "ucx-ipc": "UCX messages, blocks by CUDA IPC",
                    "ucx-nvlink": "UCX: messages and blocks (NVLink)",
                    "tcp": "TCP: messages and blocks (host memory)"}


def plot_transports(path, out, schedule="start", gpus=None) -> None:
    """Every transport's speed over one pyblasgemm call side by side, per product, on ``gpus``
    GPUs (default: the most) of one results file (the rows of one ``schedule``), log scale
    (TCP's blocks are ~30x slower), the ideal (n GPUs) dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    doc = json.loads(pathlib.Path(path).read_text())
    rows = [r for r in guide_rows(path, schedule)]
    top = gpus or max(r[1] for r in rows)
    cases = list(dict.fromkeys(r[0] for r in rows))
    transports = [t for t in TRANSPORT_LABELS if any(r[2] == t and r[1] == top for r in rows)]
    width = 0.8 / max(len(transports), 1)
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for n, t in enumerate(transports):
        xs, ys = [], []
        for c, case in enumerate(cases):
            got = [r[4] for r in rows if r[0] == case and r[2] == t and r[1] == top]
            if got:
                xs.append(c + (n - (len(transports) - 1) / 2) * width)
                ys.append(got[0])
        bars = ax.bar(xs, ys, width * 0.9, label=TRANSPORT_LABELS[t])
        for bar, y in zip(bars, ys):
            ax.annotate(f"{y:.2f}x", (bar.get_x() + bar.get_width() / 2, y), ha="center", va="bottom", fontsize=6)
    ax.axhline(top, color="grey", linestyle="--", linewidth=0.8, label=f"ideal ({top} GPUs)")
    ax.set_yscale("log")
    ax.set_xticks(range(len(cases)))
    ax.set_xticklabels(cases, fontsize=8)
    ax.set_ylabel(f"speed on {top} GPUs / one pyblasgemm call on one GPU")
    ax.set_title(f"pyblasgemm.dask on {top} x {doc['device']['name']}: Dask's transport, "
                 f"{schedule} schedule, git {doc['git_sha']}", fontsize=9)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=2)
    fig.tight_layout()
    fig.savefig(out, dpi=130)


if __name__ == "__main__":
    sys.exit(main())
