"""pyblasgemm against cuBLAS on the held-out shape corpus, by shape class, on a GPU.

    python bench/heldout.py --dry-run                    # the plan and a runtime estimate, no GPU
    python bench/heldout.py [--out FILE] [--max-seconds S] [--classes ...] [--dtypes ...]
    python bench/heldout.py --resume FILE                # go on with a run that stopped
    python bench/heldout.py --summary FILE               # print a results file's summary

For every entry of ``bench/heldout_corpus_2026-11-24.json`` (bench/corpus.py) the operands are
drawn fresh on the GPU (uniform in [-1, 1), int8 over its whole range) and every contender runs
on those same bytes, in one process:

``torch``, ``cupy``   the yardstick, cuBLAS: ``torch.matmul`` and ``cupy.matmul`` (the faster
                      counts); int8: ``torch._int_mm`` alone (2-D, m > 16, k and n multiples
                      of 8: elsewhere the row has no yardstick and is summarized apart), on
                      the stored layout and (``torch_tn``) on untimed copies in cuBLASLt's
                      own int8 arrangement (A row-major, B column-major);
                      float32_3xtf32: SGEMM (TF32 off), the other way to fp32 accuracy;
``auto``              ``pyblasgemm.matmul(A, B)`` (int8: ``dtype=numpy.int32``, the int32
                      result _int_mm returns; 3xtf32: ``compute='3xtf32'``);
``tensorcore``        the same with ``backend='tensorcore'``;
``cublas``            the same with ``backend='cublas'`` (3xtf32: cuBLAS runs it as its
                      float32 SGEMM, as accurate).

Each contender is first run once and checked against a float64 (int64) reference on 64 sampled
output entries (error relative to |A|@|B|, the suite's tolerance); one that fails is not timed.
Then ``steady``: 3 warm-up calls, 20 back to back, one synchronize, wall time / 20 (median over
``--rounds``, contenders interleaved); ``single``: synchronize, one call, synchronize, median of
5 (bench/timing.py's paired_single_us, contenders interleaved). speedup = yardstick / ours
(> 1: we are faster). The plan auto used is read from the plan cache after its first call.

Rows are written after every entry (atomically), so a run stopped by a time limit keeps them;
``--resume`` skips the rows already there.
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import math
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:       # `bench` and `pyblasgemm` of this checkout, however run
    sys.path.insert(0, str(ROOT))
from bench import corpus  # noqa: E402

SCHEMA = "pyblasgemm-heldout/1"
WARMUP, STEADY_CALLS, SINGLE_CALLS = 3, 20, 5
SAMPLES = 64            # output entries checked against the float64 reference
WITHIN = 1.05           # auto counts as well planned within 5% of the best forced backend
SLOW = 0.9              # rows below this speedup are counted
OURS = ("auto", "tensorcore", "cublas")
YARDSTICKS = ("torch", "torch_tn", "cupy")
MODES = ("steady", "single")
GROUPS = {"float16": "fp16/bf16", "bfloat16": "fp16/bf16", "int8": "int8",
          "float32_3xtf32": "3xtf32"}
DTYPE_ALIASES = {"fp16": "float16", "f16": "float16", "half": "float16", "bf16": "bfloat16",
                 "i8": "int8", "s8": "int8", "3xtf32": "float32_3xtf32",
                 "float32": "float32_3xtf32"}
#: the benchmark suite's tolerance rows (pyblasgemm/benchmarks/suite.py: tolerance())
TOL_ROW = {"float16": "fp16", "bfloat16": "bf16", "int8": "int8", "float32_3xtf32": "3xtf32"}


# ---------------------------------------------------------------------------------------------
# The plan of runs (no GPU needed)
# ---------------------------------------------------------------------------------------------

def yardstick_calls(e) -> dict:
    """{name: call text, or None} and {name + '_why': reason} for the yardsticks of entry e."""
    dt = e["dtype"]
    if dt == "int8":
        why = []
        if e["batch"] > 1:
            why.append("batched (torch._int_mm is 2-D)")
        if e["m"] <= 16:
            why.append("m <= 16")
        if e["k"] % 8 or e["n"] % 8:
            why.append("k or n not a multiple of 8")
        why = "torch._int_mm cannot run: " + "; ".join(why) if why else None
        # cuBLASLt's int8 arrangement is A row-major, B column-major (the corpus's 'NT'):
        # for the other layouts _int_mm also runs on copies in it (copies not timed)
        tn = None if why or e["transa"] + e["transb"] == "NT" else \
            "torch._int_mm(A', B') on copies: A' row-major, B' column-major"
        return {"torch": None if why else "torch._int_mm(A, B)", "torch_why": why,
                "torch_tn": tn, "torch_tn_why": why or (None if tn else "the layout is 'NT'"),
                "cupy": None, "cupy_why": "cupy.matmul on int8 is not cuBLAS IMMA"}
    sgemm = " (SGEMM, TF32 off)" if dt == "float32_3xtf32" else ""
    out = {"torch": "torch.matmul(A, B)" + sgemm, "torch_why": None,
           "torch_tn": None, "torch_tn_why": "int8 only",
           "cupy": "cupy.matmul(A, B)" + sgemm, "cupy_why": None}
    if dt == "bfloat16":
        out.update(cupy=None, cupy_why="CuPy has no bfloat16 matmul")
    return out


def ours_kwargs(e, name: str, int8_form: str = "matmul") -> dict:
    """The keywords of pyblasgemm's call for contender ``name`` of entry e."""
    kw = {} if name == "auto" else {"backend": name}
    if e["dtype"] == "int8" and int8_form == "matmul":
        kw["dtype"] = np.int32          # int32 like torch._int_mm (plain matmul: int8, NumPy's)
    if e["dtype"] == "float32_3xtf32":
        kw["compute"] = "3xtf32"        # forced cuBLAS: its SGEMM, 3xTF32's cuBLAS route
    return kw


