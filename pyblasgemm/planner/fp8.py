"""The planner's float8 route: which library runs a float8 product (cuBLASLt's FP8 GEMM or our
kernels) and which of our configs, as pure functions of its description
(:func:`pyblasgemm.desc.describe_fp8`) and the machine (an :class:`~pyblasgemm.planner.arch.ArchSpec`
and cuBLASLt's version, None where it cannot be loaded). :func:`plan_fp8` makes the
:class:`~pyblasgemm.planner.plan.Plan` (:func:`pyblasgemm.planner.plan_for` sends a float8
description here and memoizes it; :func:`pyblasgemm.execute.execute_fp8` runs it). :func:`plan`
is the same in the call's terms, read as the kernel's column-major problem (:class:`Fp8Plan`: the
tests' and benches' view, and :func:`warm_specs`').

The rules and the measurements behind them are :mod:`pyblasgemm.kernels.fp8`'s module docstring
(routes, block scales); the settings the tests and benches turn, ``kernels.fp8.FAMILY`` and
``kernels.fp8.ROUTE``, are passed in (``family``, ``route``) or read here by :func:`plan`.

>>> from pyblasgemm.desc import describe_fp8
>>> from pyblasgemm.planner.arch import FAMILIES
>>> d = describe_fp8("doc", "float8_e4m3fn", "float8_e4m3fn", ("row", 4096), ("col", 4096), "row", 256, 4096,
...                  4096, 4096, ("tensor", "tensor"), "bfloat16", None, None, False, "cupy", 0, (256,), 1.0, 0.0)
>>> p = plan_fp8(d, FAMILIES["sm_90"], 130100)
>>> p.backend, p.reason[:56]
('cublas', 'cublaslt: cuBLASLt takes this case and ran 1.20-1.35x ou')
>>> plan_fp8(d, FAMILIES["sm_90"], None).config.name      # cuBLASLt not loaded: our Hopper kernel
'sm90a_splitk_parallel_128x128x128_w2x1_s4_g8'
"""
from __future__ import annotations

from dataclasses import replace

from typing import NamedTuple

from ..backends import cublaslt as lt
from ..desc import FP8_BIAS_SIDES, FP8_SCALE_MODES, describe_fp8
from ..epilogue import ACTIVATIONS
from ..kernels import fp8 as settings       # FAMILY, ROUTE: the float8 route's settings
from ..kernels.fp8 import MIN_CC, kernel_lds, kernel_problem, launch_config
from .arch import FAMILIES, ArchSpec, family_of
from .plan import Candidate, Plan, Route

__all__ = ["MIN_CC", "DECODE_ROWS", "lt_refusal", "choose_route", "sm90_config", "config_for", "epilogue_code_of",
           "call_terms", "route_for", "plan_fp8", "our_config", "without_lt", "machine", "Fp8Plan", "kernel_plan",
           "plan", "warm_specs"]
#: products with at most this many rows or columns (decode) stay on our kernels: there they ran
#: 1.02-1.6x the cuBLASLt route on an H100 (M = 1-64 on Llama-3-8B's projections, per-tensor and
#: row-wise scales, replayed calls; bench/results/fp8_h100_2026-11-28_743700e.json) and on an
#: H200 0.71-1.12x its time (geomean 0.96 per-tensor, 0.91 row-wise; block scales 0.66-1.67x;
#: fp8_h200_2026-11-29_e1f052c.json), where at 4096³ / 8192³ cuBLASLt ran 1.20-1.35x ours
#: (H200; block scales 2.15-2.44x)
DECODE_ROWS = 64
#: the families of our kernels kernels.fp8.FAMILY may name (None: config_for's rule)
FAMILY_SETTINGS = (None, "sm80")
#: ``backend=`` words -> the route they force
_FORCED = {"cublas": "cublaslt", "tensorcore": "ours"}
#: why the rule picks cuBLASLt (the same files)
_LT_FASTER = ("cuBLASLt takes this case and ran 1.20-1.35x our kernels at 4096³ / 8192³ on an H200 "
              "(per-tensor and row-wise scales)")
