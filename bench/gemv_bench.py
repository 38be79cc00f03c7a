"""The GEMV kernel (pyblasgemm.kernels.gemv) against cuBLAS on decode layers: y = x @ W.T.

    GIT_SHA=$(git rev-parse HEAD) PYTHONPATH=.:bench python bench/gemv_bench.py --out bench/results/gemv_<gpu>_<date>.json

* layers: x @ W.T with W as ``torch.nn.Linear`` holds it (N x K, row-major), projections of
  public model configurations: Llama-3-8B (4096 -> 6144 qkv, 4096 -> 4096 o, 4096 -> 14336
  gate/up, 14336 -> 4096 down), Qwen2-7B (3584 -> 4608 qkv, 3584 -> 18944 up, 18944 -> 3584
  down); tokens M = 1, 4, 16, 64; bfloat16 and float16.
* contenders, on the same bytes: the GEMV kernel's bound launch called with raw pointers
  (``gemv.bind(desc)(w, x, y)``: the entry point the planner will call), ``torch.matmul(x, W.T)``
  and ``cupy.matmul(x, W.T)`` (float16 only: CuPy has no bfloat16 matmul); yardstick = the
  faster of the two.
* every call streams its weight from HBM, as a model's next layer does: the weight (and x, y)
  rotate through enough copies to exceed twice the L2 cache, for every contender alike.
* steady: CUDA events around 20 back-to-back calls, median of 7 (bench/timing.py's loop, the
  copies rotating); single: one call issued and waited for, median of 50 (paired_single_us,
  contenders interleaved); host_us: the host's time to issue one call (paired_host_us): where it
  is near steady, steady measures the host, not the GPU; graph: the same 20 calls captured in
  one CUDA graph and replayed (device time without the host; cupy.matmul is not captured).
* achieved GB/s = (weight + x + y bytes) / steady time; % of the datasheet's HBM bandwidth
  (H100 SXM 3.35 TB/s, H100 PCIe 2.0, H200 4.8, A100 SXM 2.04 by device name); ratio =
  yardstick s / ours s (> 1: ours faster).
* checked first: the kernel's y on 64 sampled output features against float64 from host copies
  (error within 2^-7 (bf16) / 2^-10 (fp16) of |W| @ |x|); a failing shape is not timed.
* where the kernel takes the row-block split by default (gemv.SPLITS: T <= 16, 16-byte vectors),
  the stream-k split of the same problem is timed beside it on the same bytes (``stream_k``,
  with ``ratio_*_stream_k``): the before / after of the split in one run.
* ``--rows-sweep``: first the row-block split's variants (ROWS_VARIANTS: rings with fewer
  registers, so more warps resident), graph replay on every layer at M = 1 and 16; the pick per
  token-group count (smallest geometric-mean time) then serves the main table's rows.
* ``--sweep``: a few other tile shapes and residencies of the kernel on two layers (M = 1, 16),
  for choosing gemv.TILES; ``--quick``: two layers, M = 1 and 16.

About 30-60 s on an H100 (kernel compiles included).
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
import types
import zlib

import numpy as np

sys.path.insert(0, __import__("pathlib").Path(__file__).resolve().parent.as_posix())
sys.path.insert(0, __import__("pathlib").Path(__file__).resolve().parents[1].as_posix())

from bench.heldout import meta, write_doc  # noqa: E402
from timing import paired_host_us, paired_single_us  # noqa: E402

LAYERS = {"llama3-8b qkv": (4096, 6144), "llama3-8b o": (4096, 4096), "llama3-8b gate/up": (4096, 14336),
          "llama3-8b down": (14336, 4096), "qwen2-7b qkv": (3584, 4608), "qwen2-7b up": (3584, 18944),
          "qwen2-7b down": (18944, 3584)}
TOKENS = (1, 4, 16, 64)
QUICK_LAYERS = ("llama3-8b o", "llama3-8b gate/up")
#: HBM bytes/s of the datasheets, by a substring of the device name (first match wins)
PEAK_BW = (("H200", 4.8e12), ("H100 PCIe", 2.0e12), ("H100", 3.35e12), ("A100-SXM", 2.039e12),
           ("A100", 1.935e12))
#: --sweep: (P1, P2, WR, WK) of the mma_k mainloop per token groups, and CTAs per SM
SWEEP_TILES = {1: [(2, 1, 1, 4), (1, 2, 1, 4), (2, 2, 1, 4), (2, 1, 2, 2), (2, 1, 4, 1), (4, 1, 1, 4)],
               2: [(2, 1, 2, 2), (1, 2, 2, 2), (2, 1, 1, 4), (2, 1, 4, 1)]}
SWEEP_OCCUPANCY = (None, 1, 2, 8)
STEADY_CALLS, STEADY_SAMPLES, SINGLE_CALLS = 20, 7, 50
#: the operands' seed (torch.Generator on the GPU), recorded in the JSON
ROW_SEED = "per row: zlib.crc32 of '<layer> <m> <dtype>'"


def peak_bw(name: str):
    return next((bw for key, bw in PEAK_BW if key in name), None)


class Rotation:
    """``copies`` sets of (W, x, y) on the device (torch tensors), W as nn.Linear holds it; each
    contender's call takes the next set (the weight streamed from HBM on every call)."""

    def __init__(self, torch, n, k, m, dtype, copies, seed):
        g = torch.Generator(device="cuda").manual_seed(seed)
        self.w = [torch.randn(n, k, device="cuda", dtype=dtype, generator=g) * 0.02 for _ in range(copies)]
        self.x = [torch.randn(m, k, device="cuda", dtype=dtype, generator=g) for _ in range(copies)]
        self.y = [torch.empty(m, n, device="cuda", dtype=dtype) for _ in range(copies)]
        self.i = 0

    def next(self) -> int:
        self.i = (self.i + 1) % len(self.w)
        return self.i


