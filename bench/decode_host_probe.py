"""Where the held-out decode class's small products lose to torch.matmul: host issue time against GPU
time and the kernels each contender runs (torch.profiler), on CuPy arrays laid out as bench/heldout.py
lays them out, plus a cProfile of the auto call on decode-06's shape.

    PYTHONPATH=. python bench/decode_host_probe.py OUT.json
"""
import cProfile, io, json, pstats, sys, time, types
from pathlib import Path

import numpy as np, cupy as cp, torch, ml_dtypes
import pyblasgemm as pb

sys.path.insert(0, Path(__file__).resolve().parents[1].as_posix())
from bench.heldout import meta  # noqa: E402

SEED = 0

ENTRIES = [("decode-00", 1, 4289, 1194, "float16", "N", "T"), ("decode-06", 1, 1043, 4124, "bfloat16", "N", "T"),
           ("decode-12", 10, 1451, 3010, "float16", "T", "N"), ("decode-21", 57, 3096, 1245, "float16", "T", "T"),
           ("decode-04", 34, 3807, 1179, "bfloat16", "T", "N"), ("decode-09", 11, 2340, 6497, "float16", "T", "T")]
rs = np.random.RandomState(SEED)
out = {"schema": "pyblasgemm-decode-host-probe/1", **meta(types.SimpleNamespace(torch=torch), seed=SEED), "rows": []}

def store(r, c, dt):
    x = rs.uniform(-1, 1, size=(r, c)).astype(np.float32)
    return cp.asarray(x.astype(ml_dtypes.bfloat16) if dt == "bfloat16" else x.astype(np.float16))

def tview(s, dt, trans):
    t = torch.as_tensor(s.view(np.int16), device="cuda").view(torch.bfloat16) if dt == "bfloat16" else torch.as_tensor(s, device="cuda")
    return t.t() if trans == "T" else t

def timing(fn, n=300):
    for _ in range(20): fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n): fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    return (t1 - t0) / n * 1e6, (t2 - t0) / n * 1e6

for name, m, n, k, dt, ta, tb in ENTRIES:
    a_s = store(k, m, dt) if ta == "T" else store(m, k, dt)
    b_s = store(n, k, dt) if tb == "T" else store(k, n, dt)
    a = a_s.T if ta == "T" else a_s
    b = b_s.T if tb == "T" else b_s
    tA, tB = tview(a_s, dt, ta), tview(b_s, dt, tb)
    same = {"dtype": a.dtype} if dt == "bfloat16" else {}
    fns = {"torch.matmul": lambda: torch.matmul(tA, tB), "pb auto": lambda: pb.matmul(a, b, **same),
           "pb cublas": lambda: pb.matmul(a, b, backend="cublas", **same), "pb torch tensors": lambda: pb.matmul(tA, tB)}
    if dt != "bfloat16":
        fns["cupy.matmul"] = lambda: cp.matmul(a, b)
    try:
        plan_line = [l for l in pb.explain(a, b, **same).splitlines() if l.startswith("plan:")][0][:200]
    except Exception as e:
        plan_line = f"explain failed: {type(e).__name__}: {e}"[:200]
    row = {"id": name, "m": m, "n": n, "k": k, "dtype": dt, "layout": ta + tb, "plan": plan_line}
    for label, fn in fns.items():
        host, wall = timing(fn)
        row[label] = {"issue_us": round(host, 2), "wall_us": round(wall, 2)}
    # kernels and their GPU time per contender
    from torch.profiler import profile, ProfilerActivity
    kern = {}
    for label, fn in fns.items():
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(20): fn()
            torch.cuda.synchronize()
        ev = [e for e in prof.events() if e.device_type.name == "CUDA"]
        names = {}
        for e in ev:
            names.setdefault(e.name[:90], []).append(e.device_time if hasattr(e, "device_time") else e.cuda_time)
        kern[label] = {k2: [len(v), round(sum(v) / len(v), 2)] for k2, v in names.items()}
    row["kernels_us"] = kern
    out["rows"].append(row)
    print(json.dumps(row), flush=True)

# cProfile of the auto call on decode-06's shape (own time, top 15)
name, m, n, k, dt, ta, tb = ENTRIES[1]
a = store(m, k, dt); b = store(n, k, dt).T
same = {"dtype": a.dtype}
for _ in range(50): pb.matmul(a, b, **same)
pr = cProfile.Profile(); pr.enable()
for _ in range(500): pb.matmul(a, b, **same)
pr.disable(); cp.cuda.Device().synchronize()
s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(15)
out["cprofile_decode06"] = s.getvalue()[-4000:]
print(s.getvalue()[-4000:])
json.dump(out, open(sys.argv[1], "w"), indent=1)
