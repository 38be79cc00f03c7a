"""Float8 products on the GPU (issue 36): pyblasgemm's mma.sync float8 kernel against
``torch._scaled_mm`` (cuBLASLt) on the same bytes, same process.

    GIT_SHA=<sha> PYTHONPATH=.:bench python bench/fp8.py --out bench/results/fp8_<gpu>_<date>_<sha>.json

Rows: 4096³ and 8192³, and decode M = 1, 16, 64 tokens over public model layers (Llama-3-8B's
4096 -> 4096 o projection, 4096 -> 14336 gate/up, 14336 -> 4096 down: N x K = 4096 x 4096,
14336 x 4096, 4096 x 14336); e4m3 operands, ``a`` (M x K) row-major, ``b`` (K x N)
column-major (``torch._scaled_mm``'s layout: both K-contiguous), bfloat16 output; scales
per-tensor (one float32 each), row-wise (``scale_a`` per row of a, ``scale_b`` per column
of b: ``_scaled_mm``'s row-wise mode) and blocks (1 x 128 of a, 128 x 128 of b: ours against
``_scaled_mm`` only where this PyTorch takes those scales as given and agrees with the
dequantized product; otherwise the row records why and has our times alone).

Contenders: ``pyblasgemm.matmul`` on the CUDA tensors (the array door), the same call on
CuPy views of the same memory (the route rule: cuBLASLt for per-tensor and row-wise scales,
our kernels for block scales), that call with each route forced (``cupy arrays, ours``:
``backend='tensorcore'``, on sm_90 the Hopper kernel, block scales included; ``cupy arrays,
cuBLASLt``: ``backend='cublas'``, block scales included; a refusal is recorded), ours forced
onto the mma.sync kernel (``cupy arrays, mma.sync``), and ``torch._scaled_mm``;
``lt_over_ours_*``, ``lt_over_mma_sync_*`` = that contender's time / the cuBLASLt route's.
steady = CUDA events around 20 back-to-back calls (torch's current stream, where every contender queues), single = one call
waited for (host time included), median of 5 each; ``speedup_vs_scaled_mm_*`` =
``_scaled_mm``'s time / ours (above 1: ours faster). Every result is checked against
``_scaled_mm``'s first (within two bfloat16 steps plus 2^-12 of the terms' magnitude); a
row that fails (or that ``_scaled_mm`` refuses) records why.

Host rows (``host``): µs of host time per repeated call (the replay of the recorded launch,
pyblasgemm.fp8.replay) at 64 x 256 x 256 (e4m3, bfloat16 out; the GPU's few µs per product
never throttle the host), per scale layout: torch tensors, CuPy arrays of the same bytes,
``torch._scaled_mm`` (per-tensor and row-wise), the CuPy call forced onto cuBLASLt
(``cupy arrays, cuBLASLt``: that route's replay) and ``pyblasgemm.gemm('N', 'N', ...)`` on
the CuPy arrays (``cupy gemm``, float32 out); bench/timing.py's paired rounds (200 calls a
round, 15 rounds, each contender's rounds interleaved), after checking that the tensors' and
the CuPy arrays' results are the same bits. ``torch_vs_cupy`` (the bar: the plain products'
torch calls cost what CuPy calls cost) and ``speedup_vs_scaled_mm_host``.
"""
from __future__ import annotations

import argparse
import sys
import time
import types

sys.path.insert(0, __import__("pathlib").Path(__file__).resolve().parent.as_posix())
sys.path.insert(0, __import__("pathlib").Path(__file__).resolve().parents[1].as_posix())

from bench.heldout import geomean, meta, write_doc  # noqa: E402
from timing import paired_host_us, torch_single_s, torch_steady_s  # noqa: E402

