"""The on-chip back-to-back MLP kernel (``impls/sm80_fused_mlp.cuh``): its constants, the
bounds it needs (:func:`fits`), its compile (online through the kernel cache, offline for CI) and
its launch.

``y = act(x @ w1 + b1) @ w2 + b2`` in one kernel: each CTA owns :data:`BM` rows of ``x``,
computes their whole row slice of ``h`` in 128-column chunks into shared memory (rounded once to
the 16-bit layer dtype) and multiplies it by ``w2`` (the only operand of the second product
read from global memory). Grid: ``(ceil(M / BM), n2_splits)``; CTA ``(i, j)`` produces only its
share of ``y``'s 128-column chunks (and recomputes ``h`` for its rows).

Nothing here imports CuPy or compiles at import time.

>>> smem_bytes(1024), max_hidden(SMEM_OPTIN["sm_90"]), max_hidden(SMEM_OPTIN["sm_80"])
(173568, 1472, 960)
>>> print(fits(4096, 1024, 4096, 1024, "float16", SMEM_OPTIN["sm_90"])[1])  # doctest: +NORMALIZE_WHITESPACE
shared memory: 64 rows x (4096 + 8) x 2 B of h + 41472 B operand ring = 566784 B, more than
the device's 232448 B (opt-in maximum per block); N1 <= 1472 fits
"""
from __future__ import annotations

import math
import threading

import numpy as np

__all__ = ["BM", "CHUNK", "BK", "STAGES", "THREADS", "PAD", "RING_BYTES", "SMEM_OPTIN", "HEADER",
           "h_width", "smem_bytes", "max_hidden", "fits", "choose_n2_splits", "kernel_name",
           "compile_offline", "get_kernel", "launch"]

HEADER = "pyblasgemm/impls/sm80_fused_mlp.cuh"

# The kernel's constants, mirrored from the header (tests/test_mlp_kernel_compile.py greps the
# header to check every one): kMlpBM, kMlpChunk, kMlpBK, kMlpStages, kMlpWarpsM x kMlpWarpsN,
# kMlpPad.
BM = 64          #: rows of x per CTA (the h buffer's rows)
CHUNK = 128      #: columns of h (stage 1) and y (stage 2) per register tile
BK = 32          #: K per ring step
STAGES = 3       #: cp.async ring depth
WARPS_M, WARPS_N = 2, 4
THREADS = 32 * WARPS_M * WARPS_N
PAD = 8          #: halves of padding per shared-memory row (conflict-free ldmatrix)
#: the operand ring: per stage a BM x (BK + PAD) x tile and a BK x (CHUNK + PAD) weight tile
RING_BYTES = STAGES * (BM * (BK + PAD) * 2 + BK * (CHUNK + PAD) * 2)
#: cudaDevAttrMaxSharedMemoryPerBlockOptin of sm_80 (A100) and sm_90 (H100 / H200); at run time
#: the device's own value is used
SMEM_OPTIN = {"sm_80": 166912, "sm_90": 232448}
#: the dtypes the kernel instantiates (template bool BF16)
DTYPES = ("float16", "bfloat16")
#: activation codes the kernel instantiates (epilogue/activation.cuh; 0 = none)
ACTIVATION_CODES = (0, 1, 2, 3, 4)
#: each dimension stays an int32 in the kernel with room for a chunk past it
_MAX_DIM = 2**31 - 1 - 2 * CHUNK
#: grid dimension y's limit
_MAX_GRID_Y = 65535


