"""Host µs of a repeated call's replay (the call-signature path into the mma.sync kernel's
launch), without a GPU: stand-in CuPy arrays and a stand-in libcuda, the package's own Python.

Issue 35's GPU run (bench/results/tree_host_cost_h200_2026-11-28_50c5b05.json) found the
mma.sync launch path (``matmul`` auto at 64³) 1.2-1.7 µs a call slower than before the public
bindings (tree 25a6ec1). What that path costs is Python: the signature key and its lookup, the
bound launch's argument cells, and one driver call. This script runs exactly that Python, from a
tree given on the command line, on arrays that answer what the key reads (dtype, shape, strides,
``data.ptr`` / ``device_id``) and a driver whose every entry returns success at once:

* ``--driver stub`` (default where ``cc`` is found): a stand-in ``libcuda.so.1`` compiled into a
  temporary folder from the C below (every entry returns 0) and put first on the loader's path,
  so that both NVIDIA's ``cuda.bindings`` and CuPy's ``cupy_backends`` (the old tree's) run their
  real argument conversion and call a real C function;
* ``--driver python``: the driver modules replaced by Python functions (the package's own
  Python only; the bindings' conversion not timed).

The arrays' attribute reads cost less than CuPy's (plain slots against Cython properties) and a
fresh result is a Python object, not a pool allocation (~3.7 µs on an H100 host): the same in
every tree, so trees compare by their difference. Rows: the three forms of tree_host_cost on the
auto route, plus the launch alone (``BoundLaunch.__call__``) and the bare driver call.

    python bench/replay_host.py --tree .dev/old25a6ec1 --tree . [--rounds 15] [--out x.json]

Each tree runs in its own processes (both import ``pyblasgemm``), alternating, ``--processes``
each; the table holds the median over processes of each process's median round.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import types

N = 64
FPTR = 0x7F00_0000_1000          # a kernel handle the stand-in driver never reads
STREAM = 0x7F00_0000_2000
PTRS = (0x7F10_0000_0000, 0x7F10_0001_0000, 0x7F10_0002_0000, 0x7F10_0003_0000)

# Every driver entry point the bindings or CuPy look up answers CUDA_SUCCESS and writes nothing,
# except cuDriverGetVersion (13.0) and cuGetProcAddress (this same answer for every name).
STUB_C = r"""
#include <string.h>
typedef int CUresult;
static CUresult ok(void) { return 0; }
CUresult cuDriverGetVersion(int *v) { *v = 13000; return 0; }
CUresult cuInit(unsigned f) { (void)f; return 0; }
CUresult cuGetProcAddress_v2(const char *sym, void **pfn, int ver, unsigned long long flags, int *status) {
    (void)ver; (void)flags;
    if (!strcmp(sym, "cuDriverGetVersion")) *pfn = (void *)cuDriverGetVersion;
    else if (!strcmp(sym, "cuGetProcAddress")) *pfn = (void *)cuGetProcAddress_v2;
    else *pfn = (void *)ok;
    if (status) *status = 0;
    return 0;
}
CUresult cuGetProcAddress(const char *sym, void **pfn, int ver, unsigned long long flags) {
    return cuGetProcAddress_v2(sym, pfn, ver, flags, 0);
}
"""
# the names CuPy's driver module resolves by name (cupy_backends' soft links), each the same
# success; a name it looks up that is missing here fails its call, not the import
CUPY_NAMES = """cuCtxCreate_v2 cuCtxDestroy_v2 cuCtxGetCurrent cuCtxGetDevice cuCtxGetLimit
cuCtxPopCurrent cuCtxPushCurrent cuCtxSetCurrent cuCtxSetLimit cuCtxSynchronize cuDeviceGet
cuDeviceGetAttribute cuDevicePrimaryCtxRelease cuDevicePrimaryCtxRelease_v2 cuDevicePrimaryCtxReset
cuDevicePrimaryCtxRetain cuFuncGetAttribute cuFuncSetAttribute cuGetErrorName cuGetErrorString
cuLaunchCooperativeKernel cuLaunchKernel cuLaunchKernelEx cuLinkAddData_v2 cuLinkAddFile_v2
cuLinkComplete cuLinkCreate_v2 cuLinkDestroy cuMemcpyDtoH_v2 cuModuleGetFunction
cuModuleGetGlobal_v2 cuModuleLoad cuModuleLoadData cuModuleLoadDataEx cuModuleLoadFatBinary
cuModuleUnload cuOccupancyMaxActiveBlocksPerMultiprocessor cuOccupancyMaxPotentialBlockSize
cuStreamGetCtx cuMemsetD32Async cuTensorMapReplaceAddress""".split()


def build_stub(folder: pathlib.Path) -> pathlib.Path:
    """Compile the stand-in libcuda into ``folder``; returns the folder."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise SystemExit("replay_host: --driver stub needs a C compiler (cc); use --driver python")
    src = folder / "stub.c"
    src.write_text(STUB_C + "".join(f"CUresult {n}(void) {{ return 0; }}\n" for n in CUPY_NAMES))
    subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(folder / "libcuda.so.1"), str(src)], check=True)
    (folder / "libcuda.so").symlink_to("libcuda.so.1")
    return folder