SQUARE = (4096, 8192)
LAYERS = {"llama3-8b o": (4096, 4096), "llama3-8b gate/up": (14336, 4096), "llama3-8b down": (4096, 14336)}
TOKENS = (1, 16, 64)
SCALES = ("tensor", "rowwise", "blocks")
#: the host rows' product (m, n, k): small enough that the GPU keeps up with the host
HOST_SHAPE = (64, 256, 256)


def shapes():
    """(label, m, n, k) of every row."""
    out = [(f"square {s}", s, s, s) for s in SQUARE]
    for layer, (n, k) in LAYERS.items():
        out += [(f"{layer} decode", m, n, k) for m in TOKENS]
    return out


def _on_family(fn, family):
    """``fn`` with float8 products on one kernel family ('sm80': mma.sync;
    pyblasgemm.kernels.fp8.FAMILY)."""
    from pyblasgemm.kernels import fp8 as gpu

    def call():
        gpu.FAMILY = family
        try:
            return fn()
        finally:
            gpu.FAMILY = None
    return call


def _forced(fns, ca, cb, csa, csb, backend):
    """pyblasgemm.matmul on the CuPy views with ``backend=`` forcing one float8 route."""
    import ml_dtypes

    import pyblasgemm as pb

    def call():
        return pb.matmul(ca, cb, scale_a=csa, scale_b=csb, dtype=ml_dtypes.bfloat16, backend=backend)
    return call


def _as_torch(torch, x):
    """A CuPy bfloat16 result as a float32 CUDA tensor (through its bits)."""
    import cupy as cp

    return torch.from_dlpack(x.view(cp.int16)).view(torch.bfloat16).float()


def _first(r):
    """``torch._scaled_mm``'s result (a tuple ``(out, amax)`` before PyTorch 2.4)."""
    return r[0] if isinstance(r, tuple) else r


def cupy_view(cp, t):
    """A CuPy array on a tensor's memory (float8 / bfloat16 through their bits)."""
    import ml_dtypes
    import numpy as np
    import torch

    bits = {torch.float8_e4m3fn: (torch.uint8, np.uint8, ml_dtypes.float8_e4m3fn),
            torch.bfloat16: (torch.int16, np.int16, ml_dtypes.bfloat16)}.get(t.dtype)
    if bits is None:
        return cp.from_dlpack(t)
    return cp.from_dlpack(t.view(bits[0])).view(bits[2])


