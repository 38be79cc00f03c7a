"""Batch-invariant plans (``invariant=True``): every element's bits depend only on its row of
op(A), its column of op(B) and K, never on the problem's other rows, its m, n or batch.

Why a GEMM is not invariant by default: the planner picks the implementation by shape. A
different kernel configuration, split-k or stream-k (partial sums added in another order),
or cuBLAS's own heuristic (another kernel, its own split) changes the order in which a dot
product's K terms are added, and float addition is not associative: a row of ``x @ W`` changes
its last bits when other rows join the batch (docs/design/invariance.md).

What the planner does instead, on the GPU:

* one of our kernels, **sliced-k** (one CTA walks all of K in order; no split, no stream-k
  fixup), with the configuration chosen **without m or n** (:func:`invariant_config`: over
  reference problems from decode to prefill size of the same type, compute mode, layout and
  K, at full alignment). The tile only decides which CTA computes an element; the K order
  inside it (the configuration's instruction sequence) is the same for every m and n;
* an operand whose alignment keeps that configuration off its fast path is packed first (a
  copy changes no value), rather than taking another configuration;
* cuBLAS is not a candidate (its kernel choice varies with the shape), nor cuBLASLt's
  epilogue, nor another fused configuration; a grouped call runs as a loop of such products.

On the host every element is one dot product of its row and column
(:func:`pyblasgemm.backends.host.invariant_matmul`): a BLAS GEMM's bits depend on where an
element lies in its register tiles. Composite routes (the Ozaki scheme's modes) are not yet
invariant on either: their guard and fallbacks look at the whole operands.

``GemmDesc.invariant`` names the dimension whose size may change: 'm' for the BLAS forms
(rows of C, column-major), 'n' for the row-major forms (``matmul``, ``gemm``: they describe
Cᵀ = op(B)ᵀ op(A)ᵀ, so the caller's rows are the description's n); '' for an ordinary problem.

Example (``plan`` describes a column-major problem: its invariant dimension is m)::

    >>> from pyblasgemm.planner import plan
    >>> p1 = plan(1, 4096, 4096, "bf16", transa="T", invariant=True, arch="sm_90")
    >>> p2 = plan(333, 4096, 4096, "bf16", transa="T", invariant=True, arch="sm_90")
    >>> p1.config == p2.config and p1.decomposition == "sliced" and p1.backend == "tensorcore"
    True
"""
from __future__ import annotations

from ..desc import alignment
from ..kinds import route_of
from ..plancache import get_plan_cache
from .arch import ArchSpec
from .candidates import _supports, enumerate_candidates
from .plan import Candidate

__all__ = ["REFERENCE_SIZES", "INVARIANCE_CLASS", "invariance_class", "invariant_choice", "invariant_config",
           "reference_alignment", "check_route"]

#: the row counts a batch-invariant configuration is chosen on (the invariant dimension, with
#: the other one the problem's own): decode-sized to prefill-sized, so the one configuration
#: is never far from the best at either end
REFERENCE_SIZES = (1, 16, 256, 4096)

_cache = get_plan_cache()

#: what must stay fixed for no element's bits to change with the row count: 'config', the whole
#: sliced-k configuration (true by construction: one kernel, one instruction sequence along K);
#: or 'family', the kernel family and its MMA instruction ``(family, consumer)``, the tile shape
#: then free per row count, if the hardware sums a k16 slice alike whatever the instruction's N
#: and the tile: it does (bench/invariance.py --families, one H200: 48 configurations x problems
#: of both families bitwise equal; docs/design/invariance.md), so 'family'
INVARIANCE_CLASS = "family"


def invariance_class(config):
    """The part of ``config`` an invariant plan keeps for every row count
    (:data:`INVARIANCE_CLASS`).

    >>> from pyblasgemm.kernels.config import KernelConfig
    >>> invariance_class(KernelConfig(bm=64)) == invariance_class(KernelConfig(bm=128))  # 'family'
    True
    """
    return config if INVARIANCE_CLASS == "config" else (config.family, config.consumer)


def _class_name(cls) -> str:
    return cls.name if INVARIANCE_CLASS == "config" else f"family {cls[0]} ({cls[1]} consumers)"


