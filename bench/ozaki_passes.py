"""Ozaki-II dgemm, pass by pass (issue 34, item 1): CUDA-event times of each pass of one
``compute='int8-ozaki'`` product (float64 by default; ``--dtype complex128`` / ``float32``, and
``--bits`` for a dial ``'int8-ozaki-<bits>'``) (the complex stacking copy, scaling, residues with each of its kernels:
the word kernel and the tile kernels of 16 and 8 positions a thread; the guard's int8 GEMM,
the moduli's batched int8 GEMM, the reconstruction with each of its kernels: the element
kernel, the row kernel loading into registers and the row kernel staging through shared
memory; the moduli's GEMM with int32 planes, then with the digit store where the Hopper int8
kernel runs it, each with its reconstruction), then the whole call with each residue kernel
(the default reconstruction; and once with the int32 planes instead of the digits) against
CuPy's native product (cuBLAS DGEMM, ZGEMM or SGEMM; for float32 also ours with
``compute='3xtf32'``), in the same run. The passes are the calls the composite route made
(recorded while it ran once), timed again on the same arrays; the kernels' outputs (the residue
planes and guard sums, the whole C after each reconstruction kernel, C of the whole call) are
compared bit for bit.

Run (on a GPU)::

    GIT_SHA=$(git rev-parse HEAD) python bench/ozaki_passes.py --out bench/results/ozaki_passes.json
    GIT_SHA=... python bench/ozaki_passes.py --sizes 8192 --bits 40 --out ozaki_passes_40bits.json
    GIT_SHA=... python bench/ozaki_passes.py --sizes 8192 --dtype complex128 --out ozaki_passes_zgemm.json

``--sizes 4096,8192``: the square sizes (default 4096, 8192 and 16384 where memory allows).

Expected time on one H200 (from ozaki_passes_h200_2026-11-28_f5a2290.json's pass times times the
~55 calls each pass timing makes and the ~26 of each whole-call timing): the default run ~60 s
with the kernels compiled (57 s measured in the call that wrote f5a2290's file, after the Ozaki
GPU tests), ~20 s more on a cold kernel cache; one size of 8192 ~10-15 s (``--bits 40``: 12
moduli, no guard), ``--dtype complex128`` at 8192 ~20-25 s (4x the int8 work, ZGEMM 85 ms a
call), ``--dtype float32`` at 8192 ~10 s; each ~10-20 s more on a cold cache.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import pathlib
import sys
import types

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from bench.heldout import meta, write_doc  # noqa: E402
from bench.timing import event_median_s, interleaved_median_s  # noqa: E402

KERNELS = ("elements", "rows", "rows-staged")
#: the dtypes ``--dtype`` takes and cuBLAS's native routine for each (the yardstick)
NATIVE = {"float64": "DGEMM", "complex128": "ZGEMM", "float32": "SGEMM"}


def compute_of(bits) -> str:
    """The ``compute=`` word of a run: the default mode, or the dial ``bits``.

    >>> compute_of(None), compute_of(40)
    ('int8-ozaki', 'int8-ozaki-40')
    """
    return "int8-ozaki" if bits is None else f"int8-ozaki-{bits}"


def _operands(cp, size, dtype, seed):
    """A and B (size² elements, flat) and C of ``dtype``, A and B standard normal (complex: both
    parts), drawn on the GPU."""
    rs = cp.random.RandomState(seed)
    real = cp.float32 if dtype == "float32" else cp.float64

    def draw():
        x = rs.standard_normal(size * size, dtype=real)
        return x + 1j * rs.standard_normal(size * size, dtype=real) if dtype == "complex128" else x

    a, b = draw(), draw()
    return a, b, cp.empty(size * size, dtype)


def bytes_per_element(dtype: str, planes: int) -> int:
    """GPU bytes a run of one size needs per element of C, at most (the check before each
    size): A, B and C; complex's stacked copies (A2 m x 2k, B2 2k x 2n in the real type); the
    int8 residue planes of both operands three times over (the call's, and the residue check's
    copies of the words kernel's and of each tile kernel's); the int32 products (m x n, 2n for
    complex); C once more for each reconstruction kernel's bits.

    >>> bytes_per_element("float64", 17), bytes_per_element("complex128", 17), bytes_per_element("float32", 10)
    (218, 586, 124)
    """
    item = {"float64": 8, "complex128": 16, "float32": 4}[dtype]
    cplx = dtype == "complex128"
    stacked = 3 * item if cplx else 0
    int8 = planes * (6 if cplx else 2)
    int32 = 4 * planes * (2 if cplx else 1)
    return 3 * item + stacked + 3 * int8 + int32 + 3 * item


@contextlib.contextmanager
def _digits(on: bool):
    """Plans made inside with the planner's ``DIGITS`` = ``on`` (the plan cache emptied on the
    way in and out: a cached plan keeps the choice it was made with)."""
    import pyblasgemm
    from pyblasgemm.planner import composite as planned

    saved = planned.DIGITS
    pyblasgemm.clear_plan_cache()
    planned.DIGITS = on
    try:
        yield
    finally:
        planned.DIGITS = saved
        pyblasgemm.clear_plan_cache()


def _device_tag(name: str) -> str:
    for tag in ("H200", "H100", "A100", "GH200", "B200"):
        if tag in name:
            return tag.lower()
    return name.split()[-1].lower()


def _record(cp, pb, size, dtype="float64", bits=None, digits=True):
    """Run one forced composite product, recording every pass call, the complex stacking,
    each inner GEMM and the moduli's GEMM with the digit store (``digits``: the planner's
    ``DIGITS`` for this plan): (calls, plan, route, C)."""
    from pyblasgemm import composite, execute as ex
    from pyblasgemm.kernels import ozaki_kernels as ok
    from pyblasgemm.planner import make_desc, plan_for

    a, b, c = _operands(cp, size, dtype, size)
    desc = make_desc(size, size, size, dtype, compute=compute_of(bits))
    with _digits(digits):
        plan = plan_for(desc, "tensorcore")
    calls = []
    originals = {name: getattr(ok.OzakiPasses, name) for name in ("scale", "residues", "guard_count", "reconstruct")}
    stack = composite._stack
    digit_launch = composite._digit_launch

    def with_digits(moduli, backend):
        launch = digit_launch(moduli, backend)
        if launch is None:
            return None

        def run(*args, **kw):
            calls.append(("digit gemm", launch, args, kw))
            return launch(*args, **kw)
        return run

    def wrap(name):
        def f(self, *args, **kw):
            calls.append((name, self, args, kw))
            return originals[name](self, *args, **kw)
        return f

    def stacked(*args):
        calls.append(("stack", None, args, {}))
        return stack(*args)

    def inner(d, x, y, z, backend=None):
        calls.append(("gemm", None, (d, x, y, z, backend), {}))
        return ex.execute(d, x, y, z, backend)

    try:
        for name in originals:
            setattr(ok.OzakiPasses, name, wrap(name))
        composite._stack = stacked
        composite._digit_launch = with_digits
        assert digits or plan.launch.digits is None
        composite.run(desc, a, b, c, plan, inner)
    finally:
        for name, fn in originals.items():
            setattr(ok.OzakiPasses, name, fn)
        composite._stack = stack
        composite._digit_launch = digit_launch
    cp.cuda.Device().synchronize()
    return calls, plan, composite.last_route(), c


def passes_row(cp, pb, size, inner=5, samples=10, dtype="float64", bits=None, digits=True) -> dict:
    """The passes of one product: the moduli's GEMM writing int32 planes (``digits`` False) or
    each product's CRT digit (True, where the Hopper int8 kernel runs it: ``digit_store`` says
    whether it did), and the reconstruction from those planes."""
    from pyblasgemm import composite, execute as ex
    from pyblasgemm.kernels import ozaki_kernels as ok

    calls, plan, route, c = _record(cp, pb, size, dtype, bits, digits)
    setting = plan.launch.setting
    digit_gemm = [x for x in calls if x[0] == "digit gemm"]
    row = {"m": size, "n": size, "k": size, "dtype": dtype, "compute": compute_of(bits), "count": setting.count,
           "bits": setting.bits, "guard": setting.guard, "route": route, "digit_store": bool(digit_gemm),
           "passes_ms": {}}

    def group(names):
        picked = [(n, s, a, k) for n, s, a, k in calls if n in names]
        return lambda: [getattr(ok.OzakiPasses, n)(s, *a, **k) if n != "gemm" else ex.execute(*a)
                        for n, s, a, k in picked]

    t = row["passes_ms"]
    stacks = [args for n, _, args, _ in calls if n == "stack"]
    if stacks:
        # complex: [Ar Ai] and [[Br, Bi], [-Bi, Br]] copied out in the real type, which the passes read
        t["stacking (A2, B2 copies)"] = event_median_s(lambda: composite._stack(*stacks[0]), inner,
                                                       samples) * 1e3
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
    if digit_gemm:
        (_, launch, largs, lkw), = digit_gemm
        t[f"int8 GEMMs ({setting.count} moduli, batched, digit store)"] = event_median_s(
            lambda: launch(*largs, **lkw), inner, samples) * 1e3
    else:
        mod = gemms[-1]
        t[f"int8 GEMMs ({setting.count} moduli, batched)"] = event_median_s(lambda: ex.execute(*mod[2]), inner,
                                                                             samples) * 1e3
    (_, passes, args, kw), = [c for c in calls if c[0] == "reconstruct"]
    prod = args[0]
    row["reconstruct_bytes"] = int(prod.nbytes + c.nbytes)     # the planes read, C written
    row["rows_kernel_applies"] = ok.rows_kernel_applies(prod, size)
    outs = {}
    # (digit planes: 'rows-staged' is the 16-row kernel, ozaki_reconstruct_digits16)
    kernels = [k for k in KERNELS if k == "elements" or ok.rows_kernel_applies(prod, size, k)]
    for kernel in kernels:
        kw2 = dict(kw, kernel=kernel)
        ms = event_median_s(lambda: passes.reconstruct(*args, **kw2), inner, samples) * 1e3
        t[f"reconstruction ({kernel})"] = ms
        row.setdefault("reconstruct_TBps", {})[kernel] = row["reconstruct_bytes"] / (ms * 1e-3) / 1e12
        # the whole C after this kernel alone (the native fix-ups do not run here), kept on the
        # GPU (the kernels take C's first element, args[7]: reading that alone compared one value);
        # zeroed first, so a kernel that wrote nothing cannot pass on the previous one's C
        c[...] = 0
        passes.reconstruct(*args, **kw2)
        outs[kernel] = c.copy()
    row["reconstruction_bits_equal"] = all(bool(cp.array_equal(outs[k], outs["elements"])) for k in kernels)
    del outs
    default = next(k for k in ok.RECONSTRUCT_KERNELS if k in kernels)     # reconstruct's own pick
    old, new = t["reconstruction (elements)"], t[f"reconstruction ({default})"]
    row["reconstruction_speedup_default_vs_elements"] = old / new
    return row


def end_to_end_row(cp, pb, size, inner=3, samples=7, dtype="float64", bits=None) -> dict:
    """The whole call (C-ordered operands, as a user calls it), with each residue kernel (the
    default reconstruction), and CuPy's native product on the same arrays (float32: also ours
    with ``compute='3xtf32'``). ``ratio_vs_native`` (and, for float64, ``ratio_vs_dgemm``, the
    name earlier files use): the native time over ours, per residue kernel."""
    from pyblasgemm.composite import last_route
    from pyblasgemm.kernels import ozaki_kernels as ok

    a, b, _ = _operands(cp, size, dtype, size + 1)
    a, b = a.reshape(size, size), b.reshape(size, size)
    compute = compute_of(bits)
    mode = "default" if bits is None else f"{bits} bits"
    # complex: 4 real products a multiply-add (the FLOPs of ZGEMM)
    flops = 2.0 * size**3 * (4 if dtype == "complex128" else 1)
    row = {"m": size, "n": size, "k": size, "dtype": dtype, "compute": compute, "ms": {}, "TFLOPs": {}}
    native_name = f"cupy.matmul (cuBLAS {NATIVE[dtype]})"
    fns, enter = {native_name: lambda: cp.matmul(a, b)}, {}
    if dtype == "float32":
        fns["pyblasgemm 3xtf32"] = lambda: pb.matmul(a, b, compute="3xtf32", backend="tensorcore")

    def ours():
        return pb.matmul(a, b, compute=compute, backend="tensorcore")

    @contextlib.contextmanager
    def residues(kernel):
        # where the planes allow a tile kernel, residues picks RESIDUES_DEFAULT: point it at each
        saved = ok.RESIDUES_DEFAULT
        ok.RESIDUES_DEFAULT = kernel
        try:
            yield
        finally:
            ok.RESIDUES_DEFAULT = saved

    outs = {}
    names = {kernel: f"pyblasgemm {compute} ({mode}), residues {kernel}, reconstruction {ok.ROWS_DEFAULT}"
             for kernel in ok.RESIDUE_KERNELS}
    for kernel, name in names.items():
        with residues(kernel):
            outs[kernel] = ours()
            row.setdefault("route", last_route())
        fns[name], enter[name] = ours, lambda kernel=kernel: residues(kernel)
    # the int32 planes instead of the digit store (the default residue kernel), same arrays
    planes_name = f"pyblasgemm {compute} ({mode}), int32 planes"
    with _digits(False):
        outs["int32 planes"] = ours()
        row["route_int32_planes"] = last_route()
    fns[planes_name], enter[planes_name] = ours, lambda: _digits(False)
    # all contenders' brackets interleaved (the clock drifts under the int8 load: timed one after
    # the other, 8192³'s calls spread 16.2-18.3 ms across kernels whose passes agree within 0.1 ms)
    times = interleaved_median_s(fns, inner, samples, enter=enter)
    row["ms"] = {name: t * 1e3 for name, t in times.items()}
    native = times[native_name]
    ratios = row["ratio_vs_native"] = {}
    for kernel, name in names.items():
        ratios[kernel] = native / times[name]
    ratios["int32 planes"] = native / times[planes_name]
    row["digit_store_speedup"] = times[planes_name] / times[names[ok.RESIDUES_DEFAULT]]
    if dtype == "float64":
        row["ratio_vs_dgemm"] = dict(ratios)
    for name, ms in row["ms"].items():
        row["TFLOPs"][name] = flops / (ms * 1e-3) / 1e12
    # compared on the GPU (the results of 16384² are 2 GiB each)
    row["bits_equal_across_kernels"] = all(bool(cp.array_equal(outs[k], outs["words"]))
                                           for k in (*ok.RESIDUE_KERNELS, "int32 planes"))
    return row


def check_sizes(parser, args) -> None:
    """``args.sizes`` (a comma list) as positive integers, or the parser's error naming it (the
    Ozaki benches' one rule).

    >>> p = argparse.ArgumentParser()
    >>> a = argparse.Namespace(sizes="4096,8192")
    >>> check_sizes(p, a); a.sizes
    [4096, 8192]
    """
    try:
        args.sizes = [int(x) for x in args.sizes.split(",")]
    except ValueError:
        parser.error(f"--sizes: {args.sizes!r} is not a comma list of integers")
    if any(x < 1 for x in args.sizes):
        parser.error(f"--sizes: {args.sizes} holds a size below 1")


def run_header(cp, seed: int, stem: str, tag: str, out: str | None):
    """``(info, device name, date, JSON path)`` of an Ozaki bench run: :func:`bench.heldout.meta`
    (versions, git SHA), and ``out`` or bench/results/<stem><tag>_<device>_<date>_<sha>.json."""
    info = meta(types.SimpleNamespace(torch=None), seed=seed)
    name = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    date = datetime.date.today().isoformat()
    sha = (info.get("git_sha") or "nosha")[:7]
    return info, name, date, out or f"bench/results/{stem}{tag}_{_device_tag(name)}_{date}_{sha}.json"


def parse_args(argv=None):
    """The command line, checked before any GPU work: ``--sizes`` positive integers, ``--dtype``
    one of :data:`NATIVE`, ``--bits`` 1 to ``pyblasgemm.ozaki.MAX_BITS``.

    >>> a = parse_args(["--sizes", "8192", "--dtype", "complex128", "--bits", "40"])
    >>> a.sizes, a.dtype, a.bits
    ([8192], 'complex128', 40)
    """
    from pyblasgemm.ozaki import MAX_BITS

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default="4096,8192,16384", help="comma list of square sizes")
    p.add_argument("--dtype", default="float64", choices=tuple(NATIVE), help="the operands' type (default float64)")
    p.add_argument("--bits", type=int, default=None,
                   help=f"the dial 'int8-ozaki-<bits>' (1 to {MAX_BITS}); default: the mode's default")
    p.add_argument("--out", default=None, help="the JSON's path (default bench/results/ozaki_passes_<device>_"
                                               "<date>_<sha>.json, with _<dtype> and _<bits>bits where given)")
    args = p.parse_args(argv)
    check_sizes(p, args)
    if args.bits is not None and not 1 <= args.bits <= MAX_BITS:
        p.error(f"--bits: {args.bits} is outside 1..{MAX_BITS}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    import cupy as cp

    import pyblasgemm as pb
    from pyblasgemm.kernels import ozaki_kernels as ok

    tag = ("" if args.dtype == "float64" else f"_{args.dtype}") + ("" if args.bits is None else f"_{args.bits}bits")
    info, name, date, out = run_header(cp, 20261128, "ozaki_passes", tag, args.out)
    doc = {"schema": "pyblasgemm-ozaki-passes/1", **info, "device_name": name, "date": date, "dtype": args.dtype,
           "compute": compute_of(args.bits), "rows_default": ok.ROWS_DEFAULT, "residues_default": ok.RESIDUES_DEFAULT,
           "method": __doc__, "passes": [], "end_to_end": []}
    free = cp.cuda.runtime.memGetInfo()[0]
    from pyblasgemm.planner import make_desc, plan_for

    for size in args.sizes:
        planes = plan_for(make_desc(size, size, size, args.dtype, compute=compute_of(args.bits)),
                          "tensorcore").launch.setting.planes
        need = bytes_per_element(args.dtype, planes) * size * size
        if need > 0.8 * free:
            doc.setdefault("skipped", []).append({"size": size, "why": f"needs ~{need / 2**30:.0f} GiB, "
                                                                       f"{free / 2**30:.0f} GiB free"})
            continue
        for digits in (False, True):        # the int32 planes, then the digit store (where it runs)
            row = passes_row(cp, pb, size, dtype=args.dtype, bits=args.bits, digits=digits)
            doc["passes"].append(row)
            print(size, "digit store" if row["digit_store"] else "int32 planes",
                  {k: round(v, 3) for k, v in row["passes_ms"].items()}, "bits equal:",
                  row["reconstruction_bits_equal"], row["residues_bits_equal"], flush=True)
            cp.get_default_memory_pool().free_all_blocks()
        e2e = end_to_end_row(cp, pb, size, dtype=args.dtype, bits=args.bits)
        doc["end_to_end"].append(e2e)
        print(size, {k: round(v, 3) for k, v in e2e["ms"].items()}, f"ratio vs {NATIVE[args.dtype]}:",
              {k: round(v, 3) for k, v in e2e["ratio_vs_native"].items()}, flush=True)
        cp.get_default_memory_pool().free_all_blocks()
        write_doc(doc, out)                 # after each size: a call cut short keeps what it measured
    write_doc(doc, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
