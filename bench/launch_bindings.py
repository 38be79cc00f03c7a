"""Host µs per launch through the public CUDA bindings against the old path, in one process.

Issue 35 moved every driver call of the launchers from CuPy's internal ``cupy_backends`` (and
ctypes over libcuda) to NVIDIA's ``cuda.bindings``, and cuBLASLt to nvmath-python's bindings
where installed (ctypes over the library cuda-pathfinder loads otherwise). The hot path must not
get slower. Three parts, each a set of callables timed with their rounds interleaved
(``paired_host_us``: a drift of the host's speed falls on all of a set alike):

* ``primitives``: one driver call each way. The old ones are what the package called before
  (``cupy_backends``' ``launchKernel`` and cudart ``memsetAsync`` behind the package's old
  wrapper, copied here; ctypes ``cuTensorMapReplaceAddress``; ``cublasLtMatmul`` with ctypes
  argument objects), the new ones what it calls now (``kernels.driver``: ``cuLaunchKernel`` and
  ``cuMemsetD32Async`` with handles made once; ``cuTensorMapReplaceAddress`` on a
  ``CUtensorMap``; ``LtLaunch`` through each cuBLASLt binding that loads). ``deltas_us``: new
  minus old, per pair (negative: the new path is faster).
* ``end_to_end``: ``pyblasgemm.matmul`` (fresh result and ``out=``) and the stateful
  ``Matmul.execute`` at 64³ float16 on each route, beside ``torch.matmul`` in the same rounds.
* ``baseline``: the same forms in the newest committed ``bench/results/host_cost_<device>_*``
  file of this device kind (another process, another day: compare the ratio to torch, not the
  µs) and the committed ``launch_primitives`` file's launch rows.

    python bench/launch_bindings.py --out bench/results/launch_bindings_h100_<date>_<sha>.json [--quick]
"""
from __future__ import annotations

import argparse
import ctypes as ct
import json
import pathlib
import re
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.heldout import meta, write_doc  # noqa: E402
from bench.timing import paired_host_us  # noqa: E402

N = 64
NOP = r'extern "C" __global__ void nop(float* x, float* y, float* z, float s, float t) {}'


class _Gpu:
    def __init__(self):
        import cupy
        import torch

        self.cp, self.torch = cupy, torch


def _old_launch_kernel():
    """The package's launch wrapper before issue 35 (kernels/driver.py), over cupy_backends."""
    from cupy_backends.cuda.api import driver

    state = {}

    def _driver():
        if "drv" not in state:
            state["drv"] = driver
        return state["drv"]

    def launch_kernel(device, fptr, gx, gy, gz, bx, by, bz, smem, stream, params):
        drv = _driver()
        try:
            drv.launchKernel(fptr, gx, gy, gz, bx, by, bz, smem, stream, params, 0)
        except drv.CUDADriverError:
            raise

    return launch_kernel


def _old_memset():
    """The old flags memset (mma_sync.py / sm90.py before issue 35): cudart through cupy_backends."""
    from cupy_backends.cuda.api import runtime

    state = {}

    def _runtime():
        if "rt" not in state:
            state["rt"] = runtime
        return state["rt"]

    return lambda ptr, nbytes, stream: _runtime().memsetAsync(ptr, 0, nbytes, stream)


