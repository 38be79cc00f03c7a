"""The float8 route's planning as it stood before it moved into the planner (pyblasgemm/kernels/fp8.py
at 2ff281c: ``plan``, ``lt_refusal``, ``choose_route``, ``sm90_config``, verbatim but for the imports
and the Fp8Plan doctest): tests/test_fp8_desc_plan.py checks that the planner's float8 route
(pyblasgemm/planner/fp8.py, through kernels.fp8.plan) makes the same choices for every input.
:data:`FAMILY` and :data:`ROUTE` are set by the test, as the tests set kernels.fp8's."""
from __future__ import annotations

from typing import NamedTuple

from pyblasgemm.backends import cublaslt as lt
from pyblasgemm.epilogue import ACTIVATIONS
from pyblasgemm.kinds import FP8_KINDS

MIN_CC = (8, 9)


class Fp8Plan(NamedTuple):
    """How one float8 product is launched (:func:`plan`): the kernel's column-major problem."""

    swap: bool          # c^T = b^T a^T (a row-major result): kernel A is b, its rows c's columns
    kind: str
    transa: str
    transb: str
    m: int              # the kernel's m, n, k and leading dimensions (elements)
    n: int
    k: int
    lda: int
    ldb: int
    ldc: int
    config: object      # the KernelConfig (fp8_config's rule)
    epi: int            # the EPI template argument
    bias_axis: str | None   # the kernel's 'm' / 'n' axis of the bias
    route: str = "ours"     # 'cublaslt' or 'ours' (choose_route's rule)
    why: str = ""           # the rule's reason, in words

    def explain(self) -> str:
        """Which route the plan takes and why, in one line.

        """
        return f"{self.route}: {self.why}"


FAMILY = None


ROUTE = None
#: ``backend=`` words -> the route they force
_FORCED = {"cublas": "cublaslt", "tensorcore": "ours"}
#: products with at most this many rows or columns (decode) stay on our kernels
DECODE_ROWS = 64
#: why the rule picks cuBLASLt (the same files)
_LT_FASTER = ("cuBLASLt takes this case and ran 1.20-1.35x our kernels at 4096³ / 8192³ on an H200 "
              "(per-tensor and row-wise scales)")
_LT_BLOCKS_FASTER = ("block scales: cuBLASLt's block-scaled FP8 GEMM ran 2.15-2.44x ours at 4096³ / 8192³ on an "
                     "H200; their relayout runs into buffers the launch owns (LtBlockScaled: capturable)")
_OURS_FOR_DECODE = (f"at most {DECODE_ROWS} rows or columns (decode): our kernels ran 0.71-1.12x the cuBLASLt "
                    f"route's time there on an H200 (1.02-1.6x its speed on an H100)")
#: activation code -> cuBLASLt's name for it (LT_EPILOGUES' keys)
_ACTIVATION_NAMES = {a.code: a.name for a in ACTIVATIONS.values()}
_SCALE_PAIRS = {("tensor", "tensor"): ("SCALAR_32F", "SCALAR_32F"),
                ("rows", "cols"): ("OUTER_VEC_32F", "OUTER_VEC_32F"),
                ("blocks", "blocks"): ("VEC128_32F", "BLK128x128_32F")}


