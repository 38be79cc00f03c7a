"""Emulated float64 (Ozaki scheme II on int8 tensor cores) and complex on tensor cores, against
cuBLAS on the same bytes, in one process (issue: FP64 via int8 + complex on tensor cores).

    PYTHONPATH=. python bench/ozaki.py --out bench/results/ozaki_<gpu>_<date>_<sha>.json

Cases:

* dgemm, m = n = k in SIZES, random normal operands: native DGEMM (the faster of
  ``torch.matmul`` and ``cupy.matmul``), ``matmul(compute='int8-ozaki')`` (its default), the
  precision dial ``'int8-ozaki-<bits>'`` over BITS (at the largest size: the bits-vs-speed
  figure), and cuBLAS's own emulation (``CUBLAS_EMULATE_DOUBLE_PRECISION=1`` with
  ``CUBLAS_EMULATION_STRATEGY=eager``, in a child process on the same bytes: the variables are
  read when cuBLAS starts);
* dgemm at 4096 with rows / columns scaled over 1e-30..1e30 and with single elements spread
  that far (the fallback's case); at 8192 graded data (entries of magnitude 0.5-1, columns of A
  alternately x1 and x2^-30 (x2^-20), rows of B the reverse: the guard's case, issue 30);
* zgemm (complex128) at ZSIZES: native ZGEMM against the emulated default;
* cgemm (complex64) at 8192: cuBLAS CGEMM, cuBLAS's TF32 CGEMM, ours with compute='tf32' and
  '3xtf32'.

Errors: max over sampled entries (16 rows x 256 columns) of |result - reference| / (|A| @ |B|)
against a long-double product (x86 80-bit) computed on the host from the same bytes; complex64
against complex128 products of the sampled rows. Steady: CUDA events around back-to-back calls
(bench/timing.py); single call: wall clock of one call plus synchronize, median of 5. Ratios
> 1: pyblasgemm is faster.
"""
from __future__ import annotations

import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time
import types

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.heldout import meta, plot_or_args, write_doc  # noqa: E402
from bench.timing import event_median_s  # noqa: E402

SIZES = [1024, 4096, 8192]
BITS = [24, 32, 40, 48, 56, 62]
ZSIZES = [4096, 8192]
ROWS, COLS = 16, 256


def _single_s(cp, fn, n=5):
    fn()
    cp.cuda.Device().synchronize()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        cp.cuda.Device().synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _sample(rng, m, n):
    return np.sort(rng.choice(m, min(ROWS, m), replace=False)), np.sort(rng.choice(n, min(COLS, n), replace=False))


def _ld_error(result_rows, a_rows, b_cols) -> float:
    """Max error of sampled entries vs a long-double product, relative to |A| @ |B|."""
    ld = np.longdouble
    if np.iscomplexobj(a_rows):
        ar, ai, br, bi = (x.astype(ld) for x in (a_rows.real, a_rows.imag, b_cols.real, b_cols.imag))
        ref_re, ref_im = ar @ br - ai @ bi, ar @ bi + ai @ br
        scale = np.abs(a_rows).astype(ld) @ np.abs(b_cols).astype(ld)
        err = np.hypot((result_rows.real.astype(ld) - ref_re).astype(np.float64),
                       (result_rows.imag.astype(ld) - ref_im).astype(np.float64))
        return float(np.max(err / scale.astype(np.float64)))
    ref = a_rows.astype(ld) @ b_cols.astype(ld)
    scale = np.abs(a_rows).astype(ld) @ np.abs(b_cols).astype(ld)
    return float(np.max((np.abs(result_rows.astype(ld) - ref) / scale).astype(np.float64)))


def _time(cp, fn, big):
    inner, samples = (1, 5) if big else (5, 10)
    return {"steady_s": event_median_s(fn, inner=inner, samples=samples, warmup=2),
            "single_s": _single_s(cp, fn)}