def ours_call(e, name: str, int8_form: str = "matmul") -> str:
    kw = ours_kwargs(e, name, int8_form)
    args = "".join(f", {k}={'numpy.int32' if v is np.int32 else repr(v)}" for k, v in kw.items())
    if e["dtype"] == "int8" and int8_form == "gemm":
        return f"pyblasgemm.gemm('N', 'N', A, B{args})"
    return f"pyblasgemm.matmul(A, B{args})"


def planner_candidates(e) -> tuple:
    """The forced backends auto chooses between (3xTF32's cuBLAS route is its SGEMM)."""
    return ("tensorcore", "cublas")


#: rough H100 speeds for the runtime estimate only (dense FLOP/s, HBM bytes/s, host s per call)
_PEAK = {"float16": 600e12, "bfloat16": 600e12, "int8": 900e12, "float32_3xtf32": 40e12}
_SGEMM, _BW, _HOST_S, _PER_ENTRY_S = 45e12, 2.5e12, 25e-6, 1.5


def estimate_s(e, rounds: int = 3) -> float:
    """Rough wall seconds for entry e on an H100: every contender's calls plus a fixed
    allowance per entry (operands, reference, first calls, kernel compilation)."""
    b, m, n, k = e["batch"], e["m"], e["n"], e["k"]
    size = 1 if e["dtype"] == "int8" else (4 if e["dtype"] == "float32_3xtf32" else 2)
    nbytes = b * (size * (m * k + k * n) + (4 if size != 2 else 2) * m * n)
    calls = 1 + WARMUP + STEADY_CALLS * rounds + SINGLE_CALLS
    y = yardstick_calls(e)
    total = 0.0
    for name in OURS + YARDSTICKS:
        if name in YARDSTICKS and y[name] is None:
            continue
        sgemm = e["dtype"] == "float32_3xtf32" and name != "auto" and name != "tensorcore"
        peak = _SGEMM if sgemm else _PEAK[e["dtype"]]
        total += calls * max(2 * b * m * n * k / peak, nbytes / _BW, _HOST_S)
    return total + _PER_ENTRY_S


def select(entries, classes=None, dtypes=None, ids=None, limit=None, order="interleave"):
    """The entries to run, filtered; ``interleave`` takes the classes in turn, so a run cut
    short still covers every class."""
    out = [e for e in entries if (not classes or e["class"] in classes)
           and (not dtypes or e["dtype"] in dtypes) and (not ids or e["id"] in ids)]
    if order == "interleave":
        by: dict = {}
        for e in out:
            by.setdefault(e["class"], []).append(e)
        queues = list(by.values())
        out = [q[i] for i in range(max(map(len, queues), default=0)) for q in queues
               if i < len(q)]
    return out[:limit] if limit else out


def dry_run(entries, rounds: int = 3, int8_form: str = "matmul", out=None) -> dict:
    """Print the plan of runs and the runtime estimate; return {class: estimated s}."""
    out = out or sys.stdout
    per_class: dict = {}
    for e in entries:
        y = yardstick_calls(e)
        yard = ", ".join(y[n] for n in YARDSTICKS if y[n]) or f"none ({y['torch_why']})"
        est = estimate_s(e, rounds)
        per_class[e["class"]] = per_class.get(e["class"], 0.0) + est
        shape = f"{e['batch']}x" if e["batch"] > 1 else ""
        shape += f"{e['m']}x{e['n']}x{e['k']}"
        print(f"{e['id']:16} {e['dtype']:15} {e['transa']}{e['transb']} {shape:22} "
              f"~{est:5.1f} s  yardstick: {yard}", file=out)
    print(f"\n{len(entries)} entries; contenders: yardstick (above), "
          + ", ".join(f"{n}: {ours_call({'dtype': 'float16'}, n)}" for n in OURS), file=out)
    print("int8: " + ours_call({"dtype": "int8"}, "auto", int8_form) + "; 3xtf32: "
          + ours_call({"dtype": "float32_3xtf32"}, "auto") + ", forced cuBLAS "
          + ours_call({"dtype": "float32_3xtf32"}, "cublas"), file=out)
    print("estimated seconds on an H100 (rough: roofline calls + 1.5 s per entry; add ~20 s "
          "for imports and the first compilations):", file=out)
    for cls, s in per_class.items():
        print(f"  {cls:14} {s:7.0f} s", file=out)
    print(f"  {'total':14} {sum(per_class.values()):7.0f} s", file=out)
    return per_class


# ---------------------------------------------------------------------------------------------
# Summary (no GPU needed)
# ---------------------------------------------------------------------------------------------

def geomean(values) -> float | None:
    values = [v for v in values if v and v > 0]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def _stats(rows) -> dict:
    out = {"rows": len(rows)}
    for name in OURS:
        out[name] = {}
        for mode in MODES:
            r = [row["speedup"][name][mode] for row in rows
                 if (row.get("speedup") or {}).get(name, {}).get(mode)]
            out[name][mode] = {"n": len(r), "geomean": geomean(r),
                               "min": min(r) if r else None, "max": max(r) if r else None,
                               f"below_{SLOW}": sum(v < SLOW for v in r)}
    out["planner_within_5pct"] = {}
    for mode in MODES:
        w = [row["planner"]["within_5pct"][mode] for row in rows
             if (row.get("planner") or {}).get("within_5pct", {}).get(mode) is not None]
        out["planner_within_5pct"][mode] = {"n": len(w), "count": sum(w),
                                            "pct": 100.0 * sum(w) / len(w) if w else None}
    return out


