"""Command line: ``python -m pyblasgemm demo | info | bench | plan | tune``.

``plan M N K --dtype f16 --trans NT`` prints the planner's explanation (no GPU needed);
``tune M N K ...`` autotunes one problem on the GPU (see ``pyblasgemm.planner.cli``).

``demo`` runs a few GEMMs on the best device available (the GPU through CuPy when there is
one, else the host), and prints the device, the backend the planner chose, the speed and the
error against a float64 reference.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

import pyblasgemm
from pyblasgemm import settings
from pyblasgemm._types import TYPE_ROWS


def _gpu():
    """(the cupy module, '') if a CUDA device is usable, else (None, why not in one sentence)."""
    try:
        import cupy
    except ImportError:
        return None, "CuPy is not installed (install the GPU extra: pip install -e '.[cuda13]')"
    try:
        if cupy.cuda.runtime.getDeviceCount() > 0:
            return cupy, ""
        return None, "CuPy sees no CUDA device"
    except Exception as exc:        # e.g. cudaErrorInsufficientDriver, cudaErrorNoDevice
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return None, f"CUDA is not usable here ({text})"


def _device_name(cupy) -> str:
    if cupy is None:
        import platform
        return f"host CPU ({platform.processor() or platform.machine()}), NumPy {np.__version__}"
    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    return f"{name} (sm_{props['major']}{props['minor']}, {props['multiProcessorCount']} SMs)"


def _why(plan) -> str:
    """The plan in one line: backend, kernel, and the first clause of its reason."""
    what = plan.backend + (f" {plan.config.name}" if plan.config is not None else "")
    if plan.pack:
        what += f" (packs {', '.join(plan.pack)})"
    return f"{what}: {plan.reason.split(';')[0][:110]}"


def _error(got, want) -> float:
    got = np.asarray(got, dtype=np.float64)
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


#: memory the demo takes per element of one n x n matrix, an upper bound used to refuse a
#: --size that cannot fit before anything runs. Host: at its peak about a dozen n x n arrays,
#: most float64 (A and B, the reference, float64 operands and result, error temporaries);
#: GPU: the routines' operands and results, at most 8 bytes an element, a few at a time.
DEMO_BYTES_PER_ELEMENT = {"host": 128, "gpu": 64}


def check_demo_size(n: int, have_host: int | None, have_gpu: int | None = None) -> str | None:
    """Why ``demo --size n`` cannot fit in memory (``have_host`` / ``have_gpu`` bytes; None:
    unknown or no GPU), or None.

    >>> check_demo_size(512, have_host=1 << 30) is None
    True
    >>> print(check_demo_size(10**6, have_host=1 << 30))
    demo --size 1000000 needs about 116 TiB of host memory (128 bytes per element of an
    n x n matrix), more than the 1 GiB there is
    """
    from pyblasgemm.benchmarks.suite import format_bytes

    for where, have in (("host", have_host), ("gpu", have_gpu)):
        need = DEMO_BYTES_PER_ELEMENT[where] * n * n
        if have is not None and need > have:
            return (f"demo --size {n} needs about {format_bytes(need)} of "
                    f"{where.replace('gpu', 'GPU')} memory ({DEMO_BYTES_PER_ELEMENT[where]} bytes "
                    f"per element of an n x n matrix), more than the {format_bytes(have)} there is")
    return None


def demo(size: int | None = None) -> int:
    """The three forms on random data, each with its result checked against float64, the
    backend and kernel the planner chose and why; then a few routines' speed."""
    cupy, why_host = _gpu()
    xp = cupy or np
    n = size or (4096 if cupy is not None else 512)
    host = lambda x: x.get() if cupy is not None else x          # noqa: E731
    print(f"pyblasgemm {pyblasgemm.__version__} on {_device_name(cupy)}")
    if cupy is None:
        print(f"no GPU: {why_host}; everything below runs on the host (NumPy arrays).")
    where = "cupy" if cupy is not None else "numpy"
    rng = np.random.default_rng(0)
    a64, b64 = rng.uniform(-1, 1, (n, n)), rng.uniform(-1, 1, (n, n))
    ref = a64 @ b64
    a = xp.asarray(a64.astype(np.float16))
    b = xp.asarray(b64.astype(np.float16))
    print(f"\nA, B: {n} x {n} float16 {where} arrays of uniform(-1, 1); error = ||C - C64|| / ||C64||"
          f" against float64\n")

    print("1. matmul: numpy.matmul's semantics (broadcasting, dtypes, out=)")
    print("   >>> C = pyblasgemm.matmul(A, B)")
    c = pyblasgemm.matmul(a, b)
    plan = pyblasgemm.plan(n, n, n, "float16") if cupy is not None else None   # C^T = B^T A^T
    print(f"   {type(c).__module__.split('.')[0]} {c.dtype} {c.shape}, error {_error(host(c), ref):.1e}; "
          + (f"ran {_why(plan)}" if plan else "ran on the host (NumPy's BLAS, float32 accumulation)"))

    print("2. gemm: cupy.cublas.gemm's form, transposes as flags")
    print("   >>> C = pyblasgemm.gemm('N', 'T', A, B)      # A @ B.T")
    c = pyblasgemm.gemm("N", "T", a, b)
    print(f"   {c.dtype} {c.shape}, error {_error(host(c), a64 @ b64.T):.1e}")

    print("3. BLAS raw form: reference BLAS's 13 arguments on column-major memory")
    print("   >>> pyblasgemm.hgemm('N', 'N', n, n, n, 1.0, A, n, B, n, 0.0, C, n)")
    af, bf = xp.asfortranarray(a), xp.asfortranarray(b)
    cf = xp.empty((n, n), dtype=np.float16, order="F")
    pyblasgemm.hgemm("N", "N", n, n, n, 1.0, af, n, bf, n, 0.0, cf, n)
    print(f"   C {cf.dtype} {cf.shape}, error {_error(host(cf), ref):.1e}")
    print("   (the same for sgemm dgemm bgemm igemm cgemm zgemm; pyblasgemm.scipy has SciPy's "
          "signatures)")
    if cupy is not None:
        print(f"\n   explain() in full: pyblasgemm.plan({n}, {n}, {n}, 'float16').explain()")

    print(f"\nSpeed of each routine at {n}³ ({'GPU: CUDA events' if cupy else 'host: wall clock'}, "
          f"median of 10):")
    print(f"{'routine':8} {'compute':8} {'backend':10} {'TFLOP/s':>9} {'rel. error':>11}")
    cases = [("h", "fp32"), ("b", "fp32"), ("s", "fp32"), ("s", "tf32"), ("d", "fp64"),
             ("i", "int32")]
    for prefix, compute in cases:
        row = TYPE_ROWS[prefix]
        if prefix == "i":
            a_h = rng.integers(-128, 128, (n, n)).astype(np.int8)
            b_h = rng.integers(-128, 128, (n, n)).astype(np.int8)
            want = a_h.astype(np.float64) @ b_h.astype(np.float64)
        else:
            a_h, b_h, want = a64.astype(row.ab_dtype), b64.astype(row.ab_dtype), ref
        a, b = xp.asarray(a_h, order="F"), xp.asarray(b_h, order="F")
        c = xp.empty((n, n), dtype=row.c_dtype, order="F")
        routine = getattr(pyblasgemm, row.routine)
        call = lambda: routine("N", "N", n, n, n, 1, a, n, b, n, 0, c, n, compute=compute)  # noqa: E731
        try:
            call()  # warm-up: compilation, handles, plan
        except NotImplementedError as exc:
            print(f"{row.routine:8} {compute:8} {'-':10} {'-':>9} {'-':>11}  ({exc})")
            continue
        plan = pyblasgemm.planner.plan_for(
            pyblasgemm.desc.describe_blas(row, "N", "N", n, n, n, 1, a, n, b, n, 0, c, n,
                                          compute, None)[0])
        seconds = _time(call, cupy)
        err = _error(host(c), want)
        print(f"{row.routine:8} {compute:8} {plan.backend:10} {2 * n**3 / seconds / 1e12:9.3f} "
              f"{err:11.2e}")
    return 0