def dgemm_case(cp, torch, pb, s, rng, bits_sweep, layout="normal", child=True) -> dict:
    a = rng.standard_normal((s, s))
    b = rng.standard_normal((s, s))
    if layout == "row scales":
        a *= 10.0 ** rng.uniform(-30, 30, (s, 1))
        b *= 10.0 ** rng.uniform(-30, 30, (1, s))
    elif layout == "element spread":
        a *= 10.0 ** rng.uniform(-30, 30, (s, s))
        b *= 10.0 ** rng.uniform(-30, 30, (s, s))
    elif layout.startswith("graded"):                     # 'graded 2^-30': every term large x small
        small = 2.0 ** -int(layout.split("^")[1])
        a = rng.uniform(0.5, 1.0, (s, s)) * rng.choice([-1.0, 1.0], (s, s))
        b = rng.uniform(0.5, 1.0, (s, s)) * rng.choice([-1.0, 1.0], (s, s))
        a *= np.where(np.arange(s) % 2 == 0, 1.0, small)[None, :]
        b *= np.where(np.arange(s) % 2 == 0, small, 1.0)[:, None]
    rows, cols = _sample(rng, s, s)
    a_rows, b_cols = a[rows], b[:, cols]
    da, db = cp.asarray(a), cp.asarray(b)
    ta, tb = torch.as_tensor(da, device="cuda"), torch.as_tensor(db, device="cuda")
    big = s >= 8192
    out = {}

    def record(name, fn, side, route=None):
        res = fn()
        host = res.cpu().numpy() if hasattr(res, "cpu") else cp.asnumpy(res)
        row = {"side": side, **_time(cp, fn, big), "max_rel_err_vs_longdouble": _ld_error(host[rows][:, cols], a_rows, b_cols)}
        if route is not None:
            row["route"] = route()
        out[name] = row
        del res
        cp.get_default_memory_pool().free_all_blocks()

    from pyblasgemm.composite import last_route

    record("torch.matmul (DGEMM)", lambda: ta @ tb, "native")
    record("cupy.matmul (DGEMM)", lambda: da @ db, "native")
    record("pyblasgemm int8-ozaki (default)",
           lambda: pb.matmul(da, db, compute="int8-ozaki", backend="tensorcore"), "ours", last_route)
    for bits in bits_sweep:
        record(f"pyblasgemm int8-ozaki-{bits}",
               lambda bits=bits: pb.matmul(da, db, compute=f"int8-ozaki-{bits}", backend="tensorcore"),
               "ours", last_route)
    if child:
        out.update(_cublas_emulation(a, b, rows, cols, a_rows, b_cols))
    native = min(v["steady_s"] for v in out.values() if v["side"] == "native")
    native_single = min(v["single_s"] for v in out.values() if v["side"] == "native")
    for v in out.values():
        v["ratio_steady_vs_native"] = native / v["steady_s"]
        v["ratio_single_vs_native"] = native_single / v["single_s"]
    return {"case": "dgemm", "layout": layout, "m": s, "n": s, "k": s, "contenders": out}


_CHILD = r"""
import json, os, sys, time, statistics
import numpy as np, torch
a = np.load(sys.argv[1]); b = np.load(sys.argv[2])
ta, tb = torch.as_tensor(a, device="cuda"), torch.as_tensor(b, device="cuda")
r = ta @ tb; torch.cuda.synchronize()
ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
times = []
for _ in range(5):
    ev[0].record(); r = ta @ tb; ev[1].record(); torch.cuda.synchronize()
    times.append(ev[0].elapsed_time(ev[1]) / 1e3)
np.save(sys.argv[3], r.cpu().numpy())
out = {}
try:                                    # CuPy's cuBLAS (the toolkit's), same bytes
    import cupy as cp
    ca, cb = cp.asarray(a), cp.asarray(b)
    cr = ca @ cb; cp.cuda.Device().synchronize()
    s_, e_ = cp.cuda.Event(), cp.cuda.Event()
    ts = []
    for _ in range(5):
        s_.record(); cr = ca @ cb; e_.record(); e_.synchronize()
        ts.append(cp.cuda.get_elapsed_time(s_, e_) / 1e3)
    np.save(sys.argv[3] + ".cupy.npy", cp.asnumpy(cr))
    out = {"cupy_steady_s": statistics.median(ts), "cupy_cublas_version": cp.cuda.cublas.getVersion(cp.cuda.device.get_cublas_handle())}
except Exception as e:
    out = {"cupy_error": repr(e)[:300]}
print(json.dumps({**out, "steady_s": statistics.median(times), "torch": torch.__version__,
                  "torch_cublas_version": torch._C._cuda_getCompiledVersion() if hasattr(torch._C, "_cuda_getCompiledVersion") else None,
                  "cublas": torch.backends.cuda.preferred_blas_library().name if hasattr(torch.backends.cuda, "preferred_blas_library") else None,
                  "env": {k: os.environ.get(k) for k in ("CUBLAS_EMULATE_DOUBLE_PRECISION", "CUBLAS_EMULATION_STRATEGY")}}))
"""


