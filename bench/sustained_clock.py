"""The SM clock and board power while one GEMM runs back to back: what the int8 numbers of issue
34 lacked. Nsight Compute timed our int8 kernel at 8192³ in 0.686 ms (1,603 TOPS, 88% of the dense
int8 peak per cycle, at 1.67 GHz; ``bench/results/ncu_int8_h200_2026-11-29_082ba57.json``), while
the steady benchmark timed the same launch at 0.79 ms. If the board's power limit pulls the clock
down under a steady int8 load, the gap is the clock, not the mainloop.

    PYTHONPATH=. python bench/sustained_clock.py --out bench/results/sustained_clock_<gpu>_<date>_<sha>.json

Each case runs ``--seconds`` of back-to-back calls (CUDA events around the whole run, one
synchronize at its end) while ``nvidia-smi`` samples the SM clock, power draw, power limit,
temperature and the clock-event reasons every 50 ms. The record per case: calls, seconds a call,
TOPS / TFLOP/s, and the samples' median and range (the first 0.5 s dropped: the ramp).

Cases (8192³): ``int8 ours`` (igemm, our Hopper kernel forced), ``int8 cuBLAS`` (cublasGemmEx),
``dgemm cuBLAS`` (cupy.matmul), ``int8-ozaki`` (dgemm's default emulation, whose int8 GEMMs are
80% of the call). Expected on one H200: ~4 s a case plus the compiles.
"""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

#: nvidia-smi's fields, in order (the clock-event reasons as a hex mask: 0x4 SW power cap,
#: 0x20 SW thermal slowdown, 0x40 HW thermal, 0x80 HW power brake; nvidia-smi --help-query-gpu)
FIELDS = ("clocks.sm", "power.draw", "power.limit", "temperature.gpu", "clocks_event_reasons.active")
#: samples before this many seconds into a run are the clock's ramp, not its steady value
RAMP_S = 0.5


def summarize(samples: list, t0: float) -> dict:
    """Median, min and max of each numeric field over the samples taken ``RAMP_S`` after ``t0``,
    and every clock-event reason mask seen.

    >>> s = [(0.1, 1980.0, 300.0, 700.0, 40.0, "0x0"), (1.0, 1500.0, 690.0, 700.0, 60.0, "0x4"),
    ...      (1.1, 1520.0, 695.0, 700.0, 61.0, "0x4"), (1.2, 1510.0, 699.0, 700.0, 61.0, "0x4")]
    >>> r = summarize(s, 0.0)
    >>> r["clocks.sm"], r["reasons"], r["samples"]
    ({'median': 1510.0, 'min': 1500.0, 'max': 1520.0}, ['0x4'], 3)
    """
    kept = [s for s in samples if s[0] - t0 >= RAMP_S]
    out = {"samples": len(kept)}
    for i, name in enumerate(FIELDS[:-1], start=1):
        values = sorted(s[i] for s in kept)
        if values:
            out[name] = {"median": values[len(values) // 2], "min": values[0], "max": values[-1]}
    out["reasons"] = sorted({s[-1] for s in kept})
    return out


def parse_line(line: str, t: float):
    """One ``nvidia-smi --format=csv,noheader,nounits`` line as (t, clock, power, limit, temp,
    reasons), or None for a line that does not parse (a header, a '[N/A]').

    >>> parse_line("1755, 512.34, 700.00, 55, 0x0000000000000004", 2.0)
    (2.0, 1755.0, 512.34, 700.0, 55.0, '0x4')
    >>> parse_line("[N/A], 1, 2, 3, 0x0", 0.0) is None
    True
    """
    parts = [p.strip() for p in line.split(",")]
    if len(parts) != len(FIELDS):
        return None
    try:
        return (t, *(float(p) for p in parts[:-1]), hex(int(parts[-1], 16)))
    except ValueError:
        return None


def sampled_run(call, seconds: float, sync) -> tuple:
    """(calls, seconds a call, samples): ``call`` back to back for ``seconds`` with nvidia-smi
    sampling every 50 ms in a child process."""
    import threading

    proc = subprocess.Popen(["nvidia-smi", f"--query-gpu={','.join(FIELDS)}", "--format=csv,noheader,nounits",
                             # the first visible device (an index or a UUID: nvidia-smi -i takes both)
                             "-lms", "50", "-i", os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip()],
                            stdout=subprocess.PIPE, text=True)
    samples, t0 = [], time.perf_counter()

    def reader():
        for line in proc.stdout:
            row = parse_line(line, time.perf_counter())
            if row is not None:
                samples.append(row)

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    import cupy as cp

    start, end = cp.cuda.Event(), cp.cuda.Event()
    calls, begin = 0, time.perf_counter()
    start.record()
    while time.perf_counter() - begin < seconds:
        for _ in range(20):             # 20 calls between host checks: the queue never drains
            call()
        calls += 20
    end.record()
    sync()
    proc.terminate()
    thread.join(timeout=2)
    return calls, cp.cuda.get_elapsed_time(start, end) * 1e-3 / calls, summarize(samples, t0)


def cases(cp, pb, s):
    """name -> (call, operations a call)."""
    rs = cp.random.RandomState(34)
    x = rs.randint(-128, 128, size=(s, s), dtype=cp.int32).astype(cp.int8).ravel()
    w = rs.randint(-128, 128, size=(s, s), dtype=cp.int32).astype(cp.int8).ravel()
    c = cp.empty(s * s, cp.int32)
    a = cp.random.standard_normal((s, s))
    b = cp.random.standard_normal((s, s))

    def igemm(backend):
        return lambda: pb.igemm("T", "N", s, s, s, 1, x, s, w, s, 0, c, s, backend=backend)

    ops = 2.0 * s ** 3
    return {"int8 ours": (igemm("tensorcore"), ops), "int8 cuBLAS": (igemm("cublas"), ops),
            "dgemm cuBLAS": (lambda: cp.matmul(a, b), ops),
            "int8-ozaki (dgemm default)": (lambda: pb.matmul(a, b, compute="int8-ozaki"), ops)}


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--size", type=int, default=8192)
    ap.add_argument("--seconds", type=float, default=3.0)
    args = ap.parse_args(argv)
    import types

    import cupy as cp

    import pyblasgemm as pb
    from bench.heldout import meta, write_doc

    doc = {**meta(types.SimpleNamespace(torch=None), seed=34), "what": __doc__.split("\n")[0],
           "size": args.size, "seconds": args.seconds, "fields": list(FIELDS), "cases": {}}
    for name, (call, ops) in cases(cp, pb, args.size).items():
        for _ in range(3):                  # compile, heuristics
            call()
        cp.cuda.Device().synchronize()
        time.sleep(2.0)                     # cool down between cases: each starts from idle clocks
        calls, per_call, clocks = sampled_run(call, args.seconds, cp.cuda.Device().synchronize)
        doc["cases"][name] = {"calls": calls, "seconds_per_call": per_call,
                              "tera_ops_per_s": ops / per_call / 1e12, **clocks}
        print(name, f"{per_call * 1e3:.3f} ms", f"{ops / per_call / 1e12:.0f} T/s",
              {k: v for k, v in clocks.items() if k in ("clocks.sm", "power.draw", "reasons")}, flush=True)
    write_doc(doc, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
