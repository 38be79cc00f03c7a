"""GPU time of the packing copies (kernels/pack.py) against the planner's price for them.

A ``PackedLaunch`` whose GEMM is a no-op runs only its copies: the pitched ``cudaMemcpy2DAsync``
(odd source pitch -> 16-byte pitch) and the int8 transposing kernel. Each is timed with CUDA
events (median of 20 calls after 3 warm-ups) and set beside ``copy_seconds`` at the device's
DRAM bandwidth as the planner reads it (``arch_for_device``). Sizes are round, not corpus shapes.

Usage (on a GPU)::

    python bench/pack_probe.py --out bench/results/pack_probe_<gpu>_<date>.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

#: (label, rows, cols, source pitch, element bytes, transpose): column-major stored operands
CASES = [
    ("fp16 pitch copy 8 MB", 2047, 2048, 2047, 2, False),
    ("fp16 pitch copy 32 MB", 4095, 4096, 4095, 2, False),
    ("fp16 pitch copy 128 MB", 8191, 8192, 8191, 2, False),
    ("bf16 pitch copy, short rows 17 MB", 63, 131072, 63, 2, False),
    ("int8 transpose 4 MB", 2048, 2048, 2048, 1, True),
    ("int8 transpose 16 MB", 4096, 4096, 4096, 1, True),
    ("int8 transpose 64 MB", 8192, 8192, 8192, 1, True),
    ("int8 transpose, odd pitch 25 MB", 5001, 5003, 5001, 1, True),
]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="results JSON")
    args = ap.parse_args(argv)

    import cupy as cp

    from pyblasgemm.kernels.pack import PackedLaunch, PackStep, copy_seconds, packed_ld
    from pyblasgemm.planner.arch import arch_for_device

    dev = cp.cuda.runtime.getDevice()
    arch = arch_for_device(dev)
    rows_out = []
    cp.random.seed(0)                 # the copied bytes: CuPy's global generator, in order
    for label, rows, cols, ld, eb, transpose in CASES:
        src = cp.random.randint(0, 255, size=ld * cols * eb, dtype=cp.uint8)
        pld = packed_ld(cols if transpose else rows, eb)
        step = PackStep("a" + ("t" if transpose else ""), rows, cols, 1, ld, 0, pld, 0, eb, transpose)
        launch = PackedLaunch(lambda *a: None, (step,), dev)      # the copies only
        stream = cp.cuda.get_current_stream()
        for _ in range(3):
            launch(src.data.ptr, src.data.ptr, 0, 1, 0, stream.ptr)
        times = []
        for _ in range(20):
            e0, e1 = cp.cuda.Event(), cp.cuda.Event()
            e0.record(stream)
            launch(src.data.ptr, src.data.ptr, 0, 1, 0, stream.ptr)
            e1.record(stream)
            e1.synchronize()
            times.append(cp.cuda.get_elapsed_time(e0, e1) * 1e-3)
        if transpose:          # the copy is exact: out = in^T
            got = launch._slots[stream.ptr][0][0][: pld * rows].reshape(rows, pld)[:, :cols]
            want = src[: ld * cols].reshape(cols, ld)[:, :rows].T
            assert bool((got == want).all()), label
        t = statistics.median(times)
        pred = copy_seconds(step.nbytes, arch.dram_bw, transpose)
        moved = 2 * step.nbytes
        rows_out.append({"case": label, "rows": rows, "cols": cols, "ld": ld, "elem_bytes": eb,
                         "transpose": transpose, "packed_bytes": step.nbytes, "measured_s": t,
                         "predicted_s": pred, "measured_over_predicted": t / pred,
                         "bytes_moved_per_s": moved / t,
                         "fraction_of_dram_bw": moved / t / arch.dram_bw})
        print(f"{label:36} {t * 1e6:8.1f} us  predicted {pred * 1e6:8.1f} us  "
              f"x{t / pred:5.2f}  {moved / t / 1e12:5.2f} TB/s ({moved / t / arch.dram_bw:.0%} of "
              f"{arch.dram_bw / 1e12:.2f})")
        del src, launch
        cp.get_default_memory_pool().free_all_blocks()
    if args.out:
        import os
        from pyblasgemm.benchmarks.suite import provenance

        meta = {**provenance("CuPy's global RNG seeded 0"),
                "device": cp.cuda.runtime.getDeviceProperties(dev)["name"].decode(),
                "dram_bw_read": arch.dram_bw, "date": time.strftime("%Y-%m-%d"),
                "git_sha": os.environ.get("GIT_SHA"), "cupy": cp.__version__,
                "driver": cp.cuda.runtime.driverGetVersion()}
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "rows": rows_out}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
