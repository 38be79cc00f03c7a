"""Where a small product's host time goes on the cuBLAS route, per way of issuing it (issue 33).

    GIT_SHA=<sha> PYTHONPATH=. python bench/lt_host_cost.py OUT.json [--ids decode-00,...] [--max-seconds S]

For each fp16/bf16 entry of the held-out corpus's decode class (bench/heldout.py's operands, the
same bytes for every contender), one product ``C = A @ B`` issued each of these ways:

``torch.matmul``, ``torch.mm(out=)``, ``cupy.matmul`` (float16)   the yardstick and its parts
``pb auto`` / ``pb cublas``   ``pyblasgemm.matmul`` (fresh result), auto and forced cuBLAS
``lt chosen``       the route's own ``LtLaunch`` (cuBLASLt's first heuristic choice, the
                    workspace it asks for), called with pointers into a result made once
``lt algo i``       the heuristic's other answers (up to :data:`TOP` within the workspace)
``lt ws0``          the first answer with no workspace (no split-K reduction buffer)
``lt per-call assembly`` / ``lt made once``   one LtLaunch's repeated call through its general path
                    (arguments assembled per call, as before session 25) and its kept arguments
``lt chosen nvmath`` / ``lt chosen ctypes``   the same launch through each cuBLASLt binding
``gemmex``          ``cublasGemmEx`` (CUBLAS_GEMM_DEFAULT, host scalars), the handle's stream set
                    once; ``gemmex+stream`` sets it per call (as the route's fallback does)
``gemv``            pyblasgemm's GEMV kernel on the same problem (one launch; M <= 64)
``cupy alloc`` / ``torch alloc``   the fresh result alone (``cupy.ndarray``, ``torch.empty``)

Per contender: ``host_us`` (time to issue one call, 300 back to back, median of 5 rounds,
contenders interleaved: bench/timing.py's paired_host_us), ``gpu_us`` (CUDA events around 20
calls queued behind a ~1 ms ``torch.cuda._sleep``, so the host is hidden and only the GPU's time
per call is left), ``steady_us`` (heldout.py's: 3 warm-up calls, 20 back to back, one synchronize,
wall / 20, median of 5) and ``single_us`` (synchronize, call, synchronize, median of 30). Every
way's result is checked against ``torch.matmul``'s first (max relative error).
"""
from __future__ import annotations

import argparse
import ctypes as ct
import json
import pathlib
import statistics
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import heldout  # noqa: E402
from bench.timing import event_median_s, paired_host_us, paired_single_us  # noqa: E402

#: heuristic answers timed per problem beyond the first
TOP = 4
#: whether nvmath-python's bindings load here (set by main)
NVMATH = False
#: cuBLAS bindings for cublasGemmEx ({name: binding}) and a handle of each (set by main)
BLAS: dict = {}
HANDLES: dict = {}
SCHEMA = "pyblasgemm-lt-host-cost/1"
FIRST = ("decode-00", "decode-06", "decode-12", "decode-21", "decode-04", "decode-09")


def _gpu_us(torch, fn):
    """GPU µs per call with the host hidden: 20 calls queue behind a ~1 ms sleep kernel (longer
    than issuing them), median of 5 brackets."""
    def behind_a_sleep():
        torch.cuda.synchronize()
        torch.cuda._sleep(2_000_000)          # ~1 ms at 1.98 GHz
    return event_median_s(fn, inner=20, samples=5, warmup=0, before=behind_a_sleep) * 1e6


def _desc(e, make_desc):
    """The column-major problem of the row-major ``C = A @ B`` (Cᵀ = op(B')·op(A'), B's store
    as BLAS's A): (desc, swap) with launch(b_ptr, a_ptr, c_ptr)."""
    m, n, k, ta, tb = e["m"], e["n"], e["k"], e["transa"], e["transb"]
    dt = {"float16": "float16", "bfloat16": "bfloat16"}[e["dtype"]]
    return make_desc(n, m, k, dt, transa="N" if tb == "N" else "T", transb="N" if ta == "N" else "T",
                     lda=n if tb == "N" else k, ldb=k if ta == "N" else m, ldc=n, align=16)