def _refuse(desc, why: str):
    raise NotImplementedError(f"{desc.routine}: invariant=True runs on pyblasgemm's own kernels, "
                              f"and {why}; cuBLAS picks its kernel by shape and cannot promise "
                              f"batch invariance")


def check_route(desc) -> None:
    """NotImplementedError for an invariant problem whose compute mode is a composite route:
    the Ozaki scheme decides natively computed rows, columns and elements (and whether the
    whole product runs natively) from the whole operands, so a row's bits depend on the
    others.

    >>> from pyblasgemm.planner.problem import make_desc
    >>> check_route(make_desc(64, 64, 64, "f64", compute="int8-ozaki", invariant=True))
    Traceback (most recent call last):
        ...
    NotImplementedError: plan: invariant=True is not available with compute='int8-ozaki' for float64: its composite route decides from the whole operands which elements run natively; use the native compute mode
    """
    if desc.invariant and route_of(desc.prefix, desc.compute).composite is not None:
        raise NotImplementedError(
            f"{desc.routine}: invariant=True is not available with compute={desc.compute!r} for "
            f"{desc.row.ab_dtype.name}: its composite route decides from the whole operands which "
            f"elements run natively; use the native compute mode")


def reference_desc(desc, m: int, n: int):
    """``desc`` as an m x n product at the alignment its configuration is chosen for (see
    :func:`reference_alignment`), one problem, no epilogue or group, leading dimensions at
    least as the sizes need (the scores read them only through the alignment)."""
    align = reference_alignment(desc)
    lda = max(desc.lda, m if desc.transa == "N" else 1)
    ldb = max(desc.ldb, n if desc.transb != "N" else 1)
    return desc._replace(m=m, n=n, lda=lda, ldb=ldb, ldc=max(desc.ldc, m), batch=1, stride_a=0,
                         stride_b=0, stride_c=0, align=align, ptr_align=min(align, desc.ptr_align),
                         epilogue=None, group=None)


def reference_alignment(desc) -> int:
    """The byte alignment an invariant configuration must run at: what the row count cannot
    change. Row-major forms ('n'): they hand over their rows (op(B) in the description, and
    C) tight and 16-byte aligned (``_strided.INVARIANT_ALIGN``), so it is the weight's (A's
    pointer and lda) and the fixed leading dimensions (K for the rows, N for C). The BLAS form
    ('m'): the caller's lda and ldc grow with m, so any alignment must run: the element's.

    >>> from pyblasgemm.planner.problem import make_desc
    >>> reference_alignment(make_desc(64, 64, 64, "bf16", invariant=True))         # the BLAS form
    2
    >>> reference_alignment(make_desc(4096, 5, 4096, "bf16", transa="T")._replace(invariant="n"))
    16
    """
    row = desc.row
    isz, csz = row.ab_dtype.itemsize, row.c_dtype.itemsize
    if desc.invariant == "m":
        return min(isz, csz)
    return alignment(desc.ptr_align, desc.lda * isz, desc.ldb * isz, desc.ldc * csz,
                     desc.stride_a * isz)


def _reference_problems(desc) -> list:
    """(m, n) of each reference problem: the invariant dimension (``desc.invariant``, 'm' or
    'n') through :data:`REFERENCE_SIZES`, the other one ``desc``'s."""
    if desc.invariant == "m":
        return [(r, desc.n) for r in REFERENCE_SIZES]
    return [(desc.m, r) for r in REFERENCE_SIZES]