def h_width(n1: int) -> int:
    """Columns of ``h`` the kernel keeps: ``N1`` rounded up to :data:`BK` (zeros past ``N1``).

    >>> h_width(200), h_width(1024)
    (224, 1024)
    """
    return -(-n1 // BK) * BK


def smem_bytes(n1: int) -> int:
    """Dynamic shared memory of one CTA for hidden width ``n1``: ring + padded h buffer.

    >>> smem_bytes(1024)           # 41472 B of ring + 64 rows x (1024 + 8) x 2 B
    173568
    """
    return RING_BYTES + BM * (h_width(n1) + PAD) * 2


def max_hidden(max_smem: int) -> int:
    """The widest hidden size (a multiple of 8) whose CTA fits in ``max_smem`` bytes.

    >>> max_hidden(232448), max_hidden(166912)     # H100 / H200, A100 opt-in shared memory
    (1472, 960)
    """
    w = ((max_smem - RING_BYTES) // (BM * 2) - PAD) // BK * BK
    return max(w, 0)


def dtype_name(dtype) -> str:
    """'float16', 'bfloat16', ... for a dtype, a type or a name (without importing ml_dtypes)."""
    if isinstance(dtype, str):
        return dtype
    try:
        return np.dtype(dtype).name
    except TypeError:
        return str(dtype)


def fits(M: int, K1: int, N1: int, N2: int, dtype, max_smem: int) -> tuple[bool, str]:
    """``(ok, reason)``: whether the kernel can run a layer of these sizes on a device with
    ``max_smem`` bytes of opt-in shared memory per block; the reason names the failing bound with
    its numbers (or, when it fits, the shared memory it takes).

    >>> fits(33, 72, 200, 136, "bfloat16", 232448)
    (True, '71168 B of shared memory (64 rows x (224 + 8) x 2 B of h + 41472 B operand ring) of the 232448 B available')
    >>> fits(8, 64, 100, 64, "float16", 232448)
    (False, 'N1 = 100 is not a multiple of 8 (the kernel copies rows in 16-byte pieces)')
    """
    name = dtype_name(dtype)
    if name not in DTYPES:
        return False, f"the on-chip kernel takes float16 or bfloat16 operands, not {name}"
    for label, v in (("M", M), ("K1", K1), ("N1", N1), ("N2", N2)):
        if v < 1:
            return False, f"{label} = {v}: nothing for the on-chip kernel to do"
        if v > _MAX_DIM:
            return False, f"{label} = {v} is more than the kernel's 32-bit index bound {_MAX_DIM}"
    for label, v in (("K1", K1), ("N1", N1), ("N2", N2)):
        if v % 8:
            return False, f"{label} = {v} is not a multiple of 8 (the kernel copies rows in 16-byte pieces)"
    need = smem_bytes(N1)
    what = f"{BM} rows x ({h_width(N1)} + {PAD}) x 2 B of h + {RING_BYTES} B operand ring"
    if need > max_smem:
        return False, (f"shared memory: {what} = {need} B, more than the device's {max_smem} B "
                       f"(opt-in maximum per block); N1 <= {max_hidden(max_smem)} fits")
    return True, f"{need} B of shared memory ({what}) of the {max_smem} B available"


def choose_n2_splits(M: int, N2: int, sm_count: int) -> int:
    """How many CTAs share one block of rows (grid dimension y): enough that
    ``ceil(M / BM) * n2_splits`` roughly fills ``sm_count`` SMs, at most one per 128-column chunk
    of ``N2``, and normalised so that no CTA is left without a chunk. Each split recomputes the
    rows' ``h``: the split buys parallelism for small ``M`` at that price.

    >>> choose_n2_splits(16, 1024, 132), choose_n2_splits(4096, 1024, 132), choose_n2_splits(100, 640, 132)
    (8, 2, 5)
    """
    grid_m = -(-M // BM)
    chunks = -(-N2 // CHUNK)
    want = max(1, sm_count // max(grid_m, 1))
    splits = min(chunks, want, _MAX_GRID_Y)
    per = -(-chunks // splits)
    return -(-chunks // per)


def kernel_name(dtype, activation_code: int) -> str:
    """The C++ name expression of the instantiation.

    >>> kernel_name("bfloat16", 2)
    'pyblasgemm::fused_mlp_kernel<true, 2>'
    """
    name = dtype_name(dtype)
    if name not in DTYPES:
        raise ValueError(f"the on-chip MLP kernel has no {name} instantiation; choose from {DTYPES}")
    if activation_code not in ACTIVATION_CODES:
        raise ValueError(f"activation code {activation_code} is not one of {ACTIVATION_CODES}")
    return f"pyblasgemm::fused_mlp_kernel<{'true' if name == 'bfloat16' else 'false'}, {activation_code}>"


def _source() -> str:
    from . import jit

    return (f"// pyblasgemm {jit.PACKAGE_VERSION} headers sha256={jit.header_fingerprint()}\n"
            f'#include "{HEADER}"\n')


def compile_offline(dtype, activation_code: int, arch: str = "sm_80", ptx: bool = False):
    """Compile one instantiation without a GPU (no CUDA context): ``(cubin or PTX bytes, log)``;
    the log carries ptxas's resource report (``jit.ptxas_resources`` parses it).

    Example::

        binary, log = compile_offline("float16", 2, "sm_90a")
    """
    from .jit import compile_program

    binary, log, _ = compile_program(_source(), "pyblasgemm_fused_mlp.cu",
                                     [kernel_name(dtype, activation_code)], arch, ptx=ptx)
    return binary, log


_cache: dict = {}
_lock = threading.Lock()


def get_kernel(dtype, activation_code: int, device_id: int | None = None):
    """The compiled kernel (a :class:`~pyblasgemm.kernels.jit.CompiledKernel`) for the current (or given) device, compiled
    once per (device, headers' fingerprint, name expression), with its dynamic shared memory
    opted in up to the device's maximum (blocks get more than 48 KB only after opting in).

    Example::

        kern = get_kernel("float16", 2)      # the erf GELU variant, compiled on first use
    """
    import cupy

    from . import jit

    name = kernel_name(dtype, activation_code)
    dev = cupy.cuda.Device(device_id)
    key = (dev.id, jit.header_fingerprint(), name)
    hit = _cache.get(key)
    if hit is not None:
        return hit
    kern = jit.load_kernels(_source(), [name], dev.id)[name]
    optin = max_smem(dev.id)
    if optin > 48 * 1024:
        with dev:
            kern.allow_dynamic_shared_memory(optin)
    with _lock:
        _cache[key] = kern
    return kern


_device_attrs: dict = {}


def _attrs(device_id: int) -> tuple[int, int]:
    hit = _device_attrs.get(device_id)
    if hit is None:
        import cupy

        attrs = cupy.cuda.Device(device_id).attributes
        hit = (int(attrs["MaxSharedMemoryPerBlockOptin"]), int(attrs["MultiProcessorCount"]))
        _device_attrs[device_id] = hit
    return hit


def max_smem(device_id: int) -> int:
    """The device's opt-in shared memory per block (cudaDevAttrMaxSharedMemoryPerBlockOptin)."""
    return _attrs(device_id)[0]


def sm_count(device_id: int) -> int:
    return _attrs(device_id)[1]


def launch(x_ptr: int, w1_ptr: int, b1_ptr: int, w2_ptr: int, b2_ptr: int, y_ptr: int, M: int, K1: int,
           N1: int, N2: int, dtype, activation_code: int, n2_splits: int, stream_ptr: int | None,
           device_id: int | None = None) -> None:
    """Launch ``y = act(x @ w1 + b1) @ w2 + b2`` on ``stream_ptr`` (None: CuPy's current stream)
    of the current (or given) device. Pointers are raw device addresses (0 for a missing bias);
    the caller has checked :func:`fits`, the 16-byte alignment of ``x``, ``w1``, ``w2``, ``y``
    and the contiguity of every array; this only re-checks the cheap bounds.

    Example::

        launch(x.data.ptr, w1.data.ptr, b1.data.ptr, w2.data.ptr, 0, y.data.ptr,
               4096, 1024, 1024, 1024, "float16", 2, n2_splits=2, stream_ptr=None)
    """
    import cupy

    from .. import streams

    ok, why = fits(M, K1, N1, N2, dtype, max_smem(cupy.cuda.Device(device_id).id))
    if not ok:
        raise ValueError(f"fused MLP kernel: {why}")
    chunks = -(-N2 // CHUNK)
    if not 1 <= n2_splits <= min(chunks, _MAX_GRID_Y):
        raise ValueError(f"fused MLP kernel: n2_splits = {n2_splits} is outside 1..{min(chunks, _MAX_GRID_Y)} "
                         f"(N2 = {N2} has {chunks} chunks of {CHUNK})")
    for label, p in (("x", x_ptr), ("w1", w1_ptr), ("w2", w2_ptr), ("y", y_ptr)):
        if p % 16:
            raise ValueError(f"fused MLP kernel: {label} at 0x{p:x} is not 16-byte aligned")
    kern = get_kernel(dtype, activation_code, device_id)
    grid = (math.ceil(M / BM), n2_splits, 1)
    args = (np.uint64(x_ptr), np.uint64(w1_ptr), np.uint64(b1_ptr or 0), np.uint64(w2_ptr),
            np.uint64(b2_ptr or 0), np.uint64(y_ptr), np.int32(M), np.int32(K1), np.int32(N1), np.int32(N2))
    with cupy.cuda.Device(device_id), streams.on(stream_ptr):
        kern(grid, (THREADS,), args, shared_mem=smem_bytes(N1))