def _heuristic_algos(launch, count, max_ws):
    """Up to ``count`` (result struct, algo address, workspace bytes) from cuBLASLt's heuristic
    for ``launch``'s descriptors (the ctypes binding's library)."""
    from pyblasgemm.backends import cublaslt as L

    lib = launch._lib
    if lib.name != "ctypes":
        return []
    pref = lib.matmul_preference_create()
    try:
        attr = lib.pref_attr
        lib.set_cell(lib.matmul_preference_set_attribute, pref, attr["MAX_WORKSPACE_BYTES"], ct.c_uint64(max_ws))
        for side in "ABCD":
            lib.set_cell(lib.matmul_preference_set_attribute, pref, attr[f"MIN_ALIGNMENT_{side}_BYTES"],
                         ct.c_uint32(launch._align))
        results, got = (L._HeuristicResult * count)(), ct.c_int(0)
        lay = launch._layouts
        status = lib._lib.cublasLtMatmulAlgoGetHeuristic(launch._handle, launch._desc, lay[0], lay[1], lay[2],
                                                         lay[2], pref, count, ct.addressof(results),
                                                         ct.addressof(got))
    finally:
        lib.matmul_preference_destroy(pref)
    if status:
        return []
    return [(results[i], ct.addressof(results[i]), int(results[i].workspace_size)) for i in range(got.value)]


def _lt_variant(desc, types, algo):
    """A fresh LtLaunch of ``desc`` running ``algo`` (result, address, workspace bytes)."""
    from pyblasgemm.backends.cublaslt import LtLaunch

    launch = LtLaunch(desc, types, 0)
    launch._results.append(algo[0])
    launch._algo, launch._ws_size = algo[1], algo[2]
    return launch


