"""Epilogue benchmarks (issue: fusion): pyblasgemm's GEMM + epilogue against the same work
done by PyTorch's unfused sequence, on the same bytes, in one process.

    PYTHONPATH=. python bench/fusion.py --out bench/results/fusion_<gpu>_<date>_<sha>.json

Cases (the issue's targets):

* bias + GELU, float16 and bfloat16, at 4096³, 8192 x 11008 x 4096 and 16 x 11008 x 4096
  (M x N x K): ``matmul(x, w, bias=b, activation='gelu')`` against the faster of
  ``gelu(x @ w + b)`` and ``gelu(addmm(b, x, w))``;
* bias + tanh GELU, float16, the same shapes: the epilogue cuBLASLt fuses, against PyTorch's
  fused ``torch._addmm_activation(b, x, w, use_gelu=True)`` and its unfused sequence;
* the epilogue's own cost: ``matmul(x, w)`` against ``matmul(x, w, bias=b, activation='gelu')``
  at 8192³ (float16);
* int8: ``matmul(xq, wq, scale_a=, scale_b=, bias=, activation='relu', dtype=float16)`` against
  ``torch._int_mm`` followed by the same elementwise work;
* GEMM -> GELU -> GEMM: ``fused_mlp(x, w1, w2, b1, b2)`` against PyTorch's
  ``gelu(x @ w1 + b1) @ w2 + b2`` (float16), where the intermediate would fit on chip
  (4096 x 1024 -> 1024 -> 1024) and where it would not (16 x 4096 -> 11008 -> 4096);
* grouped (mixture of experts, bfloat16, N = K = 4096, M per expert drawn from 0..2048 with a
  fixed seed): ``grouped_matmul(a, b, offsets=)`` against a loop of ``torch.matmul`` and
  ``torch._grouped_mm`` where it runs, for 8 and 64 experts; and 64 small experts (M 0..64,
  N = K = 1024) and 128 (M 0..64, N = K = 2048), where the loop is host-bound; pyblasgemm with
  the offsets on the host and on the GPU (int32, as ``offs``: the table built on the device).
  ``--grouped`` runs these cases alone, ``--grouped-small`` the small-expert ones alone.

Each contender's output is compared with the fastest PyTorch sequence's first (max relative
error over the whole output) before it is timed. Steady: CUDA events around back-to-back
calls (bench/timing.py); single call: host wall clock of one call plus synchronize, median of
20. Ratios > 1: pyblasgemm is faster.
"""
from __future__ import annotations

import json
import pathlib
import statistics
import sys
import time

import ml_dtypes
import numpy as np


ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.heldout import meta, plot_or_args, write_doc  # noqa: E402
from bench.timing import event_median_s  # noqa: E402

SHAPES = [(4096, 4096, 4096), (8192, 11008, 4096), (16, 11008, 4096)]
INT8_SHAPES = [(4096, 4096, 4096), (8192, 11008, 4096), (32, 11008, 4096)]   # _int_mm: M > 16


class _Gpu:
    def __init__(self):
        import cupy
        import torch

        import pyblasgemm

        self.cp, self.torch, self.pb = cupy, torch, pyblasgemm
        self.torch_ok = torch.cuda.is_available()

    def t(self, x):
        """A torch view of a CuPy array's memory (bfloat16 through a uint16 view)."""
        torch = self.torch
        if x.dtype.name == "bfloat16":
            return torch.as_tensor(x.view(self.cp.uint16), device="cuda").view(torch.bfloat16)
        return torch.as_tensor(x, device="cuda")

    def sync(self):
        self.cp.cuda.Device().synchronize()
        self.torch.cuda.synchronize()


def _single_s(gpu, fn, n=20):
    out = []
    for _ in range(n):
        gpu.sync()
        t0 = time.perf_counter()
        fn()
        gpu.sync()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def _rel_err(gpu, ours, ref) -> float:
    """max |ours - ref| / max |ref| over the whole output (ours: CuPy, ref: torch)."""
    g, w = gpu.t(ours).float(), ref.float()
    return float((g - w).abs().max() / w.abs().max().clamp_min(1e-30))