def _cublas_emulation(a, b, rows, cols, a_rows, b_cols) -> dict:
    """cuBLAS's own FP64 emulation (Ozaki I), in a child process: torch.matmul with the
    variable set, on the same bytes."""
    with tempfile.TemporaryDirectory() as tmp:
        pa, pb_, pr = (os.path.join(tmp, f) for f in ("a.npy", "b.npy", "r.npy"))
        np.save(pa, a)
        np.save(pb_, b)
        # the default strategy ('performant') may keep native DGEMM where it predicts no gain;
        # 'eager' emulates every eligible call (cuBLAS 13.1's environment variables)
        env = dict(os.environ, CUBLAS_EMULATE_DOUBLE_PRECISION="1", CUBLAS_EMULATION_STRATEGY="eager")
        done = subprocess.run([sys.executable, "-c", _CHILD, pa, pb_, pr], env=env, capture_output=True,
                              text=True, timeout=300)
        if done.returncode != 0:
            return {"cuBLAS emulation (CUBLAS_EMULATE_DOUBLE_PRECISION=1)": {
                "side": "theirs", "error": done.stderr[-2000:]}}
        info = json.loads(done.stdout.strip().splitlines()[-1])
        r = np.load(pr)
        rc = np.load(pr + ".cupy.npy") if "cupy_steady_s" in info else None
    out = {"cuBLAS emulation, torch.matmul (CUBLAS_EMULATE_DOUBLE_PRECISION=1)": {
        "side": "theirs", "steady_s": info["steady_s"], "single_s": float("nan"), "child": info,
        "max_rel_err_vs_longdouble": _ld_error(r[rows][:, cols], a_rows, b_cols)}}
    if rc is not None:
        out["cuBLAS emulation, cupy.matmul (CUBLAS_EMULATE_DOUBLE_PRECISION=1)"] = {
            "side": "theirs", "steady_s": info["cupy_steady_s"], "single_s": float("nan"), "child": info,
            "max_rel_err_vs_longdouble": _ld_error(rc[rows][:, cols], a_rows, b_cols)}
    return out


def _contenders(cp, items, big: bool, error, route) -> dict:
    """Each (name, fn, side) of ``items`` timed (:func:`_time`), with ``error(host result)``'s
    fields and, for ours, the route it took; memory returned between contenders."""
    out = {}
    for name, fn, side in items:
        res = fn()
        host = res.cpu().numpy() if hasattr(res, "cpu") else cp.asnumpy(res)
        out[name] = {"side": side, **_time(cp, fn, big), **error(host)}
        if side == "ours":
            out[name]["route"] = route()
        del res
        cp.get_default_memory_pool().free_all_blocks()
    return out


def _ratios(out: dict, key: str) -> None:
    """Each contender's steady-state speed against the fastest native one, as ``key``."""
    native = min(v["steady_s"] for v in out.values() if v["side"] == "native")
    for v in out.values():
        v[key] = native / v["steady_s"]


def zgemm_case(cp, torch, pb, s, rng) -> dict:
    a = rng.standard_normal((s, s)) + 1j * rng.standard_normal((s, s))
    b = rng.standard_normal((s, s)) + 1j * rng.standard_normal((s, s))
    rows, cols = _sample(rng, s, s)
    da, db = cp.asarray(a), cp.asarray(b)
    ta, tb = torch.as_tensor(da, device="cuda"), torch.as_tensor(db, device="cuda")
    from pyblasgemm.composite import last_route

    out = _contenders(cp, (("torch.matmul (ZGEMM)", lambda: ta @ tb, "native"),
                           ("cupy.matmul (ZGEMM)", lambda: da @ db, "native"),
                           ("pyblasgemm int8-ozaki (default)",
                            lambda: pb.matmul(da, db, compute="int8-ozaki", backend="tensorcore"), "ours")),
                      s >= 4096,
                      lambda h: {"max_rel_err_vs_longdouble": _ld_error(h[rows][:, cols], a[rows], b[:, cols])},
                      last_route)
    _ratios(out, "ratio_steady_vs_native")
    return {"case": "zgemm", "m": s, "n": s, "k": s, "contenders": out}


