"""Plans of the composite routes (``kinds.Route.composite``): problems our tensor-core kernels
run as other GEMMs plus passes of their own (:mod:`pyblasgemm.composite` executes them).

* ``'ozaki'`` (``compute='int8-ozaki'``, float64 and complex128, float32 and complex64): the
  Ozaki scheme II, one batched int8 GEMM over the moduli (:mod:`pyblasgemm.ozaki`); against
  native cuBLAS DGEMM / ZGEMM / SGEMM / CGEMM (cuBLAS's route of the mode, ``Route.native``).
  Only where a call asks for it: no type's default compute is an emulated one (float32's
  default stays ``'fp32'``, ``_types.FP32_DEFAULTS``), so the planner weighs the composition
  against native only for a call that names ``'int8-ozaki'``.
* ``'complex'`` (``compute='tf32'`` / ``'3xtf32'``, complex64): ``[Cr Ci] = [Ar Ai] @
  [[Br, Bi], [-Bi, Br]]``, one real product of 2n columns and 2k terms on the float32 kernels
  of that mode; against cuBLAS's CGEMM of the mode.

The plan carries a :class:`CompositeSpec`: the inner problem with its own plan, the same problem
run natively, and the model's times. Nothing here runs a GPU.

Example
-------
>>> from pyblasgemm.planner import FAMILIES, make_desc, plan_for
>>> p = plan_for(make_desc(8192, 8192, 8192, "float64", compute="int8-ozaki"), arch=FAMILIES["sm_90"])
>>> p.backend, p.decomposition, p.launch.setting.count
('tensorcore', 'ozaki', 16)
>>> small = plan_for(make_desc(256, 256, 256, "float64", compute="int8-ozaki"), arch=FAMILIES["sm_90"])
>>> small.backend, small.reason.split(":")[0]
('cublas', 'native DGEMM predicted faster')
"""
from __future__ import annotations

from typing import NamedTuple

from ..desc import GemmDesc
from ..kinds import base_compute, ozaki_bits, ozaki_scaling, route_of
from . import model as M
from .plan import Plan

__all__ = ["CompositeSpec", "plan_composite", "inner_problem", "contiguous_lines", "PASS_HOST_S", "PASS_DRAM_EFFICIENCY",
           "PLANE_ROW"]

#: host time of a composite call beyond its inner GEMM's (Python, ~8 launches, one counter
#: read that waits for the GPU). H100, dgemm 1024³ at 16 moduli: 257 µs a call, of which the
#: int8 GEMM and the passes' bytes account for ~55 µs
PASS_HOST_S = 200e-6
#: the passes' share of DRAM bandwidth: H100, dgemm 8192³ at 16 moduli, the scaling, residue
#: and reconstruction passes took 5.3 ms for 9.1 GB (bench/results/ozaki_h100_2026-11-25_e859705.json
#: and the per-pass CUDA events in kernels/NOTES.md, session 12)
PASS_DRAM_EFFICIENCY = 0.5
#: Ozaki: the moduli's GEMM writes each product's CRT digit (one byte) where its plan runs the
#: Hopper int8 kernel's sliced tiles (kernels.jit.residue_store_fits), instead of int32 planes
#: that the reconstruction reduces: 16 planes of 4 bytes a product, written and read, are 4.3
#: GB at 8192^2, a quarter of that as digits (docs/design/ozaki-residue-planes.md). False: the
#: int32 planes everywhere (the tests plan both, with a fresh plan cache; the bits are the same)
DIGITS = True
#: Ozaki: the scaling and the residues of each operand in one pass over it
#: (``ozaki_kernels.one_pass_shape``: lines held on chip by a CTA or a cluster of them) where its
#: lines fit and the scaling is the default one; False: the statistics pass, then the residues
#: (the tests plan both, with a fresh plan cache; the bits are the same)
ONE_PASS = True
#: Ozaki: the residue planes' rows (the moduli GEMM's k) are a whole number of this many bytes,
#: zeros past the operand's k (ozaki_kernels.OzakiPasses.residues' ``row``): the Hopper
#: kernel's TMA needs 16-byte aligned leading dimensions, and k = 1000 otherwise packed all
#: 17 planes of A and B into copies before the GEMM (and kept the int32 planes: the digit
#: store takes no packed operands)
PLANE_ROW = 16


