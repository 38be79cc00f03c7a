"""The decode route: products with at most :data:`MAX_TOKENS` tokens on the GEMV kernel
(:mod:`pyblasgemm.kernels.gemv`), where it was measured to beat cuBLAS.

A plan on this route has ``backend='tensorcore'`` (our kernels), ``decomposition='gemv'``,
no :class:`~pyblasgemm.kernels.config.KernelConfig` and the
:class:`~pyblasgemm.kernels.gemv.GemvSpec` as its ``launch``;
:func:`pyblasgemm.backends.tensorcore.bind` binds it through :func:`pyblasgemm.kernels.gemv.bind`.

The rule (:func:`decode_rule`) is the range where it was measured to win (H100 and H200, same
run as torch.matmul and cupy.matmul, bench/results/gemv_rows_h*_2026-11-28_*): 16-bit operands
with float32 accumulation and a 16-bit C (``hgemm`` / ``bgemm``: the ``x @ W.T`` of a decoder's
linear layers), the weight and the activations K-contiguous with 16-byte vector loads (the
kernel's row-block split: whole 16-row blocks per CTA, no workspace), one problem, no epilogue,
at most :data:`MAX_TOKENS` tokens, a weight of at least :data:`MIN_WEIGHT_BYTES` (the smallest
layer measured), and every row block on its own resident CTA (one wave: the regime measured;
weights with more blocks than resident CTAs stream grid-stride, not measured). There, on seven
projections of Llama-3-8B and Qwen2-7B at 1-8 tokens, graph replay 0.99-1.18x of cuBLAS
(geomean 1.07), single call 0.99-1.57x (geomean 1.26-1.31); at 16 tokens three of the seven
lose on device time (0.90-0.93x), so 16 stays on cuBLAS.
``PYBLASGEMM_CONFIG`` / ``PYBLASGEMM_DECOMPOSITION``, autotuning and batch-invariant problems
keep the ordinary planner.
"""
from __future__ import annotations

__all__ = ["ENABLED", "MAX_TOKENS", "MIN_WEIGHT_BYTES", "KINDS", "MEASURED_CC", "MAX_DRAM_BW", "decode_rule",
           "decode_plan", "CUBLAS_BAND_TOKENS", "cublas_band_reason"]

#: whether the planner takes the route at all: on since its test through ``matmul``
#: (tests/test_gemv_gpu.py::test_decode_route_through_matmul, one token included) passed on an
#: H200 on 2026-11-28 beside the kernel's 32 other GPU tests; the range is the H100 run's
#: (module docstring). False gives cuBLAS these shapes again
ENABLED = True
#: the most tokens (C's smaller side) the route takes: at 16 the row-block split's stream
#: (2.80 TB/s against cuBLAS's 2.97) loses on device time on half the layers
MAX_TOKENS = 8
#: the smallest weight (bytes) the route takes: Qwen2-7B's qkv, 3584 x 4608 x 2 B, the smallest
#: layer measured (14.1 us graph replay, 1.0x of cuBLAS: below it nothing was measured)
MIN_WEIGHT_BYTES = 30 << 20
#: (BLAS prefix, base compute mode) the route takes
KINDS = (("h", "fp32"), ("b", "fp32"))
#: the GEMV kernel's streaming rate for the predicted time (fraction of DRAM bandwidth) and its
#: fixed cost per launch: the o -> down fit of the H100 graph replays at T = 1 (3.04 TB/s of
#: 3.35, intercept 3.1 us; cuBLAS's 3.01 TB/s and 5.6 us)
STREAM_FRACTION, FIXED_S = 0.91, 3.1e-6
#: the devices measured: sm_90 with H100 memory (3.35 TB/s) and with H200 memory (4.8 TB/s:
#: the row-block split at 1-8 tokens on the same seven projections, one H200, same run, graph
#: replay 1.03-1.06x torch.matmul by token count (0.91-1.21x), steady 1.19-1.22x, single call
#: 1.37-1.41x; 16 tokens 0.85x graph: bench/results/gemv_rows_h200_2026-11-28_f5a2290.json).
#: Faster memory than measured keeps cuBLAS
MEASURED_CC, MAX_DRAM_BW = (9, 0), 5e12


