"""Run-time compilation of the kernel headers with NVRTC (through CuPy).

The generated source is two lines: a fingerprint comment and ``#include`` of the kernel
header; the instantiation is named through ``name_expressions``. CuPy's on-disk cache
(``CUPY_CACHE_DIR``) keys on source + options + arch + NVRTC version + name expressions but
cannot see headers pulled in with ``-I``; the fingerprint comment (sha256 of every shipped
header + package version) puts them into the key. In front of it, a dict per device.

``compile_offline`` compiles with ``cupy.cuda.nvrtc`` directly and needs no GPU and no CUDA
context: CI uses it to check every shipped instantiation for errors, spills and local memory.
"""
from __future__ import annotations

import hashlib
import os
import re
import threading
from functools import lru_cache
from pathlib import Path

from .config import KernelConfig
from .problem import ACCUMULATE

__all__ = [
    "KernelCompileError", "INCLUDE_DIR", "header_fingerprint", "kernel_name", "reduce_name",
    "get_kernels", "compile_offline", "ptxas_resources", "warm", "KERNEL_HEADER", "all_headers",
]

INCLUDE_DIR = Path(__file__).resolve().parent / "include"
KERNEL_HEADER = "pyblasgemm/impls/sm80_gemm.cuh"
PACKAGE_VERSION = "0.1.0"
#: NVRTC options shared by the online and offline paths (no fast-math: it would flush
#: denormals and change the rounding of the epilogue).
BASE_OPTIONS = ("-std=c++17",)

_KIND_STRUCT = {
    ("f16", "f32"): "KindF16F32",
    ("f16", "f16"): "KindF16F16",
    ("bf16", "f32"): "KindBF16F32",
    ("s8", "s32"): "KindS8S32",
    ("tf32", "f32"): "KindTF32",
    ("3xtf32", "f32"): "Kind3xTF32",
}


class KernelCompileError(RuntimeError):
    """NVRTC rejected a kernel; ``.log`` holds the compiler log, ``.instantiation`` the name."""

    def __init__(self, message: str, log: str = "", instantiation: str = ""):
        super().__init__(f"{message}\n--- NVRTC log ---\n{log}" if log else message)
        self.log = log
        self.instantiation = instantiation


def all_headers() -> list[Path]:
    """Every shipped device header, in a stable order."""
    return sorted(INCLUDE_DIR.rglob("*.cuh"))


