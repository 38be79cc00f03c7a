"""Where Dask's time goes between ``persist`` and the first task of a pyblasgemm.dask product,
on the host (issue 32: 8-13 ms on the GPU machines before the first task, against GPUs busy
51 ms a run).

    PYTHONPATH=. python bench/dask_overhead.py --workers 2,4 --out /tmp/overhead.json
    PYTHONPATH=. python bench/dask_overhead.py --src before=/tmp/pb-main,after=. --out /tmp/cmp.json

The same graph as the GPU benchmark's 32768^3 float16 case in 8192^2 chunks (4 x 4 output
blocks, 4 K chunks; ``--blocks``) with NumPy stand-in blocks of ``--chunk``^2 (the tasks, the
keys, the placement and the IPC export / fetch tasks are the same; a block product takes
microseconds), on a ``distributed.LocalCluster`` of 2 or 4 single-thread worker processes (work
stealing off, as bench/dask_scaling.py's smoke), operands generated on and kept by their
workers as in bench/dask_scaling.py (A by row panels, B by column panels). Per timed run, all on
the host's clock (time.time(), one clock for every process):

* ``build_ms``: ``pyblasgemm.dask.matmul`` (the graph, the placement, the scheduler round trip
  that asks where the blocks are);
* ``persist_call_ms``: ``client.persist`` until it returns (expression, optimization on the
  client, pickling, queueing the message);
* ``to_scheduler_ms``: from the call's return until the scheduler's ``update_graph`` starts
  (the client's batched stream: one message every 10 ms at most; the socket);
* ``update_graph_ms``: the scheduler's update_graph until its tasks exist (its own metrics:
  materialization, which runs a graph's low-level optimization, ordering, task states);
* ``first_processing_ms``: the first of the product's tasks sent to a worker (transition to
  ``processing``, after persist's start);
* ``worker_received_ms``: the first compute-task message a worker handled;
  ``first_executing_ms``: the first task's transition to executing in a worker's state
  machine; ``first_submitted_ms``: the event loop handing it to the executor (its
  ``start_time``); ``first_thread_ms``: the executor's thread starting it;
* ``first_start_ms``: the first task function's start on any worker (a wrapper on the task
  functions, as bench/dask_scaling.py's --trace); ``first_start_by_worker_ms``: each worker's;
* ``done_ms``: ``wait`` on the persisted result returned;
* CPU time, which another process on the host does not inflate as it does the wall times above:
  ``persist_call_cpu_ms`` (this thread's, in ``client.persist``), ``scheduler_cpu_ms`` (the
  scheduler process's from before ``persist`` until ``wait`` returned: the whole product, two
  ``run_on_scheduler`` calls included), and ``client_steps``: persist's steps and the scheduler's
  materialization and ordering, run in this process on another product of the same shape (thread
  CPU ms, median of 20).

``--src NAME=PATH,...``: each source tree of pyblasgemm in a process of its own, one after the
other (never two clusters at once), so that before / after are measured in one run. Median of
``--reps`` timed runs after ``--warmup``.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import threading
import time
import types
import uuid

import numpy as np

_TRACE = "_pyblasgemm_overhead_trace"
#: pyblasgemm.dask's transport keyword (--transport)
TRANSPORT = "ipc"
TRACED = (("pyblasgemm.dask", "_product_finish"), ("pyblasgemm.dask", "_product"), ("pyblasgemm.dask", "_add"),
          ("pyblasgemm.dask", "_sum_finish"), ("pyblasgemm._dask_ipc", "export"), ("pyblasgemm._dask_ipc", "fetch"))


def _state():
    mod = sys.modules.get(_TRACE)
    if mod is None:
        mod = sys.modules[_TRACE] = types.ModuleType(_TRACE)
        mod.starts, mod.threads, mod.installed = [], [], False
    return mod


def _install(dask_worker=None):
    """Wrap the task functions on this worker: each call's start and name recorded."""
    import functools
    import importlib

    state = _state()
    if state.installed:
        return True
    import distributed.worker as dw

    run_task = dw._run_task

    def _run_task(*args, **kwargs):         # the executor thread's start of a task
        state.threads.append(time.time())
        return run_task(*args, **kwargs)

    dw._run_task = _run_task
    for modname, name in TRACED:
        mod = importlib.import_module(modname)
        fn = getattr(mod, name, None)
        if fn is None:
            continue

        def wrap(fn, name):
            @functools.wraps(fn)
            def wrapper(*args, **kwargs):
                state.starts.append((name, time.time()))
                return fn(*args, **kwargs)
            return wrapper

        setattr(mod, name, wrap(fn, name))
    state.installed = True
    return True