def invariant_config(desc, arch: ArchSpec, cal: dict):
    """``(class, regret)``: the :func:`invariance_class` (a sliced-k configuration of our
    kernels, or a family) for every invariant problem of ``desc``'s type, compute mode,
    layout, K and fixed dimension (the one that is not ``desc.invariant``) on ``arch``: among
    those valid at every reference row count (:data:`REFERENCE_SIZES`), the one whose worst
    predicted time (its best configuration's) against the best sliced-k configuration at each
    is least. Memoized in the plan cache (it depends on neither the row count nor the batch).
    None when none qualifies.

    >>> from pyblasgemm.planner import model
    >>> from pyblasgemm.planner.arch import FAMILIES
    >>> from pyblasgemm.planner.problem import make_desc
    >>> d = make_desc(4096, 7, 4096, "bf16", transa="T")._replace(invariant="n")
    >>> config, regret = invariant_config(d, FAMILIES["sm_90"], model.load_calibration())
    >>> config == invariant_config(d._replace(n=3000), FAMILIES["sm_90"], model.load_calibration())[0]
    True
    """
    key = ("invariant config", INVARIANCE_CLASS, reference_desc(desc, *_reference_problems(desc)[0]).key,
           arch.key)
    hit = _cache.get(key)
    if hit is not None:
        return hit
    times: dict = {}
    problems = _reference_problems(desc)
    for m, n in problems:
        sliced = {c.config: c.time for c in enumerate_candidates(reference_desc(desc, m, n), arch, cal)
                  if c.backend == "tensorcore" and c.score is not None and not c.pack
                  and c.config.decomposition == "sliced"}
        if not sliced:
            return None
        best = min(sliced.values())
        per_class: dict = {}
        for config, t in sliced.items():
            cls = invariance_class(config)
            per_class[cls] = min(per_class.get(cls, t), t)
        for cls, t in per_class.items():
            times.setdefault(cls, []).append(t / best)
    everywhere = {config: max(r) for config, r in times.items() if len(r) == len(problems)}
    if not everywhere:
        return None
    found = min(everywhere.items(), key=lambda item: (item[1], _class_name(item[0])))
    _cache.put(key, found)
    return found


def invariant_choice(desc, requested: str, arch: ArchSpec, cal: dict) -> tuple[Candidate, str, list]:
    """(the candidate to run, why, its candidates) for a batch-invariant GPU problem.
    ValueError for ``backend='cublas'``; NotImplementedError where our kernels cannot run the
    problem (the message says why)."""
    if requested == "cublas":
        raise ValueError(f"{desc.routine}: invariant=True cannot run on backend='cublas': cuBLAS "
                         f"picks its kernel by shape; use backend='auto' or 'tensorcore'")
    check_route(desc)
    ok, why_not = _supports("tensorcore", desc)
    if ok and arch.cc < (8, 0):
        ok, why_not = False, f"they need sm_80+ (device is sm_{arch.cc[0]}{arch.cc[1]})"
    if not ok:
        _refuse(desc, f"they cannot run this problem: {why_not}")
    found = invariant_config(desc, arch, cal)
    if found is None:
        _refuse(desc, "no sliced-k configuration of theirs runs this type and layout at every size")
    cls, regret = found
    if INVARIANCE_CLASS == "config":
        cands = enumerate_candidates(desc, arch, cal, cls)
    else:
        cands = enumerate_candidates(desc, arch, cal)
    runnable = [c for c in cands if c.score is not None and c.config.decomposition == "sliced"
                and invariance_class(c.config) == cls]
    if not runnable:
        rejected = sorted({c.rejected for c in cands if c.rejected})
        _refuse(desc, f"their invariant {_class_name(cls)} cannot run this problem"
                      + (f" ({'; '.join(rejected[:3])})" if rejected else ""))
    pick = min(runnable, key=lambda c: (bool(c.pack), c.time))
    sizes = "/".join(str(r) for r in REFERENCE_SIZES)
    what = (f"{pick.config.name} for every {desc.invariant} and batch" if INVARIANCE_CLASS == "config"
            else f"{pick.config.name}, of the {_class_name(cls)} every {desc.invariant} and batch runs")
    why = (f"invariant along {desc.invariant}: {what}, K walked in order by one CTA, no split "
           f"(chosen without {desc.invariant}: of the sliced-k "
           f"{'configurations' if INVARIANCE_CLASS == 'config' else 'families'} valid at "
           f"{desc.invariant} = {sizes}, the one at most {regret:.2f}x the best at each)"
           + (f"; {' and '.join(x.upper() for x in pick.pack)} packed first (its alignment)"
              if pick.pack else "")
           + "; cuBLAS not considered (its kernel changes with the shape)")
    return pick, why, cands