def _contend(gpu, ours: dict, theirs: dict, tol: float) -> dict:
    """{name: {steady_s, single_s, err}} for every contender; ratios of the best of each side."""
    res = {}
    ref = None
    for name, fn in theirs.items():
        try:
            out = fn()
            ref = out if ref is None else ref
            res[name] = {"steady_s": event_median_s(fn), "single_s": _single_s(gpu, fn), "side": "torch"}
        except Exception as exc:  # report and go on
            res[name] = {"error": f"{type(exc).__name__}: {str(exc)[:200]}", "side": "torch"}
    for name, fn in ours.items():
        try:
            out = fn()
            gpu.sync()
            err = None if ref is None else _rel_err(gpu, out, ref)
            row = {"side": "ours", "max_rel_err_vs_torch": err}
            if err is not None and not err <= tol:
                row["error"] = f"differs from PyTorch's result: {err:.3g} > {tol:.3g}; not timed"
            else:
                row.update(steady_s=event_median_s(fn), single_s=_single_s(gpu, fn))
            res[name] = row
        except Exception as exc:
            res[name] = {"error": f"{type(exc).__name__}: {str(exc)[:200]}", "side": "ours"}
    ratios = {}
    for how in ("steady_s", "single_s"):
        best = {side: min((r[how] for r in res.values() if r.get("side") == side and how in r), default=None)
                for side in ("ours", "torch")}
        if best["ours"] and best["torch"]:
            ratios[f"ratio_{how[:-2]}"] = best["torch"] / best["ours"]
    return {"contenders": res, **ratios}


def bias_gelu(gpu, m, n, k, dtype) -> dict:
    cp, torch, pb = gpu.cp, gpu.torch, gpu.pb
    x = (cp.random.uniform(-1, 1, (m, k), dtype=cp.float32)).astype(dtype)
    w = (cp.random.uniform(-1, 1, (k, n), dtype=cp.float32) / 64).astype(dtype)
    b = cp.random.uniform(-1, 1, (n,), dtype=cp.float32).astype(dtype)
    tx, tw, tb = gpu.t(x), gpu.t(w), gpu.t(b)
    gelu = torch.nn.functional.gelu
    theirs = {"torch gelu(x@w + b)": lambda: gelu(torch.matmul(tx, tw) + tb),
              "torch gelu(addmm(b, x, w))": lambda: gelu(torch.addmm(tb, tx, tw))}
    ours = {"pyblasgemm matmul(bias, gelu)": lambda: pb.matmul(x, w, bias=b, activation="gelu")}
    if dtype == "bfloat16":
        # NumPy's result type for bfloat16 operands is float32 (twice PyTorch's output bytes);
        # dtype= asks for PyTorch's bfloat16
        ours["pyblasgemm matmul(bias, gelu, dtype=bfloat16)"] = lambda: pb.matmul(
            x, w, bias=b, activation="gelu", dtype=x.dtype)
    tol = 2.0**-8 * 4 if dtype == "bfloat16" else 2.0**-11 * 4
    row = _contend(gpu, ours, theirs, tol)
    pb.matmul(x, w, bias=b, activation="gelu")
    from pyblasgemm.epilogue import last_route

    row["route"] = last_route()
    return row


