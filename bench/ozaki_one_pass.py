"""Ozaki-II scaling and residues in one pass (issue 34, item 1b), against the two passes, in
one run: the operand passes of one ``compute='int8-ozaki'`` product (the default and the
'fast' scaling) timed both ways on the same arrays, their outputs compared bit for bit, and
the whole call both ways against CuPy's native product (cuBLAS DGEMM / ZGEMM / SGEMM),
interleaved.

The passes are the calls the composite route made with the planner's one pass off (recorded
while it ran once): ``scale`` (or ``scale_fast``) of A and B, then ``residues`` of both. The one
pass runs ``scale_residues`` on the same arguments with the plan's shapes
(``ozaki_kernels.one_pass_shape``).

What it should gain, written before the run (H200, 8192^3 float64, 16 moduli and the guard;
docs/design/ozaki-residue-planes.md's profile): the two passes are 0.26 ms of statistics plus
1.07 ms of residues; the one pass moves the residues' bytes alone (A and B read once, 17 planes
written: 3.35 GB, 1.08 ms at the residue kernel's 3.1 TB/s), so at best ~0.25 ms of a 16.3 ms
call (1.6 %); at 4096^3 ~0.1 ms of 2.35 (4 %); 'fast' (three reads before) twice that.

Run (on a GPU)::

    GIT_SHA=$(git rev-parse HEAD) python bench/ozaki_one_pass.py --sizes 4096,8192

Expected time on one H200: ~15 s a size of 8192 with the kernels compiled (each whole-call
bracket ~20 calls of 17 ms, four contenders; the passes ~100 calls of ~1.3 ms each way).
"""
from __future__ import annotations

import argparse
import contextlib
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from bench.heldout import write_doc  # noqa: E402
from bench.ozaki_passes import NATIVE, _operands, check_sizes, run_header  # noqa: E402
from bench.timing import interleaved_median_s  # noqa: E402

MODES = ("int8-ozaki", "int8-ozaki-fast")


@contextlib.contextmanager
def one_pass(on: bool):
    """Plans made inside with the planner's ``ONE_PASS`` = ``on`` (the plan cache emptied on the
    way in and out: a cached plan keeps the choice it was made with)."""
    import pyblasgemm
    from pyblasgemm.planner import composite as planned

    saved = planned.ONE_PASS
    pyblasgemm.clear_plan_cache()
    planned.ONE_PASS = on
    try:
        yield
    finally:
        planned.ONE_PASS = saved
        pyblasgemm.clear_plan_cache()


def _recorded(cp, pb, a, b, compute):
    """The operand passes of one whole call with the one pass off: [(name, passes, args, kw)]."""
    from pyblasgemm.kernels import ozaki_kernels as ok

    names = ("scale", "scale_fast", "residues")
    originals = {n: getattr(ok.OzakiPasses, n) for n in names}
    calls = []

    def wrap(name):
        def f(self, *args, **kw):
            calls.append((name, self, args, kw))
            return originals[name](self, *args, **kw)
        return f

    try:
        for n in names:
            setattr(ok.OzakiPasses, n, wrap(n))
        with one_pass(False):
            pb.matmul(a, b, compute=compute, backend="tensorcore")
    finally:
        for n, fn in originals.items():
            setattr(ok.OzakiPasses, n, fn)
    cp.cuda.Device().synchronize()
    return calls


def passes_row(cp, pb, a, b, compute, inner=5, samples=10) -> dict:
    """The two passes and the plan's passes of A and B (one pass for each operand the plan gives
    a shape), and each operand alone in every shape the device runs, timed interleaved;
    outputs compared."""
    from pyblasgemm.kernels import ozaki_kernels as ok
    from pyblasgemm.planner.arch import arch_for_device

    calls = _recorded(cp, pb, a, b, compute)
    scales = [c for c in calls if c[0] in ("scale", "scale_fast")]
    residues = [c for c in calls if c[0] == "residues"]
    fast = scales[0][0] == "scale_fast"
    arch = arch_for_device(cp.cuda.Device().id)
    jobs = []               # per operand: (two-pass closure, one-pass closure, outputs of each)
    for (sname, passes, sargs, skw), (_, _, rargs, rkw) in zip(scales, residues):
        x, lines, length, s_line, s_k = sargs[:5]
        out, bits, sums = rargs[6], rargs[7], rargs[8]
        row = rkw.get("row", length)
        shape = ok.one_pass_shape(lines, row, x.dtype.itemsize, arch, s_k == 1 and s_line != 1)
        out1 = cp.empty_like(out)
        sums1 = None if sums is None else cp.zeros_like(sums)
        counts1 = cp.zeros(2, cp.int32)

        def two(passes=passes, sname=sname, sargs=sargs, skw=skw, rargs=rargs, rkw=rkw):
            if sums is not None:
                rargs[8][...] = 0
            got = getattr(passes, sname)(*sargs, **skw)
            line_bits = got[2] if fast else None
            return passes.residues(*rargs[:5], got[0], *rargs[6:], **dict(rkw, line_bits=line_bits)), got

        def one(passes=passes, x=x, lines=lines, length=length, s_line=s_line, s_k=s_k, bits=bits, row=row,
                shape=shape, out1=out1, sums1=sums1, counts1=counts1, sname=sname, sargs=sargs, skw=skw,
                rargs=rargs, rkw=rkw):
            if shape is None:               # the plan keeps this operand's two passes (into its own planes)
                if sums1 is not None:
                    sums1[...] = 0
                got = getattr(passes, sname)(*sargs, **skw)
                passes.residues(*rargs[:5], got[0], out1, rargs[7], sums1,
                                **dict(rkw, line_bits=got[2] if fast else None))
                return got
            if sums1 is not None:
                sums1[...] = 0
            counts1[...] = 0
            return passes.scale_residues(x, lines, length, s_line, s_k, bits, counts1, out1, shape, sums1,
                                         row=row, fast=fast)
        jobs.append((two, one, out, sums, out1, sums1, shape))
    fns = {"two passes (A and B)": lambda: [j[0]() for j in jobs],
           "the plan's passes (A and B)": lambda: [j[1]() for j in jobs]}
    # each operand alone, with the plan's shape and every other cluster size that fits
    for name, job, (sname, passes, sargs, skw), (_, _, rargs, rkw) in zip("AB", jobs, scales, residues):
        x, lines, length, s_line, s_k = sargs[:5]
        row = rkw.get("row", length)
        for shape in ok.one_pass_shapes(row, x.dtype.itemsize, arch, s_k == 1 and s_line != 1):
            tag = f"{name} one pass {tuple(shape)}{' (plan)' if shape == job[6] else ''}"
            fns[tag] = (lambda p=passes, a=(x, lines, length, s_line, s_k, rargs[7], cp.zeros(2, cp.int32), job[4],
                                              shape, job[5]): p.scale_residues(*a, row=row, fast=fast))
    times = interleaved_median_s(fns, inner, samples)
    two_out = [j[0]()[1] for j in jobs]
    one_out = [j[1]() for j in jobs]
    equal = all(bool(cp.array_equal(j[2], j[4])) and (j[3] is None or bool(cp.array_equal(j[3], j[5])))
                for j in jobs)
    equal = equal and all(bool(cp.array_equal(t[0], o[0])) and bool(cp.array_equal(t[1], o[1]))
                          for t, o in zip(two_out, one_out))
    ms = {k: v * 1e3 for k, v in times.items()}
    return {"compute": compute, "shapes": [None if j[6] is None else list(j[6]) for j in jobs], "ms": ms,
            "speedup_plan_vs_two": ms["two passes (A and B)"] / ms["the plan's passes (A and B)"],
            "bits_equal": equal}