# ---------------------------------------------------------------------------------------------
# Stand-in CuPy: what the replay paths read


class _Mem:
    __slots__ = ("ptr", "device_id")

    def __init__(self, ptr, device_id=0):
        self.ptr, self.device_id = ptr, device_id


class _Flags:
    __slots__ = ("c_contiguous", "f_contiguous")

    def __init__(self, c, f):
        self.c_contiguous, self.f_contiguous = c, f


class ndarray:       # noqa: N801 (CuPy's name: the package compares types by identity)
    """A 2-D array's facts, no memory: CuPy's ndarray(shape, dtype) constructor's signature."""

    __slots__ = ("dtype", "shape", "strides", "data", "size", "ndim", "flags")

    def __init__(self, shape, dtype, memptr=None, strides=None, order="C", _ptr=PTRS[3]):
        import numpy as np

        self.dtype = np.dtype(dtype)
        self.shape = tuple(shape)
        size = self.dtype.itemsize
        if strides is None:
            strides = (shape[1] * size, size) if order == "C" else (size, shape[0] * size)
        self.strides = tuple(strides)
        self.data = _Mem(_ptr)
        self.size = shape[0] * shape[1]
        self.ndim = 2
        self.flags = _Flags(order == "C", order == "F")


class _Stream:
    __slots__ = ("ptr",)

    def __init__(self, ptr):
        self.ptr = ptr

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def install_fake_cupy():
    """A ``cupy`` module in sys.modules with what the replay paths call: ``ndarray``,
    ``cuda.get_current_stream``, ``cuda.runtime.getDevice``, ``cuda.Device``."""
    cupy = types.ModuleType("cupy")
    cuda = types.ModuleType("cupy.cuda")
    runtime = types.ModuleType("cupy.cuda.runtime")
    current = _Stream(STREAM)
    runtime.getDevice = int                      # a builtin answering 0, as cudaGetDevice's wrapper
    cuda.runtime = runtime
    cuda.get_current_stream = lambda device=None: current
    cuda.Device = lambda dev=0: _Stream(0)
    cupy.cuda, cupy.ndarray, cupy.__version__ = cuda, ndarray, "stand-in"
    sys.modules.update({"cupy": cupy, "cupy.cuda": cuda, "cupy.cuda.runtime": runtime})


def fake_driver(tree_new: bool):
    """Replace the tree's driver calls by Python functions that return success."""
    from pyblasgemm.kernels import driver

    if tree_new:
        class CU:
            @staticmethod
            def cuLaunchKernel(*args):
                return (0,)

            @staticmethod
            def cuLaunchKernelEx(*args):
                return (0,)

            @staticmethod
            def cuMemsetD32Async(*args):
                return (0,)

            CUfunction = CUstream = CUdeviceptr = int

            class CUlaunchConfig:
                pass
        driver._CU = CU
    else:
        class Drv:
            CUDADriverError = RuntimeError

            @staticmethod
            def launchKernel(*args):
                return None
        driver._DRIVER = Drv


# ---------------------------------------------------------------------------------------------
# One tree, one process


def _replay_launch(calls, bl, sptr):
    """What a replay calls to launch: the recorded Call's ``run`` where the tree has one, else
    ``launch`` with the branch the old replays wrote."""
    if hasattr(calls, "ordered"):
        run = calls.ordered(bl, True)
        return lambda: run(PTRS[0], PTRS[1], PTRS[2], 1.0, 0.0, sptr)

    def old(swap=True):
        if swap:
            bl(PTRS[1], PTRS[0], PTRS[2], 1.0, 0.0, sptr)
        else:
            bl(PTRS[0], PTRS[1], PTRS[2], 1.0, 0.0, sptr)
    return old


