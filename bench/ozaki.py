"""Emulated float64 (Ozaki scheme II on int8 tensor cores) and complex on tensor cores, against
cuBLAS on the same bytes, in one process (issue: FP64 via int8 + complex on tensor cores).

    PYTHONPATH=. python bench/ozaki.py --out bench/results/ozaki_<gpu>_<date>_<sha>.json
    PYTHONPATH=. python bench/ozaki.py --cases closing --out bench/results/ozaki_closing_<gpu>_<date>_<sha>.json

``--cases``: a comma list of the groups below, or a named set: ``guide`` (the default: dgemm,
layouts, zgemm, cgemm, the precision guide's table and figure), ``closing`` (dgemm16k, sgemm,
native, igemm: issue 34's targets that no committed run had measured), ``all``. The JSON is
written after every case, so a run cut short keeps what it measured.

Expected time on one H200 with a cold kernel cache (estimates from the steady times of
ozaki_h200_2026-11-27_a8ba380.json and ozaki_passes_h200_2026-11-28_f5a2290.json times the
calls each contender makes, ~14 at 8192³ and above, plus operand generation, the host's
long-double references and NVRTC compiles): ``guide`` ~90-140 s (dgemm 45-70 with its
cuBLAS-emulation child, layouts 15-25, zgemm 15-20, cgemm 15-25); ``closing`` ~90-135 s
(dgemm16k 25-35, sgemm 30-45, native 20-30, igemm 15-25). ``--quick``: every size at most 4096,
no child, ~30-60 s.

Cases (group in brackets):

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
  '3xtf32';
* [dgemm16k] dgemm at 16384³ (operands drawn on the GPU): native DGEMM, the default and
  ``'int8-ozaki-40'`` (the issue's 16384³ targets);
* [sgemm] float32 at SSIZES (8192³, 16384³; drawn on the GPU): native SGEMM (``torch.matmul``
  with TF32 off, ``cupy.matmul``), ours with ``compute='3xtf32'`` and ``'int8-ozaki'`` forced
  onto the composition (``backend='tensorcore'``), and ``'int8-ozaki'`` where the planner
  chooses (its plan recorded); ``err_over_sgemm``: each error over native SGEMM's (the issue's
  bar: <= 1);
* [native] the native routes at NATIVE_SIZE (8192³) for float64, complex128 and float32:
  ``pyblasgemm.matmul`` (default compute) and the raw form (``dgemm`` / ``zgemm`` / ``sgemm``
  on the same bytes, C = A @ B as the column-major ``Cᵀ = Bᵀ Aᵀ``) against the faster of
  ``torch.matmul`` and ``cupy.matmul`` (cuBLAS); ``same_bits_as_cupy`` for each;
* [igemm] int8 at ISIZES (4096³, 8192³, 16384³), x (m x k) and w (n x k) row-major, the product
  ``w @ x.T`` (n x m, int32, exact): ``torch._int_mm`` (cuBLASLt), ``pyblasgemm.igemm('T', 'N',
  ...)`` on its plan, forced onto our kernel and onto cuBLAS (``cublasGemmEx``), and
  ``pyblasgemm.matmul(w, x.T, dtype=int32)``; TOPS and ratios against ``torch._int_mm``; every
  result checked bit for bit against ``torch._int_mm``'s.

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
from bench.timing import interleaved_median_s  # noqa: E402

SIZES = [1024, 4096, 8192]
BITS = [24, 32, 40, 48, 56, 62]
ZSIZES = [4096, 8192]
ROWS, COLS = 16, 256
#: the layouts' sizes (wide exponent ranges; graded data, the guard's case), the cgemm size, and
#: the size of every case of the closing groups under --quick
LSIZE, GSIZE, CSIZE, QUICK_SIZE = 4096, 8192, 8192, 2048
#: the largest dgemm (the issue's 16384³ targets) and the dials timed there
BIG, BIG_BITS = 16384, [40]
#: float32 sizes of the FP32-accurate int8 mode against SGEMM (the issue's 8192³ and 16384³)
SSIZES = [8192, 16384]
#: the size of the native routes' rows (the issue's "0.90x cupy's DGEMM at 8192³")
NATIVE_SIZE = 8192
#: the int8 GEMM's sizes (the issue's 1,500 TOPS at 8192³)
ISIZES = [4096, 8192, 16384]
#: the case groups of ``--cases``, in run order
GROUPS = ("dgemm", "layouts", "zgemm", "cgemm", "dgemm16k", "sgemm", "native", "igemm")
#: the named sets of ``--cases``
SETS = {"guide": GROUPS[:4], "closing": GROUPS[4:], "all": GROUPS}


def parse_cases(text: str) -> tuple:
    """The groups ``--cases`` names, in run order: a named set or a comma list of groups.

    >>> parse_cases("igemm,sgemm")
    ('sgemm', 'igemm')
    >>> parse_cases("closing")
    ('dgemm16k', 'sgemm', 'native', 'igemm')
    >>> parse_cases("sgem")
    Traceback (most recent call last):
    ...
    ValueError: --cases: 'sgem' is not a group; the groups are dgemm, layouts, zgemm, cgemm, dgemm16k, sgemm, native, igemm and the sets guide, closing, all
    """
    names = [x.strip() for x in text.split(",") if x.strip()]
    if not names:
        raise ValueError(f"--cases: {text!r} names no group")
    picked = set()
    for name in names:
        if name in SETS:
            picked.update(SETS[name])
        elif name in GROUPS:
            picked.add(name)
        else:
            raise ValueError(f"--cases: {name!r} is not a group; the groups are {', '.join(GROUPS)} and the sets "
                             f"{', '.join(SETS)}")
    return tuple(g for g in GROUPS if g in picked)


def _cases_arg(text: str) -> tuple:
    """``parse_cases`` as an argparse type (its message on the command line)."""
    import argparse

    try:
        return parse_cases(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("--cases: ")) from None


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


def _ld_reference(a_rows, b_cols):
    """(the long-double product of the sampled rows and columns, |A| @ |B| there); a complex
    product's reference is the pair (real part, imaginary part). One per case: each is ~0.4 s
    of host time at k = 8192 (NumPy has no long-double BLAS), and every contender reads it.

    >>> ref, scale = _ld_reference(np.array([[1.0, -2.0]]), np.array([[3.0], [1.0]]))
    >>> float(ref[0, 0]), float(scale[0, 0])
    (1.0, 5.0)
    """
    ld = np.longdouble
    if np.iscomplexobj(a_rows):
        ar, ai, br, bi = (x.astype(ld) for x in (a_rows.real, a_rows.imag, b_cols.real, b_cols.imag))
        ref = (ar @ br - ai @ bi, ar @ bi + ai @ br)
    else:
        ref = a_rows.astype(ld) @ b_cols.astype(ld)
    return ref, np.abs(a_rows).astype(ld) @ np.abs(b_cols).astype(ld)


def _ld_error(result_rows, a_rows, b_cols, ref=None) -> float:
    """Max error of sampled entries vs a long-double product, relative to |A| @ |B|
    (``ref``: :func:`_ld_reference`'s of these rows and columns, else computed here).

    >>> a, b = np.array([[1.0, -2.0]]), np.array([[3.0], [1.0]])
    >>> _ld_error(np.array([[1.5]]), a, b), _ld_error(np.array([[1.0]]), a, b, _ld_reference(a, b))
    (0.1, 0.0)
    """
    ld = np.longdouble
    want, scale = _ld_reference(a_rows, b_cols) if ref is None else ref
    if isinstance(want, tuple):
        err = np.hypot((result_rows.real.astype(ld) - want[0]).astype(np.float64),
                       (result_rows.imag.astype(ld) - want[1]).astype(np.float64))
        return float(np.max(err / scale.astype(np.float64)))
    return float(np.max((np.abs(result_rows.astype(ld) - want) / scale).astype(np.float64)))


def _timed_together(cp, fns: dict, big: bool) -> dict:
    """{name: {steady_s, single_s}} of each of ``fns``: steady from brackets interleaved across
    the contenders (``bench.timing.interleaved_median_s``: the GPU's clock drifts under a long
    run), single one contender after the other."""
    inner, samples = (1, 5) if big else (5, 10)
    steady = interleaved_median_s(fns, inner=inner, samples=samples, warmup=2)
    return {name: {"steady_s": steady[name], "single_s": _single_s(cp, fn)} for name, fn in fns.items()}


def _sampled(cp, res, rows, cols):
    """The entries ``res[rows][:, cols]`` of a CuPy array or a CUDA tensor, on the host (picked
    on the GPU: a whole 16384² float64 result is 2 GiB to copy)."""
    if hasattr(res, "cpu"):
        import torch

        r = torch.as_tensor(rows, device=res.device)
        c = torch.as_tensor(cols, device=res.device)
        return res[r][:, c].cpu().numpy()
    return cp.asnumpy(res[cp.asarray(rows)][:, cp.asarray(cols)])


def _gpu_normal(cp, rng, s, dtype):
    """Two s x s standard normal operands drawn on the GPU (seeded from ``rng``): at 16384²
    NumPy's generator took ~7 s an operand on the host, the GPU's well under one."""
    rs = cp.random.RandomState(int(rng.integers(2**31)))
    return rs.standard_normal((s, s), dtype=dtype), rs.standard_normal((s, s), dtype=dtype)


def dgemm_case(cp, torch, pb, s, rng, bits_sweep, layout="normal", child=True, gpu_operands=False) -> dict:
    """One dgemm row: native DGEMM, the default, the dials ``bits_sweep`` and (``child``) cuBLAS's
    emulation. ``gpu_operands``: normal operands drawn on the GPU, only the sampled rows and
    columns copied to the host (no child then: it reads host copies of A and B)."""
    if gpu_operands and (child or layout != "normal"):
        raise ValueError(f"gpu_operands=True takes layout='normal' and child=False, got layout={layout!r}, "
                         f"child={child!r}")
    if gpu_operands:
        da, db = _gpu_normal(cp, rng, s, cp.float64)
        rows, cols = _sample(rng, s, s)
        a_rows, b_cols = cp.asnumpy(da[cp.asarray(rows)]), cp.asnumpy(db[:, cp.asarray(cols)])
        return _dgemm_contenders(cp, torch, pb, s, da, db, rows, cols, a_rows, b_cols, bits_sweep, layout, None)
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
    return _dgemm_contenders(cp, torch, pb, s, da, db, rows, cols, a_rows, b_cols, bits_sweep, layout,
                             (a, b) if child else None)


def _dgemm_contenders(cp, torch, pb, s, da, db, rows, cols, a_rows, b_cols, bits_sweep, layout, host):
    """dgemm_case's contenders on the GPU operands ``da``, ``db`` (``host``: (A, B) on the host
    for cuBLAS's emulation in a child process, or None)."""
    ta, tb = torch.as_tensor(da, device="cuda"), torch.as_tensor(db, device="cuda")
    big = s >= 8192
    ref = _ld_reference(a_rows, b_cols)
    out = {}

    fns = {}

    def record(name, fn, side, route=None):
        res = fn()
        row = {"side": side, "max_rel_err_vs_longdouble": _ld_error(_sampled(cp, res, rows, cols), a_rows, b_cols, ref)}
        if route is not None:
            row["route"] = route()
        out[name], fns[name] = row, fn
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
    for name, times in _timed_together(cp, fns, big).items():
        out[name].update(times)
    if host is not None:
        out.update(_cublas_emulation(*host, rows, cols, a_rows, b_cols, ref))
    native = min(v["steady_s"] for v in out.values() if v["side"] == "native")
    native_single = min(v["single_s"] for v in out.values() if v["side"] == "native")
    for v in out.values():
        if "steady_s" in v:             # (a child that failed left its error alone)
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


def _cublas_emulation(a, b, rows, cols, a_rows, b_cols, ref=None) -> dict:
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
        "max_rel_err_vs_longdouble": _ld_error(r[rows][:, cols], a_rows, b_cols, ref)}}
    if rc is not None:
        out["cuBLAS emulation, cupy.matmul (CUBLAS_EMULATE_DOUBLE_PRECISION=1)"] = {
            "side": "theirs", "steady_s": info["cupy_steady_s"], "single_s": float("nan"), "child": info,
            "max_rel_err_vs_longdouble": _ld_error(rc[rows][:, cols], a_rows, b_cols, ref)}
    return out