def lt_refusal(a_dtype: str, b_dtype: str, la: tuple, lb: tuple, target: str, k: int, ldc: int, out_name: str,
               layouts: tuple, activation_code: int, bias_axis, has_pre: bool, aligned: bool, cc: tuple,
               lt_version) -> str | None:
    """Why cuBLASLt's FP8 GEMM cannot run this product (None: it can), from its documented
    rules (the module docstring; :func:`plan`'s arguments). Pure: no device.

    >>> lt_refusal("float8_e4m3fn", "float8_e4m3fn", ("row", 64), ("row", 32), "row", 64, 32, "float32",
    ...            ("tensor", "tensor"), 0, None, False, True, (9, 0), 130100)
    "cuBLASLt's FP8 GEMM takes only the TN form (a row-major, b column-major: both K-contiguous); b is row-major"
    """
    if lt_version is None:
        return "cuBLASLt could not be loaded (pyblasgemm.backends.cublaslt.status() says why)"
    if tuple(cc) < MIN_CC:
        return f"cuBLASLt's FP8 GEMM needs sm_89+, this device is sm_{cc[0]}{cc[1]}"
    if a_dtype == b_dtype == "float8_e5m2":
        return "cuBLASLt has no e5m2 x e5m2 FP8 GEMM"
    if la[0] != "row" or lb[0] != "col":
        bad = [f"{name} is {'row' if x[0] == 'row' else 'column'}-major"
               for name, x, good in (("a", la, "row"), ("b", lb, "col")) if x[0] != good]
        return ("cuBLASLt's FP8 GEMM takes only the TN form (a row-major, b column-major: both "
                f"K-contiguous); {' and '.join(bad)}")
    osz = 4 if out_name == "float32" else 2
    if k % 16 or la[1] % 16 or lb[1] % 16 or (ldc * osz) % 16:
        return (f"cuBLASLt's FP8 GEMM needs K and the leading dimensions in multiples of 16 bytes; "
                f"k={k}, lda={la[1]}, ldb={lb[1]}, ldc={ldc} ({osz}-byte elements)")
    if not aligned:
        return "cuBLASLt's FP8 GEMM needs 16-byte aligned pointers (an operand, the result or the bias is not)"
    modes = _SCALE_PAIRS.get(tuple(layouts))
    if modes is None:
        return (f"cuBLASLt takes scale pairs of one kind (tensor/tensor, rows/cols, blocks/blocks); "
                f"got {layouts[0]}/{layouts[1]}")
    if modes[0] != "SCALAR_32F":
        if tuple(cc) != (9, 0) or lt_version < lt.FP8_SCALE_MODES_VERSION:
            return (f"cuBLASLt's {'row/column' if layouts[0] == 'rows' else '128-block'} FP8 scales need "
                    f"sm_90 and cuBLAS 12.9+; this is sm_{cc[0]}{cc[1]}, cuBLAS {lt_version}")
        if layouts[0] == "blocks" and target != "row":
            return "cuBLASLt's block scales are wired for a row-major (C-ordered) result only"
    if has_pre:
        return "cuBLASLt's FP8 epilogues do not write preactivation_out here"
    activation = _ACTIVATION_NAMES.get(activation_code)
    if (activation, bias_axis is not None, False) not in lt.LT_EPILOGUES and (activation, bias_axis) != (None, None):
        return f"cuBLASLt's epilogues have no {activation} (only relu and gelu_tanh, with or without bias)"
    if bias_axis is not None:
        if out_name == "float32":
            return "cuBLASLt's FP8 bias epilogue takes no float32 result (its bias would be bfloat16)"
        if bias_axis != ("cols" if target == "row" else "rows"):
            return (f"cuBLASLt's bias runs along the result's {'columns' if target == 'row' else 'rows'} "
                    f"for this result order; bias_axis is {bias_axis!r}")
    return None


def choose_route(refusal: str | None, layouts: tuple, backend=None, rows: int | None = None) -> tuple:
    """``(route, why)``: 'cublaslt' where cuBLASLt takes the case (``refusal`` None: see
    :func:`lt_refusal`) and is measured faster (``rows``, the product's smaller side m or n,
    above :data:`DECODE_ROWS`; None: not known, taken as large), 'ours' elsewhere; ``backend`` 'cublas' /
    'tensorcore' (or :data:`ROUTE`) forces one, and a forced cuBLASLt it refuses is a
    ValueError naming why. Pure.

    >>> choose_route(None, ("rows", "cols"))[0], choose_route(None, ("blocks", "blocks"))[0]
    ('cublaslt', 'cublaslt')
    >>> choose_route(None, ("rows", "cols"), rows=16)[0]            # decode: our kernels
    'ours'
    >>> choose_route("cuBLASLt has no e5m2 x e5m2 FP8 GEMM", ("tensor", "tensor"), "cublas")
    Traceback (most recent call last):
        ...
    ValueError: backend='cublas' cannot run this float8 product: cuBLASLt has no e5m2 x e5m2 FP8 GEMM; backend='tensorcore' (or None) runs it on our kernels
    """
    forced = _FORCED.get(backend) or ROUTE
    if forced not in (None, "cublaslt", "ours"):
        raise ValueError(f"pyblasgemm.kernels.fp8.ROUTE={ROUTE!r} must be None, 'cublaslt' or 'ours'")
    said = f"backend={backend!r}" if backend in _FORCED else f"pyblasgemm.kernels.fp8.ROUTE={ROUTE!r}"
    if forced == "ours":
        return "ours", f"forced by {said}"
    if forced == "cublaslt":
        if refusal is not None:
            raise ValueError(f"{said} cannot run this float8 product: {refusal}; backend='tensorcore' (or None) "
                             f"runs it on our kernels")
        return "cublaslt", f"forced by {said}"
    if refusal is not None:
        return "ours", refusal
    if rows is not None and rows <= DECODE_ROWS:
        return "ours", _OURS_FOR_DECODE
    if "blocks" in layouts:
        return "cublaslt", _LT_BLOCKS_FASTER
    return "cublaslt", _LT_FASTER