def bias_gelu_tanh(gpu, m, n, k) -> dict:
    """The tanh GELU, which cuBLASLt fuses: against PyTorch's own fused cuBLASLt call
    (``torch._addmm_activation(..., use_gelu=True)``) and its unfused sequence."""
    cp, torch, pb = gpu.cp, gpu.torch, gpu.pb
    x = cp.random.uniform(-1, 1, (m, k), dtype=cp.float32).astype(cp.float16)
    w = (cp.random.uniform(-1, 1, (k, n), dtype=cp.float32) / 64).astype(cp.float16)
    b = cp.random.uniform(-1, 1, (n,), dtype=cp.float32).astype(cp.float16)
    tx, tw, tb = gpu.t(x), gpu.t(w), gpu.t(b)
    gelu = torch.nn.functional.gelu
    theirs = {"torch gelu_tanh(addmm(b, x, w))": lambda: gelu(torch.addmm(tb, tx, tw), approximate="tanh")}
    if hasattr(torch, "_addmm_activation"):
        theirs["torch._addmm_activation(use_gelu)"] = lambda: torch._addmm_activation(tb, tx, tw, use_gelu=True)
    ours = {"pyblasgemm matmul(bias, gelu_tanh)": lambda: pb.matmul(x, w, bias=b, activation="gelu_tanh")}
    row = _contend(gpu, ours, theirs, 2.0**-11 * 8)
    pb.matmul(x, w, bias=b, activation="gelu_tanh")
    from pyblasgemm.epilogue import last_route

    row["route"] = last_route()
    return row


def epilogue_cost(gpu, s=8192) -> dict:
    cp, pb = gpu.cp, gpu.pb
    x = cp.random.uniform(-1, 1, (s, s), dtype=cp.float32).astype(cp.float16)
    w = (cp.random.uniform(-1, 1, (s, s), dtype=cp.float32) / 64).astype(cp.float16)
    b = cp.zeros((s,), cp.float16)
    plain = event_median_s(lambda: pb.matmul(x, w))
    fused = event_median_s(lambda: pb.matmul(x, w, bias=b, activation="gelu"))
    return {"plain_s": plain, "with_epilogue_s": fused, "overhead": fused / plain - 1}


def int8_dequant(gpu, m, n, k) -> dict:
    cp, torch, pb = gpu.cp, gpu.torch, gpu.pb
    xq = cp.random.randint(-128, 128, (m, k), dtype=cp.int8)
    wq = cp.random.randint(-128, 128, (k, n), dtype=cp.int8)
    sa = cp.random.uniform(1e-3, 1e-2, (m,), dtype=cp.float32)
    sb = cp.random.uniform(1e-3, 1e-2, (n,), dtype=cp.float32)
    b = cp.random.uniform(-1, 1, (n,), dtype=cp.float32).astype(cp.float16)
    txq, twq, tsa, tsb, tb = (gpu.t(v) for v in (xq, wq, sa, sb, b))
    twq_t = twq.t().contiguous().t()     # _int_mm wants the second operand column-major

    def torch_seq():
        acc = torch._int_mm(txq, twq_t)
        return torch.relu((acc.float() * tsa[:, None] * tsb) + tb).half()

    call = lambda: pb.matmul(xq, wq, scale_a=sa, scale_b=sb, bias=b, activation="relu", dtype=cp.float16)  # noqa: E731
    row = _contend(gpu, {"pyblasgemm matmul(int8, dequant, bias, relu)": call},
                   {"torch _int_mm + dequant + bias + relu": torch_seq}, 2.0**-11 * 4)
    from pyblasgemm.epilogue import last_route

    call()
    row["route"] = last_route()      # fused in our store, or the GEMM and one pass
    return row