def rows(cp, torch, pb, done=lambda rows: None):
    """Every row (``done(rows so far)`` after each: the caller writes the JSON as it grows)."""
    out = []
    for label, m, n, k in shapes():
        x = (torch.randn(m, k, device="cuda") * 0.5).to(torch.float8_e4m3fn)
        w = (torch.randn(n, k, device="cuda") * 0.5).to(torch.float8_e4m3fn)
        a, b = x, w.t()                        # b: K x N, column-major
        ca, cb = cupy_view(cp, x), cupy_view(cp, w).T
        for mode in SCALES:
            # (blocks: _scaled_mm's blockwise form may differ: tried, else recorded)
            (sa, sb), (ours_sa, ours_sb) = _scales(torch, mode, m, n, k)
            csa, csb = cp.from_dlpack(ours_sa), cp.from_dlpack(ours_sb)
            fns = {"torch tensors": lambda: pb.matmul(a, b, scale_a=ours_sa, scale_b=ours_sb, dtype=torch.bfloat16),
                   "cupy arrays": lambda: pb.matmul(ca, cb, scale_a=csa, scale_b=csb,
                                                    dtype=__import__("ml_dtypes").bfloat16),
                   "torch._scaled_mm": lambda: _first(torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16))}
            # the routes forced: our kernels (the rule sends these K-major products to cuBLASLt)
            # and cuBLASLt's FP8 GEMM through pyblasgemm (block scales too)
            fns["cupy arrays, ours"] = _forced(fns, ca, cb, csa, csb, "tensorcore")
            fns["cupy arrays, cuBLASLt"] = _forced(fns, ca, cb, csa, csb, "cublas")
            # our kernels on each family: on sm_90 the Hopper kernel runs the K-major products
            # ("ours"), mma.sync beside it
            fns["cupy arrays, mma.sync"] = _on_family(fns["cupy arrays, ours"], "sm80")
            row = {"shape": label, "m": m, "n": n, "k": k, "scales": mode, "dtype": "e4m3 -> bfloat16"}
            try:
                got = fns["torch tensors"]().float()
                if mode == "blocks":            # the dequantized operands, float32
                    da = x.float() * ours_sa.repeat_interleave(128, 1)[:, :k]
                    db = w.float() * ours_sb.t().repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)[:, :k]
                    mag = da.abs() @ db.abs().t()
                    ref = da @ db.t()
                else:
                    mag = (x.float().abs() @ w.float().abs().t()) * (sa.abs() * sb.abs())
                    ref = (x.float() @ w.float().t()) * (sa * sb)
                try:
                    want = fns["torch._scaled_mm"]().float()
                    if mode == "blocks":        # trusted only where it agrees with the dequantized product
                        assert ((want - ref).abs() <= 2.0**-7 * ref.abs() + 2.0**-10 * mag).all(), \
                            "_scaled_mm read these block scales otherwise"
                except Exception as e:          # cuBLASLt's shape rules (e.g. M = 1), blockwise forms
                    row["scaled_mm_failure"] = f"{type(e).__name__}: {e}"[:300]
                    want = ref
                    fns.pop("torch._scaled_mm")
                bad = ((got - want).abs() > 2.0**-7 * want.abs() + 2.0**-12 * mag).sum().item()
                row["elements_off"] = bad
                for name, fn in list(fns.items()):
                    try:
                        if name.startswith("cupy arrays, "):        # a forced route, checked like the first
                            res = _as_torch(torch, fn())
                            row[f"{name} elements_off"] = ((res - want).abs()
                                                           > 2.0**-7 * want.abs() + 2.0**-12 * mag).sum().item()
                        row[name] = {"steady_s": torch_steady_s(fn), "single_s": torch_single_s(fn)}
                    except ValueError as e:                         # a forced route that refuses the case
                        row[f"{name} refused"] = str(e)[:300]
                        fns.pop(name)
                for who, key in (("cupy arrays, ours", "lt_over_ours"), ("cupy arrays, mma.sync", "lt_over_mma_sync")):
                    if "cupy arrays, cuBLASLt" in row and who in row:
                        for kind in ("steady_s", "single_s"):
                            row[f"{key}_{kind[:-2]}"] = row[who][kind] / row["cupy arrays, cuBLASLt"][kind]
                row["tflops_steady_ours_cupy"] = 2 * m * n * k / row["cupy arrays"]["steady_s"] / 1e12
                if "torch._scaled_mm" in fns:
                    for kind in ("steady_s", "single_s"):
                        for who, key in (("torch tensors", "speedup_vs_scaled_mm"),
                                         ("cupy arrays", "speedup_vs_scaled_mm_cupy"),
                                         ("cupy arrays, mma.sync", "speedup_vs_scaled_mm_mma_sync"),
                                         ("cupy arrays, ours", "speedup_vs_scaled_mm_ours"),
                                         ("cupy arrays, cuBLASLt", "speedup_vs_scaled_mm_lt")):
                            if who not in row:
                                continue
                            row[f"{key}_{kind[:-2]}"] = row["torch._scaled_mm"][kind] / row[who][kind]
            except Exception as e:
                row["failure"] = f"{type(e).__name__}: {e}"[:300]
            out.append(row)
            print({k_: v for k_, v in row.items() if not isinstance(v, dict)}, flush=True)
            done(out)
    return out