def sm90_config(kind: str, m: int, n: int, k: int, sm_count: int):
    """The Hopper kernel's config for a float8 product of the kernel's m x n x k: 128 x 128
    tiles (64 x 64 when n <= 64: decode, or m*n <= 128*128), parallel split-k (the launcher's
    split count) when there are fewer tiles than SMs and at least 8 stages of 128 k.

    >>> sm90_config("e4m3", 4096, 16, 4096, 132).name
    'sm90a_splitk_parallel_64x64x128_w1x1_s8_g8'
    """
    from dataclasses import replace

    from pyblasgemm.kernels.config import SM90_CONFIGS_BY_TILE, SM90_SMALL_CONFIGS

    small = n <= 64 or m * n <= 128 * 128
    cfg = SM90_SMALL_CONFIGS[kind][64] if small else SM90_CONFIGS_BY_TILE[kind][128]
    tiles = -(-m // cfg.bm) * -(-n // cfg.bn)
    if tiles < sm_count and -(-k // 128) >= 8:
        cfg = replace(cfg, decomposition="splitk_parallel", splits=0)
    return cfg


def plan(m: int, n: int, k: int, a_dtype: str, b_dtype: str, la: tuple, lb: tuple, target: str, ldc: int,
         layouts: tuple, out_name: str, activation_code: int, bias_axis, sm_count: int,
         cc: tuple = (8, 9), lt_version=None, backend=None, aligned: bool = True, has_pre: bool = False) -> Fp8Plan:
    """The launch of ``(scale_a ⊙ a) @ (scale_b ⊙ b)`` for a (m x k) and b (k x n) of layouts
    ``la`` / ``lb`` (:func:`_layout`'s ``('row' | 'col', ld)``) into a result stored ``target``
    ('row': C-ordered rows ``ldc`` apart, computed as c^T = b^T a^T; 'col': F-ordered):
    pure arithmetic, no device. The kernel's scale_m is then scale_b when ``swap`` (else
    scale_a), its scale_n the other. On sm_90 (``cc``) a product with both operands K-major
    takes the Hopper kernel (:func:`sm90_config`), block scales included (:data:`FAMILY` =
    'sm80' keeps mma.sync); the caller falls back to mma.sync where its TMA rules refuse the
    problem.
    ``route`` / ``why``: :func:`choose_route` on :func:`lt_refusal` (``lt_version``: cuBLASLt's,
    None when it is not loaded; ``aligned``: all pointers 16-byte aligned; ``has_pre``: a
    ``preactivation_out``); our kernel's fields are filled either way (the fallback's).

    >>> p = plan(16, 4096, 4096, "float8_e4m3fn", "float8_e5m2", ("row", 4096), ("col", 4096), "row",
    ...          4096, ("rows", "tensor"), "bfloat16", 0, "cols", 132)
    >>> p.swap, p.kind, p.transa, p.transb, (p.m, p.n, p.k), p.bias_axis, p.config.decomposition
    (True, 'e5m2_e4m3', 'T', 'N', (4096, 16, 4096), 'm', 'splitk_serial')
    """
    from pyblasgemm.kernels.config import fp8_config
    from pyblasgemm.kernels.jit import BLOCK_MODE, epilogue_code

    swap = target == "row"
    if swap:        # c^T (n x m, column-major) = b^T a^T
        kind = FP8_KINDS[(b_dtype, a_dtype)]
        km, kn = n, m
        ta, lda = ("T", lb[1]) if lb[0] == "col" else ("N", lb[1])
        tb, ldb = ("N", la[1]) if la[0] == "row" else ("T", la[1])
        first, second = layouts[1], layouts[0]          # the scales of the kernel's m, n sides
        axis = {"cols": "m", "rows": "n", None: None}[bias_axis]
    else:           # c (m x n, column-major) = a b
        kind = FP8_KINDS[(a_dtype, b_dtype)]
        km, kn = m, n
        ta, lda = ("T", la[1]) if la[0] == "row" else ("N", la[1])
        tb, ldb = ("N", lb[1]) if lb[0] == "col" else ("T", lb[1])
        first, second = layouts[0], layouts[1]
        axis = {"cols": "n", "rows": "m", None: None}[bias_axis]
    # the kernel needs ld >= its stored rows even where one row is all there is
    lda = max(lda, k if ta == "T" else km)
    ldb = max(ldb, kn if tb == "T" else k)
    blocked = "blocks" in layouts
    config = fp8_config(km, kn, k, sm_count, blocked)
    if FAMILY not in (None, "sm80"):
        raise ValueError(f"pyblasgemm.kernels.fp8.FAMILY={FAMILY!r} must be None or 'sm80'")
    if tuple(cc) == (9, 0) and (ta, tb) == ("T", "N") and FAMILY is None:
        config = sm90_config(kind, km, kn, k, sm_count)
    if blocked:     # each side's layout; the mainloop promotes every 128-wide K block
        mode_a = BLOCK_MODE[{"tensor": "tensor", "rows": "vector", "blocks": "a_blocks"}[layouts[0]]]
        mode_b = BLOCK_MODE[{"tensor": "tensor", "cols": "vector", "blocks": "b_blocks"}[layouts[1]]]
        modes = (mode_b, mode_a) if swap else (mode_a, mode_b)
        epi = epilogue_code(activation_code, out_name, block_m=modes[0], block_n=modes[1])
    else:
        epi = epilogue_code(activation_code, out_name, first == "tensor", second == "tensor")
    refusal = lt_refusal(a_dtype, b_dtype, la, lb, target, k, ldc, out_name, layouts, activation_code, bias_axis,
                         has_pre, aligned, cc, lt_version)
    route, why = choose_route(refusal, layouts, backend, min(m, n))
    return Fp8Plan(swap, kind, ta, tb, km, kn, k, lda, ldb, ldc, config, epi, axis, route, why)
