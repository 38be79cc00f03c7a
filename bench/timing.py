"""The one GPU timing loop the benchmarks share.

CUDA events bracket ``inner`` back-to-back calls, so the GPU queue never drains between calls
and the host's time to issue a call does not leak into the device time; the median over
``samples`` such brackets, after ``warmup`` calls, is returned in seconds per call.
"""
import statistics


def event_median_s(fn, inner=10, samples=30, warmup=5):
    """Median GPU seconds per call of ``fn`` (CUDA events; see the module docstring).

    Example (on a GPU machine)::

        t = event_median_s(lambda: cupy.matmul(a, b))
    """
    import cupy as cp

    for _ in range(warmup):
        fn()
    cp.cuda.get_current_stream().synchronize()
    times = []
    for _ in range(samples):
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        for _ in range(inner):
            fn()
        stop.record()
        stop.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, stop) * 1e-3 / inner)
    return statistics.median(times)