def summarize(rows) -> dict:
    """Geometric-mean speedups (by class and overall), the count below 0.9x and the planner's
    within-5% share, per contender and timing mode; for all rows and per dtype group
    ('fp16/bf16', 'int8', '3xtf32'). Rows without a yardstick count only for the planner."""
    groups = {"all": list(rows)}
    for r in rows:
        groups.setdefault(GROUPS[r["dtype"]], []).append(r)
    out = {}
    for g, grows in groups.items():
        # the random corpus's classes in their order, then any other (the model-layer
        # corpus's decode / prefill)
        seen = list(dict.fromkeys(r["class"] for r in grows))
        classes = [c for c in corpus.CLASSES if c in seen] + [c for c in seen if c not in corpus.CLASSES]
        out[g] = {"overall": _stats(grows),
                  "by_class": {c: _stats([r for r in grows if r["class"] == c]) for c in classes}}
    out["no_yardstick"] = [r["id"] for r in rows if not r.get("yardstick")]
    out["failed_checks"] = [f"{r['id']} {n}" for r in rows for n in OURS
                            if ((((r.get("contenders") or {}).get(n) or {}).get("check") or {})
                                .get("ok") is False)]
    out["errors"] = [f"{r['id']} {n}: {c['error']}" for r in rows
                     for n, c in (r.get("contenders") or {}).items()
                     if n in OURS and c.get("error")] + \
        [f"{r['id']}: {r['error']}" for r in rows if r.get("error")]
    return out


def format_summary(summary: dict) -> str:
    """A text table of :func:`summarize`'s output."""
    def f(x, fmt="{:.2f}"):
        return "-" if x is None else fmt.format(x)

    lines = []
    for g, block in summary.items():
        if not isinstance(block, dict):
            continue
        lines.append(f"== {g}: geomean speedup vs cuBLAS (n, below {SLOW}x), planner within 5%")
        lines.append(f"{'class':14} {'rows':>4}  " + "  ".join(
            f"{n + ' ' + m:>22}" for n in OURS for m in MODES) + f"  {'planner st/si':>14}")
        for cls, s in [*block["by_class"].items(), ("overall", block["overall"])]:
            cells = []
            for n in OURS:
                for m in MODES:
                    x = s[n][m]
                    cells.append(f"{f(x['geomean']):>7} ({x['n']:3d}, {x[f'below_{SLOW}']:3d})"
                                 .rjust(22))
            p = s["planner_within_5pct"]
            lines.append(f"{cls:14} {s['rows']:4d}  " + "  ".join(cells) + "  "
                         + f"{f(p['steady']['pct'], '{:.0f}%')}/{f(p['single']['pct'], '{:.0f}%')}"
                         .rjust(14))
    for key in ("no_yardstick", "failed_checks", "errors"):
        items = summary.get(key) or []
        lines.append(f"{key}: {len(items)}" + (": " + "; ".join(items[:20]) if items else ""))
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# The GPU run
# ---------------------------------------------------------------------------------------------

class Gpu:
    """CuPy, PyTorch (optional) and pyblasgemm, imported here (not at module import). The
    tests hand in NumPy stand-ins (``cp``, ``timing``) to run the machinery without a GPU."""

    def __init__(self, cp=None, pb=None, torch="import", timing=None):
        import ml_dtypes
        if cp is None:
            import cupy as cp
        if pb is None:
            import pyblasgemm as pb
        self.cp, self.pb, self.bf16 = cp, pb, np.dtype(ml_dtypes.bfloat16)
        if torch == "import":
            try:
                import torch
                torch = torch if torch.cuda.is_available() else None
            except Exception:
                torch = None
        self.torch = torch
        if torch is not None:
            # the SGEMM yardstick of 3xTF32 must be IEEE fp32 (its default, made explicit)
            torch.backends.cuda.matmul.allow_tf32 = False
        if timing is None:
            from bench import timing      # the shared single-call loop (paired_single_us)
        self.timing = timing

    def meta(self) -> dict:
        return meta(self)

    def sync(self):
        self.cp.cuda.Device().synchronize()

    def free(self):
        self.cp.get_default_memory_pool().free_all_blocks()
        self.cp.get_default_pinned_memory_pool().free_all_blocks()
        if self.torch is not None:
            self.torch.cuda.empty_cache()

    def operands(self, e, seed):
        """(A, B, A_store, B_store): A and B as matmul sees them, views of C-contiguous stores."""
        cp, b = self.cp, e["batch"]
        rs = cp.random.RandomState(seed)

        def store(rows, cols):
            shape = (b, rows, cols) if b > 1 else (rows, cols)
            if e["dtype"] == "int8":
                return rs.randint(-128, 128, size=shape, dtype=np.int32).astype(np.int8)
            x = rs.uniform(-1, 1, size=shape, dtype=np.float32)
            if e["dtype"] == "float16":
                return x.astype(np.float16)
            if e["dtype"] == "bfloat16":
                return x.astype(self.bf16)
            return x

        a_s = store(e["k"], e["m"]) if e["transa"] == "T" else store(e["m"], e["k"])
        b_s = store(e["n"], e["k"]) if e["transb"] == "T" else store(e["k"], e["n"])
        a = a_s.swapaxes(-1, -2) if e["transa"] == "T" else a_s
        bb = b_s.swapaxes(-1, -2) if e["transb"] == "T" else b_s
        return a, bb, a_s, b_s

    def tview(self, store, trans):
        """A torch view of a CuPy store (same memory), transposed like matmul's operand."""
        torch = self.torch
        if store.dtype == self.bf16:
            t = torch.as_tensor(store.view(np.int16), device="cuda").view(torch.bfloat16)
        else:
            t = torch.as_tensor(store, device="cuda")
        return t.transpose(-1, -2) if trans == "T" else t

    def contenders(self, e, a, b, a_s, b_s, int8_form):
        """{name: (call text, fn or reason str)} for every contender of entry e."""
        out = {}
        y = yardstick_calls(e)
        torch = self.torch
        if y["torch"] and torch is None:
            out["torch"] = (y["torch"], "PyTorch with CUDA is not installed")
        elif y["torch"]:
            ta, tb = self.tview(a_s, e["transa"]), self.tview(b_s, e["transb"])
            f = torch._int_mm if e["dtype"] == "int8" else torch.matmul
            out["torch"] = (y["torch"], lambda: f(ta, tb))
            if y["torch_tn"]:          # int8 in cuBLASLt's own arrangement (copies, untimed)
                ta_tn, tb_tn = ta.contiguous(), tb.t().contiguous().t()
                out["torch_tn"] = (y["torch_tn"], lambda: f(ta_tn, tb_tn))
        else:
            out["torch"] = ("-", y["torch_why"])
        if y["cupy"]:
            out["cupy"] = (y["cupy"], lambda: self.cp.matmul(a, b))
        else:
            out["cupy"] = ("-", y["cupy_why"])
        for name in OURS:
            kw = ours_kwargs(e, name, int8_form)
            if e["dtype"] == "int8" and int8_form == "gemm":
                fn = (lambda kw=kw: self.pb.gemm("N", "N", a, b, **kw))
            else:
                fn = (lambda kw=kw: self.pb.matmul(a, b, **kw))
            out[name] = (ours_call(e, name, int8_form), fn)
        return out

    def as_cupy(self, c):
        """A CuPy view of an output (a torch bfloat16 tensor through int16: the CUDA array
        interface has no bfloat16)."""
        if isinstance(c, self.cp.ndarray):
            return c
        if self.torch is not None and c.dtype == self.torch.bfloat16:
            return self.cp.asarray(c.view(self.torch.int16)).view(self.bf16)
        return self.cp.asarray(c)

    def take(self, x, index):
        """x[index] on the host; bfloat16 moved as int16 (a pure copy) and widened there."""
        bf = x.dtype == self.bf16
        got = self.cp.ascontiguousarray((x.view(np.int16) if bf else x)[index]).get()
        return got.view(self.bf16).astype(np.float32) if bf else got

    def poison(self, e, dtype_bytes):
        """Fill the pools' next output-sized blocks with garbage and free them: a contender
        that leaves its output unwritten then fails its check instead of reading stale data."""
        n = e["batch"] * e["m"] * e["n"] * dtype_bytes
        x = self.cp.empty(n, dtype=np.uint8)
        x.fill(0xA5)
        del x
        if self.torch is not None:
            t = self.torch.empty(n, dtype=self.torch.uint8, device="cuda")
            t.fill_(0xA5)
            del t