def _scales(torch, mode, m, n, k):
    """(scale_a, scale_b) for ``torch._scaled_mm``, and ours (the same memory, ours 1-D for
    row-wise), as CUDA tensors."""
    if mode == "tensor":
        sa, sb = torch.tensor(0.75, device="cuda"), torch.tensor(1.25, device="cuda")
        return (sa, sb), (sa, sb)
    if mode == "rowwise":
        sa, sb = torch.rand(m, 1, device="cuda") + 0.5, torch.rand(1, n, device="cuda") + 0.5
        return (sa, sb), (sa.reshape(-1), sb.reshape(-1))
    kb, nb = -(-k // 128), -(-n // 128)         # 1 x 128 blocks of a, 128 x 128 of b
    sa, sb = torch.rand(m, kb, device="cuda") + 0.5, torch.rand(kb, nb, device="cuda") + 0.5
    return (sa, sb), (sa, sb)


def host_rows(cp, torch, pb):
    """Host µs per repeated call: torch tensors, CuPy arrays of the same bytes, _scaled_mm."""
    import ml_dtypes

    m, n, k = HOST_SHAPE
    x = (torch.randn(m, k, device="cuda") * 0.5).to(torch.float8_e4m3fn)
    w = (torch.randn(n, k, device="cuda") * 0.5).to(torch.float8_e4m3fn)
    a, b = x, w.t()
    ca, cb = cupy_view(cp, x), cupy_view(cp, w).T
    out = []
    for mode in SCALES:
        (sa, sb), (ours_sa, ours_sb) = _scales(torch, mode, m, n, k)
        csa, csb = cp.from_dlpack(ours_sa), cp.from_dlpack(ours_sb)
        fns = {"torch tensors": lambda: pb.matmul(a, b, scale_a=ours_sa, scale_b=ours_sb, dtype=torch.bfloat16),
               "cupy arrays": lambda: pb.matmul(ca, cb, scale_a=csa, scale_b=csb, dtype=ml_dtypes.bfloat16)}
        if mode != "blocks":
            fns["torch._scaled_mm"] = lambda: _first(torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16))
            # the cuBLASLt route's replay (the rule keeps 64 rows on ours: forced here)
            fns["cupy arrays, cuBLASLt"] = lambda: pb.matmul(ca, cb, scale_a=csa, scale_b=csb,
                                                             dtype=ml_dtypes.bfloat16, backend="cublas")
        # gemm's form (cupy.cublas.gemm's): float32 out, its own replay where the tree has one
        fns["cupy gemm"] = lambda: pb.gemm("N", "N", ca, cb, scale_a=csa, scale_b=csb)
        row = {"form": "matmul", "m": m, "n": n, "k": k, "scales": mode, "dtype": "e4m3 -> bfloat16"}
        try:
            got_t, got_c = fns["torch tensors"](), fns["cupy arrays"]()
            same = torch.equal(got_t.view(torch.int16), torch.from_dlpack(got_c.view("int16")))
            assert same, "the tensors' and the CuPy arrays' results differ"
            us = paired_host_us(fns, calls=200, rounds=15)
            row.update({name + "_us": v for name, v in us.items()})
            row["torch_vs_cupy"] = us["torch tensors"] / us["cupy arrays"]
            if "torch._scaled_mm" in us:
                row["speedup_vs_scaled_mm_host"] = us["torch._scaled_mm"] / us["torch tensors"]
                row["speedup_vs_scaled_mm_host_cupy"] = us["torch._scaled_mm"] / us["cupy arrays"]
        except Exception as e:         # recorded, not hidden
            row["failure"] = f"{type(e).__name__}: {e}"[:300]
        out.append(row)
        print(row, flush=True)
    return out


