"""Ozaki-II dgemm, pass by pass (issue 34, item 1): CUDA-event times of each pass of one
default ``compute='int8-ozaki'`` float64 product (scaling, residues with each of its kernels:
the word kernel and the tile kernels of 16 and 8 positions a thread; the guard's int8 GEMM,
the moduli's batched int8 GEMM, the reconstruction with each of its kernels: the element
kernel, the row kernel loading into registers and the row kernel staging through shared
memory), then the whole call with each residue kernel (the default reconstruction) against
CuPy's native DGEMM (cuBLAS), in the same run. The passes are the calls the composite route
made (recorded while it ran once), timed again on the same arrays; the kernels' outputs (the
residue planes and guard sums, C after the reconstruction, C of the whole call) are compared
bit for bit.

Run (on a GPU)::

    GIT_SHA=$(git rev-parse HEAD) python bench/ozaki_passes.py --out bench/results/ozaki_passes.json

``--sizes 4096,8192``: the square sizes (default 4096, 8192 and 16384 where memory allows).
"""
from __future__ import annotations

import argparse
import datetime
import pathlib
import sys
import types

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from bench.heldout import meta, write_doc  # noqa: E402
from bench.timing import event_median_s  # noqa: E402

KERNELS = ("elements", "rows", "rows-staged")


def _device_tag(name: str) -> str:
    for tag in ("H200", "H100", "A100", "GH200", "B200"):
        if tag in name:
            return tag.lower()
    return name.split()[-1].lower()


def _record(cp, pb, size):
    """Run one forced composite dgemm, recording every pass call and inner GEMM: (calls, A, B)."""
    from pyblasgemm import composite, execute as ex
    from pyblasgemm.kernels import ozaki_kernels as ok
    from pyblasgemm.planner import make_desc, plan_for

    rs = cp.random.RandomState(size)
    a = rs.standard_normal(size * size)
    b = rs.standard_normal(size * size)
    c = cp.empty(size * size)
    desc = make_desc(size, size, size, "float64", compute="int8-ozaki")
    plan = plan_for(desc, "tensorcore")
    calls = []
    originals = {name: getattr(ok.OzakiPasses, name) for name in ("scale", "residues", "guard_count", "reconstruct")}

    def wrap(name):
        def f(self, *args, **kw):
            calls.append((name, self, args, kw))
            return originals[name](self, *args, **kw)
        return f

    def inner(d, x, y, z, backend=None):
        calls.append(("gemm", None, (d, x, y, z, backend), {}))
        return ex.execute(d, x, y, z, backend)

    try:
        for name in originals:
            setattr(ok.OzakiPasses, name, wrap(name))
        composite.run(desc, a, b, c, plan, inner)
    finally:
        for name, fn in originals.items():
            setattr(ok.OzakiPasses, name, fn)
    cp.cuda.Device().synchronize()
    return calls, plan, composite.last_route()


def passes_row(cp, pb, size, inner=5, samples=10) -> dict:
    from pyblasgemm import execute as ex
    from pyblasgemm.kernels import ozaki_kernels as ok

    calls, plan, route = _record(cp, pb, size)
    setting = plan.launch.setting
    row = {"m": size, "n": size, "k": size, "count": setting.count, "bits": setting.bits, "guard": setting.guard,
           "route": route, "passes_ms": {}}

    def group(names):
        picked = [(n, s, a, k) for n, s, a, k in calls if n in names]
        return lambda: [getattr(ok.OzakiPasses, n)(s, *a, **k) if n != "gemm" else ex.execute(*a)
                        for n, s, a, k in picked]

    t = row["passes_ms"]
    t["scaling (stats + exponents, A and B)"] = event_median_s(group({"scale"}), inner, samples) * 1e3
    res_calls = [(s, a, k) for n, s, a, k in calls if n == "residues"]
    row["residues_bytes"] = int(sum(a[0].dtype.itemsize * a[1] * a[2] + a[6].nbytes for _, a, _ in res_calls))
    # the floor the prediction used: the operands read once, every plane written once, at 3.2 TB/s
    # (what the reconstruction's stream reached on an H200)
    row["residues_floor_ms_at_3.2TBps"] = row["residues_bytes"] / 3.2e12 * 1e3
    def run_res(kernel):
        for s_, a, k in res_calls:
            s_.residues(*a, **dict(k, kernel=kernel))

    def outputs(kernel):
        """The planes and sums of one run (the sums accumulate: zeroed first), on the GPU."""
        for _, a, _ in res_calls:
            if a[8] is not None:
                a[8][...] = 0
        run_res(kernel)
        return [x.copy() for _, a, _ in res_calls for x in (a[6], a[8]) if x is not None]

    for kernel in ok.RESIDUE_KERNELS:
        ms = event_median_s(lambda: run_res(kernel), inner, samples) * 1e3
        t[f"residues (A and B, {kernel})"] = ms
        row.setdefault("residues_TBps", {})[kernel] = row["residues_bytes"] / (ms * 1e-3) / 1e12
    # compared on the GPU: copying 16384^2's 9 GB of planes to the host took longer than a call
    want = outputs("words")
    row["residues_bits_equal"] = all(all(bool(cp.array_equal(g, w)) for g, w in zip(outputs(k), want))
                                     for k in ok.RESIDUE_KERNELS if k != "words")
    del want
    row["residues_speedup_default_vs_words"] = (t["residues (A and B, words)"]
                                                / t[f"residues (A and B, {ok.RESIDUES_DEFAULT})"])
    gemms = [c for c in calls if c[0] == "gemm"]
    if setting.guard:
        g = gemms[0]
        t["guard int8 GEMM (1 plane) + count"] = event_median_s(
            lambda: (ex.execute(*g[2]), group({"guard_count"})()), inner, samples) * 1e3
    mod = gemms[-1]
    t[f"int8 GEMMs ({setting.count} moduli, batched)"] = event_median_s(lambda: ex.execute(*mod[2]), inner,
                                                                         samples) * 1e3
    (_, passes, args, kw), = [c for c in calls if c[0] == "reconstruct"]
    prod = args[0]
    row["reconstruct_bytes"] = int(prod.nbytes + 8 * size * size)     # the planes read, C written
    row["rows_kernel_applies"] = ok.rows_kernel_applies(prod, size)
    outs = {}
    for kernel in KERNELS:
        kw2 = dict(kw, kernel=kernel)
        ms = event_median_s(lambda: passes.reconstruct(*args, **kw2), inner, samples) * 1e3
        t[f"reconstruction ({kernel})"] = ms
        row.setdefault("reconstruct_TBps", {})[kernel] = row["reconstruct_bytes"] / (ms * 1e-3) / 1e12
        # C's bytes after this kernel alone (the native fix-ups do not run here)
        passes.reconstruct(*args, **kw2)
        outs[kernel] = cp.asnumpy(args[7]).tobytes()
    row["reconstruction_bits_equal"] = all(outs[k] == outs["elements"] for k in KERNELS)
    old, new = t["reconstruction (elements)"], t[f"reconstruction ({ok.ROWS_DEFAULT})"]
    row["reconstruction_speedup_default_vs_elements"] = old / new
    return row