def _steady_s(cp, fn):
    """bench/timing.py's event loop (its median of per-bracket times), inline: the rotation
    lives in ``fn``."""
    for _ in range(5):
        fn()
    cp.cuda.get_current_stream().synchronize()
    times = []
    for _ in range(STEADY_SAMPLES):
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        for _ in range(STEADY_CALLS):
            fn()
        stop.record()
        stop.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, stop) * 1e-3 / STEADY_CALLS)
    return statistics.median(times)


def _graph_s(cp, torch, fn):
    """Median seconds per call of STEADY_CALLS calls of ``fn(stream_handle)`` captured in one CUDA
    graph on a side stream (warmed up there first: a launch's workspace is made per stream)."""
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        for _ in range(3):
            fn(side.cuda_stream)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=side):
        for _ in range(STEADY_CALLS):
            fn(side.cuda_stream)
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(STEADY_SAMPLES):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        g.replay()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1e-3 / STEADY_CALLS)
    del g
    return statistics.median(times)


def _desc(m, n, k, dtype_name, ptrs):
    from pyblasgemm._types import TYPE_ROWS
    from pyblasgemm.desc import describe

    prefix = {"bfloat16": "b", "float16": "h"}[dtype_name]
    # y (m x n, row-major) = x @ W.T is the column-major yᵀ = W xᵀ: transa='T' on W's rows (lda = k),
    # transb='N' on x's rows (ldb = k), ldc = n
    return describe("gemv_bench", TYPE_ROWS[prefix], "fp32", "T", "N", n, m, k, k, k, n, 1, 0, 0, 0, "cupy", 0,
                    ptrs, 1.0, 0.0)


def _check(torch, rot, m, n, k, dtype_name) -> dict:
    """The kernel's y (the last call's copy) on 64 sampled output features against float64."""
    i = rot.i
    rng = np.random.default_rng(n * 31 + m)
    cols = torch.as_tensor(np.sort(rng.choice(n, size=min(64, n), replace=False)), device="cuda")
    w = rot.w[i].index_select(0, cols).double().cpu().numpy()
    x = rot.x[i].double().cpu().numpy()
    got = rot.y[i].index_select(1, cols).double().cpu().numpy()
    ref = x @ w.T
    scale = np.abs(x) @ np.abs(w).T
    tol = {"bfloat16": 2.0 ** -7, "float16": 2.0 ** -10}[dtype_name]
    err = float(np.max(np.abs(got - ref) / (scale + 1e-30)))
    return {"max_rel_err": err, "tolerance": tol, "ok": bool(np.isfinite(got).all() and err <= tol)}