def _time(call, cupy, repeats: int = 10) -> float:
    """Median seconds per call: CUDA events on the GPU, perf_counter on the host."""
    times = []
    for _ in range(repeats):
        if cupy is not None:
            start, stop = cupy.cuda.Event(), cupy.cuda.Event()
            start.record()
            call()
            stop.record()
            stop.synchronize()
            times.append(cupy.cuda.get_elapsed_time(start, stop) / 1e3)
        else:
            t0 = time.perf_counter()
            call()
            times.append(time.perf_counter() - t0)
    return float(np.median(times))


def info_dict() -> dict:
    """Everything ``info --json`` prints: versions (pyblasgemm, Python, NumPy, CuPy, the CUDA
    runtime and driver, cuBLAS, NVRTC, the CUDA bindings: cuda-bindings, cuda-pathfinder,
    nvmath-python, and the other packages pyblasgemm uses where installed: ml_dtypes, tqdm,
    SciPy, PyTorch, JAX and jaxlib, Dask and distributed, read from their metadata, so none is
    imported; None where absent), the device, the cuBLAS route (which cuBLASLt binding, or
    why none: :func:`pyblasgemm.backends.cublaslt.status`), the default compute, the
    ``PYBLASGEMM_*`` settings, the cache locations and sizes. Works without a GPU.

    >>> d = info_dict()
    >>> sorted(d)
    ['caches', 'compute', 'cublas_route', 'device', 'environment', 'results_dir', 'versions']
    """
    import platform
    from importlib import metadata

    from pyblasgemm import _files
    from pyblasgemm.backends import cublaslt
    from pyblasgemm.benchmarks.suite import results_dir
    from pyblasgemm.kernels import nvrtc

    cupy, why = _gpu()
    versions = {"pyblasgemm": pyblasgemm.__version__, "python": platform.python_version(),
                "numpy": np.__version__, "cupy": None, "cuda_runtime": None, "cuda_driver": None,
                "cublas": None, "nvrtc": None}
    for dist in ("cuda-bindings", "cuda-pathfinder", "nvmath-python", "ml_dtypes", "tqdm",
                 "scipy", "torch", "jax", "jaxlib", "dask", "distributed"):
        try:
            versions[dist.replace("-", "_")] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist.replace("-", "_")] = None
    try:
        import cupy as cp           # installed, even where no device is
        versions["cupy"] = cp.__version__
    except Exception:               # not installed, or its import fails without CUDA
        cp = None
    for key, get in (("cuda_runtime", lambda: cp.cuda.runtime.runtimeGetVersion()),
                     ("cuda_driver", lambda: cp.cuda.runtime.driverGetVersion()),
                     ("nvrtc", lambda: ".".join(map(str, nvrtc.getVersion()))),
                     ("cublas", lambda: cublaslt.version())):
        if cp is not None:
            try:
                versions[key] = get() or None       # driverGetVersion is 0 without a driver
            except Exception:       # no driver / no device: that version stays None
                pass
    known, unknown = settings.in_environment()
    return {"versions": versions,
            "device": {"name": _device_name(cupy), "gpu": cupy is not None,
                       "why_not": None if cupy is not None else why},
            "cublas_route": cublaslt.status() if cp is not None else None,
            "compute": pyblasgemm.get_default_compute(),
            "environment": {"set": {k: str(v) for k, v in known.items()}, "unknown": list(unknown)},
            "caches": _files.cache_info(), "results_dir": str(results_dir())}