def end_to_end_row(cp, pb, size, inner=3, samples=7) -> dict:
    """The whole default call (C-ordered operands, as a user calls it), with each residue
    kernel (the default reconstruction), and CuPy's DGEMM on the same arrays."""
    from pyblasgemm.composite import last_route
    from pyblasgemm.kernels import ozaki_kernels as ok

    rs = cp.random.RandomState(size + 1)
    a = rs.standard_normal((size, size))
    b = rs.standard_normal((size, size))
    flops = 2.0 * size**3
    row = {"m": size, "n": size, "k": size, "ms": {}, "TFLOPs": {}}
    native = event_median_s(lambda: cp.matmul(a, b), inner, samples)
    row["ms"]["cupy.matmul (cuBLAS DGEMM)"] = native * 1e3
    outs = {}
    saved = ok.RESIDUES_DEFAULT
    try:
        for kernel in ok.RESIDUE_KERNELS:
            # where the planes allow a tile kernel, residues picks RESIDUES_DEFAULT: point it at each
            ok.RESIDUES_DEFAULT = kernel
            out = pb.matmul(a, b, compute="int8-ozaki", backend="tensorcore")
            outs[kernel] = cp.asnumpy(out).tobytes()
            row.setdefault("route", last_route())
            s = event_median_s(lambda: pb.matmul(a, b, compute="int8-ozaki", backend="tensorcore"), inner, samples)
            row["ms"][f"pyblasgemm int8-ozaki (default), residues {kernel}, reconstruction {ok.ROWS_DEFAULT}"] = s * 1e3
            row.setdefault("ratio_vs_dgemm", {})[kernel] = native / s
    finally:
        ok.RESIDUES_DEFAULT = saved
    for name, ms in row["ms"].items():
        row["TFLOPs"][name] = flops / (ms * 1e-3) / 1e12
    row["bits_equal_across_kernels"] = all(outs[k] == outs["words"] for k in ok.RESIDUE_KERNELS)
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default="4096,8192,16384")
    p.add_argument("--out", default=None, help="the JSON's path (default bench/results/ozaki_passes_<device>_"
                                               "<date>_<sha>.json)")
    args = p.parse_args(argv)
    import cupy as cp

    import pyblasgemm as pb
    from pyblasgemm.kernels import ozaki_kernels as ok

    info = meta(types.SimpleNamespace(torch=None), seed=20261128)
    name = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    date = datetime.date.today().isoformat()
    sha = (info.get("git_sha") or "nosha")[:7]
    out = args.out or f"bench/results/ozaki_passes_{_device_tag(name)}_{date}_{sha}.json"
    doc = {"schema": "pyblasgemm-ozaki-passes/1", **info, "device_name": name, "date": date,
           "rows_default": ok.ROWS_DEFAULT, "residues_default": ok.RESIDUES_DEFAULT, "method": __doc__, "passes": [], "end_to_end": []}
    free = cp.cuda.runtime.memGetInfo()[0]
    for size in (int(s) for s in args.sizes.split(",")):
        # A, B, C float64, 17 int8 planes of each operand, 17 int32 planes: ~110 bytes an element
        if 110 * size * size > 0.8 * free:
            doc.setdefault("skipped", []).append({"size": size, "why": f"needs ~{110 * size * size / 2**30:.0f} GiB, "
                                                                       f"{free / 2**30:.0f} GiB free"})
            continue
        row = passes_row(cp, pb, size)
        doc["passes"].append(row)
        print(size, {k: round(v, 3) for k, v in row["passes_ms"].items()}, "bits equal:",
              row["reconstruction_bits_equal"], row["residues_bits_equal"], flush=True)
        cp.get_default_memory_pool().free_all_blocks()
        e2e = end_to_end_row(cp, pb, size)
        doc["end_to_end"].append(e2e)
        print(size, {k: round(v, 3) for k, v in e2e["ms"].items()}, "ratio vs DGEMM:",
              {k: round(v, 3) for k, v in e2e["ratio_vs_dgemm"].items()}, flush=True)
        cp.get_default_memory_pool().free_all_blocks()
        write_doc(doc, out)                 # after each size: a call cut short keeps what it measured
    write_doc(doc, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