def measure(cp, torch, gemv, layer, m, dtype_name, tiles=None, occupancy=None, with_yardsticks=True, split=None,
            resident_warps=None, rows_tiles=None) -> dict:
    k, n = LAYERS[layer]
    dtype = getattr(torch, dtype_name)
    eb = 2
    l2 = cp.cuda.Device().attributes["L2CacheSize"]
    w_bytes, xy_bytes = n * k * eb, (m * k + m * n) * eb
    copies = max(2, math.ceil(2 * l2 / (w_bytes + xy_bytes)))
    rot = Rotation(torch, n, k, m, dtype, copies, seed=zlib.crc32(f"{layer} {m} {dtype_name}".encode()))
    desc = _desc(m, n, k, dtype_name, (rot.w[0].data_ptr(), rot.x[0].data_ptr(), rot.y[0].data_ptr()))
    if rows_tiles is not None and tiles is None and split is None and gemv.plan(desc, 132).split == "rows":
        tiles, split = rows_tiles, "rows"       # the row-block sweep's pick in place of gemv.ROWS_TILES
    launch = gemv.bind(desc, tiles=tiles, occupancy=occupancy, split=split, resident_warps=resident_warps)
    ptrs = [(w.data_ptr(), x.data_ptr(), y.data_ptr()) for w, x, y in zip(rot.w, rot.x, rot.y)]
    stream = torch.cuda.current_stream().cuda_stream

    def ours():
        pw, px, py = ptrs[rot.next()]
        launch(pw, px, py, 1.0, 0.0, stream)

    def spec_of(s):
        return {"split": s.split, "path": s.path, "tiles": [s.p1, s.p2, s.wr, s.wk], "pipe": s.pipe,
                "threads": s.threads, "ctas": s.ctas, "smem": s.smem, "occupancy": s.occupancy,
                "row_tiles": s.row_tiles, "csteps": s.csteps, "shared_tiles": s.slots > 0, "loads": s.loads,
                "kernel": s.kernel_name}
    s = launch.spec
    row = {"layer": layer, "m": m, "n": n, "k": k, "dtype": dtype_name, "weight_copies": copies, "spec": spec_of(s)}
    # the row-block split's before: the stream-k split of the same problem, same bytes
    alt = gemv.bind(desc, split="stream_k") if with_yardsticks and s.split == "rows" else None
    ours()
    torch.cuda.synchronize()
    row["check"] = _check(torch, rot, m, n, k, dtype_name)
    if not row["check"]["ok"]:
        row["failure"] = "the GEMV kernel's result is outside the tolerance: not timed"
        return row
    fns = {"ours": ours}
    if alt is not None:
        row["stream_k_spec"] = spec_of(alt.spec)

        def ours_stream_k():
            pw, px, py = ptrs[rot.next()]
            alt(pw, px, py, 1.0, 0.0, stream)
        fns["stream_k"] = ours_stream_k
        ours_stream_k()
        torch.cuda.synchronize()
        row["stream_k_check"] = _check(torch, rot, m, n, k, dtype_name)
        if not row["stream_k_check"]["ok"]:
            del fns["stream_k"]
    if with_yardsticks:
        def torch_mm():
            i = rot.next()
            torch.matmul(rot.x[i], rot.w[i].T, out=rot.y[i])
        fns["torch"] = torch_mm
        if dtype_name == "float16":
            cw = [cp.from_dlpack(w) for w in rot.w]
            cx = [cp.from_dlpack(x) for x in rot.x]
            cy = [cp.from_dlpack(y) for y in rot.y]

            def cupy_mm():
                i = rot.next()
                cp.matmul(cx[i], cw[i].T, out=cy[i])
            fns["cupy"] = cupy_mm
        else:
            row["cupy"] = {"unavailable": "CuPy has no bfloat16 matmul"}
    peak = peak_bw(cp.cuda.runtime.getDeviceProperties(0)["name"].decode())
    single = paired_single_us(fns, calls=SINGLE_CALLS, warmup=5)
    host = paired_host_us(fns, calls=200, rounds=3, warmup=5)
    # the graph-captured form of each contender: the stream comes from the capture
    in_graph = {"ours": lambda h: launch(*ptrs[rot.next()], 1.0, 0.0, h)}
    if "stream_k" in fns:
        in_graph["stream_k"] = lambda h: alt(*ptrs[rot.next()], 1.0, 0.0, h)
    if "torch" in fns:
        in_graph["torch"] = lambda h: fns["torch"]()
    for name, fn in fns.items():
        t = _steady_s(cp, fn)
        row[name] = {"steady_s": t, "single_s": single[name] * 1e-6, "host_us": host[name],
                     "gbps": (w_bytes + xy_bytes) / t / 1e9, "weight_gbps": w_bytes / t / 1e9}
        if peak:
            row[name]["pct_peak"] = 100 * (w_bytes + xy_bytes) / t / peak
        if name in in_graph:
            try:
                tg = _graph_s(cp, torch, in_graph[name])
                row[name]["graph_s"] = tg
                row[name]["graph_gbps"] = (w_bytes + xy_bytes) / tg / 1e9
                if peak:
                    row[name]["graph_pct_peak"] = 100 * (w_bytes + xy_bytes) / tg / peak
            except Exception as e:      # recorded, not hidden
                row[name]["graph_error"] = f"{type(e).__name__}: {e}"[:200]
    yard = [nm for nm in ("torch", "cupy") if nm in fns]
    if yard:
        best = min(yard, key=lambda nm: row[nm]["steady_s"])
        row["yardstick"] = best
        row["ratio_steady"] = row[best]["steady_s"] / row["ours"]["steady_s"]
        best1 = min(yard, key=lambda nm: row[nm]["single_s"])
        row["ratio_single"] = row[best1]["single_s"] / row["ours"]["single_s"]
        if "graph_s" in row["ours"] and "graph_s" in row.get("torch", {}):
            row["ratio_graph_vs_torch"] = row["torch"]["graph_s"] / row["ours"]["graph_s"]
        if "stream_k" in fns:
            row["ratio_steady_stream_k"] = row[best]["steady_s"] / row["stream_k"]["steady_s"]
            row["ratio_single_stream_k"] = row[best1]["single_s"] / row["stream_k"]["single_s"]
            if "graph_s" in row["stream_k"] and "graph_s" in row.get("torch", {}):
                row["ratio_graph_vs_torch_stream_k"] = row["torch"]["graph_s"] / row["stream_k"]["graph_s"]
    del rot
    return row


