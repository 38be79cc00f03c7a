"""The one GPU timing loop the benchmarks share.

CUDA events bracket ``inner`` back-to-back calls, so the GPU queue never drains between calls
and the host's time to issue a call does not leak into the device time; the median over
``samples`` such brackets, after ``warmup`` calls, is returned in seconds per call.
"""
import statistics


def event_median_s(fn, inner=10, samples=30, warmup=5, before=None):
    """Median GPU seconds per call of ``fn`` (CUDA events; see the module docstring).
    ``before``: called ahead of each bracket's start event (bench/lt_host_cost.py queues a
    sleep kernel there, so that the calls wait behind it and no issue time shows).

    Example (on a GPU machine)::

        t = event_median_s(lambda: cupy.matmul(a, b))
    """
    import cupy as cp

    for _ in range(warmup):
        fn()
    cp.cuda.get_current_stream().synchronize()
    times = []
    for _ in range(samples):
        if before is not None:
            before()
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        for _ in range(inner):
            fn()
        stop.record()
        stop.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, stop) * 1e-3 / inner)
    return statistics.median(times)


def interleaved_median_s(fns: dict, inner=5, samples=10, warmup=2, enter=None) -> dict:
    """Median GPU seconds per call of each of ``fns`` (name -> callable), the contenders' brackets
    interleaved: each of ``samples`` rounds times one bracket of ``inner`` back-to-back calls
    of every contender (CUDA events, as :func:`event_median_s`), the order rotated by one each
    round. Timed one after the other, contenders met a GPU whose clock had moved in between
    (H200, int8 Ozaki at 8192³: 16.2 to 18.3 ms a call across residue kernels that the
    per-pass profile puts within 0.1 ms; the raw form's DGEMM 0.86x the same cuBLAS call).
    ``enter``: name -> a context manager factory, entered around that contender's warmup calls
    and each of its brackets (a global knob it needs). Each bracket starts with one call before
    its start event: a contender whose plan another's knob dropped from the cache plans it there.

    Example (on a GPU machine)::

        t = interleaved_median_s({"cupy": lambda: a @ b, "ours": lambda: pyblasgemm.matmul(a, b)})
    """
    import contextlib

    import cupy as cp

    names = list(fns)
    enter = enter or {}
    times = {name: [] for name in names}

    def bracket(name, calls, timed):
        with enter.get(name, contextlib.nullcontext)():
            if not timed:
                for _ in range(calls):
                    fns[name]()
                cp.cuda.get_current_stream().synchronize()
                return
            fns[name]()     # outside the events: a plan another's knob emptied the cache of is made here
            start, stop = cp.cuda.Event(), cp.cuda.Event()
            start.record()
            for _ in range(calls):
                fns[name]()
            stop.record()
            stop.synchronize()
            times[name].append(cp.cuda.get_elapsed_time(start, stop) * 1e-3 / calls)

    for name in names:
        bracket(name, warmup, False)
    for r in range(samples):
        for i in range(len(names)):
            bracket(names[(r + i) % len(names)], inner, True)
    return {name: statistics.median(v) for name, v in times.items()}


def host_us_per_call(fn, calls=2000, rounds=5, warmup=50):
    """Median host µs per call of ``fn`` issued back to back (the GPU synchronized after each
    round, outside the timed region): what a caller waits before its next line runs, when the
    GPU keeps up. Example (on a GPU machine)::

        us = host_us_per_call(lambda: cupy.matmul(a, b))
    """
    return paired_host_us({"fn": fn}, calls, rounds, warmup)["fn"]


def paired_host_us(fns: dict, calls=1000, rounds=5, warmup=50, sync=None):
    """Median host µs per call of each of ``fns`` ({name: fn}), their rounds interleaved (one
    round of each in turn, ``rounds`` times): a drift of the host's speed during the measurement
    (clock, another tenant) then falls on all of them alike, so their ratios are fair. ``sync``:
    called after the warm-up and after each round, outside the timed region (default: the
    current CuPy device's synchronize; bench/replay_host.py, with no GPU, passes its own)."""
    import time

    if sync is None:
        import cupy as cp

        sync = cp.cuda.Device().synchronize
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    sync()
    samples = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            samples[name].append((time.perf_counter() - t0) / calls * 1e6)
            sync()
    return {name: statistics.median(v) for name, v in samples.items()}


def paired_single_us(fns: dict, calls=200, warmup=20):
    """Median µs of one call, issue to completion, of each of ``fns``, the calls interleaved."""
    import time

    import cupy as cp

    dev = cp.cuda.Device()
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    dev.synchronize()
    samples = {name: [] for name in fns}
    for _ in range(calls):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            dev.synchronize()
            samples[name].append((time.perf_counter() - t0) * 1e6)
    return {name: statistics.median(v) for name, v in samples.items()}


def torch_steady_s(fn, calls=20, samples=5):
    """Seconds per call of ``calls`` back-to-back calls, CUDA events on torch's current stream
    (where a torch caller's work is queued), median of ``samples``."""
    import torch

    fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(samples):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        stop.record()
        stop.synchronize()
        out.append(start.elapsed_time(stop) / 1e3 / calls)
    return statistics.median(out)


def torch_single_s(fn, samples=5):
    """Seconds of one call, issue to completion (host cost included), median of ``samples``."""
    import time

    import torch

    fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(samples):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)