class _Reference:
    """float64 (int64 for int8) values of 64 sampled output entries, and the check."""

    def __init__(self, gpu, e, a, b, seed):
        cp, rng = gpu.cp, np.random.default_rng(seed)
        self.e = e
        self.bi = rng.integers(0, e["batch"], SAMPLES)
        self.ii = rng.integers(0, e["m"], SAMPLES)
        self.jj = rng.integers(0, e["n"], SAMPLES)
        wide = np.int64 if e["dtype"] == "int8" else np.float64
        ii, jj = cp.asarray(self.ii), cp.asarray(self.jj)
        if e["batch"] > 1:
            bi = cp.asarray(self.bi)
            ra, rb = gpu.take(a, (bi, ii, slice(None))), gpu.take(b, (bi, slice(None), jj))
        else:
            ra, rb = gpu.take(a, (ii, slice(None))), gpu.take(b, (slice(None), jj)).T
        ra, rb = ra.astype(wide), rb.astype(wide)                   # both (SAMPLES, k)
        self.want = (ra * rb).sum(axis=1)
        self.scale = (np.abs(ra) * np.abs(rb)).sum(axis=1).astype(np.float64)

    def check(self, gpu, c, tol_row: str) -> dict:
        from pyblasgemm.benchmarks.suite import DTYPES, tolerance
        c, cp = gpu.as_cupy(c), gpu.cp
        index = (cp.asarray(self.ii), cp.asarray(self.jj))
        if c.ndim == 3:
            index = (cp.asarray(self.bi),) + index
        got = gpu.take(c, index).astype(np.float64)
        err = np.abs(got - self.want.astype(np.float64)) / np.where(self.scale > 0, self.scale, 1)
        worst = float(np.max(err)) if np.isfinite(err).all() else float("inf")
        tol = tolerance(DTYPES[tol_row], self.e["k"])
        return {"ok": bool(worst <= tol), "max_rel_err": worst, "tol": tol,
                "out_dtype": str(c.dtype), "sampled": SAMPLES}


def _plans(pb) -> dict:
    """{requested backend (None: auto): Plan} of the plans now in pyblasgemm's plan cache."""
    cache = pb.get_plan_cache()
    keys: list = []
    cache.discard_where(lambda key: keys.append(key) or False)    # reads the keys, drops none
    found = {}
    for key in keys:
        if isinstance(key, tuple) and len(key) > 2 and key[0] == "plan":
            plan = cache.get(key)
            if plan is not None:
                found[key[2]] = plan
    return found


def describe_plan(plan, source: str) -> dict:
    """The plan's decision as JSON (getattr: the Plan class is being extended elsewhere)."""
    cfg = getattr(plan, "config", None)
    d = getattr(plan, "problem", None)
    pred = getattr(plan, "predicted_s", None)
    return {"backend": plan.backend, "config": getattr(cfg, "name", None),
            "decomposition": getattr(plan, "decomposition", None),
            "splits": getattr(plan, "splits", None), "source": getattr(plan, "source", None),
            "predicted_us": None if pred is None else pred * 1e6,
            "reason": (getattr(plan, "reason", "") or "")[:400],
            "pack": list(getattr(plan, "pack", ()) or ()),      # operands copied first
            "problem": None if d is None else f"{d.routine} {d.transa}{d.transb} m={d.m} "
            f"n={d.n} k={d.k} batch={d.batch} align={d.align}", "how_found": source}