def _geomean(xs):
    xs = [x for x in xs if x]
    return float(np.exp(np.mean(np.log(xs)))) if xs else None


def summarize(rows) -> dict:
    ok = [r for r in rows if "ratio_steady" in r]
    out = {"geomean_ratio_steady": _geomean([r["ratio_steady"] for r in ok]),
           "geomean_ratio_single": _geomean([r["ratio_single"] for r in ok]),
           "failures": sum("failure" in r for r in rows)}
    for m in sorted({r["m"] for r in ok}):
        sel = [r for r in ok if r["m"] == m]
        if sel:
            out[f"m{m}"] = {"geomean_ratio_steady": _geomean([r["ratio_steady"] for r in sel]),
                            "geomean_ratio_single": _geomean([r["ratio_single"] for r in sel]),
                            "min_ratio_graph_vs_torch": min((r["ratio_graph_vs_torch"] for r in sel
                                                             if r.get("ratio_graph_vs_torch")), default=None),
                            "min_ratio_single": min(r["ratio_single"] for r in sel),
                            "geomean_ratio_graph_vs_torch_stream_k":
                                _geomean([r.get("ratio_graph_vs_torch_stream_k") for r in sel]),
                            "geomean_ratio_single_stream_k": _geomean([r.get("ratio_single_stream_k") for r in sel]),
                            "min_graph_pct_peak": min((r["ours"].get("graph_pct_peak") for r in sel
                                                       if r["ours"].get("graph_pct_peak")), default=None),
                            "geomean_ratio_graph_vs_torch": _geomean([r.get("ratio_graph_vs_torch") for r in sel]),
                            "max_graph_pct_peak": max((r["ours"].get("graph_pct_peak") for r in sel
                                                       if r["ours"].get("graph_pct_peak")), default=None),
                            "min_pct_peak": min((r["ours"].get("pct_peak") for r in sel
                                                 if r["ours"].get("pct_peak")), default=None),
                            "max_pct_peak": max((r["ours"].get("pct_peak") for r in sel
                                                 if r["ours"].get("pct_peak")), default=None)}
    return out