def primitives(gpu, calls: int, rounds: int) -> dict:
    cp = gpu.cp
    from pyblasgemm.kernels import driver

    dev = cp.cuda.Device().id
    c = cp.empty((N, N), np.float32)
    kern = cp.RawKernel(NOP, "nop")
    kern((1,), (32,), (c, c, c, np.float32(1), np.float32(0)))
    cp.cuda.Device().synchronize()
    fptr, sptr = kern.kernel.ptr, cp.cuda.get_current_stream().ptr
    cells = [ct.c_uint64(c.data.ptr)] * 3 + [ct.c_float(1), ct.c_float(0)]
    argv = (ct.c_void_p * len(cells))(*[ct.addressof(x) for x in cells])
    argp = ct.addressof(argv)
    fn, cs = driver.function(fptr), driver.stream(sptr)
    cu = driver.bindings()
    flags = cp.zeros(132, np.int32)
    fl_ptr, fl_dptr = flags.data.ptr, driver.device_pointer(flags.data.ptr)
    groups = {}
    launch = {"new: cuLaunchKernel (cuda.bindings, handles made once)":
              lambda: cu.cuLaunchKernel(fn, 1, 1, 1, 128, 1, 1, 0, cs, argp, 0),
              "new: kernels.driver.launch_kernel":
              lambda: driver.launch_kernel(dev, fn, 1, 1, 1, 128, 1, 1, 0, cs, argp)}
    memset = {"new: kernels.driver.memset_words_async": lambda: driver.memset_words_async(dev, fl_dptr, 132, cs)}
    try:
        from cupy_backends.cuda.api import driver as old_driver

        old_launch, old_memset = _old_launch_kernel(), _old_memset()
        launch["old: cupy_backends launchKernel"] = lambda: old_driver.launchKernel(fptr, 1, 1, 1, 128, 1, 1, 0, sptr,
                                                                                   argp, 0)
        launch["old: the package's old launch_kernel wrapper"] = lambda: old_launch(dev, fptr, 1, 1, 1, 128, 1, 1, 0,
                                                                                    sptr, argp)
        memset["old: cudart memsetAsync (cupy_backends)"] = lambda: old_memset(fl_ptr, 4 * 132, sptr)
    except ImportError as e:             # a CuPy without cupy_backends: the new rows alone
        print("no old path to compare:", e)
    groups["launch"] = launch
    groups["flags memset"] = memset
    if int(cp.cuda.Device().compute_capability) >= 90:     # TMA: Hopper and later
        groups["TMA readdress"] = _tma(cp, c)
    groups["cuBLASLt call"] = _lt(cp)
    out, deltas = {}, {}
    for name, fns in groups.items():
        res = paired_host_us(fns, calls, rounds)
        out[name] = res
        for label, us in res.items():
            print(f"{us:8.3f} us  {name}: {label}", flush=True)
        olds = [v for k, v in res.items() if k.startswith("old")]
        news = {k: v for k, v in res.items() if k.startswith("new")}
        if olds and news:
            deltas[name] = {k: v - min(olds) for k, v in news.items()}
    return {"primitives_us": out, "deltas_us": deltas}


def _tma(cp, c) -> dict:
    from pyblasgemm.kernels import driver
    from pyblasgemm.kernels.sm90 import encode_tiled

    cu = driver.bindings()
    tmap = encode_tiled("f16", c.data.ptr, (N, N, 1), (N * 2, N * N * 2), (64, 64, 1))
    old = (ct.c_uint64 * 16)()
    ct.memmove(old, tmap.getPtr(), 128)
    lib = ct.CDLL("libcuda.so.1")          # what sm90.py loaded before issue 35
    rep = lib.cuTensorMapReplaceAddress
    rep.argtypes, rep.restype = [ct.c_void_p, ct.c_void_p], ct.c_int
    ptr = c.data.ptr
    return {"old: ctypes cuTensorMapReplaceAddress": lambda: rep(ct.byref(old), ct.c_void_p(ptr)),
            "new: cuda.bindings cuTensorMapReplaceAddress": lambda: cu.cuTensorMapReplaceAddress(tmap, ptr)}


def _lt(cp) -> dict:
    """The cuBLAS route's call through each cuBLASLt binding that loads, and the pre-35 call
    (ctypes argument objects, the algorithm by reference) on the same descriptors."""
    import pyblasgemm
    from pyblasgemm.backends import cublas, cublaslt

    a = cp.asarray(np.random.default_rng(1).uniform(-1, 1, (N, N)).astype(np.float16))
    c = cp.empty((N, N), np.float16)
    pa, pc, sptr = a.data.ptr, c.data.ptr, cp.cuda.get_current_stream().ptr
    desc = pyblasgemm.plan(N, N, N, "float16", backend="cublas").problem
    fns = {}
    for name in ("ctypes", "nvmath"):
        cublaslt.use_binding(name)
        if cublaslt.status()["binding"] != name:
            print(f"cuBLASLt through {name}: {cublaslt.status()['error']}")
            continue
        launch = cublas.bind(desc)
        fns[f"new: LtLaunch ({name} binding)"] = (lambda lt=launch: lt(pa, pa, pc, 1.0, 0.0, sptr))
        if name == "ctypes":
            fns["old: cublasLtMatmul with ctypes argument objects"] = _old_lt_call(launch, pa, pc, sptr)
    cublaslt.use_binding("auto")
    return fns


def _old_lt_call(lt, pa, pc, sptr):
    mm = lt._lib._lib.cublasLtMatmul
    h, d = ct.c_void_p(lt._handle), ct.c_void_p(lt._desc)
    lay = [ct.c_void_p(x) for x in lt._layouts]
    algo = ct.byref(lt._results[0].algo)
    one_zero = lt._one_zero
    lock = lt._lock

    def call():
        with lock:
            return mm(h, d, one_zero[1], pa, lay[0], pa, lay[1], one_zero[2], pc, lay[2], pc, lay[2], algo, None, 0,
                      sptr)
    return call


