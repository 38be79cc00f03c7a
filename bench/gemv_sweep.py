"""Choose the GEMV kernel's mma_k ring (gemv.PIPES) and tiles (gemv.TILES) from one device run.

    GIT_SHA=$(git rev-parse HEAD) PYTHONPATH=.:bench python bench/gemv_sweep.py --out sweep.json --picks picks.json

For each decode layer (x @ W.T, W as ``torch.nn.Linear`` holds it, bfloat16) and token count,
every variant of ``VARIANTS`` (tiles (P1, P2, WR, WK, PIPE) of the mma_k mainloop, CTAs per SM)
is checked against float64 (gemv_bench._check) and timed as a CUDA-graph replay of 20 calls
(device time; the weight rotating through copies that exceed twice the L2, as in
gemv_bench.py), beside torch.matmul's graph replay of the same calls on the same bytes. The pick
per token-group count is the variant with the smallest geometric mean time over the layers and
token counts of that group (ties: the earlier, i.e. simpler, variant); ``--picks`` writes it as
``{token_groups: [P1, P2, WR, WK, PIPE, occupancy]}`` for ``gemv_bench.py --tiles-json``.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import types
import zlib

import numpy as np

sys.path.insert(0, __import__("pathlib").Path(__file__).resolve().parent.as_posix())
sys.path.insert(0, __import__("pathlib").Path(__file__).resolve().parents[1].as_posix())

from bench.heldout import meta, write_doc  # noqa: E402
import gemv_bench as gb  # noqa: E402

A, X, NP = 16, 8, 32   # gemv.ASYNC, gemv.X_PRE, gemv.NO_PREFETCH (literal: this module is read before pyblasgemm imports)
#: token groups -> [(name, (P1, P2, WR, WK, PIPE), CTAs per SM or None)], the first the shipped
#: default before the ring work (f58e290). Round 1 (2aa4887, H100): deeper rings, the cp.async
#: ring in shared memory (as3-as6, 12% slower than base), wider steps (kv2) lost; only reg2x won
#: (-1.7%). Round 2: without the 256-byte L2 fetch hint (ncu: L2 hit rate 43% against cuBLAS's
#: 5%, L2 throughput 77% above DRAM's 73%), 128-byte row steps in registers, WK = 4 at T = 16.
VARIANTS = {
    1: [("base", (2, 1, 1, 4, 0), None),
        ("reg2x", (2, 1, 1, 4, 2 | X), None),
        ("reg2x_nopf", (2, 1, 1, 4, 2 | X | NP), None),
        ("base_nopf", (2, 1, 1, 4, 3 | NP), None),
        ("kv2reg2x", (1, 2, 1, 4, 2 | X), None),
        ("kv2reg3", (1, 2, 1, 4, 3), None),
        ("rg1reg3x", (1, 1, 1, 4, 3 | X), None),
        ("as4", (2, 1, 1, 4, A | 4), None)],
    2: [("base", (2, 1, 2, 2, 0), None),
        ("reg2x", (2, 1, 2, 2, 2 | X), None),
        ("base_nopf", (2, 1, 2, 2, 2 | NP), None),
        ("reg2x_nopf", (2, 1, 2, 2, 2 | X | NP), None),
        ("wk4as3", (2, 1, 1, 4, A | 3), None)],
}
LAYERS = ("llama3-8b o", "llama3-8b gate/up", "llama3-8b down")
TOKENS = {1: (1, 8), 2: (16,)}


def _graph_row(cp, torch, gemv, layer, m, tiles, occ, rot, stream_check=True) -> dict:
    k, n = gb.LAYERS[layer]
    desc = gb._desc(m, n, k, "bfloat16", (rot.w[0].data_ptr(), rot.x[0].data_ptr(), rot.y[0].data_ptr()))
    launch = gemv.bind(desc, tiles=tiles, occupancy=occ)
    ptrs = [(w.data_ptr(), x.data_ptr(), y.data_ptr()) for w, x, y in zip(rot.w, rot.x, rot.y)]
    s = launch.spec
    out = {"ctas": s.ctas, "occupancy": s.occupancy, "threads": s.threads, "smem": s.smem, "kernel": s.kernel_name}
    launch(*ptrs[rot.next()], 1.0, 0.0, torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    out["check"] = gb._check(torch, rot, m, n, k, "bfloat16")
    if not out["check"]["ok"]:
        out["failure"] = "outside the tolerance: not timed"
        return out
    t = gb._graph_s(cp, torch, lambda h: launch(*ptrs[rot.next()], 1.0, 0.0, h))
    out["graph_s"] = t
    out["weight_tbps"] = n * k * 2 / t / 1e12
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--picks", required=True)
    args = ap.parse_args(argv)
    import cupy as cp
    import torch

    from pyblasgemm.kernels import gemv

    dev_name = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    peak = gb.peak_bw(dev_name)
    doc = {"schema": "pyblasgemm-gemv-sweep/1", **meta(types.SimpleNamespace(torch=torch), seed=gb.ROW_SEED),
           "method": __doc__, "variants": {str(g): [[nm, list(t), o] for nm, t, o in v] for g, v in VARIANTS.items()}}
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    names = set()
    for g, vs in VARIANTS.items():
        for m in TOKENS[g]:
            for layer in LAYERS:
                k, n = gb.LAYERS[layer]
                for _, t, _ in vs:
                    names.add(gemv.plan(gb._desc(m, n, k, "bfloat16", (16,)), sms, tiles=t).kernel_name)
    gemv.warm(names)
    rows, picks = [], {}
    for g, vs in VARIANTS.items():
        times = {nm: [] for nm, _, _ in vs}
        for m in TOKENS[g]:
            for layer in LAYERS:
                k, n = gb.LAYERS[layer]
                l2 = cp.cuda.Device().attributes["L2CacheSize"]
                copies = max(2, math.ceil(2 * l2 / (n * k * 2)))
                rot = gb.Rotation(torch, n, k, m, torch.bfloat16, copies,
                                  seed=zlib.crc32(f"{layer} {m} bfloat16".encode()))

                def torch_mm(h):
                    i = rot.next()
                    torch.matmul(rot.x[i], rot.w[i].T, out=rot.y[i])
                t_torch = gb._graph_s(cp, torch, torch_mm)
                line = [f"{layer:18s} m={m:2d} torch {t_torch * 1e6:6.2f} us {n * k * 2 / t_torch / 1e12:5.2f} TB/s |"]
                for nm, tiles, occ in vs:
                    try:
                        r = _graph_row(cp, torch, gemv, layer, m, tiles, occ, rot)
                    except Exception as e:      # recorded, not hidden
                        r = {"failure": f"{type(e).__name__}: {e}"[:300]}
                    r.update(layer=layer, m=m, variant=nm, tiles=list(tiles), asked_occupancy=occ,
                             torch_graph_s=t_torch)
                    if "graph_s" in r:
                        r["ratio_graph_vs_torch"] = t_torch / r["graph_s"]
                        if peak:
                            r["weight_pct_peak"] = 100 * n * k * 2 / r["graph_s"] / peak
                        times[nm].append(r["graph_s"])
                        line.append(f"{nm} {r['graph_s'] * 1e6:6.2f}")
                    else:
                        times[nm].append(float("inf"))
                        line.append(f"{nm} FAIL")
                    rows.append(r)
                print(" ".join(line), flush=True)
                del rot
                torch.cuda.empty_cache()
        geo = {nm: float(np.exp(np.mean(np.log(ts)))) for nm, ts in times.items()}
        best = min(vs, key=lambda v: geo[v[0]])
        picks[str(g)] = list(best[1]) + [best[2]]
        doc.setdefault("geomean_graph_s", {})[str(g)] = geo
        print(f"token groups {g}: geomean us " + " ".join(f"{nm} {t * 1e6:.2f}" for nm, t in geo.items())
              + f" -> {best[0]}", flush=True)
    doc["rows"], doc["picks"], doc["peak_bw"] = rows, picks, peak
    write_doc(doc, args.out)
    with open(args.picks, "w") as f:
        json.dump(picks, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