def mlp(gpu, t, f, h, o) -> dict:
    cp, torch, pb = gpu.cp, gpu.torch, gpu.pb
    x = cp.random.uniform(-1, 1, (t, f), dtype=cp.float32).astype(cp.float16)
    w1 = (cp.random.uniform(-1, 1, (f, h), dtype=cp.float32) / 32).astype(cp.float16)
    w2 = (cp.random.uniform(-1, 1, (h, o), dtype=cp.float32) / 32).astype(cp.float16)
    b1 = cp.random.uniform(-1, 1, (h,), dtype=cp.float32).astype(cp.float16)
    b2 = cp.random.uniform(-1, 1, (o,), dtype=cp.float32).astype(cp.float16)
    tx, tw1, tw2, tb1, tb2 = (gpu.t(v) for v in (x, w1, w2, b1, b2))
    gelu = torch.nn.functional.gelu
    theirs = {"torch gelu(x@w1 + b1) @ w2 + b2": lambda: torch.addmm(tb2, gelu(torch.addmm(tb1, tx, tw1)), tw2)}
    ours = {"pyblasgemm fused_mlp": lambda: pb.fused_mlp(x, w1, w2, b1, b2)}
    row = _contend(gpu, ours, theirs, 2.0**-11 * 8)
    row["plan"] = pb.mlp_plan(t, f, h, o).explain()
    return row


def grouped(gpu, experts, seed=5, max_rows=2048, width=4096) -> dict:
    cp, torch, pb = gpu.cp, gpu.torch, gpu.pb
    sizes = np.random.default_rng(seed).integers(0, max_rows + 1, experts)
    ends = np.cumsum(sizes)
    k = n = width
    a = cp.random.uniform(-1, 1, (int(ends[-1]), k), dtype=cp.float32).astype(ml_dtypes.bfloat16)
    b = (cp.random.uniform(-1, 1, (experts, k, n), dtype=cp.float32) / 64).astype(ml_dtypes.bfloat16)
    ta, tb = gpu.t(a), gpu.t(b)
    offs = torch.as_tensor(ends.astype(np.int32), device="cuda")
    starts = [0] + ends[:-1].tolist()

    def loop():
        out = torch.empty((int(ends[-1]), n), dtype=torch.bfloat16, device="cuda")
        for g, (s, e) in enumerate(zip(starts, ends.tolist())):
            if e > s:
                torch.matmul(ta[s:e], tb[g], out=out[s:e])
        return out

    theirs = {"torch loop of matmul": loop}
    if hasattr(torch, "_grouped_mm"):
        theirs["torch._grouped_mm"] = lambda: torch._grouped_mm(ta, tb, offs=offs)
    dev_ends = cp.asarray(ends.astype(np.int32))
    ours = {"pyblasgemm grouped_matmul": lambda: pb.grouped_matmul(a, b, offsets=ends),
            "pyblasgemm grouped_matmul, offsets on the GPU": lambda: pb.grouped_matmul(a, b, offsets=dev_ends)}
    row = _contend(gpu, ours, theirs, 2.0**-8 * 8)
    row["tokens"], row["max_rows"], row["width"] = int(ends[-1]), max_rows, width
    pb.grouped_matmul(a, b, offsets=ends)
    from pyblasgemm.epilogue import last_route

    row["route"] = last_route()
    return row


def _label(c) -> str:
    shape = {"grouped experts": lambda: f"{c['experts']} experts" + (
                 f" (M<={c['max_rows']}, {c['width']})" if c.get("max_rows", 2048) != 2048 else ""),
             "fused_mlp gelu": lambda: f"{c['tokens']}x{c['features']}->{c['hidden']}"}.get(
        c["case"], lambda: f"{c['m']}x{c['n']}x{c['k']}")()
    return f"{c['case']} {c.get('dtype', '')} {shape}"