def end_to_end(gpu, calls: int, rounds: int) -> dict:
    import pyblasgemm

    cp, torch = gpu.cp, gpu.torch
    rng = np.random.default_rng(7)
    a = cp.asarray(rng.uniform(-1, 1, (N, N)).astype(np.float16))
    b = cp.asarray(rng.uniform(-1, 1, (N, N)).astype(np.float16))
    c = cp.empty((N, N), np.float16)
    ta, tb, tc = (torch.as_tensor(x, device="cuda") for x in (a, b, c))
    rows = []
    for route in ("auto", "tensorcore", "cublas"):
        kw = dict(backend=None if route == "auto" else route)
        mm = pyblasgemm.Matmul(a, b, out=c, **kw)
        forms = {"matmul": (lambda: pyblasgemm.matmul(a, b, **kw), "torch.matmul", lambda: torch.matmul(ta, tb)),
                 "matmul_out": (lambda: pyblasgemm.matmul(a, b, out=c, **kw), "torch.matmul(out=)",
                                lambda: torch.matmul(ta, tb, out=tc)),
                 "stateful": (mm.execute, "torch.matmul", lambda: torch.matmul(ta, tb))}
        for form, (ours, yname, yard) in forms.items():
            res = paired_host_us({"ours": ours, yname: yard}, calls, rounds)
            row = dict(form=form, route=route, host_us=res["ours"], yardstick=yname, yardstick_us=res[yname],
                       ratio_to_yardstick=res["ours"] / res[yname])
            rows.append(row)
            print(f"{row['host_us']:8.3f} us  {form} {route} (x{row['ratio_to_yardstick']:.3f} of {yname})",
                  flush=True)
    return {"end_to_end": rows}


def _device_tag(name: str) -> str | None:
    m = re.search(r"\b([HAB]\d{2,3})\b", name)
    return m.group(1).lower() if m else None


def baseline(device_name: str) -> dict:
    """The committed host_cost rows of these forms, and launch_primitives' launch rows, for
    this device kind (None where there is none)."""
    tag = _device_tag(device_name)
    results = ROOT / "bench" / "results"
    out = {"device_tag": tag, "host_cost_file": None, "host_cost": [], "launch_primitives_file": None,
           "launch_primitives_us": None}
    if tag is None:
        return out
    files = sorted(results.glob(f"host_cost_{tag}_*.json"), key=lambda p: json.loads(p.read_text())
                   .get("meta", {}).get("date", ""))
    if files:
        doc = json.loads(files[-1].read_text())
        out["host_cost_file"] = files[-1].name
        out["host_cost"] = [dict(form=r["form"], route=r["route"], host_us=r["host_us"], yardstick=r["yardstick"],
                                 yardstick_us=r["yardstick_us"],
                                 ratio_to_yardstick=(r["host_us"] / r["yardstick_us"]
                                                     if r["host_us"] and r["yardstick_us"] else None))
                            for r in doc.get("rows", [])
                            if r.get("set") == "issue" and (r["m"], r["n"], r["k"]) == (N, N, N)
                            and r["dtype"] == "float16" and r["form"] in ("matmul", "matmul_out", "stateful")]
    prim = sorted(results.glob(f"launch_primitives_{tag}_*.json"))
    if prim:
        doc = json.loads(prim[-1].read_text())
        out["launch_primitives_file"] = prim[-1].name
        out["launch_primitives_us"] = {k: v for k, v in doc["host_us"].items()
                                       if "aunch" in k or "Lt" in k}
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="results JSON")
    parser.add_argument("--quick", action="store_true", help="fewer rounds (a smoke run)")
    args = parser.parse_args(argv)
    calls, rounds = (300, 3) if args.quick else (2000, 9)
    gpu = _Gpu()
    from importlib import metadata

    from pyblasgemm.backends import cublaslt

    doc = {"schema": "pyblasgemm-launch-bindings/1",
           **meta(gpu, seed="operands: numpy default_rng(1) (cuBLASLt) and default_rng(7) (end to end)"),
           "method": __doc__,
           "calls_per_round": calls, "rounds": rounds}
    for dist in ("cuda-bindings", "cuda-pathfinder", "nvmath-python", "cuda-core"):
        try:
            doc["versions"][dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            doc["versions"][dist] = None
    doc["cublas_route"] = cublaslt.status()
    doc.update(primitives(gpu, calls, rounds))
    doc.update(end_to_end(gpu, max(calls // 2, 100), rounds))
    doc["baseline"] = baseline(doc["device"]["name"])
    write_doc(doc, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