def measure(tree: str, rounds: int, calls: int, driver_kind: str) -> dict:
    if driver_kind == "stub":
        # CuPy's driver module links its entries on first use, logging through the real cupy
        # package: link them now, then hide that package behind the stand-in
        from cupy_backends.cuda.api import driver as cb

        cb.launchKernel(FPTR, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0)
        for name in [m for m in sys.modules if m == "cupy" or m.startswith("cupy.")]:
            del sys.modules[name]
    install_fake_cupy()
    sys.path.insert(0, str(pathlib.Path(tree).resolve()))
    import importlib

    import numpy as np

    import pyblasgemm as pbg
    from pyblasgemm import calls as C
    from pyblasgemm.kernels import driver as drv
    from pyblasgemm.kernels.launch import BoundLaunch
    from pyblasgemm.kernels.problem import KernelProblem
    from pyblasgemm.kernels.spec import launch_spec

    where = pathlib.Path(pbg.__file__).resolve()
    if pathlib.Path(tree).resolve() not in where.parents:
        raise SystemExit(f"replay_host: pyblasgemm came from {where}, not from {tree}")
    new = hasattr(drv, "bindings")          # the tree on cuda.bindings (issue 35) or not
    if driver_kind == "python":
        fake_driver(new)
    mm = importlib.import_module("pyblasgemm.matmul")
    blas = importlib.import_module("pyblasgemm.blas")
    cupy = sys.modules["cupy"]
    mm._CUPY[0] = cupy.ndarray
    blas._CUPY[0] = cupy.ndarray
    C.cupy_type()

    config = pbg.plan(N, N, N, "float16", arch="sm_90").config
    problem = KernelProblem("f16", "N", "N", N, N, N, N, N, N, PTRS[0], PTRS[1], PTRS[2])
    spec = launch_spec(problem, config, 132, 1)
    kern = types.SimpleNamespace(kernel=types.SimpleNamespace(ptr=FPTR))
    bl = BoundLaunch(problem, spec, kern, None, 0, (0, None))

    f16 = np.dtype("float16")
    a = cupy.ndarray((N, N), f16, _ptr=PTRS[0])
    b = cupy.ndarray((N, N), f16, _ptr=PTRS[1])
    c = cupy.ndarray((N, N), f16, _ptr=PTRS[2])
    fa = cupy.ndarray((N, N), f16, order="F", _ptr=PTRS[0])
    fb = cupy.ndarray((N, N), f16, order="F", _ptr=PTRS[1])
    fc = cupy.ndarray((N, N), f16, order="F", _ptr=PTRS[2])
    # the records the first (full-path) calls would leave: matmul runs Cᵀ = Bᵀ Aᵀ (swapped)
    fresh = cupy.ndarray((N, N), f16)
    C.record(mm._signature(a, b, None), bl, True, a, b, fresh, True, 1.0, 0.0)
    C.record(mm._signature(a, b, c), bl, True, a, b, c, False, 1.0, 0.0)
    limit = 65504.0
    if new:
        words = C.words("h", None, None, None, ("N", "N", N, N, N, N, N, N, float, float))
        hkey = C.key(words, fa, fb, fc)[0]
    else:
        import pyblasgemm._arrays as _arrays

        hkey = ("call", "h", None, None, "N", "N", N, N, N, N, N, N, float, float, fa.dtype, fa.shape,
                fa.strides, fb.dtype, fb.shape, fb.strides, fc.dtype, fc.shape, fc.strides, 0, 0, 0,
                _arrays.current_device(), (PTRS[0] | PTRS[1] | PTRS[2]) & 15)
    C.record(hkey, bl, False, fa, fb, fc, False, None, 0.0, limit)

    matmul, hgemm = pbg.matmul, pbg.hgemm
    fptr = bl._fptr
    sptr = STREAM
    if new and driver_kind == "stub":
        cu = drv.bindings()
        cs = drv.stream(sptr)
        L = cu.cuLaunchKernel
        bare = ("cuLaunchKernel (cuda.bindings)", lambda: L(fptr, 1, 1, 1, 128, 1, 1, 0, cs, 0, 0))
    elif driver_kind == "stub":
        from cupy_backends.cuda.api import driver as cb

        L = cb.launchKernel
        bare = ("launchKernel (cupy_backends)", lambda: L(fptr, 1, 1, 1, 128, 1, 1, 0, sptr, 0, 0))
    else:
        bare = ("no driver (Python stand-in)", lambda: None)

    fns = {
        "matmul | auto": lambda: matmul(a, b),
        "matmul out= | auto": lambda: matmul(a, b, out=c),
        "raw hgemm | auto": lambda: hgemm("N", "N", N, N, N, 1.0, fa, N, fb, N, 0.0, fc, N),
        "BoundLaunch call": lambda: bl(PTRS[1], PTRS[0], PTRS[2], 1.0, 0.0, sptr),
        "replay's launch (swapped)": _replay_launch(C, bl, sptr),
        "fresh result (stand-in)": lambda: cupy.ndarray((N, N), f16),
        "driver call": bare[1],
    }
    from timing import paired_host_us       # bench/timing.py, beside this file (not the tree's)

    # (a call the replay missed would take the full path, which the stand-ins cannot serve: it raises)
    us = paired_host_us(fns, calls, rounds, warmup=50, sync=lambda: None)
    return {"tree": str(pathlib.Path(tree).resolve()), "bindings": new, "driver": driver_kind,
            "driver_call": bare[0], "us": us,
            "python": sys.version.split()[0], "rounds": rounds, "calls": calls}