def _public_plan(gpu, e, backend=None):
    """The plan by pyblasgemm.plan() for matmul's column-major problem Cᵀ = op(B)ᵀ op(A)ᵀ
    (the fallback when the plan cache did not show the call's own plan)."""
    dtype = "float32" if e["dtype"] == "float32_3xtf32" else e["dtype"]
    compute = "3xtf32" if dtype == "float32" else None
    return gpu.pb.plan(e["n"], e["m"], e["k"], dtype, compute=compute, transa=e["transb"],
                       transb=e["transa"], batch=e["batch"], backend=backend)


def _steady_s(gpu, fn) -> float:
    for _ in range(WARMUP):
        fn()
    gpu.sync()
    t0 = time.perf_counter()
    for _ in range(STEADY_CALLS):
        fn()
    gpu.sync()
    return (time.perf_counter() - t0) / STEADY_CALLS


def _err(exc) -> str:
    return f"{type(exc).__name__}: {str(exc)[:300]}"


#: how each row's operands are seeded (the row records its seed)
ROW_SEED = "per row: the first 4 bytes (little-endian) of sha256 of the entry id"


def route_of_plan(plan: dict | None, forced: str | None = None) -> str | None:
    """A row's route as the suite writes it ('backend config decomposition'), from a
    :func:`describe_plan` record; ``forced`` where no plan was seen (a forced backend).

    >>> route_of_plan({"backend": "tensorcore", "config": "sliced_64x64x32_w2x2_s4_g8",
    ...                "decomposition": "sliced"})
    'tensorcore sliced_64x64x32_w2x2_s4_g8 sliced'
    >>> route_of_plan(None, "cublas"), route_of_plan({"error": "..."})
    ('cublas', None)
    """
    if not plan or not plan.get("backend"):
        return forced
    cfg = plan.get("config")
    return " ".join(x for x in (plan["backend"], cfg, plan.get("decomposition") if cfg else None)
                    if x)


def run_entry(gpu: Gpu, e, rounds=3, int8_form="matmul") -> dict:
    """One row: every contender checked, then timed; speedups, plan, planner verdict."""
    seed = int.from_bytes(hashlib.sha256(e["id"].encode()).digest()[:4], "little")
    row = {k: e[k] for k in ("id", "class", "m", "n", "k", "batch", "dtype", "transa", "transb")}
    row.update(flops=2 * e["batch"] * e["m"] * e["n"] * e["k"], seed=seed, error=None)
    gpu.pb.clear_plan_cache()      # this entry's plans only; the last entry's launches go
    gpu.free()
    a, b, a_s, b_s = gpu.operands(e, seed)
    ref = _Reference(gpu, e, a, b, seed)
    cons = gpu.contenders(e, a, b, a_s, b_s, int8_form)
    out_bytes = 4 if e["dtype"] in ("int8", "float32_3xtf32") else 2
    keep, timed, results = [], {}, {}
    plans = {}
    for name, (call, fn) in cons.items():
        rec = {"call": call, "steady_s": None, "single_s": None, "first_call_s": None,
               "check": None, "error": None}
        results[name] = rec
        if isinstance(fn, str):
            rec["error" if name in OURS else "skipped"] = fn
            continue
        tol_row = TOL_ROW[e["dtype"]]
        if e["dtype"] == "float32_3xtf32" and name not in ("auto", "tensorcore"):
            tol_row = "fp32"
        try:
            gpu.poison(e, out_bytes)
            gpu.sync()
            t0 = time.perf_counter()
            c = fn()
            gpu.sync()
            rec["first_call_s"] = time.perf_counter() - t0
            rec["check"] = ref.check(gpu, c, tol_row)
            keep.append(c)     # alive until the row ends: no later output reuses its memory
            if rec["check"]["ok"]:
                timed[name] = fn
        except Exception as exc:  # one contender's failure is recorded, never fatal
            rec["error"] = _err(exc)
        if name in OURS and name != "cublas":
            found = _plans(gpu.pb)
            found = found.get(None, found.get("auto")) if name == "auto" else found.get(name)
            if found is not None:
                plans[name] = describe_plan(found, "plan cache after the call")
    for name in ("auto", "tensorcore"):     # fallback: the public planner on the same problem
        if name not in plans:
            try:
                plans[name] = describe_plan(_public_plan(gpu, e, None if name == "auto"
                                                         else name), "pyblasgemm.plan()")
            except Exception as exc:
                plans[name] = {"error": _err(exc)}
    del keep
    # timing: steady rounds with the contenders interleaved, then the single calls
    steady: dict = {n: [] for n in timed}
    for _ in range(rounds):
        for name, fn in list(timed.items()):
            try:
                steady[name].append(_steady_s(gpu, fn))
            except Exception as exc:
                results[name]["error"] = _err(exc)
                timed.pop(name)
    for name in timed:
        results[name]["steady_s"] = statistics.median(steady[name])
    try:
        single = gpu.timing.paired_single_us(timed, calls=SINGLE_CALLS, warmup=1)
    except Exception:        # find the culprit: each alone
        single = {}
        for name, fn in timed.items():
            try:
                single.update(gpu.timing.paired_single_us({name: fn}, SINGLE_CALLS, 1))
            except Exception as exc:
                results[name]["error"] = _err(exc)
    for name, us in single.items():
        results[name]["single_s"] = us * 1e-6
    for name in OURS:          # the route each of ours ran (cuBLAS: forced, no plan kept)
        if name in results:
            results[name]["route"] = route_of_plan(plans.get(name),
                                                   "cublas" if name == "cublas" else None)
    row["contenders"] = results
    row["plan"] = plans
    _verdicts(row, e)
    return row


