"""The kinds table: one row per fact about an operand type, everything else derived from it.

Two tables, joined by the kernel kind:

* :data:`KERNEL_KINDS`: one row per kind of our kernels ('f16', 'bf16', 's8', 'tf32', '3xtf32',
  'f16_out32', 'bf16_out32', 'f32', and the float8 pairs 'e4m3', 'e4m3_e5m2', 'e5m2_e4m3', 'e5m2'): operand and output types and sizes, the accumulators, the
  C++ structs NVRTC instantiates (mma.sync per accumulator, the Hopper kernel's, None where the
  Hopper kernel does not run it), the TMA element types, the kind whose mainloop it shares
  (calibration, peaks), whether fp32 operands pass a prep kernel on Hopper, and whether it runs
  on the FP32 FMA pipes rather than the tensor cores (``simt``).
* :data:`ROUTES`: one row per (BLAS prefix, compute mode): cuBLAS's data and compute types, the
  kernel kind and accumulator that run it (None: cuBLAS only), and the relative tolerance the
  tests hold a result of it to (against a float64 reference; tests/_ref.py).

The backends' tables (cuBLAS types, our kernels' kinds), the kernels' size and struct tables, the
Hopper TMA types and the planner's kind map are read from here, so a new type is one row in
each table (and its C++ struct). Imports nothing of the package: every layer may read it.

Example
-------
>>> from pyblasgemm.kinds import ROUTES, KERNEL_KINDS
>>> r = ROUTES[("h", "fp32")]
>>> r.kernel_kind, r.accumulator, KERNEL_KINDS[r.kernel_kind].mma_struct[r.accumulator]
('f16', 'f32', 'KindF16F32')
>>> ROUTES[("d", "fp64")].kernel_kind is None              # cuBLAS only
True
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["KernelKind", "Route", "KERNEL_KINDS", "FP8_KINDS", "ROUTES", "CUDA", "CUBLAS_COMPUTE", "OZAKI",
           "OZAKI_FAST", "base_compute", "ozaki_bits", "ozaki_scaling", "route_of"]

#: cudaDataType_t values (library_types.h)
CUDA = {"R_32F": 0, "R_64F": 1, "R_16F": 2, "R_8I": 3, "C_32F": 4, "C_64F": 5, "R_32I": 10,
        "R_16BF": 14, "R_8F_E4M3": 28, "R_8F_E5M2": 29}
#: cublasComputeType_t values (cublas_api.h)
CUBLAS_COMPUTE = {"16F": 64, "32F": 68, "64F": 70, "32I": 72, "32F_FAST_TF32": 77}
#: CUtensorMapDataType values (cuda.h): the Hopper kernel's TMA element types
_TMA = {"UINT8": 0, "INT32": 3, "FLOAT16": 6, "FLOAT32": 7, "BFLOAT16": 9}


@dataclass(frozen=True)
class KernelKind:
    """One kind of our kernels."""

    name: str
    ab_dtype: str           # NumPy name of A and B
    c_dtype: str            # NumPy name of C
    elem_bytes: int
    c_bytes: int
    accumulators: tuple     # allowed accumulate types, the first the default
    mma_struct: dict        # accumulator -> C++ struct of the mma.sync kernel (kernels/include)
    sm90_struct: str | None  # C++ struct of the Hopper (wgmma/TMA) kernel; None: not run there
    tma_ab: int             # TMA element type of A and B (as the Hopper kernel reads them)
    tma_c: int              # ... and of C
    base_kind: str          # the kind whose mainloop it runs (calibration, peaks)
    sm90_prep: bool = False  # fp32 operands: a prep kernel writes them K-major for the Hopper kernel
    #: IEEE float32 FMAs on the CUDA cores (the mma.sync kernel's tiling and epilogue around a
    #: scalar mainloop): peaks are the FP32 FMA rate, not a tensor-core rate
    simt: bool = False
    #: NumPy name of B where it differs from A's (the float8 kinds take either type per operand)
    b_dtype: str | None = None


@dataclass(frozen=True)
class Route:
    """One (BLAS prefix, compute mode): how cuBLAS and our kernels run it."""

    prefix: str
    compute: str
    cuda_ab: int            # cuBLAS data type of A and B
    cuda_c: int             # ... of C
    cublas_compute: int | None   # cublasComputeType_t; None: cuBLAS has no such mode
    kernel_kind: str | None      # our kernels' kind; None: ours do not run it
    accumulator: str | None
    rtol: float             # tests: |result - float64 reference| <= rtol * the reference's scale
    scale_dtype: str | None = None   # cuBLAS's alpha/beta type when not the routine's own
    #: a composition of other routes' GEMMs (pyblasgemm.composite) that runs it on our
    #: tensor-core kernels: 'ozaki' (float64 from exact int8 products), 'complex' (complex
    #: products as one real product of the stacked parts); None: one GEMM
    composite: str | None = None
    inner: tuple | None = None      # the (prefix, compute) of the composition's real GEMMs
    #: the compute mode of the same type that an emulated route falls back to and that cuBLAS
    #: runs it as (the Ozaki modes: the type's IEEE mode); None: the mode itself
    native: str | None = None


def _kind(name, ab, c, eb, cb, accs, structs, sm90, tma_ab, tma_c, base=None, prep=False, simt=False,
          b=None):
    return KernelKind(name, ab, c, eb, cb, accs, structs, sm90, _TMA[tma_ab], _TMA[tma_c],
                      base or name, prep, simt, b)


KERNEL_KINDS = {k.name: k for k in (
    _kind("f16", "float16", "float16", 2, 2, ("f32", "f16"),
          {"f32": "KindF16F32", "f16": "KindF16F16"}, "Sm90KindF16", "FLOAT16", "FLOAT16"),
    _kind("bf16", "bfloat16", "bfloat16", 2, 2, ("f32",), {"f32": "KindBF16F32"},
          "Sm90KindBF16", "BFLOAT16", "BFLOAT16"),
    _kind("s8", "int8", "int32", 1, 4, ("s32",), {"s32": "KindS8S32"}, "Sm90KindS8",
          "UINT8", "INT32"),
    _kind("tf32", "float32", "float32", 4, 4, ("f32",), {"f32": "KindTF32"}, "Sm90KindTF32",
          "FLOAT32", "FLOAT32", prep=True),
    _kind("3xtf32", "float32", "float32", 4, 4, ("f32",), {"f32": "Kind3xTF32"},
          "Sm90Kind3xTF32", "FLOAT32", "FLOAT32", prep=True),
    # 16-bit operands, fp32 accumulation, fp32 C (shgemm / sbgemm): the 16-bit mainloop
    _kind("f16_out32", "float16", "float32", 2, 4, ("f32",), {"f32": "KindF16F32Out32"},
          "Sm90KindF16Out32", "FLOAT16", "FLOAT32", base="f16"),
    _kind("bf16_out32", "bfloat16", "float32", 2, 4, ("f32",), {"f32": "KindBF16F32Out32"},
          "Sm90KindBF16Out32", "BFLOAT16", "FLOAT32", base="bf16"),
    # float32 with IEEE FMAs (SGEMM's arithmetic) on the mma.sync kernel's tiles: what a small
    # float32 product runs on to skip cuBLASLt's ~10 µs of host work a call (H200,
    # bench/results/launch_bindings_h200_2026-11-27_bf0adaa.json) against ~4.5 µs a launch
    _kind("f32", "float32", "float32", 4, 4, ("f32",), {"f32": "KindF32Simt"}, None, "FLOAT32",
          "FLOAT32", simt=True),
    # float8 operands (either type each), float accumulators, a float32 C: the staging tile,
    # which the fused store scales (per tensor or per row / column, read on the device) and
    # writes as float32 / float16 / bfloat16 (pyblasgemm.fp8). mma.sync m16n8k32 with e4m3 /
    # e5m2 operands needs sm_89+; the Hopper kernel runs them K-major (wgmma m64nNk32, every
    # 128-k stage promoted into the accumulator). FP8_KINDS below: the kinds no BLAS route names
    _kind("e4m3", "float8_e4m3fn", "float32", 1, 4, ("f32",), {"f32": "KindE4M3F32"}, "Sm90KindE4M3", "UINT8",
          "FLOAT32"),
    _kind("e4m3_e5m2", "float8_e4m3fn", "float32", 1, 4, ("f32",), {"f32": "KindE4M3E5M2F32"}, "Sm90KindE4M3E5M2",
          "UINT8", "FLOAT32", b="float8_e5m2"),
    _kind("e5m2_e4m3", "float8_e5m2", "float32", 1, 4, ("f32",), {"f32": "KindE5M2E4M3F32"}, "Sm90KindE5M2E4M3",
          "UINT8", "FLOAT32", b="float8_e4m3fn"),
    _kind("e5m2", "float8_e5m2", "float32", 1, 4, ("f32",), {"f32": "KindE5M2F32"}, "Sm90KindE5M2", "UINT8",
          "FLOAT32"),
)}

#: (A's dtype name, B's dtype name) -> the float8 kind that multiplies them (pyblasgemm.fp8)
FP8_KINDS = {(k.ab_dtype, k.b_dtype or k.ab_dtype): k.name for k in KERNEL_KINDS.values()
             if k.ab_dtype.startswith("float8")}


def _route(prefix, compute, ab, c, cublas, kind=None, acc=None, rtol=1e-5, scale=None, composite=None,
           inner=None, native=None):
    return Route(prefix, compute, CUDA[ab], CUDA[c],
                 None if cublas is None else CUBLAS_COMPUTE[cublas], kind, acc, rtol, scale, composite,
                 inner, native)


#: the emulated float64 / float32 compute mode; ``OZAKI + "-<bits>"`` (e.g. 'int8-ozaki-40')
#: sets its precision dial: bits kept per scaled row / column (pyblasgemm.ozaki); a last word
#: :data:`OZAKI_FAST` ('int8-ozaki-fast', 'int8-ozaki-40-fast') picks the 'fast' scaling
#: (pyblasgemm.ozaki.SCALINGS: each line scaled by its 2-norm, at least those bits)
OZAKI = "int8-ozaki"
#: the dial's scaling word: a row of pyblasgemm.ozaki.SCALINGS other than the default 'max'
OZAKI_FAST = "fast"


#: rtol: relative error bound against the reference's scale (tests/_ref.py). 16-bit outputs: one
#: final rounding (2^-11 fp16, 2^-8 bf16) plus fp32 accumulation; fp16 accumulation: k roundings
#: at 2^-11 in the worst case, ~sqrt(k) typically; tf32: operands rounded to 10 mantissa bits
#: (2^-11 each); 16-bit operands with a float32 C: exact products, float32 sums; int8: exact.
ROUTES = {(r.prefix, r.compute): r for r in (
    _route("s", "fp32", "R_32F", "R_32F", "32F", "f32", "f32", rtol=2e-5),
    _route("s", "tf32", "R_32F", "R_32F", "32F_FAST_TF32", "tf32", "f32", rtol=3e-3),
    # 3xTF32 asks for float32 accuracy at tensor-core speed; cuBLAS's plain SGEMM is that
    # accuracy (or better), so the planner weighs it as 3xTF32's cuBLAS route
    _route("s", "3xtf32", "R_32F", "R_32F", "32F", "3xtf32", "f32", rtol=2e-5),
    # float32 from exact int8 products (the Ozaki scheme II, float32's setting, rounded once):
    # at its default never less accurate than SGEMM, which is its cuBLAS route and fallback
    _route("s", OZAKI, "R_32F", "R_32F", "32F", rtol=2e-5, composite="ozaki", inner=("i", "int32"),
           native="fp32"),
    _route("d", "fp64", "R_64F", "R_64F", "64F", rtol=1e-12),
    # float64 from exact int8 products (the Ozaki scheme II); cuBLAS's route is native DGEMM
    _route("d", OZAKI, "R_64F", "R_64F", "64F", rtol=1e-12, composite="ozaki", inner=("i", "int32"),
           native="fp64"),
    _route("h", "fp32", "R_16F", "R_16F", "32F", "f16", "f32", rtol=2e-3),
    # cuBLAS's 16F compute takes half-precision alpha and beta
    _route("h", "fp16", "R_16F", "R_16F", "16F", "f16", "f16", rtol=2e-2, scale="float16"),
    _route("b", "fp32", "R_16BF", "R_16BF", "32F", "bf16", "f32", rtol=1.6e-2),
    _route("sh", "fp32", "R_16F", "R_32F", "32F", "f16_out32", "f32", rtol=2e-5),
    _route("sb", "fp32", "R_16BF", "R_32F", "32F", "bf16_out32", "f32", rtol=2e-5),
    _route("i", "int32", "R_8I", "R_32I", "32I", "s8", "s32", rtol=0.0),
    _route("c", "fp32", "C_32F", "C_32F", "32F", rtol=2e-5),
    # complex on our tf32 / 3xTF32 kernels: one real product of the stacked parts; cuBLAS's
    # routes are its tf32 CGEMM and (as for float32 3xTF32) its plain CGEMM
    _route("c", "tf32", "C_32F", "C_32F", "32F_FAST_TF32", rtol=3e-3, composite="complex",
           inner=("s", "tf32")),
    _route("c", "3xtf32", "C_32F", "C_32F", "32F", rtol=2e-5, composite="complex", inner=("s", "3xtf32")),
    _route("c", OZAKI, "C_32F", "C_32F", "32F", rtol=2e-5, composite="ozaki", inner=("i", "int32"),
           native="fp32"),
    _route("z", "fp64", "C_64F", "C_64F", "64F", rtol=1e-12),
    _route("z", OZAKI, "C_64F", "C_64F", "64F", rtol=1e-12, composite="ozaki", inner=("i", "int32"),
           native="fp64"),
)}


def base_compute(compute: str) -> str:
    """The compute mode without its precision dial: 'int8-ozaki-40' -> 'int8-ozaki' (and
    'int8-ozaki-fast', 'int8-ozaki-40-fast').

    >>> base_compute("int8-ozaki-40"), base_compute("int8-ozaki-40-fast"), base_compute("tf32")
    ('int8-ozaki', 'int8-ozaki', 'tf32')
    """
    return OZAKI if compute.startswith(OZAKI + "-") else compute


def ozaki_bits(compute: str) -> int | None:
    """The dial of an 'int8-ozaki-<bits>' mode (also 'int8-ozaki-<bits>-fast'); None for plain
    'int8-ozaki' (the default), 'int8-ozaki-fast' and every other mode.

    >>> ozaki_bits("int8-ozaki-40"), ozaki_bits("int8-ozaki"), ozaki_bits("int8-ozaki-40-fast")
    (40, None, 40)
    """
    if not compute.startswith(OZAKI + "-"):
        return None
    word = compute[len(OZAKI) + 1:].split("-")[0]
    return None if word == OZAKI_FAST else int(word)


def ozaki_scaling(compute: str) -> str:
    """The scaling of an Ozaki mode (pyblasgemm.ozaki.SCALINGS): 'fast' where the mode ends in
    '-fast', else 'max' (the default; every other mode too).

    >>> ozaki_scaling("int8-ozaki-fast"), ozaki_scaling("int8-ozaki-40-fast"), ozaki_scaling("int8-ozaki-40")
    ('fast', 'fast', 'max')
    """
    fast = compute.startswith(OZAKI + "-") and compute.endswith("-" + OZAKI_FAST)
    return OZAKI_FAST if fast else "max"


def route_of(prefix: str, compute: str) -> Route:
    """The route row of a (prefix, compute) pair, the dial dropped.

    >>> route_of("d", "int8-ozaki-40").composite
    'ozaki'
    """
    return ROUTES[(prefix, base_compute(compute))]