def _contenders(cp, items, big: bool, error, route, sample=None) -> dict:
    """Each (name, fn, side[, route]) of ``items`` timed (:func:`_timed_together`), with ``error(host
    result)``'s fields and, for ours, the route it took (the item's own ``route()``, else
    ``route()``); memory returned between contenders. ``sample``: (rows, cols), the entries
    ``error`` reads, picked on the GPU (else the whole result is copied)."""
    out, fns = {}, {}
    for name, fn, side, *own in items:
        if side == "ours":
            _forget_route()
        res = fn()
        if sample is not None:
            host = _sampled(cp, res, *sample)
        else:
            host = res.cpu().numpy() if hasattr(res, "cpu") else cp.asnumpy(res)
        out[name], fns[name] = {"side": side, **error(host)}, fn
        if side == "ours":
            out[name]["route"] = (own[0] if own else route)()
        del res
        cp.get_default_memory_pool().free_all_blocks()
    for name, times in _timed_together(cp, fns, big).items():
        out[name].update(times)
    return out


def _forget_route() -> None:
    """Clear ``composite.last_route()``: a call the planner keeps native leaves no composite
    route, and the previous contender's must not be read as its."""
    from pyblasgemm import composite

    composite._last["route"] = None


def _plan_lines(pb, m, n, k, dtype, **kw) -> str:
    """The ``plan:`` and ``why:`` lines of ``pyblasgemm.plan(...).explain()``: the route a call
    with these arguments takes (for square operands, ``matmul``'s transposed problem is the same)."""
    text = pb.plan(m, n, k, dtype, **kw).explain()
    return " | ".join(line.strip()[:400] for line in text.splitlines() if line.startswith(("plan:", "why:")))


