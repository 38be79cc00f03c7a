"""Issue 33's missed targets, one representative shape each: a same-run ratio against PyTorch and,
with ``--ncu``, one call of each contender inside a profiler range for Nsight Compute.

    GIT_SHA=<sha> PYTHONPATH=. python bench/targets33.py --out OUT.json
    ncu --clock-control none --profile-from-start off --section SpeedOfLight --section Occupancy \\
        --section WarpStateStats -o REP python bench/targets33.py --ncu

Targets (issue 33, "Targets"), on CuPy arrays, PyTorch on views of the same memory:

* ``decode``: Llama-3-8B gate/up, y = x @ W.T (W 14336 x 4096 bfloat16, as nn.Linear holds it),
  1 and 16 tokens: the GEMV kernel's bound launch (``gemv.bind``), ``pyblasgemm.matmul`` (auto),
  ``torch.matmul``; two copies of (W, x, y) rotate so the weight streams from HBM (235 MB > L2).
  Target: >= 1.15x and >= 90% of HBM at 1-16 tokens.
* ``longk``: Qwen2-7B down projection at 2048 tokens (2048 x 3584 x 18944 bfloat16, x @ W.T),
  ``matmul(backend='tensorcore')`` (our kernels forced) and auto. Target: forced >= 1.0x.
* ``mlp``: 65536 tokens, 256 -> 1024 -> 256 float16, ``fused_mlp(x, w1, w2, b1, b2)`` against
  ``addmm(b2, gelu(addmm(b1, x, w1)), w2)``. Target: >= 1.3x.
* ``bias_gelu``: 8192 x 8192 x 1024 float16, ``matmul(x, w, bias=b, activation='gelu')`` against
  ``gelu(addmm(b, x, w))``. Target: >= 1.2x at K <= 2048.

steady: CUDA events around 20 back-to-back calls, median of 7 (the rotation in the call);
single: synchronize, one call, synchronize, median of 30. ratio = torch's time / ours (> 1: ours
faster). ``achieved_GBps`` for the decode rows: (W + x + y bytes) / steady time.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import heldout  # noqa: E402
from bench.timing import event_median_s, paired_single_us  # noqa: E402

SCHEMA = "pyblasgemm-targets33/1"
#: the operands: torch.Generator on the GPU (decode, long K) and CuPy's global generator, both seeded so
SEED = 33
HBM_BW = {"H200": 4.8e12, "H100": 3.35e12}


class _Rot:
    """Which of two operand copies the next call takes."""

    def __init__(self):
        self.i = 0

    def next(self) -> int:
        self.i ^= 1
        return self.i


def cases(gpu):
    """[(target, label, side, fn, extra)] with operands made; ``side`` 'ours' or 'torch'."""
    cp, torch, pb = gpu.cp, gpu.torch, gpu.pb
    from pyblasgemm._types import TYPE_ROWS
    from pyblasgemm.desc import describe
    from pyblasgemm.kernels import gemv

    out = []
    g = torch.Generator(device="cuda").manual_seed(SEED)
    cp.random.seed(SEED)
    # decode: x @ W.T, W 14336 x 4096 bf16, two rotating copies
    n, k = 14336, 4096
    for m in (1, 16):
        ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g) * 0.02 for _ in range(2)]
        xs = [torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2)]
        ys = [torch.empty(m, n, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
        cws = [cp.asarray(w.view(torch.int16)).view(gpu.bf16) for w in ws]
        cxs = [cp.asarray(x.view(torch.int16)).view(gpu.bf16) for x in xs]
        d = describe("targets33", TYPE_ROWS["b"], "fp32", "T", "N", n, m, k, k, k, n, 1, 0, 0, 0, "cupy", 0,
                     (ws[0].data_ptr(), xs[0].data_ptr(), ys[0].data_ptr()), 1.0, 0.0)
        launch = gemv.bind(d)
        sptr = cp.cuda.get_current_stream().ptr
        nbytes = (n * k + m * k + m * n) * 2
        extra = {"bytes": nbytes, "kernel": launch.spec.kernel_name, "ctas": launch.spec.ctas,
                 "split": launch.spec.split}
        rot = _Rot()

        def ours_gemv(ws=ws, xs=xs, ys=ys, launch=launch, rot=rot, sptr=sptr):
            i = rot.next()
            launch(ws[i].data_ptr(), xs[i].data_ptr(), ys[i].data_ptr(), 1.0, 0.0, sptr)

        def ours_auto(cws=cws, cxs=cxs, rot=rot):
            i = rot.next()
            return pb.matmul(cxs[i], cws[i].T, dtype=cxs[i].dtype)

        def theirs(ws=ws, xs=xs, rot=rot):
            i = rot.next()
            return torch.matmul(xs[i], ws[i].T)

        out.append(("decode", f"m={m} gemv kernel", "ours", ours_gemv, extra))
        out.append(("decode", f"m={m} pyblasgemm.matmul auto", "ours", ours_auto, {"bytes": nbytes}))
        out.append(("decode", f"m={m} torch.matmul", "torch", theirs, {"bytes": nbytes}))
    # long-K prefill: Qwen2-7B down at 2048 tokens
    m, n, k = 2048, 3584, 18944
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g) * 0.02
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g)
    cw, cx = cp.asarray(w.view(torch.int16)).view(gpu.bf16), cp.asarray(x.view(torch.int16)).view(gpu.bf16)
    try:
        plan_line = [ln for ln in pb.explain(cx, cw.T, dtype=cx.dtype, backend="tensorcore").splitlines()
                     if ln.startswith("plan:")][:1]
    except Exception as exc:     # the plan is only reported
        plan_line = [f"explain failed: {type(exc).__name__}: {exc}"[:200]]
    out.append(("longk", "forced tensorcore", "ours",
                lambda cx=cx, cw=cw: pb.matmul(cx, cw.T, dtype=cx.dtype, backend="tensorcore"),
                {"flops": 2 * m * n * k, "plan": plan_line}))
    out.append(("longk", "auto", "ours", lambda cx=cx, cw=cw: pb.matmul(cx, cw.T, dtype=cx.dtype),
                {"flops": 2 * m * n * k}))
    out.append(("longk", "torch.matmul", "torch", lambda x=x, w=w: torch.matmul(x, w.T), {"flops": 2 * m * n * k}))
    # fused MLP, narrow: 65536 tokens, 256 -> 1024 -> 256 float16
    t, f, h = 65536, 256, 1024
    x = (cp.random.uniform(-1, 1, (t, f), dtype=cp.float32)).astype(cp.float16)
    w1 = (cp.random.uniform(-1, 1, (f, h), dtype=cp.float32) / 32).astype(cp.float16)
    w2 = (cp.random.uniform(-1, 1, (h, f), dtype=cp.float32) / 32).astype(cp.float16)
    b1 = cp.random.uniform(-1, 1, (h,), dtype=cp.float32).astype(cp.float16)
    b2 = cp.random.uniform(-1, 1, (f,), dtype=cp.float32).astype(cp.float16)
    tx, tw1, tw2, tb1, tb2 = (torch.as_tensor(v, device="cuda") for v in (x, w1, w2, b1, b2))
    gelu = torch.nn.functional.gelu
    out.append(("mlp", "fused_mlp", "ours", lambda x=x, w1=w1, w2=w2, b1=b1, b2=b2: pb.fused_mlp(x, w1, w2, b1, b2),
                {"plan": pb.mlp_plan(t, f, h, f).explain()}))
    out.append(("mlp", "torch addmm-gelu-addmm", "torch",
                lambda tx=tx, tw1=tw1, tw2=tw2, tb1=tb1, tb2=tb2: torch.addmm(tb2, gelu(torch.addmm(tb1, tx, tw1)), tw2),
                {}))
    # bias + GELU, K <= 2048
    m, n, k = 8192, 8192, 1024
    x = (cp.random.uniform(-1, 1, (m, k), dtype=cp.float32)).astype(cp.float16)
    w = (cp.random.uniform(-1, 1, (k, n), dtype=cp.float32) / 64).astype(cp.float16)
    b = cp.random.uniform(-1, 1, (n,), dtype=cp.float32).astype(cp.float16)
    tx, tw, tb = (torch.as_tensor(v, device="cuda") for v in (x, w, b))
    out.append(("bias_gelu", "matmul(bias, gelu)", "ours",
                lambda x=x, w=w, b=b: pb.matmul(x, w, bias=b, activation="gelu"),
                {"flops": 2 * m * n * k}))
    out.append(("bias_gelu", "torch gelu(addmm)", "torch", lambda tx=tx, tw=tw, tb=tb: gelu(torch.addmm(tb, tx, tw)),
                {"flops": 2 * m * n * k}))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--ncu", action="store_true", help="one call of each inside a profiler range, no timing")
    args = ap.parse_args(argv)
    gpu = heldout.Gpu()
    cp, torch = gpu.cp, gpu.torch
    cs = cases(gpu)
    for c in cs:                 # compile, plan and warm outside any range
        c[3]()
    cp.cuda.Device().synchronize()
    if args.ncu:
        torch.cuda.cudart().cudaProfilerStart()
        for target, label, side, fn, _ in cs:
            print("profiled:", target, label, flush=True)
            fn()
            cp.cuda.Device().synchronize()
        torch.cuda.cudart().cudaProfilerStop()
        return 0
    name = torch.cuda.get_device_name()
    bw = next((v for key, v in HBM_BW.items() if key in name), None)
    doc = {"schema": SCHEMA, "meta": heldout.meta(gpu, seed=SEED), "method": __doc__, "rows": []}
    by = {}
    for target, label, side, fn, extra in cs:
        r = {"target": target, "label": label, "side": side,
             "steady_us": round(event_median_s(fn, inner=20, samples=7) * 1e6, 2),
             "single_us": round(paired_single_us({label: fn}, calls=30, warmup=5)[label], 2), **extra}
        if "bytes" in extra:
            r["achieved_GBps"] = round(extra["bytes"] / (r["steady_us"] * 1e-6) / 1e9, 1)
            if bw:
                r["pct_hbm"] = round(100 * extra["bytes"] / (r["steady_us"] * 1e-6) / bw, 1)
        if "flops" in extra:
            r["tflops"] = round(extra["flops"] / (r["steady_us"] * 1e-6) / 1e12, 1)
        if target == "longk" or target == "bias_gelu" or target == "mlp":
            try:
                from pyblasgemm.epilogue import last_route
                r["route"] = str(last_route())[:200] if target == "bias_gelu" else None
            except Exception:
                pass
        doc["rows"].append(r)
        group = target + (" " + label.split()[0] if target == "decode" else "")
        by.setdefault(group, []).append(r)
        print(json.dumps(r)[:400], flush=True)
    ratios = {}
    for group, rows in by.items():
        theirs = [r for r in rows if r["side"] == "torch"]
        if not theirs:
            continue
        for r in rows:
            if r["side"] == "ours":
                ratios[f"{group}: {r['label']}"] = {
                    "steady": round(theirs[0]["steady_us"] / r["steady_us"], 3),
                    "single": round(theirs[0]["single_us"] / r["single_us"], 3)}
    doc["ratios"] = ratios
    print(json.dumps(ratios, indent=1))
    if args.out:
        heldout.write_doc(doc, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