def row_of(gpu, e, deadline):
    cp, torch, pb = gpu.cp, gpu.torch, gpu.pb
    import importlib

    from pyblasgemm import calls
    from pyblasgemm.backends import cublas as blas_mod, cublaslt
    mm = importlib.import_module("pyblasgemm.matmul")
    from pyblasgemm.kernels import gemv
    from pyblasgemm.planner.problem import make_desc

    import hashlib
    seed = int.from_bytes(hashlib.sha256(e["id"].encode()).digest()[:4], "little")
    a, b, a_s, b_s = gpu.operands(e, seed)
    tA, tB = gpu.tview(a_s, e["transa"]), gpu.tview(b_s, e["transb"])
    m, n = e["m"], e["n"]
    same = {"dtype": a.dtype} if e["dtype"] == "bfloat16" else {}
    sptr = cp.cuda.get_current_stream().ptr
    desc = _desc(e, make_desc)
    types = blas_mod.lt_types(desc)
    c = cp.empty((m, n), dtype=a.dtype)
    tc = gpu.tview(c, "N")
    pa, pb_, pc = a.data.ptr, b.data.ptr, c.data.ptr
    ref = torch.matmul(tA, tB).float()
    row = {"id": e["id"], "m": m, "n": n, "k": e["k"], "dtype": e["dtype"], "layout": e["transa"] + e["transb"]}

    fns, checks = {}, {}

    def add(name, fn, out=None):
        fns[name] = fn
        checks[name] = out

    add("torch.matmul", lambda: torch.matmul(tA, tB))
    add("torch.mm(out=)", lambda: torch.mm(tA, tB, out=tc), tc)
    if e["dtype"] == "float16":
        add("cupy.matmul", lambda: cp.matmul(a, b))
    add("pb auto", lambda: pb.matmul(a, b, **same))
    add("pb cublas", lambda: pb.matmul(a, b, backend="cublas", **same))
    add("pb auto out=", lambda: pb.matmul(a, b, out=c, **same), tc)
    pb.matmul(a, b, backend="cublas", **same)
    key = mm._signature(a, b, None, backend="cublas", dtype=same.get("dtype"))
    call = calls.get(key) if key is not None else None
    lt = getattr(call, "launch", None)
    row["route_launch"] = type(lt).__name__ if lt is not None else None
    if lt is not None and hasattr(lt, "_algo"):
        add("lt chosen", lambda: call.run(pa, pb_, pc, 1.0, 0.0, sptr), tc)
        row["lt_chosen_ws"] = lt._ws_size
        algos = _heuristic_algos(lt, TOP + 1, 32 << 20)
        row["lt_algos"] = []
        for i, al in enumerate(algos):
            raw = list(al[0].algo)
            row["lt_algos"].append({"i": i, "ws": al[2], "waves": round(float(al[0].waves), 3),
                                    "algo_words": [hex(x) for x in raw[:4]]})
            if i == 0:
                continue
            v = _lt_variant(desc, types, al)
            add(f"lt algo {i}", lambda v=v: v(pb_, pa, pc, 1.0, 0.0, sptr), tc)
        ws0 = _heuristic_algos(lt, 1, 0)
        if ws0:
            row["lt_ws0"] = {"ws": ws0[0][2], "waves": round(float(ws0[0][0].waves), 3),
                             "algo_words": [hex(x) for x in list(ws0[0][0].algo)[:4]]}
            v0 = _lt_variant(desc, types, ws0[0])
            add("lt ws0", lambda: v0(pb_, pa, pc, 1.0, 0.0, sptr), tc)
        # the repeated call's two forms on one launch: as a call assembled its arguments before
        # this tree (LtLaunch._matmul under the lock) and with the arguments made once
        vo = cublaslt.LtLaunch(desc, types, 0)
        vo(pb_, pa, pc, 1.0, 0.0, sptr)

        def assembled(vo=vo):
            with vo._lock:
                vo._matmul(pb_, pa, pc, 1.0, 0.0, sptr)
        add("lt per-call assembly", assembled, tc)
        add("lt made once", lambda: vo(pb_, pa, pc, 1.0, 0.0, sptr), tc)
        if NVMATH:
            # the same launch through nvmath-python's binding (Cython), made here, then back
            cublaslt.use_binding("nvmath")
            try:
                vn = cublaslt.LtLaunch(desc, types, 0)
                add("lt chosen nvmath", lambda: vn(pb_, pa, pc, 1.0, 0.0, sptr), tc)
            finally:
                cublaslt.use_binding("ctypes")
            vc = cublaslt.LtLaunch(desc, types, 0)
            add("lt chosen ctypes", lambda: vc(pb_, pa, pc, 1.0, 0.0, sptr), tc)
    # cublasGemmEx on a cuBLAS handle of each binding (the route's fallback's)
    ab_t, c_t, comp_t, scal = types
    pal, pbe = blas_mod._scalars.pointers(scal, 1.0, 0.0)
    ta, tb = blas_mod._OPS[desc.transa], blas_mod._OPS[desc.transb]
    for bname, blas in BLAS.items():
        try:
            h = HANDLES[bname]
            blas.set_stream(h, sptr)
            args = (h, ta, tb, desc.m, desc.n, desc.k, pal, pb_, ab_t, desc.lda, pa, ab_t, desc.ldb, pbe, pc,
                    c_t, desc.ldc, comp_t, -1)
            gemm_ex = blas.gemm_ex
            add(f"gemmex {bname}", lambda gemm_ex=gemm_ex, args=args: gemm_ex(*args), tc)

            def with_stream(blas=blas, h=h, gemm_ex=gemm_ex, args=args):
                blas.set_stream(h, sptr)
                gemm_ex(*args)
            add(f"gemmex+stream {bname}", with_stream, tc)
        except Exception as exc:
            row[f"gemmex_{bname}_error"] = f"{type(exc).__name__}: {exc}"[:200]
    if min(m, n) <= gemv.MAX_TOKENS:
        try:
            g = gemv.bind(desc)
            row["gemv"] = {"kernel": g.spec.kernel_name, "ctas": g.spec.ctas, "split": g.spec.split,
                           "path": g.spec.path, "loads": g.spec.loads}
            add("gemv", lambda: g(pb_, pa, pc, 1.0, 0.0, sptr), tc)
        except Exception as exc:
            row["gemv_error"] = f"{type(exc).__name__}: {exc}"[:200]
    add("cupy alloc", lambda: cp.ndarray((m, n), a.dtype))
    tdt = tA.dtype
    add("torch alloc", lambda: torch.empty((m, n), dtype=tdt, device="cuda"))

    # check every way's product once against torch.matmul's
    errs = {}
    for name, fn in fns.items():
        if "alloc" in name:
            continue
        tc.zero_()
        out = fn()
        torch.cuda.synchronize()
        got = checks[name]
        if got is None:
            got = out if isinstance(out, torch.Tensor) else gpu.tview(out, "N")
        errs[name] = float((got.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-30))
    row["max_rel_err"] = errs
    bad = [nm for nm, v in errs.items() if not v < 2e-2]
    for nm in bad:                     # a wrong way is reported, not timed
        fns.pop(nm)
    row["failed"] = bad
    host = paired_host_us(fns, calls=300, rounds=5, warmup=30)
    res = {}
    for name, fn in fns.items():
        r = {"host_us": round(host[name], 2)}
        if "alloc" not in name and time.time() < deadline:
            r["gpu_us"] = round(_gpu_us(torch, fn), 2)
            # heldout.py's own steady loop (3 warm-up calls, 20 back to back, wall / 20), median of 5
            r["steady_us"] = round(statistics.median(heldout._steady_s(gpu, fn) for _ in range(5)) * 1e6, 2)
            r["single_us"] = round(paired_single_us({name: fn}, calls=30, warmup=3)[name], 2)
        res[name] = r
    row["ways"] = res
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--ids", default=None)
    ap.add_argument("--max-seconds", type=float, default=240)
    args = ap.parse_args(argv)
    gpu = heldout.Gpu()
    corpus = json.loads((ROOT / "bench" / "heldout_corpus_2026-11-24.json").read_text())
    entries = [x for x in corpus["entries"] if x["class"] == "decode" and x["dtype"] in ("float16", "bfloat16")]
    if args.ids:
        want = set(args.ids.split(","))
        entries = [x for x in entries if x["id"] in want]
    # decode_host_probe.py's six first (the ones profiled before), so a time limit keeps them
    entries.sort(key=lambda x: (x["id"] not in FIRST, x["id"]))
    global NVMATH
    from pyblasgemm.backends import cublas as blas_mod, cublaslt
    from cuda.pathfinder import load_nvidia_dynamic_lib

    cublaslt.use_binding("ctypes")        # pyblasgemm's own launches: the device's default binding
    BLAS["ctypes"] = blas_mod._CtypesBlas(load_nvidia_dynamic_lib("cublas").abs_path)
    try:
        import nvmath.bindings.cublas as nvcb
        import nvmath.bindings.cublasLt  # noqa: F401
        NVMATH = True
        BLAS["nvmath"] = blas_mod._NvmathBlas(nvcb)
    except ImportError:
        pass
    for bname, blas in BLAS.items():
        with gpu.cp.cuda.Device(0):
            HANDLES[bname] = blas.create()
        blas.set_pointer_mode(HANDLES[bname], 0)
    doc = {"schema": SCHEMA, "meta": heldout.meta(gpu, seed="per row: heldout.py's (sha256 of the entry id)"),
           "cublaslt": cublaslt.status(), "nvmath": NVMATH, "method": __doc__, "rows": []}
    t0 = time.time()
    deadline = t0 + args.max_seconds
    for e in entries:
        if time.time() > deadline:
            doc["stopped"] = f"time limit after {len(doc['rows'])} rows"
            break
        try:
            row = row_of(gpu, e, deadline)
        except Exception as exc:
            row = {"id": e["id"], "error": f"{type(exc).__name__}: {exc}"[:300]}
        doc["rows"].append(row)
        ways = row.get("ways", {})
        print(e["id"], e["m"], e["n"], e["k"], e["dtype"][:4], e["transa"] + e["transb"],
              " ".join(f"{k}={v['host_us']}/{v.get('gpu_us')}/{v.get('steady_us')}" for k, v in ways.items()),
              row.get("error", ""), flush=True)
        pathlib.Path(args.out).write_text(json.dumps(doc, indent=1, default=str))
    doc["seconds"] = round(time.time() - t0, 1)
    pathlib.Path(args.out).write_text(json.dumps(doc, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
