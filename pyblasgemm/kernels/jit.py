"""Run-time compilation of the kernel headers with NVRTC (the public cuda.bindings).

The generated source is two lines: a fingerprint comment (sha256 of every shipped header +
package version) and ``#include`` of the kernel header; the instantiations are named through
NVRTC's name expressions. Every kernel of the package is compiled by :func:`compile_program`
to a cubin for one target (the device's own ``sm_XY``, or a family's arch-specific one such as
the Hopper kernel's ``sm_90a``), kept on disk by :func:`cached_program` and loaded by
:func:`load_kernels`; in front of it, a dict per device.

``compile_offline`` compiles with NVRTC directly and needs no GPU and no CUDA context: CI uses
it to check every shipped instantiation for errors, spills and local memory.

The disk cache lies under :func:`kernel_cache_dir` as ``<key>.cubin`` + ``<key>.json`` (lowered
names, the cubin's size and sha256). One process compiles an entry; the others wait for it
and read it. The cache is untrusted input: an entry whose metadata has the wrong shape or
names other instantiations, whose cubin's size or sha256 differs from the metadata, or which
is not an ELF file, is never handed to the module loader: one :class:`KernelCacheWarning`
names the file and the reason, and the kernel is compiled again and the entry overwritten.
Both files are opened only if they are regular files, and read up to a bound
(:func:`pyblasgemm._files.read_regular`): a FIFO or a link to a device in their place is
unreadable, never a hang. A cache that cannot be written warns once per directory; the kernel
still runs.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import threading
import time
import warnings
from functools import lru_cache
from pathlib import Path

from .. import settings as _env
from .._files import CACHE_ENTRY_BYTES, CUBIN_BYTES, cache_home, read_regular, trim_cache
from .._warnings import PyblasgemmWarning, log
from .config import DEQUANT_KINDS, KernelConfig
from .problem import ACCUMULATE

__all__ = [
    "KernelCompileError", "KernelCacheWarning", "INCLUDE_DIR", "header_fingerprint", "kernel_name",
    "reduce_name", "get_kernels", "compile_offline", "ptxas_resources", "warm", "KERNEL_HEADER", "all_headers",
    "raw_function", "load_kernels", "cached_program", "device_target", "CompiledKernel",
]

INCLUDE_DIR = Path(__file__).resolve().parent / "include"
KERNEL_HEADER = "pyblasgemm/impls/sm80_gemm.cuh"
SM90_HEADER = "pyblasgemm/impls/sm90_gemm.cuh"
#: the Hopper kernel's target: wgmma and setmaxnreg exist only on the arch-specific sm_90a
SM90_ARCH = "sm_90a"
from ..kinds import KERNEL_KINDS  # noqa: E402

from .._version import __version__ as PACKAGE_VERSION  # noqa: E402  (the one version source)
#: NVRTC options shared by the online and offline paths (no fast-math: it would flush
#: denormals and change the rounding of the epilogue).
BASE_OPTIONS = ("-std=c++17",)

#: (kind, accumulator) -> the mma.sync kernel's C++ struct (the kinds table's rows)
_KIND_STRUCT = {(k, acc): struct for k, r in KERNEL_KINDS.items()
                for acc, struct in r.mma_struct.items()}


class KernelCompileError(RuntimeError):
    """NVRTC rejected a kernel; ``.log`` holds the compiler log, ``.instantiation`` the name."""

    def __init__(self, message: str, log: str = "", instantiation: str = ""):
        super().__init__(f"{message}\n--- NVRTC log ---\n{log}" if log else message)
        self.log = log
        self.instantiation = instantiation


class KernelCacheWarning(PyblasgemmWarning):
    """A compiled-kernel cache entry (sm_90a cubin + metadata) was unusable and is recompiled,
    or the cache could not be written (the kernel is compiled again next time)."""


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
                vec: bool = True, epi: int = 0) -> str:
    """The C++ name expression of the GEMM kernel instantiation (``epi``: its fused epilogue,
    :func:`epilogue_code`; 0 keeps the plain kernel's name)."""
    ak, bk = transa == "T", transb == "N"
    return (f"pyblasgemm::gemm_kernel<{kind_struct(kind, accumulate)}, {_b(ak)}, {_b(bk)}, {config.bm}, "
            f"{config.bn}, {config.bk_bytes(kind)}, {config.warps_m}, {config.warps_n}, {config.stages}, "
            f"{config.mode}, {_b(vec)}{f', {epi}' if epi else ''}>")


def reduce_name(config: KernelConfig, kind: str, accumulate: str | None = None, epi: int = 0) -> str:
    """The split-k reduction kernel that goes with ``config`` (its family's: same tile shape;
    ``epi``: the Hopper reduction's fused epilogue, see :func:`sm90_kernel_name`)."""
    return config.kernel_family.reduce_name(config, kind, accumulate, epi)


SM90_KIND = {k: r.sm90_struct for k, r in KERNEL_KINDS.items()}
#: fp32 operands reach the Hopper kernel through this prep kernel (impls/sm90_tf32_prep.cuh)
SM90_PREP_NAME = {"tf32": "pyblasgemm::sm90_tf32_prep<1>", "3xtf32": "pyblasgemm::sm90_tf32_prep<2>"}
SM90_PREP_KINDS = tuple(SM90_PREP_NAME)


def sm90_kernel_name(config: KernelConfig, kind: str, transa: str, transb: str, epi: int = 0) -> str:
    """The Hopper kernel instantiation (impls/sm90_gemm.cuh). Its P operand is op(B)^T
    (K-major when transb = 'N'), its Q operand op(A) (K-major when transa = 'T'); the wgmma N
    is ``config.bm`` (the tile's extent over m). ``epi``: the fused epilogue (0: none, else
    :data:`EPI_ON` | the activation's code in ``epilogue.ACTIVATIONS``; see
    :func:`epilogue_code`).

    Example::

        sm90_kernel_name(SM90_CONFIGS_BY_TILE["f16"][256], "f16", "T", "N")
        # 'pyblasgemm::sm90_gemm_kernel<pyblasgemm::Sm90KindF16, true, true, 256, 4, 0, 1, 2, false>' 
    """
    pk, qk = transb == "N", transa == "T"
    if kind in SM90_PREP_KINDS:   # the prep kernel hands over K-major operands in every layout
        pk = qk = True
    return (f"pyblasgemm::sm90_gemm_kernel<pyblasgemm::{SM90_KIND[kind]}, {_b(pk)}, {_b(qk)}, {config.bm}, "
            f"{config.stages}, {config.mode}, {config.cluster}, {config.warps_m}, "
            f"{_b(config.consumer == 'mma.sync')}{f', {epi}' if epi else ''}>")


#: epilogue/activation.cuh's kEpiOn, kEpiDequant, kEpiOutShift: the bits of the template
#: argument EPI of a fused epilogue
EPI_ON = 8
EPI_DEQUANT = 16
EPI_OUT_SHIFT = 5
#: a dequantized int8 product's output type -> its code in EPI (DequantOut in the header)
DEQUANT_OUT = {"float32": 0, "float16": 1, "bfloat16": 2}
#: kEpiScaleMOne / kEpiScaleNOne: a dequantized product's scale_m / scale_n is one value (a
#: pointer to it: float8's per-tensor scales), not one per C row / column
EPI_SCALE_M_ONE = 128
EPI_SCALE_N_ONE = 256
#: kEpiResidue: the Ozaki moduli GEMM's digit store (int8 products on the Hopper kernel's sliced
#: tiles): each int32 product of batch entry b stored as its CRT digit, one byte (the launch's
#: bias pointer holds the digit table: pyblasgemm.kernels.ozaki_kernels.digit_table)
EPI_RESIDUE = 1 << 15
#: kEpiBlockShift: a block-scaled float8 product's two 3-bit scale layouts (C's rows, then its
#: columns), by pyblasgemm.fp8's layout name of the scale on that side: 'tensor' one value,
#: 'rows' / 'cols' one per row / column, 'blocks' of a (dim, ceil(k/128)) or of b
#: (ceil(k/128), ceil(dim/128))
EPI_BLOCK_SHIFT = 9
BLOCK_MODE = {"tensor": 1, "vector": 2, "a_blocks": 3, "b_blocks": 4}


def epilogue_code(activation_code: int, dequantize_to: str | None = None, scale_m_one: bool = False,
                  scale_n_one: bool = False, block_m: int = 0, block_n: int = 0) -> int:
    """The kernels' EPI template argument for a fused epilogue with this activation (0: bias
    and/or pre-activation only); 0 itself means no fused epilogue. ``dequantize_to``: an int8
    or float8 product scaled to this float type (``DEQUANT_OUT``); ``scale_m_one`` /
    ``scale_n_one``: its scale of C's rows / columns is one value (per-tensor). ``block_m`` /
    ``block_n``: a block-scaled float8 product's layout of each side's scale (``BLOCK_MODE``;
    the mainloop promotes every 128-wide K block, the store scales nothing).

    >>> epilogue_code(0), epilogue_code(2), epilogue_code(2, "float16")   # bias only; GELU; int8 -> f16
    (8, 10, 58)
    >>> epilogue_code(0, "bfloat16", scale_m_one=True, scale_n_one=True)   # float8, per-tensor scales
    472
    """
    if (scale_m_one or scale_n_one or block_m or block_n) and dequantize_to is None:
        raise ValueError("per-tensor and block scales belong to a dequantized product")
    if (block_m or block_n) and not (block_m in BLOCK_MODE.values() and block_n in BLOCK_MODE.values()
                                     and not (scale_m_one or scale_n_one)):
        raise ValueError(f"block scale modes must both be one of {sorted(BLOCK_MODE.values())} "
                         f"(got {block_m}, {block_n}), without the per-tensor bits")
    if not 0 <= activation_code < EPI_ON:
        raise ValueError(f"activation code {activation_code} is outside 0..{EPI_ON - 1}")
    if dequantize_to is None:
        return EPI_ON | activation_code
    if dequantize_to not in DEQUANT_OUT:
        raise ValueError(f"dequantize_to={dequantize_to!r} is not one of {tuple(DEQUANT_OUT)}")
    return (EPI_ON | activation_code | EPI_DEQUANT | DEQUANT_OUT[dequantize_to] << EPI_OUT_SHIFT
            | (EPI_SCALE_M_ONE if scale_m_one else 0) | (EPI_SCALE_N_ONE if scale_n_one else 0)
            | block_m << EPI_BLOCK_SHIFT | block_n << (EPI_BLOCK_SHIFT + 3))


def residue_store_fits(config, kind: str) -> bool:
    """Whether ``config`` runs the Ozaki digit store (:data:`EPI_RESIDUE`): the Hopper kernel,
    int8, wgmma consumers, sliced tiles (the split-k and stream-k partials would need the int32
    sum first), and tiles of whole 128-byte boxes.

    >>> from pyblasgemm.kernels.config import SM90_CONFIGS_BY_TILE, SHIPPED_CONFIGS
    >>> residue_store_fits(SM90_CONFIGS_BY_TILE["s8"][256], "s8"), residue_store_fits(SHIPPED_CONFIGS["s8"][0], "s8")
    (True, False)
    """
    return (kind == "s8" and config.kernel_family.name == "sm90a" and config.consumer == "wgmma"
            and config.decomposition == "sliced" and config.bm % 128 == 0)


def _names(config, kind, transa, transb, accumulate, vec, epi: int = 0) -> list[str]:
    """The name expressions one module of ``config`` compiles: its family's GEMM kernel, the
    split-k reduction with ``splitk_parallel``, the operand-prep kernel where the kind has one."""
    if epi & EPI_DEQUANT and kind not in DEQUANT_KINDS:
        raise ValueError(f"dequantization is fused for the {', '.join(DEQUANT_KINDS)} kinds only, not "
                         f"{config.name} ({kind})")
    if epi & EPI_RESIDUE and not residue_store_fits(config, kind):
        raise ValueError(f"the digit store (EPI_RESIDUE) runs on the Hopper kernel's sliced s8 configs with "
                         f"wgmma consumers, not {config.name} ({kind})")
    family = config.kernel_family
    names = [family.kernel_name(config, kind, transa, transb, accumulate, vec, epi)]
    if config.decomposition == "splitk_parallel":
        names.append(family.reduce_name(config, kind, accumulate, epi))
    prep = family.prep_name(kind)
    if prep is not None:
        names.append(prep)
    return names


def _source(header: str = KERNEL_HEADER) -> str:
    return (f"// pyblasgemm {PACKAGE_VERSION} headers sha256={header_fingerprint()}\n"
            f'#include "{header}"\n')


def _options() -> tuple[str, ...]:
    return BASE_OPTIONS + ("-I" + str(INCLUDE_DIR),)


_cache: dict = {}
_lock = threading.Lock()


def get_kernels(config: KernelConfig, kind: str, transa: str, transb: str, accumulate: str | None = None,
                vec: bool = True, device_id: int | None = None, epi: int = 0):
    """(gemm RawKernel, reduce RawKernel or None) for the current (or given) device; ``epi``:
    the Hopper kernel's fused epilogue (:func:`epilogue_code`).

    Compiles lazily; raises :class:`KernelCompileError` with the NVRTC log on failure.
    :func:`get_prep_kernel` gives the same module's operand-prep kernel (Hopper tf32 kinds).
    """
    return _get_module_kernels(config, kind, transa, transb, accumulate, vec, device_id, epi)[:2]


def get_prep_kernel(config: KernelConfig, kind: str, transa: str, transb: str, device_id: int | None = None):
    """The fp32 operand-prep kernel (``sm90_tf32_prep``) of a Hopper tf32 / 3xTF32 instantiation.

    Example::

        prep = get_prep_kernel(SM90_CONFIGS_BY_TILE["3xtf32"][128], "3xtf32", "N", "N")
    """
    return _get_module_kernels(config, kind, transa, transb, None, True, device_id)[2]


def _get_module_kernels(config, kind, transa, transb, accumulate, vec, device_id, epi=0):
    """(gemm, reduce or None, prep or None), compiled once per (device, headers, names)."""
    import cupy

    dev = cupy.cuda.Device(device_id)
    names = _names(config, kind, transa, transb, accumulate, vec, epi)
    key = (dev.id, header_fingerprint(), tuple(names))
    hit = _cache.get(key)
    if hit is not None:
        return hit
    family = config.kernel_family
    if family.compile_target is not None:      # the Hopper family: its own arch-specific target (sm_90a)
        cubin, lowered = _cached_cubin(config, kind, transa, transb, epi)
        by_name = _load(cubin, lowered, names, dev.id)
    else:                                      # any sm_80+ device: its own sm_XY
        by_name = load_kernels(_source(family.header), names, dev.id)
    smem = config.smem_bytes(kind)
    if smem > 48 * 1024:
        # Blocks get more than 48 KB of dynamic shared memory only after opting in.
        with dev:
            by_name[names[0]].allow_dynamic_shared_memory(smem)
    by_name = dict(by_name)
    prep = by_name.pop(family.prep_name(kind), None)
    red = [f for n, f in by_name.items() if n != names[0]]
    result = (by_name[names[0]], red[0] if red else None, prep)
    with _lock:
        _cache[key] = result
    return result


class CompiledKernel:
    """One kernel of a module loaded from a cached cubin, called as CuPy's ``RawKernel`` is:
    ``kern(grid, block, args, shared_mem=...)`` on the current stream; ``kern.kernel`` is CuPy's
    ``Function`` (which holds its module alive), ``kern.ptr`` the ``CUfunction``.

    Example (on a GPU)::

        kern = load_kernels(source, ["k<float>"], 0)["k<float>"]
        kern((blocks,), (256,), (x, n), shared_mem=0)
    """

    __slots__ = ("kernel",)

    def __init__(self, function):
        self.kernel = function

    @property
    def ptr(self) -> int:
        return self.kernel.ptr

    def __call__(self, grid, block, args, *, shared_mem: int = 0):
        self.kernel(tuple(grid), tuple(block), args, shared_mem)

    def allow_dynamic_shared_memory(self, nbytes: int) -> None:
        """Opt in to ``nbytes`` of dynamic shared memory per block (past 48 KB needs it)."""
        from .driver import set_max_dynamic_shared_memory

        set_max_dynamic_shared_memory(self.kernel.ptr, nbytes)


def _load(cubin: bytes, lowered: dict, names, device: int) -> dict:
    """{name expression: CompiledKernel} of ``cubin`` loaded on ``device``."""
    import cupy

    with cupy.cuda.Device(device):
        mod = cupy.cuda.function.Module()
        mod.load(cubin)
        return {n: CompiledKernel(mod.get_function(lowered[n])) for n in names}


_targets: dict = {}


def device_target(device: int) -> str:
    """The NVRTC target of a device: its own ``sm_XY`` (a cubin, no JIT at load time).

    Example (on an H100)::

        device_target(0)     # 'sm_90'
    """
    target = _targets.get(device)
    if target is None:
        import cupy

        target = _targets[device] = f"sm_{cupy.cuda.Device(device).compute_capability}"
    return target


_loaded: dict = {}
_loaded_lock = threading.Lock()


def load_kernels(source: str, names, device: int, *, target: str | None = None) -> dict:
    """{name expression: :class:`CompiledKernel`} of a CUDA ``source`` that includes the shipped
    headers (``-I`` :data:`INCLUDE_DIR`), compiled for ``target`` (default: the device's own
    ``sm_XY``) through :func:`cached_program` (the disk cache, one compile across processes)
    and loaded on ``device`` once per process. The one way every kernel family outside the
    GEMM configs is built: the GEMV, the Ozaki passes, the on-chip MLP, the packing copies, the
    epilogue pass, the grouped table.

    Example (on a GPU)::

        kernels = load_kernels("#include <pyblasgemm/impls/grouped_offsets.cuh>\n",
                               ["pyblasgemm::grouped_offsets_kernel<int>"], 0)
    """
    names = list(names)
    key = (device, header_fingerprint(), source, tuple(names), target)
    hit = _loaded.get(key)
    if hit is None:
        target = target or device_target(device)
        cubin, lowered = cached_program(source, names, target)
        with _loaded_lock:
            hit = _loaded.setdefault(key, _load(cubin, lowered, names, device))
    return hit


def raw_function(source: str, name: str, device: int):
    """The driver function handle (``CUfunction``) of the instantiation ``name`` of a raw CUDA
    ``source`` that includes the shipped headers, on ``device``: :func:`load_kernels`' kernel
    as :func:`~pyblasgemm.kernels.driver.launch_kernel` takes it. For the small helper kernels
    that a bound launch enqueues (the epilogue pass, the grouped table).

    Example (on a GPU)::

        fn = raw_function("#include <pyblasgemm/impls/grouped_offsets.cuh>\n",
                          "pyblasgemm::grouped_offsets_kernel<int>", 0)
        fn is raw_function("#include <pyblasgemm/impls/grouped_offsets.cuh>\n",
                           "pyblasgemm::grouped_offsets_kernel<int>", 0)   # True: compiled once
    """
    key = (device, header_fingerprint(), source, name)
    hit = _raw.get(key)
    if hit is None:
        from .driver import function

        kern = load_kernels(source, [name], device)[name]
        with _raw_lock:
            hit = _raw.setdefault(key, (function(kern.ptr), kern))
    return hit[0]


_raw: dict = {}
_raw_lock = threading.Lock()


_noticed = []


def _first_compile_notice() -> None:
    """Say once per process that kernels compile on first use (seconds each, never again for
    sm_90a: the kernel cache): to the ``pyblasgemm`` logger where INFO is enabled, else one
    line on stderr (logging is rarely configured, and a silent multi-second first call looks
    like a hang)."""
    if _noticed:
        return
    _noticed.append(True)
    msg = ("pyblasgemm: compiling GPU kernels on first use (seconds each; "
           "pyblasgemm.precompile() does it ahead of time)")
    if log.isEnabledFor(20):        # logging.INFO
        log.info(msg)
    else:
        import sys
        print(msg, file=sys.stderr)


def warm(specs, workers: int | None = None) -> None:
    """Compile many (config, kind, transa, transb, accumulate, vec) specs in parallel threads
    (NVRTC releases the GIL), filling both caches."""
    from concurrent.futures import ThreadPoolExecutor

    workers = workers or min(16, os.cpu_count() or 1)
    with ThreadPoolExecutor(workers) as ex:
        list(ex.map(lambda s: get_kernels(*s), specs))


def compile_offline(config: KernelConfig, kind: str, transa: str, transb: str, arch: str = "sm_80",
                    accumulate: str | None = None, vec: bool = True, ptx: bool = False, epi: int = 0):
    """Compile without a GPU (no CUDA context). Returns ``(cubin_or_ptx_bytes, log)``; the log
    includes ptxas's resource report (parse it with :func:`ptxas_resources`). ``epi``: the
    Hopper kernel's fused epilogue (:func:`epilogue_code`).

    Example::

        binary, log = compile_offline(SHIPPED_CONFIGS["f16"][0], "f16", "N", "T", "sm_90")
    """
    names = _names(config, kind, transa, transb, accumulate, vec, epi)
    binary, log, _ = _nvrtc(names, config, arch, ptx)
    return binary, log


def _nvrtc(names: list[str], config: KernelConfig, arch: str, ptx: bool = False, verbose: bool = True):
    """(cubin or PTX bytes, log, {name expression: lowered name}) from one NVRTC compile."""
    family = config.kernel_family
    if family.compile_target is not None and arch != family.compile_target:
        raise ValueError(f"{family.title} ({config.name}) compiles for {family.compile_target} only "
                         f"(got arch={arch!r})")
    return compile_program(_source(family.header), "pyblasgemm_kernel.cu", names, arch, ptx=ptx,
                           verbose=verbose)


def compile_program(source: str, filename: str, names, arch: str, *, ptx: bool = False,
                    verbose: bool = True, what: str | None = None):
    """``(cubin or PTX bytes, log, {name expression: lowered name})`` of one NVRTC compile of
    ``source`` with the package's options (the one compile every kernel family's launcher
    shares: the GEMM kernels, the GEMV, the Ozaki passes, the on-chip MLP); ``verbose`` adds
    ptxas's resource report to the log (``ptxas_resources`` parses it).
    :class:`KernelCompileError` with NVRTC's log if it fails, naming ``what`` (default the
    first name expression).

    Example::

        cubin, log, lowered = compile_program(source, "k.cu", ["k<float>"], "sm_90")
    """
    from . import nvrtc

    prog = nvrtc.createProgram(source, filename, [], [])
    try:
        for n in names:
            nvrtc.addNameExpression(prog, n)
        arch_opt = f"--gpu-architecture={'compute_' + arch[3:] if ptx else arch}"
        opts = [arch_opt, *_options()] + ([] if ptx or not verbose else ["--ptxas-options=-v"])
        try:
            nvrtc.compileProgram(prog, opts)
        except Exception as e:  # NVRTCError carries only the status; the log has the detail
            log = nvrtc.getProgramLog(prog)
            raise KernelCompileError(f"NVRTC failed to compile {what or names[0]} for {arch}: {e}", log,
                                     names[0]) from e
        log = nvrtc.getProgramLog(prog)
        binary = nvrtc.getPTX(prog) if ptx else _get_cubin(prog)
        lowered = {n: nvrtc.getLoweredName(prog, n) for n in names}
        return binary, log, lowered
    finally:
        nvrtc.destroyProgram(prog)


def _get_cubin(prog) -> bytes:
    """The program's cubin, every byte (:func:`pyblasgemm.kernels.nvrtc.getCUBIN`)."""
    from . import nvrtc

    return nvrtc.getCUBIN(prog)


def kernel_cache_dir() -> Path:
    """Where compiled kernels are kept: ``$PYBLASGEMM_CACHE_DIR/kernels`` (default
    ``$XDG_CACHE_HOME/pyblasgemm/kernels``, else the platform's cache folder's: Linux
    ``~/.cache/pyblasgemm/kernels``; see :func:`pyblasgemm._files.cache_home`).

    Example::

        kernel_cache_dir()       # PosixPath('/home/me/.cache/pyblasgemm/kernels')
    """
    return cache_home() / "kernels"


def _cached_cubin(config: KernelConfig, kind: str, transa: str, transb: str, epi: int = 0):
    """(cubin, lowered names) of a GEMM instantiation of a family with its own arch-specific
    ``compile_target`` (the Hopper kernel's sm_90a), through :func:`cached_program`."""
    names = _names(config, kind, transa, transb, None, True, epi)
    family = config.kernel_family
    target = family.compile_target
    return cached_program(_source(family.header), names, target,
                          compile=lambda: _nvrtc(names, config, target, verbose=False))


def cached_program(source: str, names, target: str, *, compile=None) -> tuple[bytes, dict]:
    """(cubin, {name expression: lowered name}) of ``source`` compiled for ``target``, from the
    disk cache (:func:`kernel_cache_dir`) when present; ``compile`` (default
    :func:`compile_program` with the package's options; its ``(cubin, log, lowered)``) makes it
    otherwise.

    The key covers the source (which carries the headers' sha256), the options, the target,
    the NVRTC version and the name expressions. One process compiles an entry: the others
    that want it at the same time wait on its ``<key>.compile`` lock and then read what it
    wrote (pytest-xdist's 14 workers, or the ranks of one job, each warming the same ~350
    kernels compiled each ~14 times before; flock is released when a process dies, so a
    killed compiler blocks nobody). Files are written atomically (rename), so concurrent
    processes never read half a file. An entry is used only if it passes
    :func:`_read_cached_cubin`; otherwise (one :class:`KernelCacheWarning`) the kernel is
    compiled and the entry overwritten. ``PYBLASGEMM_NO_KERNEL_CACHE=1`` skips the disk.

    Example::

        cubin, lowered = cached_program('#include "pyblasgemm/impls/sm80_gemm.cuh"\n',
                                        names, "sm_90")     # NVRTC, no GPU needed
    """
    from . import nvrtc

    names = list(names)
    if compile is None:
        def compile():
            return compile_program(source, "pyblasgemm_kernel.cu", names, target, verbose=False)
    h = hashlib.sha256()
    for part in (source, " ".join(_options()), target, str(nvrtc.getVersion()), *names):
        h.update(part.encode() + b"\0")
    key = h.hexdigest()[:40]
    if _env.get("PYBLASGEMM_NO_KERNEL_CACHE"):
        return _compile_logged(compile, names[0], target, "off")
    d = kernel_cache_dir()
    cub_path, meta_path = d / f"{key}.cubin", d / f"{key}.json"
    with _entry_lock(meta_path, exclusive=True, suffix=".compile"):
        hit = _read_cached_cubin(cub_path, meta_path, names)
        if hit is not None:
            return hit
        cubin, lowered = _compile_logged(compile, names[0], target, "miss")
        if _write_cached_cubin(cub_path, meta_path, cubin, lowered) and d == cache_home() / "kernels":
            trim_cache("kernels")      # the size cap (cold: a compile just ran)
    return cubin, lowered


def _compile_logged(compile, name: str, target: str, cache: str) -> tuple[bytes, dict]:
    _first_compile_notice()
    log.info("compiling %s for %s (kernel cache %s)", name, target, cache)
    t0 = time.perf_counter()
    cubin, _, lowered = compile()
    log.info("compiled %s in %.2f s", name, time.perf_counter() - t0)
    return cubin, lowered


#: every cubin is an ELF file
ELF_MAGIC = b"\x7fELF"


def _why_invalid_cubin_entry(meta, cubin: bytes, names) -> tuple[str, str] | None:
    """(which file is at fault: 'metadata' or 'cubin', why), or None when the cached entry
    (parsed metadata, cubin bytes) is usable for the name expressions ``names``."""
    if not isinstance(meta, dict):
        what = {list: "a list", str: "a string", type(None): "null"}.get(type(meta), "a number")
        return "metadata", f"it holds {what}, not an object"
    lowered = meta.get("lowered")
    if not isinstance(lowered, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                for k, v in lowered.items()):
        return "metadata", "'lowered' is not an object of name expressions to lowered names"
    if set(lowered) != set(names):
        return "metadata", "its lowered names are for other instantiations"
    size, digest = meta.get("size"), meta.get("sha256")
    if size is None or digest is None:
        return "metadata", "no cubin size and sha256 (an older format)"
    if not isinstance(size, int) or isinstance(size, bool) or not isinstance(digest, str):
        return "metadata", "'size' is not an integer or 'sha256' not a string"
    if size != len(cubin):
        return "cubin", f"{len(cubin)} bytes, but the metadata says {size} (truncated or replaced)"
    if hashlib.sha256(cubin).hexdigest() != digest:
        return "cubin", "its sha256 differs from the metadata's"
    if not cubin.startswith(ELF_MAGIC):
        return "cubin", "not an ELF file"
    return None


def _read_cached_cubin(cub_path: Path, meta_path: Path, names) -> tuple[bytes, dict] | None:
    """(cubin, {name expression: lowered name}) from a cache entry, or None: missing (either
    file; silently), or unreadable or failing any check of :func:`_why_invalid_cubin_entry`
    (one :class:`KernelCacheWarning` naming the file and the reason).

    Example::

        _read_cached_cubin(d / "k.cubin", d / "k.json", names)   # None: compile, then write
    """
    reading = meta_path
    try:
        with _entry_lock(meta_path, exclusive=False):
            meta_bytes = read_regular(meta_path, CACHE_ENTRY_BYTES)
            reading = cub_path
            cubin = read_regular(cub_path, CUBIN_BYTES)
    except FileNotFoundError:
        return None              # not cached yet (or a writer was interrupted between files)
    except OSError as exc:       # a directory, FIFO or device in the file's place (RefusedFile),
        # a file over the bound, no permission, ...
        _warn_cache(f"ignoring unreadable kernel cache file {reading}: {exc.strerror or exc}")
        return None
    try:
        meta = json.loads(meta_bytes)
    except (ValueError, RecursionError) as exc:
        _warn_cache(f"ignoring kernel cache file {meta_path}: not JSON ({str(exc)[:120]})")
        return None
    bad = _why_invalid_cubin_entry(meta, cubin, names)
    if bad is not None:
        culprit, why = bad
        _warn_cache(f"ignoring kernel cache file {meta_path if culprit == 'metadata' else cub_path}: {why}")
        return None
    return cubin, meta["lowered"]


@contextlib.contextmanager
def _entry_lock(meta_path: Path, exclusive: bool, suffix: str = ".lock"):
    """An advisory lock on one cache entry (``<key>.lock`` beside it): writers of the entry's
    two files exclude each other and its readers. Without it two processes compiling the same
    kernel at once could leave one's cubin beside the other's metadata (NVRTC's cubins differ
    byte for byte between processes), and the next reader warned and compiled again: seen
    under pytest-xdist on the GPU machine. POSIX ``flock``; where there is none, or the lock
    file cannot be made, no lock (the reader's checks still catch a mixed pair)."""
    try:
        import fcntl
        meta_path.parent.mkdir(parents=True, exist_ok=True)    # the first entry of a new cache
        fd = os.open(meta_path.with_suffix(suffix), os.O_RDWR | os.O_CREAT, 0o644)
    except (ImportError, OSError):
        fd = None
    try:
        if fd is not None:
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield
    finally:
        if fd is not None:
            os.close(fd)         # closing the descriptor releases the lock


#: cache directories a write already failed in (warned once per process)
_unwritable_dirs: set = set()


def _write_cached_cubin(cub_path: Path, meta_path: Path, cubin: bytes, lowered: dict) -> bool:
    """Store a compiled entry (cubin first, then the metadata with its size and sha256, each
    through a temporary file renamed into place). Never raises for the file system (a
    read-only home, a file where the directory should be, a full disk): returns False, and
    warns once per directory.

    Example::

        _write_cached_cubin(d / "k.cubin", d / "k.json", cubin, lowered)   # True
    """
    meta = {"lowered": lowered, "size": len(cubin), "sha256": hashlib.sha256(cubin).hexdigest()}
    tmp = None
    try:
        cub_path.parent.mkdir(parents=True, exist_ok=True)
        with _entry_lock(meta_path, exclusive=True):
            for path, data in ((cub_path, cubin), (meta_path, json.dumps(meta).encode())):
                tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
                tmp.write_bytes(data)
                os.replace(tmp, path)
                tmp = None
    except OSError as exc:
        _remove_quietly(tmp)
        where = cub_path.parent
        if where not in _unwritable_dirs:
            _unwritable_dirs.add(where)
            _warn_cache(f"cannot write the kernel cache in {where}: {exc} (the kernel runs; it is "
                        f"compiled again in the next process; PYBLASGEMM_NO_KERNEL_CACHE=1 skips the cache)")
        return False
    except BaseException:
        _remove_quietly(tmp)
        raise
    return True


def _remove_quietly(path: Path | None) -> None:
    if path is not None:
        try:
            path.unlink()
        except OSError:
            pass


def _warn_cache(message: str) -> None:
    # stacklevel: past this helper and the reader/writer, at _cached_cubin's caller's line
    log.info("kernel cache: %s", message)
    warnings.warn(f"pyblasgemm: {message}", KernelCacheWarning, stacklevel=4)


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