class CompositeSpec(NamedTuple):
    """How a composite plan runs: its inner GEMM (description and plan), the problem run
    natively (Inf/NaN, lines the scaling cannot hold), the Ozaki setting (None for complex) and
    the model's times."""

    kind: str                   # 'ozaki' or 'complex'
    inner: GemmDesc             # the real GEMM (Ozaki: batch = moduli; per batch entry of the call)
    inner_plan: Plan
    native: GemmDesc            # the same problem in the native compute mode (planning only)
    setting: object             # ozaki.OzakiSetting or None
    passes_s: float             # the model's time of the passes around the inner GEMM
    native_s: float             # the model's time of the native route
    #: Ozaki: the plan of the moduli's GEMM (batch = moduli) when it runs with the digit store
    #: (:data:`DIGITS`; executed bound with ``kernels.jit.EPI_RESIDUE``), else None
    digits: Plan | None = None
    #: Ozaki: ``(A's OnePassShape, B's)``, each None where that operand takes the statistics
    #: pass, then the residues (:data:`ONE_PASS`, ``ozaki_kernels.one_pass_shape``); None where
    #: neither takes one pass, and why
    one_pass: tuple | None = None
    two_passes_why: str = ""

    def explain_lines(self) -> list:
        """Lines for :meth:`Plan.explain`.

        >>> from pyblasgemm.planner import FAMILIES, make_desc, plan_for
        >>> p = plan_for(make_desc(4096, 4096, 4096, "complex64", compute="3xtf32"), arch=FAMILIES["sm_90"])
        >>> p.launch.explain_lines()[0]
        'composite: one 3xtf32 product of the stacked real and imaginary parts'
        """
        inner = self.inner_plan
        cfg = f" config {inner.config.name}" if inner.config is not None else ""
        what = (f"{self.setting.describe()}" if self.setting is not None else
                f"one {self.inner.compute} product of the stacked real and imaginary parts")
        bound = [f"  error: {self.setting.bound()}"] if self.setting is not None else []
        digits = (f"; the moduli's {self.digits.config.name} stores each product's CRT digit (a byte)"
                  if self.digits is not None else "")
        passes = []
        if self.setting is not None:
            passes = [f"  scaling and residues: {_one_pass_words(self.one_pass, self.two_passes_why)}"]
        return [f"composite: {what}"] + bound + passes + [
                f"  inner GEMM: {self.inner.routine} m={self.inner.m} n={self.inner.n} k={self.inner.k} "
                f"batch={self.inner.batch} on {inner.backend}{cfg}, predicted {inner.predicted_s * 1e6:.1f} us"
                f"{digits}",
                f"  passes around it: {self.passes_s * 1e6:.1f} us predicted; native route "
                f"{self.native_s * 1e6:.1f} us predicted"]