def _composite_or_plan(pb, m, n, k, dtype, **kw):
    """A route reader for an Ozaki call the planner may keep native: the composite's route if
    it ran, else the plan's lines."""
    from pyblasgemm.composite import last_route

    return lambda: last_route() or f"no composition ran; {_plan_lines(pb, m, n, k, dtype, **kw)}"


def _ratios(out: dict, key: str) -> None:
    """Each contender's steady-state speed against the fastest native one, as ``key``."""
    native = min(v["steady_s"] for v in out.values() if v["side"] == "native")
    for v in out.values():
        v[key] = native / v["steady_s"]


def zgemm_case(cp, torch, pb, s, rng) -> dict:
    a = rng.standard_normal((s, s)) + 1j * rng.standard_normal((s, s))
    b = rng.standard_normal((s, s)) + 1j * rng.standard_normal((s, s))
    rows, cols = _sample(rng, s, s)
    ref = _ld_reference(a[rows], b[:, cols])
    da, db = cp.asarray(a), cp.asarray(b)
    ta, tb = torch.as_tensor(da, device="cuda"), torch.as_tensor(db, device="cuda")
    from pyblasgemm.composite import last_route

    out = _contenders(cp, (("torch.matmul (ZGEMM)", lambda: ta @ tb, "native"),
                           ("cupy.matmul (ZGEMM)", lambda: da @ db, "native"),
                           ("pyblasgemm int8-ozaki (default)",
                            lambda: pb.matmul(da, db, compute="int8-ozaki", backend="tensorcore"), "ours")),
                      s >= 4096,
                      lambda h: {"max_rel_err_vs_longdouble": _ld_error(h, a[rows], b[:, cols], ref)},
                      last_route, (rows, cols))
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
        True, lambda h: {"max_rel_err_vs_complex128": float(np.max(np.abs(h - ref) / scale))},
        last_route, (rows, cols))
    _ratios(out, "ratio_steady_vs_cgemm")
    return {"case": "cgemm", "m": s, "n": s, "k": s, "contenders": out}