def _verdicts(row, e) -> None:
    """Yardstick, speedups and the planner's verdict from the row's contender times."""
    res = row["contenders"]
    row["yardstick"] = None
    row["speedup"] = {}
    yard = {}
    for mode in MODES:
        times = {n: res[n][f"{mode}_s"] for n in YARDSTICKS
                 if n in res and res[n].get(f"{mode}_s")}
        if times:
            best = min(times, key=times.get)
            yard[mode] = {"name": best, "s": times[best]}
    if yard:
        row["yardstick"] = yard
        for name in OURS:
            row["speedup"][name] = {
                mode: (yard[mode]["s"] / res[name][f"{mode}_s"]
                       if mode in yard and res.get(name, {}).get(f"{mode}_s") else None)
                for mode in MODES}
    else:
        why = [res[n].get("skipped") or res[n].get("error") or
               ("check failed" if res[n].get("check") else None) for n in YARDSTICKS if n in res]
        row["yardstick_none_why"] = "; ".join(w for w in why if w) or "no yardstick ran"
    within, best_forced = {}, {}
    for mode in MODES:
        forced = {n: res[n][f"{mode}_s"] for n in planner_candidates(e)
                  if res.get(n, {}).get(f"{mode}_s")}
        auto = res.get("auto", {}).get(f"{mode}_s")
        if forced and auto:
            best = min(forced, key=forced.get)
            best_forced[mode] = best
            within[mode] = bool(auto <= WITHIN * forced[best])
        else:
            within[mode] = None
    plan = (row.get("plan") or {}).get("auto") or {}
    row["planner"] = {"choice": plan.get("backend"), "best_forced": best_forced,
                      "picked_best": {m: plan.get("backend") == b for m, b in best_forced.items()},
                      "within_5pct": within}
    bad = [n for n in OURS if (res.get(n, {}).get("check") or {}).get("ok") is False]
    err = [n for n in OURS if res.get(n, {}).get("error")]
    row["status"] = "check_failed" if bad else ("error" if err else "ok")


# ---------------------------------------------------------------------------------------------
# Files and the command line
# ---------------------------------------------------------------------------------------------

def _git(*args) -> str | None:
    """git's output in this checkout ('' for none), or None where there is no git."""
    try:
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True,
                              timeout=5, check=True).stdout.strip()
    except Exception:
        return None


def plot_or_args(description: str, quick_help: str, plot, argv=None, extra=None):
    """The measuring benchmarks' shared command line: ``--out`` (results JSON, or with
    ``--plot`` the PNG), ``--quick`` (``quick_help``) and ``--plot JSON...``; ``extra(parser)``
    adds a script's own options. With ``--plot``, draws those result files through
    ``plot(files, out)`` and returns None; otherwise returns the parsed arguments.

    >>> plot_or_args("demo", "fewer shapes", None, ["--out", "r.json", "--quick"]).quick
    True
    >>> plot_or_args("demo", "", None, ["--out", "r.json", "--n", "3"],
    ...              extra=lambda ap: ap.add_argument("--n", type=int)).n
    3
    """
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--out", required=True, help="results JSON (with --plot: the PNG)")
    ap.add_argument("--quick", action="store_true", help=quick_help)
    ap.add_argument("--plot", nargs="+", metavar="JSON", help="plot these result files instead of measuring")
    if extra is not None:
        extra(ap)
    args = ap.parse_args(argv)
    if args.plot:
        plot(args.plot, args.out)
        print("wrote", args.out)
        return None
    return args


def write_doc(doc: dict, out) -> None:
    """Write a results document (indented JSON) to ``out``, making its folder, and say where."""
    path = pathlib.Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1, default=str))
    print("wrote", out)


def meta(gpu, seed=ROW_SEED) -> dict:
    """Device, driver, runtime, versions, date and commit (the suite's own collector, plus the
    full SHA, PyTorch's matmul settings and the environment that steers the contenders), and
    the provenance every results JSON carries (``suite.provenance``: ``seed``, the
    ``PYBLASGEMM_*`` ``settings``, the ``nvrtc`` version, also in ``versions``). ``seed``: the
    operands' seed of the script that writes the file (this one's: a rule per row)."""
    from pyblasgemm.benchmarks.suite import _Env, provenance
    info = _Env("gpu").info()
    info.update(provenance(seed))
    info["versions"]["nvrtc"] = info["nvrtc"]
    given = os.environ.get("GIT_SHA")
    info["git_sha"] = given or _git("rev-parse", "HEAD") or None
    status = _git("status", "--porcelain", "--untracked-files=no")
    info["git_dirty"] = None if status is None else bool(status)   # None: no git here
    if given:
        # a copied tree (the device runner) can carry another checkout's .git: the caller's
        # GIT_SHA names the code, and the local git's view of it says nothing
        info["versions"]["git"] = given
        info["git_dirty"] = None
    info["python"] = platform.python_version()
    if gpu.torch is not None:
        m = gpu.torch.backends.cuda.matmul
        info["torch_matmul"] = {k: getattr(m, k, None) for k in (
            "allow_tf32", "allow_fp16_reduced_precision_reduction",
            "allow_bf16_reduced_precision_reduction")}
    info["env"] = {k: v for k, v in os.environ.items()
                   if k.startswith("PYBLASGEMM_") or k in ("CUPY_TF32", "CUBLAS_WORKSPACE_CONFIG",
                                                           "CUDA_VISIBLE_DEVICES")}
    return info