def cache_command(args) -> int:
    """``python -m pyblasgemm cache info [--json]`` / ``cache clear [--only tune|kernels]``."""
    from pyblasgemm import _files

    if args.action == "clear":
        names = (args.only,) if args.only else tuple(_files.CACHES)
        print(f"removed {_files.clear_cache(names)} files from the {' and '.join(names)} cache")
        return 0
    info = _files.cache_info()
    if args.json:
        print(json.dumps(info, indent=1))
        return 0
    for name in _files.CACHES:
        c = info[name]
        print(f"{name:8} {c['path']}: {c['files']} files, {c['bytes'] / 2**20:.1f} MiB")
    print(f"cap: {info['max_bytes'] / 2**20:.0f} MiB per cache (PYBLASGEMM_CACHE_MAX_MB)")
    return 0


def info(as_json: bool = False) -> int:
    if as_json:
        print(json.dumps(info_dict(), indent=1, default=str))
        return 0
    cupy, why = _gpu()
    print(f"pyblasgemm {pyblasgemm.__version__}, NumPy {np.__version__}")
    print(f"device: {_device_name(cupy)}" + (f" (no GPU: {why})" if cupy is None else ""))
    if cupy is not None:
        print(f"CuPy {cupy.__version__}, CUDA runtime {cupy.cuda.runtime.runtimeGetVersion()}")
    print(f"default float32 compute: {pyblasgemm.get_default_compute()}")
    known, unknown = settings.in_environment()
    print("environment variables (pyblasgemm.settings):"
          + ("".join(f"\n  {k}={v!r}" for k, v in known.items()) or " none set"))
    if unknown:        # a misspelt name would otherwise be silently without effect
        print(f"  not pyblasgemm variables (ignored): {', '.join(unknown)}")
    from pyblasgemm import _files

    caches = _files.cache_info()
    for name in _files.CACHES:
        c = caches[name]
        print(f"{name} cache: {c['path']} ({c['files']} files, {c['bytes'] / 2**20:.1f} MiB)")
    return 0