def _starts(dask_worker=None):
    state = _state()
    out, state.starts = list(state.starts), []
    return out


def _worker_log(since, dask_worker=None):
    """(first compute-task handled, first executing, first task handed to the executor by the
    event loop, first task started by the executor's thread) on this worker after ``since``."""
    state = _state()
    received = [e[-1] for e in dask_worker.state.log if len(e) == 5 and e[1] == "compute-task" and e[-1] >= since]
    executing = [e[-1] for e in dask_worker.state.log
                 if len(e) == 7 and e[3] == "executing" and e[-1] >= since]
    submitted = [ts.start_time for ts in dask_worker.state.tasks.values()
                 if getattr(ts, "start_time", None) and ts.start_time >= since]
    threads = [t for t in state.threads if t >= since]
    state.threads = []
    return min(received, default=None), min(executing, default=None), min(submitted, default=None), \
        min(threads, default=None)


def _scheduler_first(since, prefix, dask_scheduler=None):
    """The first transition of a task named ``prefix``... to processing after ``since``."""
    ts = [t.timestamp for t in dask_scheduler.transition_log
          if t.timestamp >= since and t.finish == "processing"
          and str(t.key[0] if isinstance(t.key, tuple) else t.key).startswith(prefix)]
    return min(ts, default=None)


def _block(seed, chunk):
    return np.random.default_rng(seed).standard_normal((chunk, chunk), dtype=np.float32).astype(np.float16)


