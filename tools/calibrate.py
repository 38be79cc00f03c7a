"""Derive the cost model's calibration from measured JSON (``bench/results/*.json``).

Run ``python tools/calibrate.py bench/results`` to regenerate
``pyblasgemm/planner/calibration_h100.json``; a test checks the shipped file matches what the
measurements in the repository give. Each constant is solved from the points that isolate it,
in this order (sm_90 rates are fractions of the H100 spec's peaks, so other families scale):

1. host overhead per call and backend: ``host us per 64^3 hgemm`` (backends JSON);
2. tile efficiency per (kind, tile): sliced points of the kernels JSON (kernel-only timing) with
   at least two waves: ``eff = model time at eff 1 / measured``, median per tile;
3. ``lone_cta_eff`` from the parallel split-k long-K points (one CTA per SM), with the reduce
   kernel's launch gap assumed (``reduce_launch_us``, not separable from those points);
4. ``splitk_link_us`` from the serial split-k point; ``streamk_fixed_us`` and
   ``streamk_partial_us`` (fixed + per added partial) by least squares on the f16 stream-k and
   hybrid points (one partial per owner at 3072^3, sixteen at 512x512x32768);
5. layout factors (NN, NT, TT vs TN) from the backends JSON tensorcore points, minus host time;
6. cuBLAS efficiency per (dtype, compute) from its large-problem points (kernel-only where
   available), its tail factor from 3072^3, its bandwidth efficiency from 512x512x32768, and the
   int8 rearranging copies (fixed + per byte) by least squares on the non-"TN" int8 points;
7. unaligned operands (leading dimensions not multiples of 16 bytes): our scalar-copy path
   (``scalar_path_factor``) and cuBLAS's (``cublas.unaligned_eff``) from the public-suite JSON
   (``bench/suite.py``, GPU time with host overhead hidden), which also validates the model:
   ``suite_validation`` holds predicted/measured per backend and dtype;
8. residuals: every point's prediction vs measurement, kept in the file.
"""
from __future__ import annotations

import copy
import glob
import json
import math
import os
import statistics
import sys

import numpy as np

from dataclasses import replace

if __name__ == "__main__":      # ``python tools/calibrate.py`` from a source checkout
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pyblasgemm.kernels.config import KernelConfig  # noqa: E402
from pyblasgemm.kernels.problem import KernelProblem  # noqa: E402
from pyblasgemm.planner.arch import FAMILIES  # noqa: E402
from pyblasgemm.planner import model as M  # noqa: E402
from pyblasgemm.planner.problem import kind_of, make_desc  # noqa: E402

REF = FAMILIES["sm_90"]

# The results files name the configs they timed directly (kernels JSON) or ran the backend's
# default rule (backends and suite JSON). That rule and the shipped tiles change with the
# kernels, so the ones in force when the measurements were taken (commits e230c2b..9e162ef,
# 2026-11-22) are frozen here: the calibration must not move when the kernels' defaults do.
# After new measurements of new kernels, update these with the rule the run used.
_C = KernelConfig
MEASURED_TILES = {   # kind -> (workhorse, small 64x64, large)
    "f16": (_C(bk=32, warps_m=2, warps_n=2, stages=4), _C(bm=64, bn=64, bk=32, stages=4),
            _C(bm=128, bn=256, bk=32, warps_m=2, warps_n=4, stages=3)),
    "s8": (_C(bk=64, warps_m=2, warps_n=4, stages=4), _C(bm=64, bn=64, bk=64, stages=4),
           _C(bm=128, bn=256, bk=128, warps_m=2, warps_n=4, stages=3)),
    "tf32": (_C(bk=32, warps_m=2, warps_n=4, stages=3), _C(bm=64, bn=64, bk=16, stages=4), None),
    "3xtf32": (_C(bk=16, warps_m=2, warps_n=4, stages=4), _C(bm=64, bn=64, bk=16, stages=4), None),
}
MEASURED_TILES["bf16"] = MEASURED_TILES["f16"]


