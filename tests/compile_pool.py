"""One NVRTC compile per distinct kernel instantiation per test run, on every core, from the
moment collection ends.

The CPU compile checks (``test_kernels_compile.py``: the mma.sync kernels; ``test_sm90_compile.py``:
the wgmma kernels) need ~400 compiles of 0.5-7 s each, most of the suite's CPU time. Each of
those modules offers ``compile_jobs(items) -> {key: job}`` for its selected tests, keyed by what
makes an instantiation distinct (arch and NVRTC name expressions: stream-k and hybrid configs
share one), and ``conftest.py`` queues them all here when collection ends. NVRTC and the
disassembler release the GIL, so the compiles run on every core beside the other tests, and a
compile test only waits for its own result. Under pytest-xdist every worker collects every test,
so there nothing is queued and each test compiles on demand (the cost is then the same as
serial, spread over the workers).
"""
from __future__ import annotations

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Hashable

_lock = threading.Lock()
_futures: dict[Hashable, Future] = {}
_executor: ThreadPoolExecutor | None = None


def start(jobs: dict[Hashable, Callable[[], object]]) -> None:
    """Queue every job (first come, first compiled); a key already queued is not queued again."""
    global _executor
    with _lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(max(1, os.cpu_count() or 1), thread_name_prefix="compile")
        for key, job in jobs.items():
            if key not in _futures:
                _futures[key] = _executor.submit(job)


def result(key: Hashable, job: Callable[[], object]):
    """The queued job's result (its exception re-raised), or ``job()`` run now if none was queued."""
    with _lock:
        future = _futures.get(key)
    return job() if future is None else future.result()


def queued() -> int:
    with _lock:
        return len(_futures)


def greedy_cover(specs: list, features: Callable[[object], set]) -> list:
    """The specs a run compiles by default: a greedy cover of ``specs`` in which every feature
    of any spec appears in at least one pick (first of the best each round; in ``specs``'
    order). The compile-check modules define the features (what a compile checks)."""
    of = {s: features(s) for s in specs}
    need = set().union(*of.values())
    covered: set = set()
    out = []
    while covered != need:
        pick = max(specs, key=lambda s: len(of[s] - covered))
        out.append(pick)
        covered |= of[pick]
    return out


def stop() -> None:
    """Drop what has not started (a run stopped early by -x or Ctrl-C need not wait for it)."""
    global _executor
    with _lock:
        ex, _executor = _executor, None
        _futures.clear()
    if ex is not None:
        ex.shutdown(wait=True, cancel_futures=True)