METHOD = {
    "operands": "fresh uniform [-1, 1) (int8: -128..127) drawn on the GPU per entry (seed from "
                "the entry id); every contender on the same bytes (torch views of CuPy memory)",
    "check": f"first call of each contender, {SAMPLES} sampled output entries vs float64 "
             "(int64) from host copies of A's rows and B's columns, error relative to "
             "|A|@|B|, tolerance of pyblasgemm.benchmarks.suite.tolerance; a contender that "
             "fails is not timed",
    "steady": f"{WARMUP} warm-up calls, {STEADY_CALLS} back to back, one device synchronize, "
              f"perf_counter wall time / {STEADY_CALLS} (median over rounds, contenders "
              "interleaved)",
    "single": f"synchronize, one call, synchronize (perf_counter), median of {SINGLE_CALLS} "
              "(bench/timing.py paired_single_us, contenders interleaved)",
    "yardstick": "faster of torch.matmul and cupy.matmul (cuBLAS); int8: torch._int_mm; "
                 "float32_3xtf32: SGEMM with TF32 off",
    "speedup": "yardstick s / ours s (> 1: pyblasgemm faster)",
    "planner": f"auto within {WITHIN:.2f}x of the faster forced backend it chooses between "
               "(3xtf32: ours or cuBLAS's SGEMM); plan read from the plan cache after auto's first "
               "call (else pyblasgemm.plan on the same problem)",
}


def _json_default(x):
    """NumPy scalars (and anything else odd in a plan) as plain JSON values."""
    return x.item() if isinstance(x, np.generic) else str(x)


def _write(doc, path) -> None:
    """Write atomically: a run killed mid-write keeps the previous complete file."""
    doc["summary"] = summarize(doc["rows"])
    tmp = pathlib.Path(f"{path}.tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=_json_default))
    os.replace(tmp, path)


def _free_name(device_name: str) -> pathlib.Path:
    dev = "".join(ch if ch.isalnum() else "_" for ch in device_name).strip("_").lower()
    base = ROOT / "bench" / "results" / f"heldout_{dev}_{datetime.date.today().isoformat()}"
    path, n = pathlib.Path(f"{base}.json"), 1
    while path.exists():            # never overwrite a measurement
        n += 1
        path = pathlib.Path(f"{base}_run{n}.json")
    return path


def _dtype_list(text):
    if not text:
        return None
    names = [DTYPE_ALIASES.get(s.strip().lower(), s.strip().lower()) for s in text.split(",")
             if s.strip()]
    bad = [n for n in names if n not in corpus.DTYPES]
    if bad:
        raise SystemExit(f"--dtypes: unknown {bad}; choose from {', '.join(corpus.DTYPES)}")
    return set(names)


def _class_list(text):
    if not text:
        return None
    names = {s.strip() for s in text.split(",") if s.strip()}
    bad = sorted(names - set(corpus.CLASSES))
    if bad:
        raise SystemExit(f"--classes: unknown {bad}; choose from {', '.join(corpus.CLASSES)}")
    return names


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python bench/heldout.py",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--corpus", default=str(corpus.CORPUS), help="corpus file (%(default)s)")
    ap.add_argument("--out", default=None,
                    help="results JSON (default: bench/results/heldout_<gpu>_<date>[_runN].json)")
    ap.add_argument("--resume", default=None, metavar="FILE",
                    help="continue FILE: its rows are kept and not run again")
    ap.add_argument("--max-seconds", type=float, default=None, metavar="S",
                    help="stop cleanly before an entry that would end past S seconds")
    ap.add_argument("--classes", default=None, help=f"comma list of {', '.join(corpus.CLASSES)}")
    ap.add_argument("--dtypes", default=None,
                    help="comma list of float16,bfloat16,int8,float32_3xtf32 (or fp16,bf16,3xtf32)")
    ap.add_argument("--ids", default=None, help="comma list of entry ids")
    ap.add_argument("--limit", type=int, default=None, help="at most N entries (after filters)")
    ap.add_argument("--order", default="interleave", choices=["interleave", "corpus"],
                    help="interleave: classes in turn, so a cut-short run covers them all")
    ap.add_argument("--rounds", type=int, default=3,
                    help="steady-state rounds of 20 calls per contender, contenders interleaved, "
                         "median (default %(default)s)")
    ap.add_argument("--int8-form", default="matmul", choices=["matmul", "gemm"],
                    help="int8: matmul(A, B, dtype=int32) (uncached call path) or "
                         "gemm('N', 'N', A, B) (int32, cached call path)")
    ap.add_argument("--dry-run", action="store_true", help="print the plan of runs and exit")
    ap.add_argument("--summary", default=None, metavar="FILE",
                    help="print the summary of a results file and exit")
    ap.add_argument("--note", default=None, help="free text stored in the results")
    ap.add_argument("--no-progress", action="store_true", help="no tqdm bar on stderr")
    return ap


