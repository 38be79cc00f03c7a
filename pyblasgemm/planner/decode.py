"""The decode route: products with at most :data:`MAX_TOKENS` tokens on the GEMV kernel
(:mod:`pyblasgemm.kernels.gemv`), where it was measured to beat cuBLAS.

A plan on this route has ``backend='tensorcore'`` (our kernels), ``decomposition='gemv'``,
no :class:`~pyblasgemm.kernels.config.KernelConfig` and the
:class:`~pyblasgemm.kernels.gemv.GemvSpec` as its ``launch``;
:func:`pyblasgemm.backends.tensorcore.bind` binds it through :func:`pyblasgemm.kernels.gemv.bind`.

The rule (:func:`decode_rule`) is narrow on purpose: 16-bit operands with float32 accumulation
and a 16-bit C (``hgemm`` / ``bgemm``: the ``x @ W.T`` of a decoder's linear layers), the
weight K-contiguous with 16-byte vector loads (the tuned mma_k mainloop and its ring), one
problem, no epilogue, at most :data:`MAX_TOKENS` tokens, and a weight of at least
:data:`MIN_WEIGHT_BYTES` (below it the launch's fixed costs, not the stream, decide).
``PYBLASGEMM_CONFIG`` / ``PYBLASGEMM_DECOMPOSITION``, autotuning and batch-invariant problems
keep the ordinary planner.
"""
from __future__ import annotations

__all__ = ["ENABLED", "MAX_TOKENS", "MIN_WEIGHT_BYTES", "KINDS", "decode_rule", "decode_plan"]

#: whether the planner takes the route at all (off until a device run shows it winning)
ENABLED = False
#: the most tokens (C's smaller side) the route takes
MAX_TOKENS = 16
#: the smallest weight (bytes) the route takes
MIN_WEIGHT_BYTES = 8 << 20
#: (BLAS prefix, base compute mode) the route takes
KINDS = (("h", "fp32"), ("b", "fp32"))
#: the GEMV kernel's streaming rate assumed for the predicted time (fraction of DRAM bandwidth)
#: and its fixed cost per launch (ramp and the in-kernel reduction)
STREAM_FRACTION, FIXED_S = 0.85, 4e-6


def decode_rule(desc, sm_count: int) -> tuple:
    """(spec or None, reason): the :class:`~pyblasgemm.kernels.gemv.GemvSpec` of ``desc`` on
    ``sm_count`` SMs where the route takes it, else None and why not (pure).

    >>> from pyblasgemm.planner.problem import make_desc
    >>> spec, why = decode_rule(make_desc(1, 4096, 4096, "bf16", transa="T"), 132)
    >>> spec.path, spec.T, why.startswith("decode")
    ('mma_k', 1, True)
    >>> decode_rule(make_desc(64, 4096, 4096, "bf16", transa="T"), 132)[1]
    '64 tokens: the decode route takes at most 16'
    """
    from ..kernels import gemv
    from ..kinds import base_compute

    if (desc.prefix, base_compute(desc.compute)) not in KINDS:
        return None, f"{desc.prefix}gemm compute={desc.compute}: the decode route takes hgemm / bgemm (fp32)"
    if desc.epilogue is not None or desc.group is not None or desc.invariant:
        return None, "an epilogue, a group or a batch-invariant problem"
    ok, why = gemv.gemv_applies(desc)
    if not ok:
        return None, why
    cn = gemv.canonical(desc)
    if cn.T > MAX_TOKENS:
        return None, f"{cn.T} tokens: the decode route takes at most {MAX_TOKENS}"
    spec = gemv.plan(desc, sm_count)
    if spec.path != "mma_k" or spec.loads != (gemv.W_VEC | gemv.X_VEC):
        return None, "the weight or the activations do not take 16-byte K-contiguous loads"
    if spec.weight_bytes < MIN_WEIGHT_BYTES:
        return None, f"a {spec.weight_bytes / 2**20:.1f} MiB weight: below the route's {MIN_WEIGHT_BYTES >> 20} MiB"
    return spec, (f"decode: {cn.T} token(s) x a {spec.R} x {spec.K} weight streamed once by the GEMV kernel "
                  f"({spec.ctas} CTAs, K split across the grid, one launch)")


def decode_plan(desc, requested: str, arch, settings):
    """The decode route's :class:`~pyblasgemm.planner.plan.Plan` for ``desc``, or None where it
    does not apply (``requested``: 'auto' or 'tensorcore'; ``settings``: the planner's)."""
    from .plan import Plan

    if not ENABLED or requested not in ("auto", "tensorcore") or desc.xp != "cupy" or arch is None or arch.cc < (8, 0):
        return None
    if settings.config is not None or settings.decomposition is not None or settings.autotune:
        return None
    spec, why = decode_rule(desc, arch.sm_count)
    if spec is None:
        return None
    predicted = spec.weight_bytes / (STREAM_FRACTION * arch.dram_bw) + FIXED_S
    return Plan("tensorcore", why, None, "gemv", 1, (spec.ctas,), spec.workspace_bytes, predicted,
                "heuristic", arch, desc, (), launch=spec)