def _versions() -> dict:
    """The installed versions of what the path calls (None: not installed)."""
    from importlib import metadata

    found = {}
    for name in ("cuda-bindings", "cupy-cuda13x", "cupy-cuda12x", "numpy"):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tree", action="append", required=True, help="a tree (repeat: old first)")
    ap.add_argument("--label", action="append", help="each tree's name in the table (e.g. its commit)")
    ap.add_argument("--driver", choices=("stub", "python"), default=None)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--processes", type=int, default=3)
    ap.add_argument("--out")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)   # a child process
    args = ap.parse_args()
    kind = args.driver or ("stub" if (shutil.which("cc") or shutil.which("gcc")) else "python")
    if args.one:
        print(json.dumps(measure(args.tree[0], args.rounds, args.calls, kind)))
        return
    env = dict(os.environ)
    with tempfile.TemporaryDirectory() as tmp:
        if kind == "stub":
            build_stub(pathlib.Path(tmp))
            env["LD_LIBRARY_PATH"] = tmp + os.pathsep + env.get("LD_LIBRARY_PATH", "")
        runs = []
        for _ in range(args.processes):
            for tree in args.tree:
                out = subprocess.run([sys.executable, __file__, "--one", "--tree", tree, "--driver", kind,
                                      "--rounds", str(args.rounds), "--calls", str(args.calls)],
                                     env=env, capture_output=True, text=True)
                if out.returncode:
                    raise SystemExit(f"replay_host: {tree} failed:\n{out.stderr[-3000:]}")
                runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    labels = args.label or args.tree
    if len(labels) != len(args.tree):
        ap.error("--label: one per --tree")
    table = {}
    for tree, label in zip(args.tree, labels):
        mine = [r for r in runs if r["tree"] == str(pathlib.Path(tree).resolve())]
        for r in mine:
            r["label"] = label
        table[label] = {k: statistics.median(r["us"][k] for r in mine) for k in mine[0]["us"]}
    rows = list(next(iter(table.values())))
    print(f"{'row':26s}" + "".join(f"{t[-22:]:>24s}" for t in labels)
          + ("   last - first" if len(labels) > 1 else ""))
    for row in rows:
        vals = [table[t][row] for t in labels]
        delta = f"   {vals[-1] - vals[0]:+.3f}" if len(vals) > 1 else ""
        print(f"{row:26s}" + "".join(f"{v:24.3f}" for v in vals) + delta)
    if args.out:
        # the seed (none: the stand-ins hold no data), PYBLASGEMM_* settings and NVRTC, read
        # through this checkout's package (the children import the trees measured)
        sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
        from pyblasgemm.benchmarks.suite import provenance

        pathlib.Path(args.out).write_text(json.dumps(
            {"schema": "replay_host/1", "driver": kind, "trees": dict(zip(labels, args.tree)),
             "table_us": table, "runs": runs, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
             "python": sys.version.split()[0], "versions": _versions(), **provenance(None)}, indent=1))


if __name__ == "__main__":
    main()
