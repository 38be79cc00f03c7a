"""``python -m pyblasgemm plan | tune``: the planner from the command line.

    python -m pyblasgemm plan 4096 4096 4096 --dtype f16 --trans NT
    python -m pyblasgemm plan 512 512 32768 --dtype f16 --backend tensorcore --all
    python -m pyblasgemm tune 3072 3072 3072 --dtype f16 --top 6

``plan`` works without a GPU (it then plans for the default H100 spec and says so); ``tune``
needs one.
"""
from __future__ import annotations

import argparse
import sys

__all__ = ["add_parsers", "run_plan", "run_tune"]


def count(minimum: int):
    """An argparse type: an integer >= ``minimum``, refused in the option's own terms."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} is below the smallest allowed, {minimum}")
        return value
    return parse


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("m", type=count(0), help="rows of op(A) and C")
    p.add_argument("n", type=count(0), help="columns of op(B) and C")
    p.add_argument("k", type=count(0), help="columns of op(A), rows of op(B)")
    p.add_argument("--dtype", default="f16", help="f16, bf16, f32, f64, i8, c64, c128, tf32, "
                   "3xtf32 (default f16)")
    p.add_argument("--compute", default=None, help="compute mode (e.g. fp32, tf32, 3xtf32, fp16)")
    p.add_argument("--trans", default="NN", help="transa and transb, e.g. NT (default NN; "
                   "column-major BLAS convention)")
    p.add_argument("--lda", type=count(1), default=None,
                   help="leading dimension of A in elements (default: its stored row count)")
    p.add_argument("--ldb", type=count(1), default=None, help="leading dimension of B (as --lda)")
    p.add_argument("--ldc", type=count(1), default=None, help="leading dimension of C (default m)")
    p.add_argument("--batch", type=count(0), default=1,
                   help="problems in a strided batch (default 1)")
    p.add_argument("--align", type=int, default=16, choices=(1, 2, 4, 8, 16),
                   help="byte alignment of the arrays' addresses (default 16, as fresh arrays)")
    p.add_argument("--device", type=count(0), default=0, help="CUDA device ordinal (default 0)")


def add_parsers(sub) -> None:
    """Add the ``plan`` and ``tune`` subcommands to an argparse subparsers object."""
    p = sub.add_parser("plan", help="print the planner's choice and its explanation")
    _common(p)
    p.add_argument("--backend", default=None, choices=("auto", "tensorcore", "cublas", "host"),
                   help="force one (default auto: the planner's choice); host: NumPy arrays")
    p.add_argument("--arch", default=None, choices=("sm_80", "sm_86", "sm_89", "sm_90"),
                   help="plan for this GPU family's datasheet numbers instead of the device's")
    p.add_argument("--all", action="store_true", help="list every candidate, not the best 12")
    t = sub.add_parser("tune", help="autotune one problem on the GPU and store the winner")
    _common(t)
    t.add_argument("--top", type=count(1), default=8, help="candidates to time (default 8)")
    t.add_argument("--repeats", type=count(1), default=20,
                   help="timed rounds per candidate, median taken (default 20)")
    t.add_argument("--no-cache", action="store_true", help="do not read or write the disk cache")


def _gpu_count() -> int:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount()
    except Exception:
        return 0


def _kw(args) -> dict:
    trans = args.trans.upper()
    if len(trans) != 2:     # ValueError: reported as 'error: ...', exit code 2
        raise ValueError(f"--trans {args.trans!r}: give two letters, e.g. NT")
    return dict(compute=args.compute, transa=trans[0], transb=trans[1], lda=args.lda,
                ldb=args.ldb, ldc=args.ldc, batch=args.batch, align=args.align, device=args.device)


def run_plan(args) -> int:
    from . import FAMILIES, plan

    try:
        kw = _kw(args)          # before anything is printed
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    empty = [f"{name} = 0" for name in ("m", "n", "k", "batch") if getattr(args, name) == 0]
    if empty:
        if args.m and args.n and args.batch:       # k = 0: reference BLAS's quick return
            what = "C = beta * C (beta = 1 leaves it as it is); A and B are not read"
        else:
            what = "C is empty: nothing is read or written"
        print(f"quick return ({', '.join(empty)}): nothing to multiply, so no kernel is planned "
              f"or launched; {what}")
        return 0
    if args.backend == "host":
        print("backend host: NumPy arrays are multiplied on the host by NumPy's own BLAS "
              "(numpy.matmul; float16, bfloat16 and int8 widened first: see the host backend), "
              "so there is no kernel or decomposition to choose")
        return 0
    arch = args.arch
    if arch is None and _gpu_count() == 0:
        print("no GPU found: planning for the default H100 spec (sm_90 datasheet numbers, "
              "132 SMs); use --arch or PYBLASGEMM_ARCH for another family")
        arch = FAMILIES["sm_90"]
    try:
        p = plan(args.m, args.n, args.k, args.dtype, backend=args.backend, arch=arch, **kw)
    except (ValueError, TypeError, NotImplementedError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(p.explain(limit=0 if args.all else 12))
    return 0


def run_tune(args) -> int:
    from . import tune

    try:
        kw = _kw(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if _gpu_count() == 0:
        print("error: 'tune' times kernels on a GPU, and CuPy finds no CUDA device here; "
              "'python -m pyblasgemm plan ...' shows the model's choice without one", file=sys.stderr)
        return 2
    try:
        p = tune(args.m, args.n, args.k, args.dtype, top=args.top, repeats=args.repeats,
                 cache=not args.no_cache, **kw)
    except (ValueError, TypeError, NotImplementedError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from .autotune import cache_dir

    print(p.explain())
    if not args.no_cache:
        print(f"stored in {cache_dir()}")
    return 0