_LT_BLOCKS_FASTER = ("block scales: cuBLASLt's block-scaled FP8 GEMM ran 2.15-2.44x ours at 4096³ / 8192³ on an "
                     "H200; their relayout runs into buffers the launch owns (LtBlockScaled: capturable)")
_OURS_FOR_DECODE = (f"at most {DECODE_ROWS} rows or columns (decode): our kernels ran 0.71-1.12x the cuBLASLt "
                    f"route's time there on an H200 (1.02-1.6x its speed on an H100)")
#: activation code -> cuBLASLt's name for it (LT_EPILOGUES' keys)
_ACTIVATION_NAMES = {a.code: a.name for a in ACTIVATIONS.values()}
#: the scale pairs cuBLASLt takes (one kind for both operands) -> its scale modes of a and b
_SCALE_PAIRS = {(wa, wb): (lt.FP8_SCALE_MODE[FP8_SCALE_MODES["a"][wa]], lt.FP8_SCALE_MODE[FP8_SCALE_MODES["b"][wb]])
                for wa, wb in (("tensor", "tensor"), ("rows", "cols"), ("blocks", "blocks"))}
#: a side's mode in the description -> the call's word for a's / b's scale (desc.FP8_SCALE_MODES read back)
_CALL_WORDS = tuple({mode: word for word, mode in FP8_SCALE_MODES[side].items()} for side in "ab")
#: result order -> the described C's bias side -> the call's bias axis (desc.FP8_BIAS_SIDES read back)
_CALL_BIAS = {order: {side: axis for axis, side in sides.items()} for order, sides in FP8_BIAS_SIDES.items()}


def lt_refusal(a_dtype: str, b_dtype: str, la: tuple, lb: tuple, target: str, k: int, ldc: int, out_name: str,
               layouts: tuple, activation_code: int, bias_axis, has_pre: bool, aligned: bool, cc: tuple,
               lt_version) -> str | None:
    """Why cuBLASLt's FP8 GEMM cannot run this product (None: it can), from its documented
    rules (:mod:`pyblasgemm.kernels.fp8`'s docstring), in the call's terms (:func:`call_terms`).
    Pure: no device.

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


def choose_route(refusal: str | None, layouts: tuple, backend=None, rows: int | None = None,
                 route: str | None = None) -> tuple:
    """``(route, why)``: 'cublaslt' where cuBLASLt takes the case (``refusal`` None: see
    :func:`lt_refusal`) and is measured faster (``rows``, the product's smaller side m or n,
    above :data:`DECODE_ROWS`; None: not known, taken as large), 'ours' elsewhere; ``backend``
    'cublas' / 'tensorcore' (or ``route``, the value of ``kernels.fp8.ROUTE``) forces one, and
    a forced cuBLASLt it refuses is a ValueError naming why. Pure.

    >>> choose_route(None, ("rows", "cols"))[0], choose_route(None, ("blocks", "blocks"))[0]
    ('cublaslt', 'cublaslt')
    >>> choose_route(None, ("rows", "cols"), rows=16)[0]            # decode: our kernels
    'ours'
    >>> choose_route(None, ("tensor", "tensor"), route="ours")
    ('ours', "forced by pyblasgemm.kernels.fp8.ROUTE='ours'")
    >>> choose_route("cuBLASLt has no e5m2 x e5m2 FP8 GEMM", ("tensor", "tensor"), "cublas")
    Traceback (most recent call last):
        ...
    ValueError: backend='cublas' cannot run this float8 product: cuBLASLt has no e5m2 x e5m2 FP8 GEMM; \