def measured_default_config(problem: KernelProblem, sm_count: int) -> KernelConfig:
    """``kernels.default_config`` as it was when the results were measured (see above)."""
    work, small, large = MEASURED_TILES[problem.kind]
    base = work
    if problem.m * problem.n <= 128 * 128:
        base = small
    elif problem.kind == "s8" and problem.m >= 4096 and problem.n >= 4096:
        base = large
    tiles = -(-problem.m // base.bm) * -(-problem.n // base.bn) * problem.batch
    kt = -(-problem.k // base.bk)
    if tiles < sm_count and kt >= 16:
        splits = max(2, min(kt // 4, -(-sm_count // tiles)))
        d = "splitk_serial" if splits <= 4 else "splitk_parallel"
        return replace(base if base.bm == 64 else work, decomposition=d, splits=splits)
    waves = tiles / sm_count
    frac = waves - int(waves)
    if waves > 1 and frac and frac < 0.5 and kt >= 8 and base.bm == 128:
        return replace(base, decomposition="hybrid")
    return base
#: not separable from the measurements we have; stated, not fitted
ASSUMED = {"kernel_latency_us": 3.0, "reduce_launch_us": 3.0, "scalar_path_factor": 0.5,
           "cta_overhead_it": 2.0}   # scalar_path_factor: replaced by the suite's fit when present
_KIND_DT = {"f16": "h", "bf16": "b", "s8": "i", "tf32": "s", "3xtf32": "s"}
_COMPUTE = {"f16": "fp32", "bf16": "fp32", "s8": "int32", "tf32": "tf32", "3xtf32": "3xtf32"}


def _problem(kind, ta, tb, m, n, k):
    lda = k if ta == "T" else m
    ldb = n if tb == "T" else k
    one, zero = (1, 0) if kind == "s8" else (1.0, 0.0)
    return KernelProblem(kind, ta, tb, m, n, k, lda, ldb, m, 256, 256, 256, one, zero)


def _base() -> dict:
    cal = {"ref_arch": "sm_90", "ref_device": "NVIDIA H100 80GB HBM3", **ASSUMED,
           "host_us": {"tensorcore": 70.0, "cublas": 20.0}, "lone_cta_eff": 1.0,
           "splitk_link_us": 0.0, "streamk_partial_us": 0.0, "streamk_fixed_us": 0.0,
           "ours": {k: {"tiles": {}, "workhorse_eff": 0.5,
                        "layout": {"TN": 1.0, "NN": 1.0, "NT": 1.0, "TT": 1.0}}
                    for k in ("f16", "bf16", "s8", "tf32", "3xtf32")},
           "cublas": {"eff": {}, "eff_default": 0.85, "tail": 0.0, "bw_eff": 1.0, "unaligned_eff": 1.0,
                      "int8_copy": {"fixed_us": 0.0, "bytes_per_s": 1e12}}}
    return cal


def file_sha256(path) -> str:
    """sha256 of a results file (the calibration records which versions it was derived from)."""
    import hashlib

    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _load(results_dir, sources=None):
    kernels, backends, suites, host_costs = [], [], [], []
    for path in sorted(glob.glob(os.path.join(results_dir, "*.json"))):
        name = os.path.basename(path)
        if sources is not None and name not in sources:
            continue
        with open(path) as f:
            d = json.load(f)
        if "results" in d and name.startswith("kernels"):
            kernels.append((name, d))
        elif "cases" in d and name.startswith("backends"):
            backends.append((name, d))
        elif d.get("schema") == "pyblasgemm-bench/1" and d.get("device", {}).get("kind") == "gpu":
            suites.append((name, d))
        elif name.startswith("launch_primitives") and "cupy launchKernel" in d.get("host_us", {}):
            host_costs.append((name, d))
        elif name.startswith("host_cost") and any(r.get("form") == "stateful" and r.get("set")
                                                   for r in d.get("rows", ())):
            host_costs.append((name, d))
    return kernels, backends, suites, host_costs


def _call_host_us(host_costs) -> dict | None:
    """Host µs of one call once planned and bound, per route, from bench/host_cost.py runs: the
    stateful form's (``Matmul.execute``: the launch and nothing else), 64³ and 256³ float16 and
    bfloat16, each route forced. ``tensorcore``/``cublas``: the median over every such row
    (the model's host term); ``tensorcore_high``/``cublas_low``: the largest per-run median of
    ours and the smallest of cuBLAS's (the host-bound rule's cautious pair); ``launch``: one
    more kernel launch, from bench/launch_primitives.py runs. None without runs
    of the current form (interleaved timing, a ``set`` per row)."""
    rows = {"tensorcore": [], "cublas": []}
    per_run = {"tensorcore": [], "cublas": []}
    launches = [d["host_us"]["cupy launchKernel"] for _, d in host_costs if "rows" not in d]
    for _, d in host_costs:
        if "rows" not in d:
            continue
        for route in rows:
            v = [r["host_us"] for r in d["rows"]
                 if r.get("set") == "issue" and r.get("form") == "stateful"
                 and r.get("route") == route and r.get("dtype") in ("float16", "bfloat16")
                 and r.get("host_us")]
            if v:
                rows[route] += v
                per_run[route].append(statistics.median(v))
    if not rows["tensorcore"] or not rows["cublas"]:
        return None
    return {"tensorcore": round(statistics.median(rows["tensorcore"]), 2),
            "cublas": round(statistics.median(rows["cublas"]), 2),
            "tensorcore_high": round(max(per_run["tensorcore"]), 2),
            "cublas_low": round(min(per_run["cublas"]), 2),
            # one more launch in a call (prep, reduce, memset): a raw CuPy launchKernel
            # (bench/launch_primitives.py); 0 without such runs
            "launch": round(statistics.median(launches), 2) if launches else 0.0}


_SUITE_DT = {"fp16": "f16", "bf16": "bf16", "int8": "i8", "fp32": "f32", "3xtf32": "f32"}


def _suite_points(suites):
    """(source, impl, GemmDesc, GPU seconds) for our kernels (default config) and cuBLAS from
    the public-suite JSON (bench/suite.py: host overhead hidden by queueing the calls)."""
    out = []
    for src, d in suites:
        for r in d["results"]:
            if r.get("error") or not r.get("seconds") or r["impl"] not in ("tensorcore", "cublas"):
                continue
            dt = _SUITE_DT.get(r["dtype"])
            if dt is None:
                continue
            comp = None if r["compute"] == "default" else r["compute"]
            desc = make_desc(r["m"], r["n"], r["k"], dt, compute=comp, transa=r["trans"][0],
                             transb=r["trans"][1])
            if r["impl"] == "cublas" and desc.compute == "3xtf32":
                desc = desc._replace(compute="fp32")      # the yardstick there is SGEMM
            out.append((src, r["impl"], desc, r["seconds"]))
    return out


def _suite_pred(impl, desc, cal):
    if impl == "cublas":
        return M.score_cublas(desc, REF, cal).gpu
    from pyblasgemm.planner.core import kernel_problem_for

    prob = kernel_problem_for(desc)
    return M.score_ours(measured_default_config(prob, REF.sm_count), prob, REF, cal).gpu


def _kernel_points(kernels):
    """(source, kind, layout, m, n, k, config, ours_s, ref_name, ref_s) from the kernels JSON."""
    out = []
    for src, d in kernels:
        for r in d["results"]:
            words = r["name"].split()
            layout = next((w for w in words if w in ("TN", "NN", "NT", "TT")), "TN")
            out.append((src, r["kind"], layout, r["m"], r["n"], r["k"],
                        M.parse_config_name(r["config"]), r["ours_s"], r.get("ref"), r.get("ref_s")))
    return out


def _gpu(cfg, prob, cal, part="gpu"):
    return getattr(M.score_ours(cfg, prob, REF, cal), part)


def derive(results_dir: str, sources=None) -> dict:
    """The calibration dict from the JSON files in ``results_dir`` (``kernels*.json`` and
    ``backends*.json``; only the file names in ``sources`` when given)."""
    kernels, backends, suites, host_costs = _load(results_dir, sources)
    cal = _base()
    lat = cal["kernel_latency_us"] * 1e-6
    cal["sources"] = [n for n, _ in kernels + backends + suites + host_costs]
    cal["source_sha256"] = {n: file_sha256(os.path.join(results_dir, n)) for n in cal["sources"]}
    for _, d in backends:
        for c in d["cases"]:
            if str(c.get("case", "")).startswith("host us"):
                cal["host_us"] = {"tensorcore": round(c["tensorcore"], 2), "cublas": round(c["cublas"], 2)}
    # host_us is the call path's cost when the API-call timings above were taken (subtracted
    # from them below); call_host_us is today's (the model's host term)
    call_host = _call_host_us(host_costs)
    if call_host is not None:
        cal["call_host_us"] = call_host
    kp = _kernel_points(kernels)
    S = REF.sm_count

    # 2) tile efficiencies from sliced points with >= 2 waves, measured layout TN; per point
    #    eff = model compute time at eff 1 / measured
    implied: dict = {}
    for _, kind, lay, m, n, k, cfg, t, _, _ in kp:
        if cfg.decomposition != "sliced" or lay != "TN":
            continue
        prob = _problem(kind, "T", "N", m, n, k)
        if -(-m // cfg.bm) * -(-n // cfg.bn) < 2 * S:
            continue
        key = M.tile_key(cfg, kind)
        cal["ours"][kind]["tiles"][key] = 1.0
        compute = _gpu(cfg, prob, cal, "compute")
        implied.setdefault((kind, key), {}).setdefault((m, n, k), []).append(compute / (t - lat))
    # the workhorse tile: median over its points; any other tile: the workhorse's efficiency
    # times the median ratio on the shapes both were measured on (shape effects cancel)
    med = lambda by: statistics.median(v for vals in by.values() for v in vals)
    for (kind, key), by in implied.items():
        work = implied.get((kind, M.tile_key(MEASURED_TILES[kind][0], kind)))
        shared = [sh for sh in by if work and sh in work]
        if work and shared and work is not by:
            ratio = statistics.median(statistics.median(by[sh]) / statistics.median(work[sh])
                                      for sh in shared)
            cal["ours"][kind]["tiles"][key] = round(med(work) * ratio, 4)
        else:
            cal["ours"][kind]["tiles"][key] = round(med(by), 4)
    for kind, entry in cal["ours"].items():
        if not entry["tiles"] and kind == "bf16":   # same MMA rate and data size as f16
            entry["tiles"] = dict(cal["ours"]["f16"]["tiles"])
        work = M.tile_key(MEASURED_TILES[kind][0], kind)
        if work in entry["tiles"]:
            entry["workhorse_eff"] = entry["tiles"][work]
        elif entry["tiles"]:
            entry["workhorse_eff"] = round(statistics.median(entry["tiles"].values()), 4)

    # 3) lone-CTA efficiency: parallel split-k points with one CTA per SM
    lone = []
    for _, kind, lay, m, n, k, cfg, t, _, _ in kp:
        if cfg.decomposition == "splitk_parallel":
            prob = _problem(kind, "T", "N", m, n, k)
            s = M.score_ours(cfg, prob, REF, cal)
            if s.ctas <= S:
                lone.append(s.compute / (t - lat - s.fixup))
    if lone:
        cal["lone_cta_eff"] = round(min(1.0, max(0.3, statistics.median(lone))), 4)
    # 4) serial split-k link; stream-k fixed cost + per-partial cost (least squares)
    link, rows, ys = [], [], []
    for _, kind, lay, m, n, k, cfg, t, _, _ in kp:
        prob = _problem(kind, "T", "N", m, n, k)
        s = M.score_ours(cfg, prob, REF, cal)
        if cfg.decomposition == "splitk_serial" and s.splits > 1:
            link.append((t - lat - s.compute) / (s.splits - 1) * 1e6)
        elif cfg.decomposition in ("streamk", "hybrid") and kind == "f16":
            # f16 only: the tf32 / 3xTF32 hybrid points differ from their sliced twins by more
            # than the whole fixup (multi-ms runs), they would swamp a microsecond fit
            rows.append([1.0, float(M.streamk_partials(cfg, prob, REF, s.occupancy))])
            ys.append((t - lat - s.compute) * 1e6)
    if link:
        cal["splitk_link_us"] = round(max(0.0, statistics.median(link)), 3)
    if len(rows) >= 2 and len({r[1] for r in rows}) >= 2:
        (fixed, per), *_ = np.linalg.lstsq(np.array(rows), np.array(ys), rcond=None)
        cal["streamk_fixed_us"] = round(max(0.0, fixed), 3)
        cal["streamk_partial_us"] = round(max(0.0, per), 3)
    elif rows:
        cal["streamk_partial_us"] = round(max(0.0, statistics.median(y / r[1] for r, y in zip(rows, ys))), 3)

    # 5) layout factors from the backends JSON (default config of the backend, minus host)
    lay_pts: dict = {}
    cases = [c for _, d in backends for c in d["cases"] if _case_kind(c) and c.get("tensorcore_ms")]

    def setting(c):
        kind = _case_kind(c)
        prob = _problem(kind, c["trans"][0], c["trans"][1], c["m"], c["n"], c["k"])
        cfg = measured_default_config(prob, S)     # what the backend ran
        measured = c["tensorcore_ms"] * 1e-3 - cal["host_us"]["tensorcore"] * 1e-6
        return kind, prob, cfg, measured

    later = []
    for c in cases:
        kind, prob, cfg, measured = setting(c)
        if M.tile_key(cfg, kind) not in cal["ours"][kind]["tiles"]:
            later.append(c)
        elif c["trans"] != "TN":
            lay_pts.setdefault((kind, c["trans"]), []).append(
                (_gpu(cfg, prob, cal) - lat) / (measured - lat))
    for (kind, lay), vals in lay_pts.items():
        cal["ours"][kind]["layout"][lay] = round(min(1.0, statistics.median(vals)), 4)
    for kind, entry in cal["ours"].items():
        lay = entry["layout"]
        if kind == "bf16" and (kind, "NN") not in lay_pts:
            lay["NN"] = cal["ours"]["f16"]["layout"]["NN"]
        if kind == "3xtf32" and (kind, "NN") not in lay_pts:   # same operand path as tf32
            lay["NN"] = cal["ours"]["tf32"]["layout"]["NN"]
        nn = lay["NN"]
        if (kind, "TT") not in lay_pts:
            lay["TT"] = nn                       # one MN-contiguous operand, like NN
        if (kind, "NT") not in lay_pts:
            lay["NT"] = round(nn * nn, 4)        # both MN-contiguous
    # the backend's default tile was not measured alone (3xTF32's 64-byte rows): the point
    # calibrates that tile, through the layout factor found above
    for c in later:
        kind, prob, cfg, measured = setting(c)
        eff, _ = M.tile_efficiency(cfg, kind, cal)
        cal["ours"][kind]["tiles"][M.tile_key(cfg, kind)] = round(
            eff * (_gpu(cfg, prob, cal) - lat) / (measured - lat), 4)

    # 6) cuBLAS
    sp = _suite_points(suites)
    _fit_cublas(cal, kp, backends, sp)

    # 7) unaligned operands (leading dimensions not multiples of 16 bytes) from the public
    #    suite: our scalar-copy path, and cuBLAS's slower kernels for such problems
    for impl, key in (("tensorcore", "scalar_path_factor"), ("cublas", "cublas_unaligned_eff")):
        ratios = []
        for _, im, desc, t in sp:
            if im == impl and desc.align < 16:
                c1 = dict(cal, **{key: 1.0}) if impl == "tensorcore" else \
                    dict(cal, cublas=dict(cal["cublas"], unaligned_eff=1.0))
                ratios.append((_suite_pred(impl, desc, c1) - lat) / (t - lat))
        if ratios:
            v = round(min(1.0, statistics.median(ratios)), 4)
            if impl == "tensorcore":
                cal[key] = v
            else:
                cal["cublas"]["unaligned_eff"] = v
    # validation on the suite: predicted / measured GPU time per (backend, dtype)
    val: dict = {}
    for _, im, desc, t in sp:
        val.setdefault(f"{im} {desc.row.ab_dtype.name}/{desc.compute}", []).append(
            _suite_pred(im, desc, cal) / t)
    cal["suite_validation"] = {k: {"points": len(v), "median_pred_over_measured": round(statistics.median(v), 3),
                                   "within_25pct": round(sum(0.8 <= x <= 1.25 for x in v) / len(v), 3)}
                               for k, v in sorted(val.items())}
    cal["points"] = _residuals(cal, kp, backends)
    errs = [abs(math.log(p["predicted_s"] / p["measured_s"])) for p in cal["points"]]
    cal["median_abs_log_error"] = round(statistics.median(errs), 4) if errs else None
    return cal


def _case_kind(c):
    dt, compute = c.get("dtype"), c.get("compute")
    if dt in ("f16", "bf16"):
        return dt
    if dt == "i8":
        return "s8"
    if dt == "f32" and compute in ("tf32", "3xtf32"):
        return compute
    return None


def _cublas_key(c):
    dt, compute = c["dtype"], c["compute"]
    prefix = {"f16": "h", "bf16": "b", "i8": "i", "f32": "s"}[dt]
    comp = {"h": "fp32", "b": "fp32", "i": "int32", "s": "fp32"}[prefix] if compute == "default" else compute
    return prefix, comp


def _ref_key(ref):
    if ref is None:
        return None
    if "int_mm" in ref:
        return "i", "int32"
    if "tf32" in ref:
        return "s", "tf32"
    if "float16" in ref:
        return "h", "fp32"
    if "float32" in ref:
        return "s", "fp32"
    return None


def _cublas_points(kp, backends, cal):
    """(prefix, compute, trans, m, n, k, gpu seconds) for cuBLAS from both files."""
    pts, seen = [], set()
    for _, kind, lay, m, n, k, cfg, t, ref, ref_s in kp:
        key = _ref_key(ref)
        if key and ref_s and (key, m, n, k) not in seen:
            seen.add((key, m, n, k))
            pts.append((*key, "TN" if key[0] == "i" else "NN", m, n, k, ref_s, "kernels"))
    for _, d in backends:
        for c in d["cases"]:
            if c.get("cublas_ms"):
                key = _cublas_key(c)
                gpu = c["cublas_ms"] * 1e-3 - cal["host_us"]["cublas"] * 1e-6
                pts.append((*key, c["trans"], c["m"], c["n"], c["k"], gpu, "backends"))
    return pts


def _fit_cublas(cal, kp, backends, suite_points=()):
    cb = cal["cublas"]
    lat = cal["kernel_latency_us"] * 1e-6
    pts = _cublas_points(kp, backends, cal)
    for _, impl, d, t in suite_points:
        if impl == "cublas" and d.align == 16:
            pts.append((d.prefix, d.compute, d.transa + d.transb, d.m, d.n, d.k, t, "suite"))

    def desc(p):
        prefix, comp, tr, m, n, k = p[:6]
        return make_desc(m, n, k, prefix, compute=comp, transa=tr[0], transb=tr[1])

    def copy_free(p):
        return p[0] != "i" or (p[2] == "TN" and p[5] % 4 == 0)

    for _ in range(3):    # eff and tail depend on each other: a few rounds settle them
        effs: dict = {}
        for p in pts:
            if min(p[3], p[4]) >= 2048 and p[5] >= 2048 and copy_free(p):
                d = desc(p)
                s = M.score_cublas(d, REF, _with_eff(cal, d, 1.0))
                effs.setdefault(f"{d.prefix}/{d.compute}", []).append((s.compute) / (p[6] - lat))
        cb["eff"] = {k: round(statistics.median(v), 4) for k, v in effs.items()}
        tails = []
        for p in pts:
            if p[0] == "h" and p[3] == p[4] == p[5] == 3072:
                d = desc(p)
                tiles = -(-d.m // 128) * -(-d.n // 256)
                w = tiles / REF.sm_count
                q = math.ceil(w) / w
                key = f"{d.prefix}/{d.compute}"
                base = d.flops / (cb["eff"][key] * REF.best_peak("f16"))
                tails.append(((p[6] - lat) / base - 1) / (q - 1))
        if tails:
            cb["tail"] = round(min(1.0, max(0.0, statistics.median(tails))), 4)
    bws = []
    for p in pts:
        if p[0] == "h" and p[5] >= 16 * max(p[3], p[4]):
            d = desc(p)
            s = M.score_cublas(d, REF, dict(cal, cublas=dict(cb, bw_eff=1.0)))
            bws.append(s.memory / (p[6] - lat))
    if bws:
        cb["bw_eff"] = round(min(1.0, statistics.median(bws)), 4)
    # int8 copies: extra = fixed + bytes / rate over the points that copy
    rows, ys = [], []
    for p in pts:
        if p[0] == "i" and not copy_free(p) and p[7] == "backends":
            d = desc(p)
            s = M.score_cublas(d, REF, cal)
            copied = (s.fixup - cb["int8_copy"]["fixed_us"] * 1e-6) * cb["int8_copy"]["bytes_per_s"]
            rows.append([1.0, copied])
            ys.append(p[6] - (s.gpu - s.fixup))
    if len(rows) >= 2:
        (fixed, per_byte), *_ = np.linalg.lstsq(np.array(rows), np.array(ys), rcond=None)
        cb["int8_copy"] = {"fixed_us": round(max(0.0, fixed) * 1e6, 2),
                           "bytes_per_s": float(f"{1.0 / max(per_byte, 1e-15):.4g}")}


def _with_eff(cal, d, eff):
    c = copy.deepcopy(cal)
    c["cublas"]["eff"][f"{d.prefix}/{d.compute}"] = eff
    return c


def _residuals(cal, kp, backends):
    out = []
    for src, kind, lay, m, n, k, cfg, t, _, _ in kp:
        s = M.score_ours(cfg, _problem(kind, lay[0], lay[1], m, n, k), REF, cal)
        out.append({"source": src, "backend": "tensorcore", "kind": kind, "trans": lay,
                    "shape": [m, n, k], "config": cfg.name, "measured_s": t,
                    "predicted_s": float(f"{s.gpu:.6g}"), "timing": "kernel only"})
    for src, d in backends:
        for c in d["cases"]:
            kind = _case_kind(c) if "dtype" in c else None
            if kind and c.get("tensorcore_ms"):
                ta, tb = c["trans"]
                prob = _problem(kind, ta, tb, c["m"], c["n"], c["k"])
                s = M.score_ours(measured_default_config(prob, REF.sm_count), prob, REF, cal)
                # API calls timed with the call path of then: its host cost (host_us), not today's
                then = s.gpu + cal["host_us"]["tensorcore"] * 1e-6
                out.append({"source": src, "backend": "tensorcore", "kind": kind, "trans": c["trans"],
                            "shape": [c["m"], c["n"], c["k"]], "measured_s": c["tensorcore_ms"] * 1e-3,
                            "predicted_s": float(f"{then:.6g}"), "timing": "API call"})
            if "dtype" in c and c.get("cublas_ms"):
                prefix, comp = _cublas_key(c)
                dd = make_desc(c["m"], c["n"], c["k"], prefix, compute=comp, transa=c["trans"][0],
                               transb=c["trans"][1])
                s = M.score_cublas(dd, REF, cal)
                then = s.gpu + cal["host_us"]["cublas"] * 1e-6
                out.append({"source": src, "backend": "cublas", "kind": f"{prefix}/{comp}",
                            "trans": c["trans"], "shape": [c["m"], c["n"], c["k"]],
                            "measured_s": c["cublas_ms"] * 1e-3, "predicted_s": float(f"{then:.6g}"),
                            "timing": "API call"})
    return out


def _read_json(path) -> dict:
    with open(path) as f:
        return json.load(f)


def derive_sm90(paths) -> dict:
    """The Hopper kernel's calibration from ``bench/bench_sm90.py`` results: per (kind, tile),
    ``eff = model time at efficiency 1 / measured`` over the sliced points with at least two
    waves of tiles (median), and every such point's residual kept for reference.

    Example::

        cal = derive_sm90(["bench/results/sm90_h100_2026-11-22_run7.json"])
        cal["f16"]["tiles"]["sm90a_256x128x128B_w2x1_s4"]             # fraction of the wgmma peak
    """
    per: dict = {}
    sources = {}
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        sources[os.path.basename(path)] = file_sha256(path)
        for row in data["rows"]:
            kind = row["kind"]
            for name, t in row["ours"].items():
                if not isinstance(t, float) or "_sliced_" not in name:
                    continue
                cfg = M.parse_config_name(name)
                prob = _problem(kind, row["layout"][0], row["layout"][1], row["m"], row["n"], row["k"])
                tiles = -(-row["m"] // cfg.bm) * -(-row["n"] // cfg.bn)
                if tiles < 2 * REF.sm_count:
                    continue
                key = M.tile_key(cfg, kind)
                cal = dict(M.load_calibration(), sm90={kind: {"tiles": {key: 1.0}}})
                t1 = M.score_ours(cfg, prob, REF, cal, 1).gpu
                per.setdefault(kind, {}).setdefault(key, []).append(t1 / t)
    out = {kind: {"tiles": {k: round(statistics.median(v), 4) for k, v in sorted(tiles.items())}}
           for kind, tiles in sorted(per.items())}
    out["sources"] = sources
    # the global numbers come from the full sweeps (files with f16 rows); runs of other kinds
    # alone (--only) contribute their tile efficiencies
    sweeps = [p for p in paths if any(r["kind"] == "f16" for r in _read_json(p)["rows"])]
    out["streamk_spread_penalty"] = round(_streamk_spread(sweeps), 4)
    # host cost per call of the Hopper path relative to cuBLAS's in the same run (public API,
    # 64^3): the model scales the calibrated cuBLAS host cost by it
    ratios = []
    for path in sweeps:
        with open(path) as f:
            host = json.load(f).get("host_us")
        if host:
            ratios.append(host["sm90"] / host["cublas"])
    if ratios:
        out["host_over_cublas"] = round(statistics.median(ratios), 4)
    return out


def _streamk_spread(paths) -> float:
    """Pure stream-k on many tiles per CTA loses L2 reuse: CTA c works on tile ~c*T/G while CTA
    c+1 works T/G tiles further on, so concurrently running tiles share no operand panels.
    Modelled as a slow-down of the stream-k iterations by ``1 + penalty * (tiles/CTA - 2)``;
    the penalty is the median over the points with more than 3 tiles per CTA of
    ``(t_streamk / t_sliced - 1) / (tiles/CTA - 2)`` (same tile, same run)."""
    vals = []
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        for row in data["rows"]:
            for name, t in row["ours"].items():
                if not isinstance(t, float) or "_streamk_" not in name:
                    continue
                sliced = row["ours"].get(name.replace("_streamk_", "_sliced_"))
                if not isinstance(sliced, float):
                    continue
                cfg = M.parse_config_name(name)
                tiles = -(-row["m"] // cfg.bm) * -(-row["n"] // cfg.bn)
                per_cta = tiles / data.get("sms", REF.sm_count)
                if per_cta > 3:
                    vals.append((t / sliced - 1) / (per_cta - 2))
    return statistics.median(vals) if vals else 0.0


# ---------------------------------------------------------------------------------------------
# Measured choices (choices_sm90_h100.json) from bench/bench_planner.py runs
# ---------------------------------------------------------------------------------------------

#: cuBLAS is the table's pick when its median time is within this fraction of the fastest: a
#: 1-2 % gap is run-to-run noise on these shapes, and a wrong switch away from cuBLAS (the
#: library everyone else uses, tuned for every shape) costs more than a missed small win
CHOICES_CUBLAS_TOLERANCE = 0.02
CHOICES_SCHEMA = "pyblasgemm-choices/1"


def _sig(t: float) -> float:
    return float(f"{t:.6g}")


def derive_choices(paths) -> dict:
    """The measured-choice table from ``bench/bench_planner.py`` runs (one or more JSON files of
    the same device and layout): per (kind, compute, m, n, k), the median measured time of every
    implementation timed (each forced config of ours, and cuBLAS; the plan's own timing is left
    out, as the bench's ``best_s`` leaves it out), and the fastest -- cuBLAS when it is within
    :data:`CHOICES_CUBLAS_TOLERANCE` of the fastest -- with its runner-up and margin.

    Example::

        table = derive_choices(["bench/results/planner_sm90_h100_2026-11-22_run4.json"])
        table["entries"][0]     # {'kind': 'f16', 'm': 1024, ..., 'impl': 'sm90a_sliced_...'}
    """
    ident, layout, sources = None, None, {}
    samples: dict = {}      # (dtype, m, n, k) -> impl -> [seconds, one per run]
    for path in sorted(paths, key=os.path.basename):    # the same table whatever the order
        with open(path) as f:
            run = json.load(f)
        if run.get("schema") != "pyblasgemm-bench-planner/1":
            raise ValueError(f"{path}: not a bench_planner.py result (schema {run.get('schema')!r})")
        this = {"name": run["device"], "cc": run["cc"], "sm_count": run["sm_count"]}
        lay = run["layout"].split()[0]        # "TN (column-major; both operands K-contiguous)"
        if ident is not None and (this, lay) != (ident, layout):
            raise ValueError(f"{path}: measured on {this} with layout {lay}, the other runs on "
                             f"{ident} with {layout}: one table is for one device and layout")
        ident, layout = this, lay
        sources[os.path.basename(path)] = file_sha256(path)
        for r in run["results"]:
            times = samples.setdefault((r["dtype"], r["m"], r["n"], r["k"]), {})
            for c in r["candidates"]:
                if c.get("measured_s"):
                    times.setdefault(c["config"], []).append(c["measured_s"])
            # for 3xTF32 the bench times SGEMM as a yardstick: not an option for the problem
            if r.get("cublas_s") and not r.get("cublas_note"):
                times.setdefault("cublas", []).append(r["cublas_s"])
    if ident is None:
        raise ValueError("derive_choices: no planner runs given")
    entries = []
    for (dt, m, n, k), times in samples.items():
        med = {impl: statistics.median(ts) for impl, ts in times.items()}
        if not med:
            continue
        order = sorted(med, key=lambda i: (med[i], i))
        best = order[0]
        if "cublas" in med and med["cublas"] <= med[best] * (1 + CHOICES_CUBLAS_TOLERANCE):
            best = "cublas"
        rest = [i for i in order if i != best]
        desc = make_desc(m, n, k, dt, transa=layout[0], transb=layout[1])
        entries.append({
            "dtype": dt, "kind": kind_of(desc), "compute": desc.compute, "m": m, "n": n, "k": k,
            "align": desc.align,     # tight leading dimensions, 16-byte aligned pointers
            "impl": best, "time_s": _sig(med[best]),
            "runner_up": rest[0] if rest else None,
            "runner_up_s": _sig(med[rest[0]]) if rest else None,
            # runner-up time / chosen time; below 1 where cuBLAS won within the tolerance
            "margin": round(med[rest[0]] / med[best], 4) if rest else None,
            "samples": len(times[best]),      # runs that timed the chosen implementation
            "times": {i: _sig(med[i]) for i in order}})
    return {"schema": CHOICES_SCHEMA, "device": ident, "layout": layout,
            "sources": sorted(sources), "source_sha256": sources,
            "cublas_tolerance": CHOICES_CUBLAS_TOLERANCE,
            "rule": "median time per implementation over the runs; the fastest, but cuBLAS when "
                    f"within {CHOICES_CUBLAS_TOLERANCE:.0%} of it",
            "entries": entries}


def main(argv=None) -> int:
    """``python tools/calibrate.py [RESULTS_DIR] [OUT] [--sources a.json,b.json]``:
    derive and write the calibration (default: every kernels*/backends*/suite results file in
    bench/results into the shipped calibration_h100.json). After re-measuring new kernels, pass
    ``--sources`` with the new files only: old and new kernels must not be averaged.

    ``--sm90 RUN.json ...`` writes calibration_sm90_h100.json from bench_sm90.py results;
    ``--choices RUN.json ...`` writes the measured-choice table choices_sm90_h100.json from
    bench_planner.py runs of one device (median per implementation over the runs; name only runs
    of the kernels as they are now)."""
    import argparse

    ap = argparse.ArgumentParser(prog="python tools/calibrate.py")
    ap.add_argument("results", nargs="?", default="bench/results")
    ap.add_argument("out", nargs="?", default=str(M.CALIBRATION_FILE))
    ap.add_argument("--sources", default=None, help="comma-separated file names to use")
    ap.add_argument("--sm90", nargs="+", default=None,
                    help="derive calibration_sm90_h100.json from these bench_sm90.py results instead")
    ap.add_argument("--choices", nargs="+", default=None,
                    help="derive choices_sm90_h100.json (measured choices) from these "
                         "bench_planner.py runs instead")
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    if args.choices:
        from pyblasgemm.planner.measured import CHOICES_FILE

        table = derive_choices(args.choices)
        with open(CHOICES_FILE, "w") as f:
            json.dump(table, f, indent=1, sort_keys=True)
            f.write("\n")
        ents = table["entries"]
        cb = sum(e["impl"] == "cublas" for e in ents)
        print(f"wrote {CHOICES_FILE}: {len(ents)} entries ({cb} cuBLAS, {len(ents) - cb} ours) "
              f"for {table['device']['name']} ({table['device']['sm_count']} SMs), "
              f"from {', '.join(table['sources'])}")
        for e in ents:
            print(f"  {e['dtype']:5} {e['m']:5}x{e['n']:5}x{e['k']:5}  {e['impl']:48} "
                  f"{e['time_s'] * 1e6:9.1f} us  runner-up {e['runner_up'] or '-':48} "
                  f"x{e['margin'] or float('nan'):.3f}")
        return 0
    if args.sm90:
        sm90 = derive_sm90(args.sm90)
        with open(M.CALIBRATION_SM90_FILE, "w") as f:
            json.dump(sm90, f, indent=1, sort_keys=True)
            f.write("\n")
        print(f"wrote {M.CALIBRATION_SM90_FILE}: {json.dumps({k: v for k, v in sm90.items() if k != 'sources'})}")
        return 0
    results, out = args.results, args.out
    cal = derive(results, args.sources.split(",") if args.sources else None)
    with open(out, "w") as f:
        json.dump(cal, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"wrote {out}: median |log(predicted/measured)| = {cal['median_abs_log_error']}")
    for p in cal["points"]:
        print(f"  {p['backend']:10} {p['kind']:8} {p['trans']} {'x'.join(map(str, p['shape'])):17} "
              f"{p.get('config', ''):42} measured {p['measured_s'] * 1e3:8.3f} ms  predicted "
              f"{p['predicted_s'] * 1e3:8.3f} ms  ({p['predicted_s'] / p['measured_s']:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