def end_to_end_row(cp, pb, a, b, dtype, compute, inner=3, samples=7) -> dict:
    """The whole call with the one pass on and off and CuPy's native product, interleaved."""
    from pyblasgemm.composite import last_route

    native = f"cupy.matmul (cuBLAS {NATIVE[dtype]})"

    def ours():
        return pb.matmul(a, b, compute=compute, backend="tensorcore")

    outs, routes = {}, {}
    for on in (True, False):
        with one_pass(on):
            outs[on] = ours()
            routes[on] = last_route()
    names = {True: f"pyblasgemm {compute}, the plan's passes", False: f"pyblasgemm {compute}, two passes"}
    fns = {native: lambda: cp.matmul(a, b), names[True]: ours, names[False]: ours}
    enter = {names[on]: (lambda on=on: one_pass(on)) for on in (True, False)}
    times = interleaved_median_s(fns, inner, samples, enter=enter)
    ms = {k: v * 1e3 for k, v in times.items()}
    return {"compute": compute, "ms": ms, "route": routes[True],
            "ratio_vs_native": {n: times[native] / times[names[n]] for n in (True, False)},
            "speedup_one_vs_two": times[names[False]] / times[names[True]],
            "bits_equal": bool(cp.array_equal(outs[True], outs[False]))}


def parse_args(argv=None):
    """The command line, checked before any GPU work.

    >>> a = parse_args(["--sizes", "4096,8192", "--dtype", "complex128"])
    >>> a.sizes, a.dtype
    ([4096, 8192], 'complex128')
    """
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default="4096,8192", help="comma list of square sizes")
    p.add_argument("--dtype", default="float64", choices=tuple(NATIVE), help="the operands' type (default float64)")
    p.add_argument("--out", default=None, help="the JSON's path (default bench/results/ozaki_one_pass_<device>_"
                                               "<date>_<sha>.json, with _<dtype> where given)")
    args = p.parse_args(argv)
    check_sizes(p, args)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    import cupy as cp

    import pyblasgemm as pb

    tag = "" if args.dtype == "float64" else f"_{args.dtype}"
    info, name, date, out = run_header(cp, 20261129, "ozaki_one_pass", tag, args.out)
    doc = {"schema": "pyblasgemm-ozaki-one-pass/1", **info, "device_name": name, "date": date,
           "dtype": args.dtype, "method": __doc__, "passes": [], "end_to_end": []}
    for size in args.sizes:
        a, b, _ = _operands(cp, size, args.dtype, size)
        a, b = a.reshape(size, size), b.reshape(size, size)
        for compute in MODES:
            row = dict(passes_row(cp, pb, a, b, compute), size=size)
            doc["passes"].append(row)
            print(size, compute, "passes", {k: round(v, 3) for k, v in row["ms"].items()}, row["shapes"],
                  "x%.3f" % row["speedup_plan_vs_two"], "equal", row["bits_equal"],
                  flush=True)
            e2e = dict(end_to_end_row(cp, pb, a, b, args.dtype, compute), size=size)
            doc["end_to_end"].append(e2e)
            print(size, compute, "call", {k: round(v, 3) for k, v in e2e["ms"].items()},
                  {k: round(v, 3) for k, v in e2e["ratio_vs_native"].items()}, "x%.3f" % e2e["speedup_one_vs_two"],
                  "equal", e2e["bits_equal"], flush=True)
            cp.get_default_memory_pool().free_all_blocks()
        write_doc(doc, out)
    write_doc(doc, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