backend='tensorcore' (or None) runs it on our kernels
    """
    forced = _FORCED.get(backend) or route
    if forced not in (None, "cublaslt", "ours"):
        raise ValueError(f"pyblasgemm.kernels.fp8.ROUTE={route!r} must be None, 'cublaslt' or 'ours'")
    said = f"backend={backend!r}" if backend in _FORCED else f"pyblasgemm.kernels.fp8.ROUTE={route!r}"
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
    from ..kernels.config import SM90_CONFIGS_BY_TILE, SM90_SMALL_CONFIGS

    small = n <= 64 or m * n <= 128 * 128
    cfg = SM90_SMALL_CONFIGS[kind][64] if small else SM90_CONFIGS_BY_TILE[kind][128]
    tiles = -(-m // cfg.bm) * -(-n // cfg.bn)
    if tiles < sm_count and -(-k // 128) >= 8:
        cfg = replace(cfg, decomposition="splitk_parallel", splits=0)
    return cfg


def config_for(desc, arch: ArchSpec, family: str | None = None):
    """Our kernel's config for a float8 description: mma.sync's tile (``kernels.config.fp8_config``,
    its block tile for block scales), or on sm_90 the Hopper kernel's (:func:`sm90_config`) for
    K-major operands (transa 'T', transb 'N': TMA reads K-contiguous rows), block scales
    included; ``family`` (``kernels.fp8.FAMILY``) 'sm80' keeps mma.sync. The launch falls back to
    mma.sync where the Hopper kernel's TMA rules refuse its class (``kernels.fp8.launch_config``).

    >>> from pyblasgemm.desc import describe_fp8
    >>> d = describe_fp8("doc", "float8_e4m3fn", "float8_e4m3fn", ("row", 4096), ("col", 4096), "row", 16, 4096,
    ...                  4096, 4096, ("blocks", "blocks"), "bfloat16", None, None, False, "cupy", 0, (256,), 1.0, 0.0)
    >>> config_for(d, FAMILIES["sm_90"]).family, config_for(d, FAMILIES["sm_90"], "sm80").family
    ('sm90a', 'sm80')
    """
    from ..kernels.config import fp8_config

    if family not in FAMILY_SETTINGS:
        raise ValueError(f"pyblasgemm.kernels.fp8.FAMILY={family!r} must be None or 'sm80'")
    config = fp8_config(desc.m, desc.n, desc.k, arch.sm_count, bool(desc.block_scales))
    if tuple(arch.cc) == (9, 0) and (desc.transa, desc.transb) == ("T", "N") and family is None:
        config = sm90_config(desc.prefix, desc.m, desc.n, desc.k, arch.sm_count)
    return config


def epilogue_code_of(desc) -> int:
    """The kernels' EPI template argument of a float8 description (``kernels.jit.epilogue_code``):
    the activation, the output type and either the store's scales (a per-tensor side's bit) or
    each side's block-scale mode (the mainloop's).

    >>> from pyblasgemm.desc import describe_fp8
    >>> d = describe_fp8("doc", "float8_e4m3fn", "float8_e4m3fn", ("row", 64), ("col", 64), "row", 16, 48, 64,
    ...                  48, ("tensor", "cols"), "float32", None, None, False, "cupy", 0, (256,), 1.0, 0.0)
    >>> from pyblasgemm.kernels.jit import epilogue_code
    >>> epilogue_code_of(d) == epilogue_code(0, "float32", False, True)
    True
    """
    from ..kernels.jit import BLOCK_MODE, epilogue_code

    epi = desc.epilogue
    if desc.block_scales:
        return epilogue_code(epi.code, epi.dequantize, block_m=BLOCK_MODE[desc.block_scales[0]],
                             block_n=BLOCK_MODE[desc.block_scales[1]])
    return epilogue_code(epi.code, epi.dequantize, epi.scales[0] == "tensor", epi.scales[1] == "tensor")


def call_terms(desc) -> dict:
    """A float8 description in the call's own terms (``swap`` undone: a and b, their layouts
    ``('row' | 'col', ld)``, the result order, :func:`pyblasgemm.fp8.check_scales`' scale
    layouts, the bias axis 'cols' / 'rows'), as :func:`lt_refusal` reads them and its messages
    name them. ``aligned``: the operand, result and bias pointers all 16-byte aligned.

    >>> from pyblasgemm.desc import describe_fp8
    >>> d = describe_fp8("doc", "float8_e4m3fn", "float8_e5m2", ("row", 64), ("col", 64), "row", 16, 48, 64,
    ...                  48, ("rows", "tensor"), "float32", None, "cols", False, "cupy", 0, (256,), 1.0, 0.0)
    >>> t = call_terms(d); t["a_dtype"], t["la"], t["lb"], t["target"], t["layouts"], t["bias_axis"]
    ('float8_e4m3fn', ('row', 64), ('col', 64), 'row', ('rows', 'tensor'), 'cols')
    """
    row, epi = desc.row, desc.epilogue
    a_t, b_n = desc.transa == "T", desc.transb == "N"      # the described A, B K-major
    sides = desc.block_scales or epi.scales                   # (the described m side's, the n side's)
    if desc.swap:   # c^T = b^T a^T: A is the call's b (column-major when K-major), B is a (row-major when K-major)
        la, lb = ("row" if b_n else "col", desc.ldb), ("col" if a_t else "row", desc.lda)
        a_dtype, b_dtype, (mode_a, mode_b), m, n = row.b_dtype.name, row.ab_dtype.name, sides[::-1], desc.n, desc.m
    else:
        la, lb = ("row" if a_t else "col", desc.lda), ("col" if b_n else "row", desc.ldb)
        a_dtype, b_dtype, (mode_a, mode_b), m, n = row.ab_dtype.name, row.b_dtype.name, sides, desc.m, desc.n
    target = "row" if desc.swap else "col"
    return dict(a_dtype=a_dtype, b_dtype=b_dtype, la=la, lb=lb, target=target, m=m, n=n,
                k=desc.k, ldc=desc.ldc, out_name=epi.dequantize,
                layouts=(_CALL_WORDS[0][mode_a], _CALL_WORDS[1][mode_b]), activation_code=epi.code,
                bias_axis=_CALL_BIAS[target][epi.bias], has_pre=epi.preactivation,
                aligned=desc.ptr_align == 16 and epi.bias_align in (0, 16))


def route_for(desc, arch: ArchSpec, lt_version, backend=None, route: str | None = None) -> tuple:
    """``(route, why)`` of a float8 description on this machine: :func:`choose_route` on
    :func:`lt_refusal` (``lt_version``: cuBLASLt's, None where it is not loaded; ``backend``
    'cublas' / 'tensorcore' or ``route``, ``kernels.fp8.ROUTE``, force one).

    >>> from pyblasgemm.desc import describe_fp8
    >>> d = describe_fp8("doc", "float8_e4m3fn", "float8_e4m3fn", ("row", 4096), ("col", 4096), "row", 16, 4096,
    ...                  4096, 4096, ("rows", "cols"), "bfloat16", None, None, False, "cupy", 0, (256,), 1.0, 0.0)
    >>> route_for(d, FAMILIES["sm_90"], 130100)[0]          # 16 rows: decode, our kernels
    'ours'
    """
    t = call_terms(desc)
    refusal = lt_refusal(t["a_dtype"], t["b_dtype"], t["la"], t["lb"], t["target"], t["k"], t["ldc"], t["out_name"],
                         t["layouts"], t["activation_code"], t["bias_axis"], t["has_pre"], t["aligned"], arch.cc,
                         lt_version)
    return choose_route(refusal, t["layouts"], backend, min(t["m"], t["n"]), route)


#: the fallback a cuBLASLt plan keeps (execute.execute_fp8 launches it where cuBLASLt's heuristic
#: finds no algorithm for the case, before any launch)
_FALLBACK = "our kernel's config where cuBLASLt's heuristic finds no algorithm (execute.execute_fp8)"


def plan_fp8(desc, arch: ArchSpec, lt_version, backend=None, family: str | None = None,
             route: str | None = None) -> Plan:
    """The :class:`Plan` of a float8 description on this machine: backend 'cublas' (cuBLASLt's
    FP8 GEMM) or 'tensorcore' (our kernel's ``config``, its EPI code ``plan.epilogue.code``);
    ``reason`` is ``'<route>: <why>'`` (:meth:`Fp8Plan.explain`'s line). Our config
    is chosen either way (a cuBLASLt plan holds it as its one candidate: the fallback).
    ``family`` / ``route``: ``kernels.fp8.FAMILY`` / ``ROUTE``. Pure: no device.

    >>> from pyblasgemm.desc import describe_fp8
    >>> d = describe_fp8("doc", "float8_e5m2", "float8_e5m2", ("row", 4096), ("col", 4096), "row", 4096, 4096,
    ...                  4096, 4096, ("tensor", "tensor"), "bfloat16", None, None, False, "cupy", 0, (256,), 1.0, 0.0)
    >>> p = plan_fp8(d, FAMILIES["sm_89"], 130100)
    >>> p.backend, p.config.name, p.reason
    ('tensorcore', 'sliced_128x128x64_w2x4_s4_g8', 'ours: cuBLASLt has no e5m2 x e5m2 FP8 GEMM')
    """
    config = config_for(desc, arch, family)
    code = epilogue_code_of(desc)
    chosen, why = route_for(desc, arch, lt_version, backend, route)
    source = "forced" if why.startswith("forced by") else "heuristic"
    if chosen == "cublaslt":
        return Plan("cublas", f"{chosen}: {why}", source=source, arch=arch, problem=desc,
                    candidates=(Candidate("tensorcore", config, None, _FALLBACK),))
    return _ours(desc, arch, config, code, why, source)


def _ours(desc, arch: ArchSpec, config, code: int, why: str, source: str) -> Plan:
    """The plan of a float8 description on our kernel ``config`` (EPI ``code``), for ``why``."""
    line = f"float8 on {config.kernel_family.title} ({config.name}); scales, alpha, beta, bias and activation fused"
    return Plan("tensorcore", f"ours: {why}", config, config.decomposition, source=source, arch=arch, problem=desc,
                epilogue=Route("ours", line, why, code=code))


def our_config(plan: Plan):
    """Our kernel's config in a float8 plan: the plan's own, or a cuBLASLt plan's fallback.

    >>> from pyblasgemm.desc import describe_fp8
    >>> d = describe_fp8("doc", "float8_e4m3fn", "float8_e4m3fn", ("row", 4096), ("col", 4096), "row", 4096, 4096,
    ...                  4096, 4096, ("tensor", "tensor"), "bfloat16", None, None, False, "cupy", 0, (256,), 1.0, 0.0)
    >>> our_config(plan_fp8(d, FAMILIES["sm_89"], 130100)).name       # (cuBLASLt's plan: the fallback)
    'sliced_128x128x64_w2x4_s4_g8'
    """
    return plan.config if plan.backend == "tensorcore" else plan.candidates[0].config


def without_lt(plan: Plan, why: str) -> Plan:
    """A cuBLASLt plan's fallback on our kernels, where cuBLASLt cannot bind it (``why``: its
    heuristic found no algorithm for the case), as :func:`plan_fp8` would have planned it.

    >>> from pyblasgemm.desc import describe_fp8
    >>> d = describe_fp8("doc", "float8_e4m3fn", "float8_e4m3fn", ("row", 4096), ("col", 4096), "row", 4096, 4096,
    ...                  4096, 4096, ("tensor", "tensor"), "bfloat16", None, None, False, "cupy", 0, (256,), 1.0, 0.0)
    >>> without_lt(plan_fp8(d, FAMILIES["sm_89"], 130100), "cuBLASLt refused it: no algorithm").reason
    'ours: cuBLASLt refused it: no algorithm'
    """
    desc = plan.problem
    return _ours(desc, plan.arch, our_config(plan), epilogue_code_of(desc), why, plan.source)


class Fp8Plan(NamedTuple):
    """A float8 plan read as the kernel's column-major problem (:func:`kernel_plan`)."""

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
    config: object      # our KernelConfig (a cuBLASLt plan's fallback)
    epi: int            # the EPI template argument
    bias_axis: str | None   # the kernel's 'm' / 'n' axis of the bias
    route: str = "ours"     # 'cublaslt' or 'ours' (choose_route's rule)
    why: str = ""           # the rule's reason, in words

    def explain(self) -> str:
        """Which route the plan takes and why, in one line.

        >>> plan(256, 4096, 4096, "float8_e4m3fn", "float8_e4m3fn", ("row", 4096), ("col", 4096), "row",
        ...      4096, ("tensor", "tensor"), "bfloat16", 0, None, 132, (9, 0), lt_version=130100).explain()
        'cublaslt: cuBLASLt takes this case and ran 1.20-1.35x our kernels at 4096³ / 8192³ on an H200 (per-tensor and row-wise scales)'
        """
        return f"{self.route}: {self.why}"


def kernel_plan(desc, planned: Plan) -> Fp8Plan:
    """The :class:`Fp8Plan` of a float8 description and its plan (:func:`plan_fp8`'s).

    >>> d = describe_fp8("doc", "float8_e4m3fn", "float8_e4m3fn", ("row", 64), ("col", 64), "col", 16, 48, 64,
    ...                  16, ("tensor", "tensor"), "float32", None, None, False, "cupy", 0, (256,), 1.0, 0.0)
    >>> kernel_plan(d, plan_fp8(d, FAMILIES["sm_89"], None))[:10]
    (False, 'e4m3', 'T', 'N', 16, 48, 64, 64, 64, 16)
    """
    route, _, why = planned.reason.partition(": ")
    lda, ldb = kernel_lds(desc)
    return Fp8Plan(desc.swap, desc.prefix, desc.transa, desc.transb, desc.m, desc.n, desc.k, lda, ldb, desc.ldc,
                   our_config(planned), epilogue_code_of(desc), desc.epilogue.bias, route, why)


def _planned(m: int, n: int, k: int, a_dtype: str, b_dtype: str, la: tuple, lb: tuple, target: str, ldc: int,
             layouts: tuple, out_name: str, activation_code: int, bias_axis, sm_count: int, cc: tuple, lt_version,
             backend, aligned: bool, has_pre: bool) -> tuple:
    """``(description, plan)`` of :func:`plan`'s arguments (no arrays: the pointers stand in as
    16-byte aligned or not, the bias' with them; the device unknown, -1)."""
    desc = describe_fp8("fp8", a_dtype, b_dtype, la, lb, target, m, n, k, ldc, layouts, out_name,
                        _activation_name(activation_code), bias_axis, has_pre, "cupy", -1,
                        (16 if aligned else 1,), 1.0, 0.0)
    return desc, plan_fp8(desc, machine(cc, sm_count), lt_version, backend, settings.FAMILY, settings.ROUTE)


def plan(m: int, n: int, k: int, a_dtype: str, b_dtype: str, la: tuple, lb: tuple, target: str, ldc: int,
         layouts: tuple, out_name: str, activation_code: int, bias_axis, sm_count: int,
         cc: tuple = (8, 9), lt_version=None, backend=None, aligned: bool = True, has_pre: bool = False) -> Fp8Plan:
    """The plan of ``(scale_a ⊙ a) @ (scale_b ⊙ b)`` for a (m x k) and b (k x n) of layouts
    ``la`` / ``lb`` (``('row' | 'col', ld)``) into a result stored ``target``
    ('row': C-ordered rows ``ldc`` apart, computed as c^T = b^T a^T; 'col': F-ordered), in the
    call's terms: pure arithmetic, no device. The product's description
    (:func:`pyblasgemm.desc.describe_fp8`) planned by :func:`plan_fp8` under ``kernels.fp8.FAMILY``
    and ``ROUTE``, as the kernel's column-major problem (:func:`kernel_plan`). The kernel's scale_m
    is then scale_b when ``swap`` (else scale_a), its scale_n the other. On sm_90 (``cc``) a
    product with both operands K-major takes the Hopper kernel (:func:`sm90_config`), block scales
    included (FAMILY = 'sm80' keeps mma.sync); the launch falls back to mma.sync where its TMA
    rules refuse the problem (``kernels.fp8.launch_config``).
    ``route`` / ``why``: :func:`choose_route` on :func:`lt_refusal` (``lt_version``: cuBLASLt's,
    None when it is not loaded; ``aligned``: all pointers 16-byte aligned; ``has_pre``: a
    ``preactivation_out``); our kernel's fields are filled either way (the fallback's).

    >>> p = plan(16, 4096, 4096, "float8_e4m3fn", "float8_e5m2", ("row", 4096), ("col", 4096), "row",
    ...          4096, ("rows", "tensor"), "bfloat16", 0, "cols", 132)
    >>> p.swap, p.kind, p.transa, p.transb, (p.m, p.n, p.k), p.bias_axis, p.config.decomposition
    (True, 'e5m2_e4m3', 'T', 'N', (4096, 16, 4096), 'm', 'splitk_serial')
    """
    return kernel_plan(*_planned(m, n, k, a_dtype, b_dtype, la, lb, target, ldc, layouts, out_name, activation_code,
                                 bias_axis, sm_count, cc, lt_version, backend, aligned, has_pre))


def _activation_name(code: int) -> str | None:
    """The activation of a device code (0: none), or a ValueError naming the code and the codes
    there are (a caller passing another one is wrong).

    >>> _activation_name(3), _activation_name(0)
    ('gelu_tanh', None)
    """
    if code == 0:
        return None
    name = _ACTIVATION_NAMES.get(code)
    if name is None:
        codes = ", ".join(f"{c}: {n}" for c, n in sorted(_ACTIVATION_NAMES.items()))
        raise ValueError(f"activation_code={code!r} is not an activation's code (0: none, {codes})")
    return name


def warm_specs(cases, sm_count: int, cc: tuple, device_id: int | None = None) -> list:
    """The :func:`pyblasgemm.kernels.jit.warm` specs of float8 products on dense, 256-byte
    aligned arrays (the tests' and benches' warm-up: a cold cache compiles them in parallel).
    ``cases``: ``(m, n, k, a dtype name, b dtype name, a order, b order, result order,
    layouts, output dtype name, activation code, bias axis)`` with orders 'C' / 'F'.

    >>> [s[1] for s in warm_specs([(16, 4096, 4096, "float8_e4m3fn", "float8_e4m3fn", "C", "F", "C",
    ...                             ("tensor", "cols"), "bfloat16", 0, None)], 132, (8, 9))]
    ['e4m3']
    """
    out = []
    for m, n, k, ta, tb, oa, ob, oc, layouts, out_name, act, axis in cases:
        isz = 4 if out_name == "float32" else 2
        per = 16 // isz
        la = ("row", k) if oa == "C" else ("col", m)
        lb = ("row", n) if ob == "C" else ("col", k)
        if oc == "F" and (n == 1 or m % per == 0):
            target, ldc = "col", (m if n > 1 else -(-m // per) * per)
        else:       # C-ordered in place, or a padded C-ordered temporary
            target, ldc = "row", -(-n // per) * per
        desc, planned = _planned(m, n, k, ta, tb, la, lb, target, ldc, layouts, out_name, act, axis, sm_count, cc,
                                 None, None, True, False)
        base = 0x7F00_0000_0000
        problem = kernel_problem(desc, base, base + (1 << 32), base + (2 << 32))
        epi = epilogue_code_of(desc)
        config = launch_config(problem, our_config(planned), epi, sm_count)
        out.append((config, desc.prefix, desc.transa, desc.transb, None, problem.operands_vectorizable(), device_id,
                    epi))
    return list(dict.fromkeys(out))


_machines: dict = {}


def machine(cc: tuple, sm_count: int) -> ArchSpec:
    """The :class:`ArchSpec` of a device the float8 route knows by its compute capability and
    SM count (the rules read only those): its family's spec (:data:`FAMILIES`; sm_80's before
    sm_80) with them. Memoized: the GPU route asks it on every call it plans.

    >>> machine((9, 0), 132) == FAMILIES["sm_90"], machine((8, 9), 142).family
    (True, 'sm_89')
    """
    key = (tuple(cc), sm_count)
    spec = _machines.get(key)
    if spec is None:
        base = FAMILIES[family_of(key[0]) or "sm_80"]
        spec = base if (base.cc, base.sm_count) == key else replace(base, cc=key[0], sm_count=sm_count)
        _machines[key] = spec
    return spec