def _line(r) -> str:
    if "failure" in r:
        return f"{r['layer']:18s} m={r['m']:3d} {r.get('dtype', '-'):8s} FAILED {r['failure']} {r.get('check', '')}"
    o = r["ours"]
    pct = f"{o['pct_peak']:5.1f}%" if "pct_peak" in o else "   - "
    yard = f"{r.get('yardstick', '-'):5s} x{r.get('ratio_steady', float('nan')):.3f}" if "ratio_steady" in r else ""
    graph = f" graph {o['graph_s'] * 1e6:7.2f} us {o.get('graph_pct_peak', 0):5.1f}%" if "graph_s" in o else ""
    sk = r.get("stream_k", {})
    before = (f" | stream_k graph {sk['graph_s'] * 1e6:7.2f} us x{r.get('ratio_graph_vs_torch_stream_k', 0):.3f}"
              if "graph_s" in sk else "")
    torch_g = r.get("torch", {}).get("graph_s")
    vs = f" torch graph {torch_g * 1e6:7.2f} us x{r.get('ratio_graph_vs_torch', 0):.3f} single x{r.get('ratio_single', 0):.3f}" \
        if torch_g else ""
    return (f"{r['layer']:18s} m={r['m']:3d} {r['dtype']:8s} ours {o['steady_s'] * 1e6:8.2f} us "
            f"{o['gbps']:7.0f} GB/s {pct} host {o.get('host_us', 0):5.1f} us{graph}  {yard}{vs}  "
            f"{r['spec'].get('split', '')} {r['spec']['path']} {r['spec']['tiles']} pipe={r['spec'].get('pipe', 0)} "
            f"ctas={r['spec']['ctas']}{before}")


#: --rows-sweep: token groups -> [(name, tiles (RG, KV, _, _, PIPE) of the row-block split or None
#: for gemv.ROWS_TILES')]: rings with fewer registers (more warps resident per SM, so more blocks x
#: warps in flight at once) beside the default; ptxas (sm_90): T <= 8 kv2r2x 90 registers (20 warps
#: per SM), kv1r4x 76, rg2r2 72, kv1r3x 80 (24); T = 16 base 124 (16), kv2r2 92 (20), kv1r3 62
#: (32), kv1r2 52 (32). The first H100 sweep (2ea2fde) picked kv1r4x at T <= 8 over the then base
#: kv2r2x (gemv.ROWS_TILES now holds it: "base" below is kv1r4x), base at T = 16.
ROWS_VARIANTS = {1: [("base", None), ("kv2r2x", (1, 2, 0, 0, 2 | 8)), ("rg2r2", (2, 1, 0, 0, 2)),
                     ("kv1r3x", (1, 1, 0, 0, 3 | 8))],
                 2: [("base", None), ("kv2r2", (1, 2, 0, 0, 2)), ("kv1r3", (1, 1, 0, 0, 3)),
                     ("kv1r2", (1, 1, 0, 0, 2))]}
ROWS_SWEEP_TOKENS = {1: 1, 2: 16}