def sgemm_case(cp, torch, pb, s, rng) -> dict:
    """float32: native SGEMM against 3xTF32 and the FP32-accurate int8 mode (issue 34's ≥ 2.7x
    SGEMM at 8192³, ≥ 3.0x at 16384³, error ≤ SGEMM's)."""
    da, db = _gpu_normal(cp, rng, s, cp.float32)
    rows, cols = _sample(rng, s, s)
    a_rows, b_cols = cp.asnumpy(da[cp.asarray(rows)]), cp.asnumpy(db[:, cp.asarray(cols)])
    ref = _ld_reference(a_rows, b_cols)
    ta, tb = torch.as_tensor(da, device="cuda"), torch.as_tensor(db, device="cuda")
    torch.backends.cuda.matmul.allow_tf32 = False       # SGEMM: what the modes replace
    out = _contenders(cp, (
        ("torch.matmul (SGEMM)", lambda: ta @ tb, "native"),
        ("cupy.matmul (SGEMM)", lambda: da @ db, "native"),
        ("pyblasgemm 3xtf32", lambda: pb.matmul(da, db, compute="3xtf32", backend="tensorcore"), "ours",
         lambda: _plan_lines(pb, s, s, s, "float32", compute="3xtf32", backend="tensorcore")),
        ("pyblasgemm int8-ozaki (default)",
         lambda: pb.matmul(da, db, compute="int8-ozaki", backend="tensorcore"), "ours"),
        ("pyblasgemm int8-ozaki (planner's choice)", lambda: pb.matmul(da, db, compute="int8-ozaki"), "ours",
         _composite_or_plan(pb, s, s, s, "float32", compute="int8-ozaki"))),
        s >= 8192, lambda h: {"max_rel_err_vs_longdouble": _ld_error(h, a_rows, b_cols, ref)},
        _composite_or_plan(pb, s, s, s, "float32", compute="int8-ozaki", backend="tensorcore"), (rows, cols))
    _ratios(out, "ratio_steady_vs_native")
    native = min(v["single_s"] for v in out.values() if v["side"] == "native")
    sgemm_err = min(v["max_rel_err_vs_longdouble"] for v in out.values() if v["side"] == "native")
    for v in out.values():
        v["ratio_single_vs_native"] = native / v["single_s"]
        v["err_over_sgemm"] = v["max_rel_err_vs_longdouble"] / sgemm_err
    return {"case": "sgemm", "m": s, "n": s, "k": s, "contenders": out}