def main(argv=None, gpu: Gpu | None = None) -> int:
    """The command line (``gpu``: a ready :class:`Gpu`, for the tests)."""
    args = parser().parse_args(argv)
    if args.summary:
        doc = json.loads(pathlib.Path(args.summary).read_text())
        print(format_summary(summarize(doc["rows"])))
        return 0
    corpus_path = pathlib.Path(args.corpus)
    corpus_doc = json.loads(corpus_path.read_text())
    ids = {s.strip() for s in args.ids.split(",")} if args.ids else None
    entries = select(corpus_doc["entries"], _class_list(args.classes), _dtype_list(args.dtypes),
                     ids, args.limit, args.order)
    done = {}
    if args.resume:
        prev = json.loads(pathlib.Path(args.resume).read_text())
        done = {r["id"]: r for r in prev["rows"]}
    todo = [e for e in entries if e["id"] not in done]
    if args.dry_run:
        if done:
            print(f"{len(done)} rows already in {args.resume}; {len(todo)} to run")
        dry_run(todo, args.rounds, args.int8_form)
        return 0
    try:
        if gpu is None:
            gpu = Gpu()
            if gpu.cp.cuda.runtime.getDeviceCount() < 1:
                raise RuntimeError("no CUDA device")
    except Exception as exc:
        print(f"error: the held-out benchmark needs CuPy and a CUDA device ({exc}); "
              f"--dry-run shows the plan", file=sys.stderr)
        return 2
    session = gpu.meta()
    session.update(started=datetime.datetime.now(datetime.timezone.utc)
                   .isoformat(timespec="seconds"), argv=sys.argv[1:] if argv is None else argv,
                   note=args.note)
    sha = hashlib.sha256(corpus_path.read_bytes()).hexdigest()
    if args.resume:
        doc, out = prev, pathlib.Path(args.out or args.resume)
        if doc["meta"]["device"]["name"] != session["device"]["name"]:
            print(f"error: {args.resume} was measured on {doc['meta']['device']['name']}, this "
                  f"is {session['device']['name']}: start a new file", file=sys.stderr)
            return 2
        if doc["corpus"]["sha256"] != sha:
            print("warning: the corpus file changed since this run began", file=sys.stderr)
        doc.setdefault("sessions", []).append(session)
    else:
        out = pathlib.Path(args.out) if args.out else _free_name(session["device"]["name"])
        if out.exists():
            print(f"error: {out} exists; --resume it or pick another --out", file=sys.stderr)
            return 2
        doc = {"schema": SCHEMA, "corpus": {"file": corpus_path.name, "sha256": sha,
                                            "entries": len(corpus_doc["entries"])},
               "meta": session, "sessions": [session], "method": dict(
                   METHOD, rounds=args.rounds, int8_form=args.int8_form), "rows": []}
    out.parent.mkdir(parents=True, exist_ok=True)
    print(f"device: {session['device']['name']}; {len(todo)} entries to run; writing {out}",
          file=sys.stderr)
    bar = None
    if not args.no_progress:
        try:
            from tqdm import tqdm
            bar = tqdm(total=len(todo), unit="shape", file=sys.stderr)
        except ImportError:
            pass
    t_start, rc = time.perf_counter(), 0
    for e in todo:
        elapsed = time.perf_counter() - t_start
        if args.max_seconds and elapsed + estimate_s(e, args.rounds) > args.max_seconds:
            session["stopped"] = f"--max-seconds {args.max_seconds:g} reached after " \
                                 f"{elapsed:.0f} s before {e['id']}"
            print(f"stopping: {session['stopped']}; go on with --resume {out}", file=sys.stderr)
            break
        if bar is not None:
            bar.set_description(f"{e['id']} {e['dtype']}")
        t0 = time.perf_counter()
        try:
            row = run_entry(gpu, e, args.rounds, args.int8_form)
        except Exception as exc:    # operands or reference (e.g. out of memory): the row says so
            row = {k: e[k] for k in ("id", "class", "m", "n", "k", "batch", "dtype", "transa",
                                     "transb")}
            row.update(error=_err(exc), status="error", contenders={}, speedup={},
                       yardstick=None, planner=None)
        row["wall_s"] = time.perf_counter() - t0
        doc["rows"].append(row)
        _write(doc, out)
        if bar is not None:
            bar.update(1)
        sp = row.get("speedup") or {}
        print(f"{row['id']:16} {row['dtype']:15} {row['status']:12} " + "  ".join(
            f"{n} {sp[n]['steady']:.2f}/{sp[n]['single']:.2f}" if sp.get(n, {}).get("steady")
            and sp[n].get("single") else f"{n} -" for n in OURS)
            + f"  plan {((row.get('plan') or {}).get('auto') or {}).get('backend')}", flush=True)
        try:
            gpu.sync()
        except Exception as exc:    # the CUDA context is gone: later rows would all fail
            session["stopped"] = f"CUDA context lost after {e['id']}: {_err(exc)}"
            print(f"stopping: {session['stopped']}; go on with --resume {out} in a new process",
                  file=sys.stderr)
            rc = 3
            break
    if bar is not None:
        bar.close()
    session["finished"] = datetime.datetime.now(datetime.timezone.utc).isoformat(
        timespec="seconds")
    _write(doc, out)
    print(format_summary(doc["summary"]))
    print(f"wrote {out}")
    return rc


if __name__ == "__main__":
    sys.exit(main())


def readme_table(docs: dict) -> str:
    """The README's held-out table from result files: ``docs`` maps a GPU label ('H100') to its
    loaded JSON. Per class and overall, the geometric mean of yardstick / ours for ``auto``
    (steady / single call) and for our kernels forced (steady), then the planner's share of
    shapes within 5 % of the faster forced backend (steady / single)."""
    labels = list(docs)
    head = ("| class (shapes) | " + " | ".join(f"{g} auto, steady / single" for g in labels)
            + " | " + " | ".join(f"{g} ours forced" for g in labels) + " |")
    lines = [head, "|---" * (1 + 2 * len(labels)) + "|"]

    def cell(part, who, how):
        return f"{part[who][how]['geomean']:.2f}"

    summaries = {g: d["summary"]["all"] for g, d in docs.items()}
    first = next(iter(summaries.values()))
    for cls in list(first["by_class"]) + ["overall"]:
        parts = {g: (s["overall"] if cls == "overall" else s["by_class"][cls])
                 for g, s in summaries.items()}
        name = "**all**" if cls == "overall" else cls.replace("_", " ")
        row = [f"{name} ({parts[labels[0]]['rows']})"]
        row += [f"{cell(parts[g], 'auto', 'steady')} / {cell(parts[g], 'auto', 'single')}" for g in labels]
        row += [cell(parts[g], "tensorcore", "steady") for g in labels]
        lines.append("| " + " | ".join(row) + " |")
    within = [f"{s['overall']['planner_within_5pct']['steady']['pct']:.0f} % / "
              f"{s['overall']['planner_within_5pct']['single']['pct']:.0f} %" for s in summaries.values()]
    lines.append("| planner within 5 % of the best, steady / single | " + " | ".join(within)
                 + " |" + " |" * len(labels))
    return "\n".join(lines)