def _warm(cp, host_only=False):
    """Compile every row's kernels in parallel first (a cold NVRTC cache), timed apart."""
    from pyblasgemm.kernels import fp8 as gpu
    from pyblasgemm.kernels import jit
    from pyblasgemm.planner.fp8 import warm_specs

    dev = cp.cuda.Device()
    cc = (int(dev.compute_capability[:-1]), int(dev.compute_capability[-1]))
    sms = dev.attributes["MultiProcessorCount"]
    lay = {"tensor": ("tensor", "tensor"), "rowwise": ("rows", "cols"), "blocks": ("blocks", "blocks")}
    cases = [(m, n, k, "float8_e4m3fn", "float8_e4m3fn", "C", "F", "C", lay[mode], "bfloat16", 0, None)
             for _, m, n, k in ([] if host_only else shapes()) + [("host", *HOST_SHAPE)] for mode in SCALES]
    specs = warm_specs(cases, sms, cc, dev.id)
    gpu.FAMILY = "sm80"
    try:
        specs += warm_specs(cases, sms, cc, dev.id)
    finally:
        gpu.FAMILY = None
    t0 = time.perf_counter()
    jit.warm(list(dict.fromkeys(specs)))
    print(f"warmed {len(set(specs))} kernels in {time.perf_counter() - t0:.1f} s", flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true", help="the host rows and the decode rows only")
    ap.add_argument("--host-only", action="store_true", help="the host rows only")
    ap.add_argument("--square", action="store_true", help="the host rows and the square rows only")
    args = ap.parse_args(argv)
    import cupy as cp
    import torch

    import pyblasgemm as pb

    global SQUARE, TOKENS
    if args.quick:
        SQUARE = ()
    if args.square:
        TOKENS = ()
    _warm(cp, args.host_only)
    torch.manual_seed(0)
    doc = {"schema": "pyblasgemm-fp8/1", **meta(types.SimpleNamespace(torch=torch), seed="torch.manual_seed(0)"),
           "method": __doc__}
    def partial(done):          # a run cut short still leaves its rows
        doc["rows"] = done
        write_doc(doc, args.out)

    doc["host"] = host_rows(cp, torch, pb)
    host_ok = [r for r in doc["host"] if "failure" not in r]
    host_summary = {}
    for r in host_ok:
        host_summary[f"host_{r['scales']}_torch_vs_cupy"] = r["torch_vs_cupy"]
        host_summary[f"host_{r['scales']}_torch_tensors_us"] = r["torch tensors_us"]
        if "speedup_vs_scaled_mm_host" in r:
            host_summary[f"host_{r['scales']}_speedup_vs_scaled_mm_host"] = r["speedup_vs_scaled_mm_host"]
    host_summary["host_failures"] = len(doc["host"]) - len(host_ok)
    write_doc(doc, args.out)
    if args.host_only:
        doc["summary"] = host_summary
        print(doc["summary"], flush=True)
        write_doc(doc, args.out)
        return 0
    doc["rows"] = rows(cp, torch, pb, partial)
    ok = [r for r in doc["rows"] if "failure" not in r]
    doc["summary"] = {}
    for mode in SCALES:
        doc["summary"][f"{mode}_geomean_tflops_steady_ours_cupy"] = geomean(
            [r.get("tflops_steady_ours_cupy") for r in ok if r["scales"] == mode])
        for key in ("speedup_vs_scaled_mm_steady", "speedup_vs_scaled_mm_single",
                    "speedup_vs_scaled_mm_cupy_steady", "speedup_vs_scaled_mm_cupy_single",
                    "speedup_vs_scaled_mm_mma_sync_steady", "speedup_vs_scaled_mm_ours_steady",
                    "speedup_vs_scaled_mm_lt_steady", "speedup_vs_scaled_mm_lt_single", "lt_over_ours_steady",
                    "lt_over_mma_sync_steady"):
            doc["summary"][f"{mode}_geomean_{key}"] = geomean([r.get(key) for r in ok if r["scales"] == mode])
    doc["summary"]["rows_with_elements_off"] = sum(1 for r in ok if r.get("elements_off"))
    doc["summary"]["failures"] = len(doc["rows"]) - len(ok)
    doc["summary"].update(host_summary)
    print(doc["summary"], flush=True)
    write_doc(doc, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