#: the native routes' rows: (case label, dtype, routine name, cuBLAS's name)
NATIVE_TYPES = (("float64", "dgemm", "DGEMM"), ("complex128", "zgemm", "ZGEMM"), ("float32", "sgemm", "SGEMM"))


def native_case(cp, torch, pb, s, rng, dtype, routine, blas) -> dict:
    """The native route of ``dtype`` (issue 34: ≥ 0.99x cuBLAS): ``pyblasgemm.matmul`` and the raw
    form ``routine`` against ``torch.matmul`` and ``cupy.matmul`` on the same bytes."""
    real = cp.float32 if dtype == "float32" else cp.float64
    da, db = _gpu_normal(cp, rng, s, real)
    if dtype == "complex128":
        di, dj = _gpu_normal(cp, rng, s, real)
        da, db = da + 1j * di, db + 1j * dj
        del di, dj
    rows, cols = _sample(rng, s, s)
    a_rows, b_cols = cp.asnumpy(da[cp.asarray(rows)]), cp.asnumpy(db[:, cp.asarray(cols)])
    ref = _ld_reference(a_rows, b_cols)
    ta, tb = torch.as_tensor(da, device="cuda"), torch.as_tensor(db, device="cuda")
    torch.backends.cuda.matmul.allow_tf32 = False
    raw = getattr(pb, routine)
    a1, b1 = da.ravel(), db.ravel()
    c1 = cp.empty(s * s, da.dtype)

    def raw_call():
        # row-major C = A @ B is the column-major Cᵀ = Bᵀ Aᵀ: B's buffer first (blas guide)
        raw("N", "N", s, s, s, 1.0, b1, s, a1, s, 0.0, c1, s)
        return c1.reshape(s, s)

    out = _contenders(cp, (
        (f"torch.matmul ({blas})", lambda: ta @ tb, "native"),
        (f"cupy.matmul ({blas})", lambda: da @ db, "native"),
        ("pyblasgemm.matmul", lambda: pb.matmul(da, db), "ours"),
        (f"pyblasgemm.{routine} (raw form)", raw_call, "ours")),
        s >= 8192, lambda h: {"max_rel_err_vs_longdouble": _ld_error(h, a_rows, b_cols, ref)},
        lambda: _plan_lines(pb, s, s, s, dtype), (rows, cols))
    want = da @ db
    for name, fn in (("pyblasgemm.matmul", lambda: pb.matmul(da, db)), (f"pyblasgemm.{routine} (raw form)", raw_call)):
        out[name]["same_bits_as_cupy"] = bool(cp.array_equal(fn(), want))
    del want
    _ratios(out, "ratio_steady_vs_cublas")
    native = min(v["single_s"] for v in out.values() if v["side"] == "native")
    for v in out.values():
        v["ratio_single_vs_cublas"] = native / v["single_s"]
    return {"case": "native", "dtype": dtype, "m": s, "n": s, "k": s, "contenders": out}