def cgemm_case(cp, torch, pb, s, rng) -> dict:
    a = (rng.standard_normal((s, s)) + 1j * rng.standard_normal((s, s))).astype(np.complex64)
    b = (rng.standard_normal((s, s)) + 1j * rng.standard_normal((s, s))).astype(np.complex64)
    rows, cols = _sample(rng, s, s)
    da, db = cp.asarray(a), cp.asarray(b)
    ref = (a[rows].astype(np.complex128) @ b[:, cols].astype(np.complex128))
    scale = np.abs(a[rows]).astype(np.float64) @ np.abs(b[:, cols]).astype(np.float64)
    ta, tb = torch.as_tensor(da, device="cuda"), torch.as_tensor(db, device="cuda")
    from pyblasgemm.composite import last_route

    out = _contenders(cp, (
        ("torch.matmul (CGEMM)", lambda: ta @ tb, "native"),
        ("cupy.matmul (CGEMM)", lambda: da @ db, "native"),
        ("cuBLAS TF32 CGEMM", lambda: pb.matmul(da, db, compute="tf32", backend="cublas"), "theirs"),
        ("pyblasgemm tf32", lambda: pb.matmul(da, db, compute="tf32", backend="tensorcore"), "ours"),
        ("pyblasgemm 3xtf32", lambda: pb.matmul(da, db, compute="3xtf32", backend="tensorcore"), "ours")),
        True, lambda h: {"max_rel_err_vs_complex128": float(np.max(np.abs(h[rows][:, cols] - ref) / scale))},
        last_route)
    _ratios(out, "ratio_steady_vs_cgemm")
    return {"case": "cgemm", "m": s, "n": s, "k": s, "contenders": out}


def _show(row):
    for name, v in row["contenders"].items():
        r = {k: (f"{x:.3g}" if isinstance(x, float) else x) for k, x in v.items()
             if k.startswith("ratio") or k.startswith("max_rel")}
        print(f"  {name}: {v.get('steady_s', float('nan')) * 1e3:.2f} ms {r}", flush=True)


def dial_points(doc) -> list:
    """(bits, speed vs native DGEMM, max error) of the largest dgemm case's dial, plus
    native DGEMM's error: what the figure and the precision guide show."""
    case = [c for c in doc["cases"] if c["case"] == "dgemm" and c.get("layout", "normal") == "normal"][-1]
    points = []
    for name, v in case["contenders"].items():
        if name.startswith("pyblasgemm int8-ozaki-"):
            points.append((int(name.rsplit("-", 1)[1]), v["ratio_steady_vs_native"],
                           v["max_rel_err_vs_longdouble"]))
    native = min(v["max_rel_err_vs_longdouble"] for v in case["contenders"].values() if v["side"] == "native")
    return sorted(points), native, case["m"]