def bench(argv) -> int:
    """``python -m pyblasgemm bench ...``: the benchmark suite (:mod:`pyblasgemm.benchmarks.suite`)."""
    from pyblasgemm.benchmarks import suite

    return suite.main(argv)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["bench"]:   # its options live with the suite: bench --help lists them
        return bench(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m pyblasgemm",
                                     description="pyblasgemm: NumPy-compatible GEMM with its own "
                                                 "tensor-core kernels. Each command has --help.")
    parser.add_argument("--version", action="version", version=f"pyblasgemm {pyblasgemm.__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    p_demo = sub.add_parser("demo", help="run a few GEMMs on the best device and report")
    from pyblasgemm.planner import cli as planner_cli
    p_demo.add_argument("--size", type=planner_cli.count(1), default=None,
                        help="n for n x n x n (default: 4096 on a GPU, 512 on the host)")
    p_info = sub.add_parser("info", help="versions, the device, the settings and the caches")
    p_info.add_argument("--json", action="store_true", help="one JSON document")
    p_cache = sub.add_parser("cache", help="the disk caches: info (locations, sizes) or clear")
    p_cache.add_argument("action", choices=["info", "clear"])
    p_cache.add_argument("--json", action="store_true", help="info as JSON")
    p_cache.add_argument("--only", choices=["tune", "kernels"], default=None,
                         help="clear one cache (default: both)")
    sub.add_parser("bench", help="benchmark suite against cuBLAS (bench --help for options)")
    planner_cli.add_parsers(sub)   # plan, tune
    args = parser.parse_args(argv)
    if args.command == "demo":
        if args.size is not None:        # checked before anything runs (issue #30)
            from pyblasgemm.benchmarks.suite import total_memory

            cupy, _ = _gpu()
            why = check_demo_size(args.size, total_memory("host"),
                                  total_memory("gpu") if cupy is not None else None)
            if why:
                print(f"error: {why}", file=sys.stderr)
                return 2
        return demo(args.size)
    if args.command == "plan":
        return planner_cli.run_plan(args)
    if args.command == "tune":
        return planner_cli.run_tune(args)
    if args.command == "cache":
        return cache_command(args)
    return info(args.json)


if __name__ == "__main__":
    sys.exit(main())