@lru_cache(maxsize=1)
def header_fingerprint() -> str:
    """sha256 over every header's relative path and bytes, plus the package version."""
    h = hashlib.sha256(PACKAGE_VERSION.encode())
    for p in all_headers():
        h.update(str(p.relative_to(INCLUDE_DIR)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def kind_struct(kind: str, accumulate: str | None = None) -> str:
    acc = accumulate or ACCUMULATE[kind][0]
    try:
        return "pyblasgemm::" + _KIND_STRUCT[(kind, acc)]
    except KeyError:
        raise ValueError(f"no kernel for kind={kind!r} accumulate={acc!r}; "
                         f"choose from {sorted(_KIND_STRUCT)}") from None


def _b(x: bool) -> str:
    return "true" if x else "false"


def kernel_name(config: KernelConfig, kind: str, transa: str, transb: str, accumulate: str | None = None,
                vec: bool = True) -> str:
    """The C++ name expression of the GEMM kernel instantiation."""
    ak, bk = transa == "T", transb == "N"
    return (f"pyblasgemm::gemm_kernel<{kind_struct(kind, accumulate)}, {_b(ak)}, {_b(bk)}, {config.bm}, "
            f"{config.bn}, {config.bk_bytes(kind)}, {config.warps_m}, {config.warps_n}, {config.stages}, "
            f"{config.mode}, {_b(vec)}>")


def reduce_name(config: KernelConfig, kind: str, accumulate: str | None = None) -> str:
    """The split-k reduction kernel that goes with ``config`` (same tile shape)."""
    return f"pyblasgemm::splitk_reduce_kernel<{kind_struct(kind, accumulate)}, {config.bm}, {config.bn}>"


def _names(config, kind, transa, transb, accumulate, vec) -> list[str]:
    names = [kernel_name(config, kind, transa, transb, accumulate, vec)]
    if config.decomposition == "splitk_parallel":
        names.append(reduce_name(config, kind, accumulate))
    return names


def _source() -> str:
    return (f"// pyblasgemm {PACKAGE_VERSION} headers sha256={header_fingerprint()}\n"
            f'#include "{KERNEL_HEADER}"\n')


def _options() -> tuple[str, ...]:
    return BASE_OPTIONS + ("-I" + str(INCLUDE_DIR),)


_cache: dict = {}
_lock = threading.Lock()


def get_kernels(config: KernelConfig, kind: str, transa: str, transb: str, accumulate: str | None = None,
                vec: bool = True, device_id: int | None = None):
    """(gemm RawKernel, reduce RawKernel or None) for the current (or given) device.

    Compiles lazily; raises :class:`KernelCompileError` with the NVRTC log on failure.
    """
    import cupy

    dev = cupy.cuda.Device(device_id)
    names = _names(config, kind, transa, transb, accumulate, vec)
    key = (dev.id, header_fingerprint(), tuple(names))
    hit = _cache.get(key)
    if hit is not None:
        return hit
    with dev:
        mod = cupy.RawModule(code=_source(), options=_options(), name_expressions=names)
        try:
            funcs = [mod.get_function(n) for n in names]
        except cupy.cuda.compiler.CompileException as e:
            raise KernelCompileError(f"NVRTC failed to compile {names[0]}", str(e), names[0]) from e
    smem = config.smem_bytes(kind)
    if smem > 48 * 1024:
        # Blocks get more than 48 KB of dynamic shared memory only after opting in.
        funcs[0].max_dynamic_shared_size_bytes = smem
    result = (funcs[0], funcs[1] if len(funcs) > 1 else None)
    with _lock:
        _cache[key] = result
    return result


def warm(specs, workers: int | None = None) -> None:
    """Compile many (config, kind, transa, transb, accumulate, vec) specs in parallel threads
    (NVRTC releases the GIL), filling both caches."""
    from concurrent.futures import ThreadPoolExecutor

    workers = workers or min(16, os.cpu_count() or 1)
    with ThreadPoolExecutor(workers) as ex:
        list(ex.map(lambda s: get_kernels(*s), specs))


def compile_offline(config: KernelConfig, kind: str, transa: str, transb: str, arch: str = "sm_80",
                    accumulate: str | None = None, vec: bool = True, ptx: bool = False):
    """Compile without a GPU (no CUDA context). Returns ``(cubin_or_ptx_bytes, log)``; the log
    includes ptxas's resource report (parse it with :func:`ptxas_resources`).

    Example::

        binary, log = compile_offline(SHIPPED_CONFIGS["f16"][0], "f16", "N", "T", "sm_90")
    """
    from cupy.cuda import nvrtc

    names = _names(config, kind, transa, transb, accumulate, vec)
    prog = nvrtc.createProgram(_source(), "pyblasgemm_kernel.cu", [], [])
    try:
        for n in names:
            nvrtc.addNameExpression(prog, n)
        arch_opt = f"--gpu-architecture={'compute_' + arch[3:] if ptx else arch}"
        opts = [arch_opt, *_options()] + ([] if ptx else ["--ptxas-options=-v"])
        try:
            nvrtc.compileProgram(prog, opts)
        except Exception as e:  # NVRTCError carries only the status; the log has the detail
            log = nvrtc.getProgramLog(prog)
            raise KernelCompileError(f"NVRTC failed to compile {names[0]} for {arch}: {e}", log, names[0]) from e
        log = nvrtc.getProgramLog(prog)
        binary = nvrtc.getPTX(prog) if ptx else nvrtc.getCUBIN(prog)
        return binary, log
    finally:
        nvrtc.destroyProgram(prog)


_RES_ENTRY = re.compile(r"Function properties for (\S+)")
_RES_STACK = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_RES_REGS = re.compile(r"Used (\d+) registers")


def ptxas_resources(log: str) -> dict[str, dict[str, int]]:
    """Per kernel (mangled name): registers, stack, spill_stores, spill_loads from a ptxas -v log."""
    out: dict[str, dict[str, int]] = {}
    cur = None
    for line in log.splitlines():
        m = _RES_ENTRY.search(line)
        if m:
            cur = out.setdefault(m.group(1), {})
            continue
        if cur is None:
            continue
        m = _RES_STACK.search(line)
        if m:
            cur.update(stack=int(m.group(1)), spill_stores=int(m.group(2)), spill_loads=int(m.group(3)))
        m = _RES_REGS.search(line)
        if m:
            cur["registers"] = int(m.group(1))
    return out