def guide_table(paths) -> str:
    """The precision guide's measured table (reStructuredText list-table rows) from result
    files, one column pair (speed, error) per file: tests/test_composite.py checks that the
    guide quotes exactly this."""
    docs = [json.loads(pathlib.Path(p).read_text()) for p in paths]

    def cell(doc, case, layout, m, name):
        c = next(c for c in doc["cases"] if c["case"] == case and c.get("layout") == layout and c["m"] == m)
        v = c["contenders"][name]
        r = v.get("ratio_steady_vs_native", v.get("ratio_steady_vs_cgemm"))
        e = v.get("max_rel_err_vs_longdouble", v.get("max_rel_err_vs_complex128"))
        return f"{r:.2f}x", f"{e:.1e}"

    def native_err(doc, case, layout, m):
        c = next(c for c in doc["cases"] if c["case"] == case and c.get("layout") == layout and c["m"] == m)
        return min(v.get("max_rel_err_vs_longdouble", v.get("max_rel_err_vs_complex128"))
                   for v in c["contenders"].values() if v["side"] == "native")

    rows = []
    for case, layout, m, name, label in (
            ("dgemm", "normal", 1024, "pyblasgemm int8-ozaki (default)", "dgemm 1024³, default"),
            ("dgemm", "normal", 4096, "pyblasgemm int8-ozaki (default)", "dgemm 4096³, default"),
            ("dgemm", "normal", 8192, "pyblasgemm int8-ozaki (default)", "dgemm 8192³, default (55 bits)"),
            *[("dgemm", "normal", 8192, f"pyblasgemm int8-ozaki-{b}", f"dgemm 8192³, ``'int8-ozaki-{b}'``")
              for b in (48, 40, 32)],
            ("dgemm", "row scales", 4096, "pyblasgemm int8-ozaki (default)", "dgemm 4096³, row / column scales 1e±30"),
            ("dgemm", "element spread", 4096, "pyblasgemm int8-ozaki (default)", "dgemm 4096³, elements 1e±30"),
            ("zgemm", None, 8192, "pyblasgemm int8-ozaki (default)", "zgemm 8192³, default"),
            ("cgemm", None, 8192, "pyblasgemm tf32", "cgemm 8192³, ``compute='tf32'``"),
            ("cgemm", None, 8192, "pyblasgemm 3xtf32", "cgemm 8192³, ``compute='3xtf32'``")):
        cells = [x for doc in docs for x in cell(doc, case, layout, m, name)]
        rows.append(f"   * - {label}\n" + "".join(f"     - {x}\n" for x in cells)
                    + f"     - {native_err(docs[0], case, layout, m):.1e}\n")
    return "".join(rows)


def plot(paths, out) -> None:
    """Bits kept (the dial) against speed relative to native DGEMM and against the error, one
    line per result file (device)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.4))
    for path in paths:
        doc = json.loads(pathlib.Path(path).read_text())
        points, native, size = dial_points(doc)
        bits = [p[0] for p in points]
        name = doc["device"]["name"].replace("NVIDIA ", "")
        left.plot(bits, [p[1] for p in points], "o-", label=name)
        right.semilogy(bits, [p[2] for p in points], "o-", label=name)
        right.axhline(native, ls="--", lw=0.8, color=left.lines[-1].get_color(),
                      label=f"native DGEMM ({name})")
    left.axhline(1.0, color="k", lw=0.8)
    left.set_xlabel("bits kept per row / column ('int8-ozaki-<bits>')")
    left.set_ylabel(f"speed vs native DGEMM ({size}³)")
    right.set_xlabel("bits kept per row / column")
    right.set_ylabel("max error / (|A| @ |B|)")
    left.legend(fontsize=7)
    right.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    args = plot_or_args(__doc__.split("\n")[0], "smaller sizes, no child process", plot, argv)
    if args is None:
        return 0
    import cupy as cp
    import torch

    import pyblasgemm as pb

    doc = {"schema": "pyblasgemm-ozaki/1", **meta(types.SimpleNamespace(torch=torch), seed=20261125),
           "method": __doc__, "cases": []}
    rng = np.random.default_rng(20261125)
    sizes = SIZES[:2] if args.quick else SIZES
    for s in sizes:
        row = dgemm_case(cp, torch, pb, s, rng, BITS if s == sizes[-1] else [], child=not args.quick and s == sizes[-1])
        doc["cases"].append(row)
        print("dgemm", s, flush=True)
        _show(row)
    for layout in ("row scales", "element spread", "graded 2^-30", "graded 2^-20"):
        size = 8192 if layout.startswith("graded") else 4096
        row = dgemm_case(cp, torch, pb, size if not args.quick else 1024, rng, [], layout, child=False)
        doc["cases"].append(row)
        print("dgemm", layout, flush=True)
        _show(row)
    for s in (ZSIZES[:1] if args.quick else ZSIZES):
        row = zgemm_case(cp, torch, pb, s, rng)
        doc["cases"].append(row)
        print("zgemm", s, flush=True)
        _show(row)
    row = cgemm_case(cp, torch, pb, 2048 if args.quick else 8192, rng)
    doc["cases"].append(row)
    print("cgemm", row["m"], flush=True)
    _show(row)
    write_doc(doc, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