def rows_sweep(cp, torch, gemv, layers) -> tuple:
    """Graph replays of the row-block split's variants (ROWS_VARIANTS) beside torch.matmul's,
    bfloat16, every layer at M = 1 and 16; (rows, picks): picks = {token groups: the tiles of the
    variant with the smallest geometric-mean time (ties: the earlier)}."""
    out, times = [], {g: {nm: [] for nm, _ in v} for g, v in ROWS_VARIANTS.items()}
    for g, variants in ROWS_VARIANTS.items():
        m = ROWS_SWEEP_TOKENS[g]
        for layer in layers:
            k, n = LAYERS[layer]
            copies = max(2, math.ceil(2 * cp.cuda.Device().attributes["L2CacheSize"] / (n * k * 2)))
            rot = Rotation(torch, n, k, m, torch.bfloat16, copies, seed=zlib.crc32(f"{layer} {m} bfloat16".encode()))

            def torch_mm(h):
                i = rot.next()
                torch.matmul(rot.x[i], rot.w[i].T, out=rot.y[i])
            t_torch = _graph_s(cp, torch, torch_mm)
            line = [f"rows-sweep {layer:18s} m={m:2d} torch {t_torch * 1e6:6.2f} us |"]
            for name, tiles in variants:
                r = {"layer": layer, "m": m, "variant": name, "tiles": tiles, "torch_graph_s": t_torch}
                try:
                    desc = _desc(m, n, k, "bfloat16", (rot.w[0].data_ptr(), rot.x[0].data_ptr(), rot.y[0].data_ptr()))
                    launch = gemv.bind(desc, tiles=tiles, split="rows")
                    ptrs = [(w.data_ptr(), x.data_ptr(), y.data_ptr()) for w, x, y in zip(rot.w, rot.x, rot.y)]
                    launch(*ptrs[rot.next()], 1.0, 0.0, torch.cuda.current_stream().cuda_stream)
                    torch.cuda.synchronize()
                    r["check"] = _check(torch, rot, m, n, k, "bfloat16")
                    sp = launch.spec
                    r.update(wk=sp.wk, ctas=sp.ctas, occupancy=sp.occupancy, resident_warps=sp.occupancy * sp.wk,
                             blocks=sp.row_tiles, kernel=sp.kernel_name)
                    if r["check"]["ok"]:
                        t = _graph_s(cp, torch, lambda h: launch(*ptrs[rot.next()], 1.0, 0.0, h))
                        r.update(graph_s=t, ratio_graph_vs_torch=t_torch / t, weight_tbps=n * k * 2 / t / 1e12)
                        times[g][name].append(t)
                        line.append(f"{name} {t * 1e6:6.2f} (wk {sp.wk} x{t_torch / t:.3f})")
                    else:
                        times[g][name].append(float("inf"))
                        line.append(f"{name} WRONG")
                except Exception as e:      # recorded, not hidden
                    r["failure"] = f"{type(e).__name__}: {e}"[:300]
                    times[g][name].append(float("inf"))
                    line.append(f"{name} FAIL")
                out.append(r)
            print(" ".join(line), flush=True)
            del rot
            torch.cuda.empty_cache()
    picks, geo = {}, {}
    for g, variants in ROWS_VARIANTS.items():
        geo[g] = {nm: float(np.exp(np.mean(np.log(ts)))) for nm, ts in times[g].items()}
        best = min(variants, key=lambda v: geo[g][v[0]])
        picks[g] = best[1]
        print(f"rows-sweep token groups {g}: geomean us " + " ".join(f"{nm} {t * 1e6:.2f}" for nm, t in geo[g].items())
              + f" -> {best[0]}", flush=True)
    return out, picks, geo


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="results JSON")
    ap.add_argument("--quick", action="store_true", help="two layers, M = 1 and 16")
    ap.add_argument("--dtypes", default="bfloat16,float16", help="comma list of bfloat16,float16")
    ap.add_argument("--sweep", action="store_true", help="also other tiles / residencies on two layers")
    ap.add_argument("--rows-sweep", action="store_true", help="also the row-block split's variants (graph replay)")
    ap.add_argument("--tokens", default=None, help="comma list of token counts (default 1,4,16,64)")
    ap.add_argument("--layers", default=None, help="comma list of layer names (default all)")
    ap.add_argument("--tiles-json", default=None,
                    help="bench/gemv_sweep.py's picks: {token groups: [P1, P2, WR, WK, PIPE, CTAs per SM]} "
                         "in place of gemv.TILES / PIPES for the mma_k mainloop")
    args = ap.parse_args(argv)
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    bad = [d for d in dtypes if d not in ("bfloat16", "float16")]
    if bad:
        raise SystemExit(f"--dtypes: {bad} not in bfloat16, float16")
    import cupy as cp
    import torch

    from pyblasgemm.kernels import gemv

    doc = {"schema": "pyblasgemm-gemv-bench/1", **meta(types.SimpleNamespace(torch=torch), seed=ROW_SEED),
           "method": __doc__,
           "tiles": {path: {str(tg): list(t) for tg, t in v.items()} for path, v in gemv.TILES.items()}}
    layers = QUICK_LAYERS if args.quick else tuple(LAYERS)
    tokens = (1, 16) if args.quick else TOKENS
    if args.layers:
        layers = tuple(x.strip() for x in args.layers.split(",") if x.strip())
    if args.tokens:
        tokens = tuple(int(x) for x in args.tokens.split(","))
    picks = {}
    if args.tiles_json:
        with open(args.tiles_json) as f:
            picks = {int(g): v for g, v in __import__("json").load(f).items()}
        doc["tiles_override"] = {str(g): v for g, v in picks.items()}

    def override(m):
        """(tiles, occupancy) of the picks for m tokens, or (None, None)."""
        v = picks.get(gemv._token_groups(m))
        return (tuple(v[:5]), v[5]) if v else (None, None)
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    # compile every instantiation the run needs in parallel first (seconds each, once)
    gemv.warm({gemv.plan(_desc(m, LAYERS[lay][1], LAYERS[lay][0], d, (16,)), sms, tiles=override(m)[0],
                         split=split).kernel_name
               for d in dtypes for lay in layers for m in tokens for split in (None, "stream_k")})
    rows_picks = {}
    if args.rows_sweep:
        sw_rows, rows_picks, geo = rows_sweep(cp, torch, gemv, layers)
        doc["rows_sweep"] = {"rows": sw_rows, "picks": {str(g): t for g, t in rows_picks.items()},
                             "geomean_graph_s": {str(g): v for g, v in geo.items()},
                             "variants": {str(g): v for g, v in ROWS_VARIANTS.items()}}
    rows = []
    for dtype_name in dtypes:
        for layer in layers:
            for m in tokens:
                try:
                    tiles, occ = override(m)
                    r = measure(cp, torch, gemv, layer, m, dtype_name, tiles=tiles, occupancy=occ,
                                rows_tiles=rows_picks.get(gemv._token_groups(m)))
                except Exception as e:      # recorded, not hidden
                    r = {"layer": layer, "m": m, "dtype": dtype_name, "failure": f"{type(e).__name__}: {e}"[:400]}
                rows.append(r)
                print(_line(r), flush=True)
                torch.cuda.empty_cache()
    doc["rows"] = rows
    doc["summary"] = summarize(rows)
    print(doc["summary"], flush=True)
    if args.sweep:
        sweep = []
        for layer in QUICK_LAYERS:
            for m in (1, 16):
                tg = 1 if m <= 8 else 2
                for tiles in SWEEP_TILES[tg]:
                    for occ in SWEEP_OCCUPANCY:
                        try:
                            r = measure(cp, torch, gemv, layer, m, "bfloat16", tiles=tiles, occupancy=occ,
                                        with_yardsticks=False)
                            r["asked"] = {"tiles": list(tiles), "occupancy": occ}
                        except Exception as e:
                            r = {"layer": layer, "m": m, "dtype": "bfloat16",
                                 "asked": {"tiles": list(tiles), "occupancy": occ},
                                 "failure": f"{type(e).__name__}: {e}"[:400]}
                        sweep.append(r)
                        print("sweep", r["asked"], _line(r), flush=True)
                        torch.cuda.empty_cache()
        doc["sweep"] = sweep
    write_doc(doc, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