def igemm_case(cp, torch, pb, s, rng) -> dict:
    """int8 (issue 34: ≥ 1,500 TOPS at 8192³, ≥ 1.6x ``torch._int_mm`` on the same bytes):
    ``w @ x.T``, x (m x k) and w (n x k) row-major, both K-contiguous as cuBLASLt wants them;
    exact int32 sums, so every result must equal ``torch._int_mm``'s bit for bit."""
    m = n = k = s
    rs = cp.random.RandomState(int(rng.integers(2**31)))
    x = rs.randint(-128, 128, size=(m, k), dtype=cp.int32).astype(cp.int8)
    w = rs.randint(-128, 128, size=(n, k), dtype=cp.int32).astype(cp.int8)
    tx, tw = torch.as_tensor(x, device="cuda"), torch.as_tensor(w, device="cuda")
    x1, w1 = x.ravel(), w.ravel()
    c1 = cp.empty(m * n, cp.int32)

    def igemm(backend):
        def call():
            # column-major C (m x n) = op(A) op(B) = x @ w.T; its bytes are the row-major n x m w @ x.T
            pb.igemm("T", "N", m, n, k, 1, x1, k, w1, k, 0, c1, m, backend=backend)
            return c1.reshape(n, m)
        return call

    fns = {"torch._int_mm (cuBLASLt)": (lambda: torch._int_mm(tw, tx.t()), "native", None),
           "pyblasgemm.igemm (planned)": (igemm(None), "ours", None),
           "pyblasgemm.igemm backend='tensorcore'": (igemm("tensorcore"), "ours", "tensorcore"),
           "pyblasgemm.igemm backend='cublas' (cublasGemmEx)": (igemm("cublas"), "cublas", "cublas"),
           "pyblasgemm.matmul(w, x.T, dtype=int32)": (lambda: pb.matmul(w, x.T, dtype=np.int32), "ours", None)}
    want = cp.asarray(torch._int_mm(tw, tx.t()))
    out, ran = {}, {}
    for name, (fn, side, backend) in fns.items():
        try:
            same = bool(cp.array_equal(cp.asarray(fn()), want))
        except Exception as e:  # noqa: BLE001 - a refusal is a result: record it and go on
            out[name] = {"side": side, "error": repr(e)[:500]}
            continue
        out[name], ran[name] = {"side": side, "same_bits_as_int_mm": same}, fn
        if name.startswith("pyblasgemm.igemm"):
            out[name]["route"] = _plan_lines(pb, m, n, k, "int8", transa="T", backend=backend)
        cp.get_default_memory_pool().free_all_blocks()
    for name, times in _timed_together(cp, ran, False).items():
        out[name].update(times)
        out[name]["TOPS_steady"] = 2.0 * m * n * k / times["steady_s"] / 1e12
    base = out["torch._int_mm (cuBLASLt)"]
    for v in out.values():
        if "steady_s" in v and "steady_s" in base:
            v["ratio_steady_vs_int_mm"] = base["steady_s"] / v["steady_s"]
            v["ratio_single_vs_int_mm"] = base["single_s"] / v["single_s"]
    return {"case": "igemm", "m": m, "n": n, "k": k, "contenders": out}


def _show(row):
    for name, v in row["contenders"].items():
        r = {k: (f"{x:.3g}" if isinstance(x, float) else x if k != "error" else x[:200]) for k, x in v.items()
             if k.startswith(("ratio", "max_rel", "err_over", "TOPS", "same_bits", "error"))}
        print(f"  {name}: {v.get('steady_s', float('nan')) * 1e3:.2f} ms {r}", flush=True)