def inner_problem(desc: GemmDesc, setting=None) -> GemmDesc:
    """The real GEMM a composite route runs for one batch entry of ``desc``.

    Ozaki: the residue planes, both K-major ("TN"), C column-major m x n (2n for complex),
    batch = moduli (one more with the guard), k rounded up to :data:`PLANE_ROW` (the planes'
    zeros past k add nothing). Complex: A2 = [Ar Ai] (m x 2k, C order), B2 (2k x 2n, C
    order), C2 column-major m x 2n.

    >>> from pyblasgemm.ozaki import setting
    >>> from pyblasgemm.planner import make_desc
    >>> d = inner_problem(make_desc(100, 60, 300, "complex128", compute="int8-ozaki"), setting(600))
    >>> d.prefix, d.transa, d.transb, (d.m, d.n, d.k), d.batch
    ('i', 'T', 'N', (100, 120, 608), 17)
    """
    from .problem import make_desc

    route = route_of(desc.prefix, desc.compute)
    two = 2 if desc.row.is_complex else 1
    m, n, k = desc.m, desc.n * two, desc.k * two
    if route.composite == "ozaki":
        row = -(-k // PLANE_ROW) * PLANE_ROW
        return make_desc(m, n, row, "int8", transa="T", transb="N", lda=row, ldb=row, ldc=m,
                         batch=setting.planes, device=desc.device)
    return make_desc(m, n, k, "float32", compute=route.inner[1], transa="T", transb="T", lda=k, ldb=n,
                     ldc=m, device=desc.device)


def _one_pass_words(one_pass, why: str = "") -> str:
    """How the plan scales and splits its operands, for :meth:`CompositeSpec.explain_lines`.

    >>> from pyblasgemm.kernels.ozaki_kernels import OnePassShape
    >>> _one_pass_words((OnePassShape(1, 1, 8192), OnePassShape(8, 4, 1024)))
    'one pass over each operand (A: a CTA a line; B: clusters of 4 CTAs of 8 lines x 1024 positions)'
    >>> _one_pass_words((None, OnePassShape(1, 1, 8192)))
    'A: a statistics pass, then the residues; B: one pass (a CTA a line)'
    >>> _one_pass_words(None, "the lines do not fit on chip")
    'a statistics pass, then the residues (the lines do not fit on chip)'
    """
    if one_pass is None:
        return f"a statistics pass, then the residues ({why})"

    def one(shape):
        lines, q, chunk = shape.lines, shape.cluster, shape.chunk
        if q == 1:
            return "a CTA a line" if lines == 1 else f"a CTA of {lines} lines"
        return f"clusters of {q} CTAs of {lines} line{'s' if lines > 1 else ''} x {chunk} positions"
    if None not in one_pass:
        return f"one pass over each operand (A: {one(one_pass[0])}; B: {one(one_pass[1])})"
    return "; ".join(f"{name}: one pass ({one(shape)})" if shape is not None else
                     f"{name}: a statistics pass, then the residues" for name, shape in zip("AB", one_pass))


def contiguous_lines(desc: GemmDesc) -> tuple[bool, bool]:
    """Whether op(A)'s rows and op(B)'s columns (the lines the Ozaki passes scale) are each
    contiguous in memory, as :mod:`pyblasgemm.composite` hands them to the passes: complex
    operands through their stacked copies (A2's rows contiguous, B2's columns strided).

    >>> from pyblasgemm.planner import make_desc
    >>> contiguous_lines(make_desc(64, 64, 64, "float64", transa="T", transb="N"))
    (True, True)
    >>> contiguous_lines(make_desc(64, 64, 64, "complex128"))
    (True, False)
    """
    if desc.row.is_complex:
        return True, False
    # column-major: A (transa 'N') holds rows strided by 1 position, its transpose contiguous
    a = desc.transa != "N" and desc.lda != 1
    b = desc.transb == "N" and desc.ldb != 1
    return a, b


def _one_pass(desc: GemmDesc, inner: GemmDesc, setting, arch) -> tuple:
    """``((A's shape, B's shape), why)``: each operand's one-pass shape
    (``ozaki_kernels.one_pass_shape``; None: that operand takes the statistics pass, then the
    residues) and, where neither takes it, why: the 'fast' scaling (its norms' sweep waits for
    the cluster's statistics: 0.93x the two passes on an H200 at 8192^3,
    bench/results/ozaki_one_pass_h200_2026-11-29_1fab3b6.json), :data:`ONE_PASS` off, or lines
    whose one pass was measured slower or that do not fit on chip.

    >>> from pyblasgemm.planner import FAMILIES, make_desc
    >>> from pyblasgemm.ozaki import setting
    >>> d = make_desc(8192, 8192, 8192, "float64", compute="int8-ozaki")
    >>> shapes, _ = _one_pass(d, inner_problem(d, setting(8192)), setting(8192), FAMILIES["sm_90"])
    >>> shapes[0], tuple(shapes[1])
    (None, (1, 1, 8192))
    """
    from ..kernels.ozaki_kernels import one_pass_shape

    if not ONE_PASS:
        return None, "the one pass turned off (planner.composite.ONE_PASS)"
    if setting.scaling == "fast":
        return None, "the 'fast' scaling: measured 0.93x in one pass on an H200"
    real = desc.row.ab_dtype.itemsize // (2 if desc.row.is_complex else 1)
    a_contig, b_contig = contiguous_lines(desc)
    a = one_pass_shape(inner.m, inner.k, real, arch, a_contig)
    b = one_pass_shape(inner.n, inner.k, real, arch, b_contig)
    if a is None and b is None:
        return None, "the one pass measured slower for these lines, or they do not fit on chip"
    return (a, b), ""


def _passes_bytes(desc: GemmDesc, kind: str, count: int, digit_planes: int = 0, fast: bool = False,
                  one_pass: tuple = (False, False)) -> float:
    """DRAM bytes of the passes around the inner GEMM, per batch entry (``digit_planes`` of
    the ``count`` planes are one byte a product: the digit store; ``fast``: the 'fast'
    scaling's statistics read each operand once more, for the norms; ``one_pass``: whether A,
    and B, are scaled and split in one pass, which reads that operand once)."""
    m, n, k = desc.m, desc.n, desc.k
    c_rw = desc.row.c_dtype.itemsize * m * n * (2 if desc.beta != 0 else 1)
    if kind == "complex":
        # A2 and B2 written from the complex operands (B2 twice B's size), C2 read once
        return 2 * 8 * m * k + 8 * k * n + 16 * k * n + 8 * m * n + c_rw
    two = 2 if desc.row.is_complex else 1
    real = desc.row.ab_dtype.itemsize // two        # bytes of one real part: 8 or 4
    mk, kn, mn = m * k * two, k * n * two * two, m * n * two
    stacked = (2 * real * (m * k + k * n) + real * (mk + kn)) if two == 2 else 0
    # statistics and residues read each operand twice ('fast': three times); residues write
    # count int8 planes; the reconstruction reads count int32 planes (digit planes: one byte a
    # product)
    reads = 3 if fast else 2
    # (the one pass spares its operand's statistics read)
    spared = real * ((mk if one_pass[0] else 0) + (kn if one_pass[1] else 0))
    return (stacked + reads * real * (mk + kn) - spared + count * (mk + kn) + (4 * count - 3 * digit_planes) * mn
            + c_rw)


def plan_composite(desc: GemmDesc, requested: str, arch, plan_for) -> Plan:
    """The plan of a composite route on the GPU: the composition, or the native route where
    the model puts it faster (``requested='auto'``); ``'tensorcore'`` forces the composition,
    ``'cublas'`` the native route (cuBLAS's route of the mode). The planner calls it for every
    composite mode (``planner.core``); ``plan_for`` is handed in to plan the inner GEMM.

    >>> from pyblasgemm.planner import FAMILIES, make_desc, plan_for
    >>> d = make_desc(64, 64, 64, "float64", compute="int8-ozaki")
    >>> plan_composite(d, "tensorcore", FAMILIES["sm_90"], plan_for).launch.setting.count
    15
    """
    from .. import constraints
    from ..ozaki import precision_of
    from ..ozaki import setting as ozaki_setting

    route = route_of(desc.prefix, desc.compute)
    native = desc._replace(compute=route.native or base_compute(desc.compute))
    # cuBLAS's route of the mode, scored directly (planning it would come back here)
    native_s = M.score_cublas(native, arch, M.load_calibration()).time
    ok, why_not = constraints.backend_supports("tensorcore", desc)
    if requested == "cublas" or (requested == "auto" and not ok):
        why = "forced by backend= / PYBLASGEMM_BACKEND" if requested == "cublas" else \
            f"native: our composition cannot run it ({why_not})"
        return Plan("cublas", f"{why}; cuBLAS runs compute={desc.compute!r} as {_native_name(desc)}",
                    None, None, 1, (), 0, native_s, "forced" if requested == "cublas" else "heuristic",
                    arch, desc)
    if not ok:
        raise NotImplementedError(f"{desc.routine}: backend='tensorcore' cannot run this problem: {why_not}")
    two = 2 if desc.row.is_complex else 1
    setting = None
    if route.composite == "ozaki":
        # the count from the dial alone ('fast': the least bits any line keeps), so the plan
        # does not depend on the data
        setting = ozaki_setting(desc.k * two, bits=ozaki_bits(desc.compute),
                                precision=precision_of(desc.row.c_dtype), scaling=ozaki_scaling(desc.compute))
    inner = inner_problem(desc, setting)
    inner_plan = _inner_plan(inner, arch, plan_for)
    count = setting.planes if setting is not None else 0
    digits = _digit_plan(inner._replace(batch=setting.count), arch, plan_for) if setting is not None else None
    fast = setting is not None and setting.scaling == "fast"
    one_pass, why = _one_pass(desc, inner, setting, arch) if setting is not None else (None, "")
    single = (False, False) if one_pass is None else tuple(s is not None for s in one_pass)
    passes = (desc.batch * _passes_bytes(desc, route.composite, count, setting.count if digits else 0, fast,
                                         single)
              / (arch.dram_bw * PASS_DRAM_EFFICIENCY) + PASS_HOST_S)
    ours = desc.batch * inner_plan.predicted_s + passes
    spec = CompositeSpec(route.composite, inner, inner_plan, native, setting, passes, native_s, digits, one_pass,
                         why)
    what = (setting.describe() if setting is not None else
            f"one {inner.compute} product of the stacked parts (m={inner.m}, n={inner.n}, k={inner.k})")
    times = (f"{ours * 1e6:.1f} us ({desc.batch} x {inner_plan.predicted_s * 1e6:.1f} us inner GEMM + "
             f"{passes * 1e6:.1f} us of passes) vs {native_s * 1e6:.1f} us for {_native_name(desc)}")
    if requested == "auto" and native_s <= ours:
        return Plan("cublas", f"{_native_name(desc)} predicted faster: {times}", None, None, 1, (), 0,
                    native_s, "heuristic", arch, desc)
    source = "forced" if requested == "tensorcore" else "heuristic"
    why = "forced by backend= / PYBLASGEMM_BACKEND; " if requested == "tensorcore" else ""
    return Plan("tensorcore", f"{why}{what}: predicted {times}", None, route.composite, 1, (), 0, ours,
                source, arch, desc, (), spec)


def _inner_plan(inner: GemmDesc, arch, plan_for) -> Plan:
    """The inner GEMM's plan. The batched int8 residue product runs on our Hopper kernel
    where it can: measured on the H100 (batch 12-18 at 4096 and 8192), 1490-1528 TOPS against
    cuBLAS's 1107-1154, which the model (its cuBLAS int8 rate is for one GEMM) ranks the other
    way round."""
    from .. import constraints

    if inner.prefix == "i" and tuple(arch.cc) == (9, 0) and constraints.backend_supports("tensorcore", inner)[0]:
        try:
            return plan_for(inner, "tensorcore", arch=arch)
        except NotImplementedError:
            pass
    return plan_for(inner, arch=arch)


def _digit_plan(moduli: GemmDesc, arch, plan_for) -> Plan | None:
    """The moduli's GEMM's plan where it runs with the digit store: our Hopper kernel's sliced
    int8 tiles (``kernels.jit.residue_store_fits``), unpacked; None elsewhere or with
    :data:`DIGITS` off.

    >>> from pyblasgemm.planner import FAMILIES, make_desc, plan_for
    >>> p = plan_for(make_desc(8192, 8192, 8192, "float64", compute="int8-ozaki"), arch=FAMILIES["sm_90"])
    >>> p.launch.digits.config.name, p.launch.digits.problem.batch
    ('sm90a_sliced_256x128x128_w2x1_s4_g8', 16)
    >>> plan_for(make_desc(8192, 8192, 8192, "float64", compute="int8-ozaki"), arch=FAMILIES["sm_80"]).launch.digits
    """
    from ..kernels.jit import residue_store_fits

    if not DIGITS:
        return None
    plan = _inner_plan(moduli, arch, plan_for)
    fits = (plan.backend == "tensorcore" and plan.config is not None and not plan.pack
            and residue_store_fits(plan.config, "s8"))
    return plan if fits else None


def _native_name(desc: GemmDesc) -> str:
    route = route_of(desc.prefix, desc.compute)
    if route.composite == "ozaki":
        return f"native {desc.prefix.upper()}GEMM"
    return "cuBLAS's TF32 CGEMM" if base_compute(desc.compute) == "tf32" else "cuBLAS's CGEMM"