def decode_rule(desc, sm_count: int) -> tuple:
    """(spec or None, reason): the :class:`~pyblasgemm.kernels.gemv.GemvSpec` of ``desc`` on
    ``sm_count`` SMs where the route takes it, else None and why not (pure).

    >>> from pyblasgemm.planner.problem import make_desc
    >>> spec, why = decode_rule(make_desc(1, 4096, 4096, "bf16", transa="T"), 132)
    >>> spec.path, spec.T, why.startswith("decode")
    ('mma_k', 1, True)
    >>> decode_rule(make_desc(16, 4096, 4096, "bf16", transa="T"), 132)[1]
    '16 tokens: the decode route takes at most 8'
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
    if spec.path != "mma_k" or spec.loads != (gemv.W_VEC | gemv.X_VEC) or spec.split != "rows":
        return None, "the weight or the activations do not take 16-byte K-contiguous loads"
    if spec.weight_bytes < MIN_WEIGHT_BYTES:
        return None, f"a {spec.weight_bytes / 2**20:.1f} MiB weight: below the route's {MIN_WEIGHT_BYTES >> 20} MiB"
    if spec.ctas < spec.row_tiles:
        return None, (f"{spec.row_tiles} row blocks on {spec.ctas} resident CTAs: grid-stride, "
                      f"outside the range measured")
    return spec, (f"decode: {cn.T} token(s) x a {spec.R} x {spec.K} weight streamed once by the GEMV kernel "
                  f"({spec.ctas} CTAs of {spec.wk} warps, a 16-row block each, K split over its warps, one launch)")


def decode_plan(desc, requested: str, arch, settings):
    """The decode route's :class:`~pyblasgemm.planner.plan.Plan` for ``desc``, or None where it
    does not apply (``requested``: 'auto' or 'tensorcore'; ``settings``: the planner's)."""
    from .plan import Plan

    if not ENABLED or requested not in ("auto", "tensorcore") or desc.xp != "cupy" or arch is None:
        return None
    if arch.cc != MEASURED_CC or arch.dram_bw >= MAX_DRAM_BW:
        return None
    if settings.config is not None or settings.decomposition is not None or settings.autotune:
        return None
    spec, why = decode_rule(desc, arch.sm_count)
    if spec is None:
        return None
    predicted = spec.weight_bytes / (STREAM_FRACTION * arch.dram_bw) + FIXED_S
    return Plan("tensorcore", why, None, "gemv", 1, (spec.ctas,), spec.workspace_bytes, predicted,
                "heuristic", arch, desc, (), launch=spec)


#: the token counts past the decode route where cuBLAS keeps x @ W.T: our tile kernels measured
#: 0.45-0.92x torch.matmul (cuBLAS) at 16 and 64 tokens on seven Llama-3-8B / Qwen2-7B
#: projections, steady, on every run of the corpus (H100: geomean 0.84-0.90 at 16 and 64 in
#: three runs; H200: 0.70-0.90 in three, as low as 0.45: bench/results/torch_callpath_h*_2026-11-2*),
#: where the model predicted ours faster (it prices their stream of the weight at the datasheet's
#: full rate; they reached 1.7-3.0 TB/s of the H200's 4.8, cuBLAS ~3.7)
CUBLAS_BAND_TOKENS = (MAX_TOKENS + 1, 64)


def cublas_band_reason(desc) -> str | None:
    """Why cuBLAS runs ``desc`` without the model's say, or None: a 16-bit x @ W.T (the weight
    K-contiguous, one problem, no epilogue) with :data:`CUBLAS_BAND_TOKENS` tokens and a weight
    of at least :data:`MIN_WEIGHT_BYTES` (the layers measured: smaller weights, which stay in
    L2, and the other orientation, where ours measured faster, keep the model's choice).

    >>> from pyblasgemm.planner.problem import make_desc
    >>> cublas_band_reason(make_desc(14336, 16, 4096, "bf16", transa="T")).startswith("16 tokens")
    True
    >>> cublas_band_reason(make_desc(14336, 4, 4096, "bf16", transa="T")) is None      # the decode route's
    True
    >>> cublas_band_reason(make_desc(16, 4096, 4096, "f16", transa="T")) is None       # the other orientation
    True
    """
    from ..kinds import base_compute

    if (desc.prefix, base_compute(desc.compute)) not in KINDS or desc.epilogue is not None \
            or desc.group is not None or desc.invariant or desc.batch != 1:
        return None
    lo, hi = CUBLAS_BAND_TOKENS
    m, n, k = desc.m, desc.n, desc.k
    if not (lo <= n <= hi < m) or desc.transa != "T":
        return None
    weight = m * k * desc.row.ab_dtype.itemsize
    if weight < MIN_WEIGHT_BYTES:
        return None
    return (f"{n} tokens x a {m} x {k} weight (x @ W.T): cuBLAS, measured faster than our tile "
            f"kernels at {lo}-{hi} tokens on the model layers (0.45-0.92x; planner/decode.py)")