def operands(client, blocks, chunk):
    import dask.array as da

    workers = sorted(client.nthreads())
    n = len(workers)
    token = uuid.uuid4().hex[:10]

    def make(tag, by_rows):
        name = f"operand-{tag}-{token}"
        futures = {}
        for i in range(blocks):
            for j in range(blocks):
                owner = workers[(i if by_rows else j) * n // blocks]
                futures[name, i, j] = client.submit(_block, hash((tag, i, j)) % 2**31, chunk, key=(name, i, j),
                                                    workers=[owner], allow_other_workers=False, pure=False)
        return da.Array(futures, name, ((chunk,) * blocks,) * 2, meta=np.empty((0, 0), np.float16))

    return make("x", True), make("y", False)


def one_run(client, blocks, chunk, persist_kw):
    from distributed import wait

    import pyblasgemm.dask as pbd

    x, y = operands(client, blocks, chunk)
    wait([x, y])
    client.run(_starts)
    time.sleep(0.05)                    # the client's batched stream idle, as before a user's call
    t0 = time.time()
    z = pbd.matmul(x, y, transport=TRANSPORT)
    t1 = time.time()
    cpu0 = client.run_on_scheduler(time.process_time)
    c0 = time.thread_time()
    done = client.persist(z, **persist_kw)
    t2 = time.time()
    c1 = time.thread_time()
    wait(done)
    t3 = time.time()
    cpu1 = client.run_on_scheduler(time.process_time)
    tasks = len(dict(z.__dask_graph__())) - 2 * blocks * blocks
    time.sleep(0.02)
    events = [m for t, m in client.get_events("scheduler") if isinstance(m, dict) and m.get("action") == "update-graph"
              and m.get("metrics", {}).get("start_timestamp_seconds", 0) >= t1]
    first_proc = client.run_on_scheduler(_scheduler_first, t1, "pyblasgemm-")
    wl = client.run(_worker_log, t1)
    starts = client.run(_starts)

    def ms(t):
        return None if t is None else round((t - t1) * 1e3, 3)

    row = {"tasks": tasks, "build_ms": round((t1 - t0) * 1e3, 3), "persist_call_ms": ms(t2),
           "first_processing_ms": ms(first_proc),
           "worker_received_ms": ms(min((v[0] for v in wl.values() if v[0]), default=None)),
           "first_executing_ms": ms(min((v[1] for v in wl.values() if v[1]), default=None)),
           "first_submitted_ms": ms(min((v[2] for v in wl.values() if v[2]), default=None)),
           "first_thread_ms": ms(min((v[3] for v in wl.values() if v[3]), default=None)),
           "first_start_ms": ms(min((t for s in starts.values() for _, t in s), default=None)),
           "first_start_by_worker_ms": {w[-5:]: ms(min((t for _, t in s), default=None)) for w, s in starts.items()},
           "first_task_by_worker": {w[-5:]: min(s, key=lambda e: e[1])[0] if s else None for w, s in starts.items()},
           "done_ms": ms(t3), "task_calls": sum(len(s) for s in starts.values()),
           "persist_call_cpu_ms": round((c1 - c0) * 1e3, 3), "scheduler_cpu_ms": round((cpu1 - cpu0) * 1e3, 3)}
    if events:
        m = events[-1]["metrics"]
        row["to_scheduler_ms"] = round((m["start_timestamp_seconds"] - t2) * 1e3, 3)
        row["update_graph_ms"] = round(m["duration_seconds"] * 1e3, 3)
        row["materialize_ms"] = round(m["materialization_duration_seconds"] * 1e3, 3)
        row["order_ms"] = round(-m["ordering_duration_seconds"] * 1e3, 3)
        row["task_states_ms"] = round(-m["state_initialization_duration_seconds"] * 1e3, 3)
        row["update_graph_end_ms"] = ms(m["start_timestamp_seconds"] + m["duration_seconds"])
    del x, y, z, done
    return row


def client_steps(client, blocks, chunk, persist_kw):
    """persist's client side, step by step, on a graph that is not submitted."""
    import dask
    from dask.base import collections_to_expr
    from distributed.protocol import serialize, to_serialize
    from distributed.utils import nbytes

    import pyblasgemm.dask as pbd

    x, y = operands(client, blocks, chunk)
    from distributed import wait

    wait([x, y])
    from dask.order import order

    from dask._task_spec import convert_legacy_graph

    z = pbd.matmul(x, y, transport=TRANSPORT)
    steps = {}
    for _ in range(20):
        zz = pbd.matmul(x, y, transport=TRANSPORT)          # a fresh collection: no cached expression
        t0 = time.thread_time()
        expr = collections_to_expr([zz], persist_kw.get("optimize_graph", True))
        t1 = time.thread_time()
        expr2 = expr.optimize()
        t2 = time.thread_time()
        ser = serialize(to_serialize(expr2), on_error="raise")
        t3 = time.thread_time()
        # what the scheduler does with it, here: the materialization (low-level optimization) and order
        dsk = expr2.__dask_graph__()
        ann = expr2.__dask_annotations__()
        t4 = time.thread_time()
        order(convert_legacy_graph(dsk))
        t5 = time.thread_time()
        for name, a, b in (("collections_to_expr", t0, t1), ("expr_optimize", t1, t2), ("serialize", t2, t3),
                           ("materialize", t3, t4), ("order", t4, t5)):
            steps.setdefault(name + "_cpu_ms", []).append((b - a) * 1e3)
    size = sum(map(nbytes, [ser[0]] + list(ser[1])))
    del x, y, z, zz
    return {**{k: round(statistics.median(v), 3) for k, v in steps.items()}, "graph_bytes": int(size),
            "graph_keys": len(dsk), "annotations": sorted(ann)}


def child(args) -> dict:
    import logging

    import dask
    import distributed

    out = {"src": args.child_src, "python": sys.version.split()[0], "dask": dask.__version__, "by_workers": {}}
    persist_kw = json.loads(args.persist_kw)
    for n in [int(w) for w in args.workers.split(",")]:
        with dask.config.set({"distributed.scheduler.work-stealing": False}):
            with distributed.LocalCluster(n_workers=n, threads_per_worker=1, processes=True, dashboard_address=None,
                                          silence_logs=logging.CRITICAL) as cl, distributed.Client(cl) as client:
                client.run(_install)
                if args.switch_interval:
                    client.run(sys.setswitchinterval, args.switch_interval)
                    client.run_on_scheduler(sys.setswitchinterval, args.switch_interval)
                rows = [one_run(client, args.blocks, args.chunk, persist_kw) for _ in range(args.warmup + args.reps)]
                rows = rows[args.warmup:]
                keys = [k for k, v in rows[0].items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
                med = {k: round(statistics.median(r[k] for r in rows if r.get(k) is not None), 3) for k in keys
                       if any(r.get(k) is not None for r in rows)}
                low = {k: round(min(r[k] for r in rows if r.get(k) is not None), 3) for k in med}
                steps = client_steps(client, args.blocks, args.chunk, persist_kw)
                out["by_workers"][str(n)] = {"median": med, "min": low, "client_steps": steps, "runs": rows}
                print(f"[{pathlib.Path(args.child_src).name or args.child_src}] {n} workers: "
                      + ", ".join(f"{k} {v}" for k, v in med.items()) + f"; client steps {steps}", flush=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--workers", default="2,4")
    ap.add_argument("--blocks", type=int, default=4, help="blocks per side of A, B and C (4: 32768 in 8192)")
    ap.add_argument("--chunk", type=int, default=64, help="the stand-in blocks' side")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--transport", default="ipc", help="pyblasgemm.dask.matmul's transport= (ipc: the GPU runs' graph)")
    ap.add_argument("--persist-kw", default="{}", help="client.persist keywords, JSON")
    ap.add_argument("--switch-interval", type=float, default=None,
                    help="sys.setswitchinterval on the workers and the scheduler (Python's default: 0.005 s)")
    ap.add_argument("--src", default=None, help="NAME=PATH,...: source trees of pyblasgemm, one process each")
    ap.add_argument("--rounds", type=int, default=1, help="--src: each tree this many times, alternating")
    ap.add_argument("--child-src", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    global TRANSPORT
    TRANSPORT = args.transport
    if args.child_src:
        doc = child(args)
        pathlib.Path(args.out).write_text(json.dumps(doc, indent=1))
        return 0
    srcs = [s.split("=", 1) for s in (args.src or f"here={pathlib.Path.cwd()}").split(",")]
    from pyblasgemm.benchmarks.suite import provenance

    import dask
    import distributed

    # the stand-in blocks' values do not enter the timings; each is drawn from its own seed
    doc = {"argv": sys.argv[1:] if argv is None else argv,
           "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "git_sha": os.environ.get("GIT_SHA"),
           "python": sys.version.split()[0], "dask": dask.__version__, "distributed": distributed.__version__,
           **provenance(seed="hash((operand, i, j)) % 2**31 per block (Python's string hash: not fixed "
                                "across processes)"), "results": []}
    for rnd in range(args.rounds):
        for name, path in srcs:
            path = str(pathlib.Path(path).resolve())
            tmp = pathlib.Path(args.out).with_suffix(f".{name}.{rnd}.json")
            env = dict(os.environ, PYTHONPATH=os.pathsep.join([path] + [p for p in os.environ.get("PYTHONPATH", "")
                                                                         .split(os.pathsep) if p and p != "."]))
            cmd = [sys.executable, __file__, "--child-src", path, "--out", str(tmp), "--workers", args.workers,
                   "--blocks", str(args.blocks), "--chunk", str(args.chunk), "--reps", str(args.reps),
                   "--warmup", str(args.warmup), "--persist-kw", args.persist_kw, "--transport", args.transport]
            if args.switch_interval:
                cmd += ["--switch-interval", str(args.switch_interval)]
            print(f"== {name} ({path}), round {rnd}", flush=True)
            subprocess.run(cmd, env=env, cwd=path, check=False, timeout=600)
            got = json.loads(tmp.read_text()) if tmp.exists() else {"failure": "no output"}
            got["name"], got["round"] = name, rnd
            doc["results"].append(got)
            pathlib.Path(args.out).write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