def dial_points(doc) -> list:
    """(bits, speed vs native DGEMM, max error) of the dgemm case with the dial sweep (the most
    dials, the largest size of those: 8192³; the 16384³ row of ``dgemm16k`` times one dial),
    plus native DGEMM's error: what the figure and the precision guide show."""
    normal = [c for c in doc["cases"] if c["case"] == "dgemm" and c.get("layout", "normal") == "normal"]
    case = max(normal, key=lambda c: (sum(n.startswith("pyblasgemm int8-ozaki-") for n in c["contenders"]), c["m"]))
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

    default = "pyblasgemm int8-ozaki (default)"
    emulation = "cuBLAS emulation, cupy.matmul (CUBLAS_EMULATE_DOUBLE_PRECISION=1)"
    rows = []
    for case, layout, m, name, label in (
            ("dgemm", "normal", 1024, default, "dgemm 1024³, default"),
            ("dgemm", "normal", 4096, default, "dgemm 4096³, default"),
            ("dgemm", "normal", 8192, default, "dgemm 8192³, default (55 bits, guarded)"),
            *[("dgemm", "normal", 8192, f"pyblasgemm int8-ozaki-{b}", f"dgemm 8192³, ``'int8-ozaki-{b}'``")
              for b in (62, 56, 48, 40, 32, 24)],
            ("dgemm", "normal", 8192, emulation, "dgemm 8192³, cuBLAS's own emulation"),
            ("dgemm", "row scales", 4096, default, "dgemm 4096³, row / column scales 1e±30"),
            ("dgemm", "element spread", 4096, default, "dgemm 4096³, elements 1e±30 (runs natively)"),
            ("dgemm", "graded 2^-30", 8192, default, "dgemm 8192³, graded 2⁻³⁰ (guard: native)"),
            ("zgemm", None, 4096, default, "zgemm 4096³, default"),
            ("zgemm", None, 8192, default, "zgemm 8192³, default"),
            ("cgemm", None, 8192, "pyblasgemm tf32", "cgemm 8192³, ``compute='tf32'``"),
            ("cgemm", None, 8192, "cuBLAS TF32 CGEMM", "cgemm 8192³, cuBLAS's TF32 CGEMM"),
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


def run_group(group, cp, torch, pb, rng, quick: bool):
    """The cases of one ``--cases`` group, one at a time (a generator: the caller writes the
    JSON after each)."""
    if group == "dgemm":
        sizes = SIZES[:2] if quick else SIZES
        for s in sizes:
            yield dgemm_case(cp, torch, pb, s, rng, BITS if s == sizes[-1] else [],
                             child=not quick and s == sizes[-1])
    elif group == "layouts":
        for layout in ("row scales", "element spread", "graded 2^-30", "graded 2^-20"):
            size = GSIZE if layout.startswith("graded") else LSIZE
            yield dgemm_case(cp, torch, pb, size if not quick else min(size, 1024), rng, [], layout, child=False)
    elif group == "zgemm":
        for s in (ZSIZES[:1] if quick else ZSIZES):
            yield zgemm_case(cp, torch, pb, s, rng)
    elif group == "cgemm":
        yield cgemm_case(cp, torch, pb, min(CSIZE, QUICK_SIZE) if quick else CSIZE, rng)
    elif group == "dgemm16k":
        yield dgemm_case(cp, torch, pb, QUICK_SIZE if quick else BIG, rng, BIG_BITS, child=False, gpu_operands=True)
    elif group == "sgemm":
        for s in ([QUICK_SIZE] if quick else SSIZES):
            yield sgemm_case(cp, torch, pb, s, rng)
    elif group == "native":
        for dtype, routine, blas in NATIVE_TYPES:
            yield native_case(cp, torch, pb, QUICK_SIZE if quick else NATIVE_SIZE, rng, dtype, routine, blas)
    elif group == "igemm":
        for s in ([QUICK_SIZE] if quick else ISIZES):
            yield igemm_case(cp, torch, pb, s, rng)
    else:
        raise ValueError(f"group={group!r}: one of {', '.join(GROUPS)}")


def main(argv=None) -> int:
    def extra(ap):
        ap.add_argument("--cases", type=_cases_arg, default=SETS["guide"],
                        help=f"comma list of groups ({', '.join(GROUPS)}) or a set ({', '.join(SETS)}); "
                             "default: guide")

    args = plot_or_args(__doc__.split("\n")[0], "smaller sizes, no child process", plot, argv, extra)
    if args is None:
        return 0
    import cupy as cp
    import torch

    import pyblasgemm as pb

    doc = {"schema": "pyblasgemm-ozaki/1", **meta(types.SimpleNamespace(torch=torch), seed=20261125),
           "method": __doc__, "groups": list(args.cases), "cases": []}
    rng = np.random.default_rng(20261125)
    for group in args.cases:
        t0 = time.perf_counter()
        for row in run_group(group, cp, torch, pb, rng, args.quick):
            doc["cases"].append(row)
            print(group, row["case"], row.get("layout") or row.get("dtype") or "", row["m"], flush=True)
            _show(row)
            cp.get_default_memory_pool().free_all_blocks()
            torch.cuda.empty_cache()
            write_doc(doc, args.out)       # after each case: a run cut short keeps what it measured
        doc.setdefault("group_seconds", {})[group] = time.perf_counter() - t0
        print(f"{group}: {doc['group_seconds'][group]:.1f} s", flush=True)
    write_doc(doc, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