def plot(paths, out) -> None:
    """A bar chart of the steady-state ratios of result files (one bar per file and case)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    docs = [json.loads(pathlib.Path(p).read_text()) for p in paths]
    labels = [_label(c) for c in docs[0]["cases"] if "ratio_steady" in c]
    fig, ax = plt.subplots(figsize=(9, 0.32 * len(labels) + 1.2))
    height = 0.8 / len(docs)
    for i, doc in enumerate(docs):
        ratio = {_label(c): c["ratio_steady"] for c in doc["cases"] if "ratio_steady" in c}
        ys = [j + i * height for j in range(len(labels))]
        ax.barh(ys, [ratio.get(lb, 0) for lb in labels], height, label=doc["device"]["name"])
    ax.axvline(1.0, color="k", lw=0.8)
    ax.set_yticks([j + 0.4 - height / 2 for j in range(len(labels))], labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("speed relative to the faster PyTorch sequence (steady state; > 1: pyblasgemm faster)")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


#: the seed of CuPy's random generator the cases draw their operands from, in order
SEED = 20261201


#: the grouped cases (experts, most rows an expert gets, k = n); ``--grouped`` runs these alone
GROUPED_CASES = ((8, 2048, 4096), (64, 2048, 4096), (64, 64, 1024), (128, 64, 2048))


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    small_only = "--grouped-small" in argv      # (the small-expert cases alone: a shorter one)
    if small_only:
        argv.remove("--grouped-small")
    grouped_only = "--grouped" in argv or small_only   # (the grouped cases alone: one short device call)
    if "--grouped" in argv:
        argv.remove("--grouped")
    args = plot_or_args(__doc__.split("\n")[0], "the first shape of each list only", plot, argv)
    if args is None:
        return 0
    gpu = _Gpu()
    gpu.cp.random.seed(SEED)          # every case's operands, drawn in order from CuPy's RNG
    doc = {"schema": "pyblasgemm-fusion/1",
           **meta(gpu, seed=f"CuPy's global RNG seeded {SEED}; expert sizes numpy default_rng(5)"),
           "method": __doc__, "cases": []}
    shapes = [] if grouped_only else SHAPES[:1] if args.quick else SHAPES
    for dtype in ("float16", "bfloat16"):
        for m, n, k in shapes:
            row = {"case": "bias+gelu", "dtype": dtype, "m": m, "n": n, "k": k,
                   **bias_gelu(gpu, m, n, k, dtype)}
            doc["cases"].append(row)
            print(row["case"], dtype, m, n, k, {key: v for key, v in row.items() if key.startswith("ratio")},
                  flush=True)
    for m, n, k in shapes:
        row = {"case": "bias+gelu_tanh", "dtype": "float16", "m": m, "n": n, "k": k,
               **bias_gelu_tanh(gpu, m, n, k)}
        doc["cases"].append(row)
        print(row["case"], m, n, k, row["route"], {key: v for key, v in row.items() if key.startswith("ratio")},
              flush=True)
    if not grouped_only:
        doc["cases"].append({"case": "epilogue cost 8192^3 float16", **epilogue_cost(gpu)})
        print(doc["cases"][-1], flush=True)
    for m, n, k in ([] if grouped_only else INT8_SHAPES[:1] if args.quick else INT8_SHAPES):
        row = {"case": "int8 dequant+bias+relu", "dtype": "int8", "m": m, "n": n, "k": k,
               **int8_dequant(gpu, m, n, k)}
        doc["cases"].append(row)
        print(row["case"], m, n, k, {key: v for key, v in row.items() if key.startswith("ratio")}, flush=True)
    for t, f, h, o in (() if grouped_only else ((4096, 1024, 1024, 1024), (16, 4096, 11008, 4096))):
        row = {"case": "fused_mlp gelu", "dtype": "float16", "tokens": t, "features": f, "hidden": h,
               "out": o, **mlp(gpu, t, f, h, o)}
        doc["cases"].append(row)
        print(row["case"], t, f, h, o, {key: v for key, v in row.items() if key.startswith("ratio")}, flush=True)
    cases = GROUPED_CASES[:1] if args.quick else GROUPED_CASES
    for experts, max_rows, width in [c for c in cases if c[1] <= 64] if small_only else cases:
        row = {"case": "grouped experts", "dtype": "bfloat16", "experts": experts,
               **grouped(gpu, experts, max_rows=max_rows, width=width)}
        doc["cases"].append(row)
        print(row["case"], experts, max_rows, width, row["route"][:60],
              {key: v for key, v in row.items() if key.startswith("ratio")}, flush=True)
    write_doc(doc, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
