"""Launch our GEMM kernels for a :class:`KernelProblem`.

``supports(problem)`` says whether these kernels can run a problem at all (the backend routes
the rest to cuBLAS); ``run(problem, config=None, stream=None)`` picks ``default_config`` when
no config is given, validates, allocates workspace/flags from CuPy's pool on the stream, and
launches. Unaligned pointers or leading dimensions are supported through a scalar
(non-cp.async) operand path and scalar C stores; only element alignment is required.
"""
from __future__ import annotations

import numpy as np

from .config import DECOMPOSITIONS, FUSED_KINDS, KernelConfig, default_config  # noqa: F401 (FUSED_KINDS: re-exported)
from .driver import occupancy
from .geometry import launch_geometry
from .jit import get_kernels
from .mma_sync import BoundLaunch
from .spec import LaunchSpec, launch_spec, problem_class
from .problem import ACCUMULATE, KernelProblem

__all__ = ["run", "supports", "prepare", "PreparedLaunch", "launch_geometry", "bind", "BoundLaunch"]


def supports(problem: KernelProblem) -> tuple[bool, str]:
    """(ok, reason): can our kernels compute this problem (with some config)?"""
    p = problem
    if p.kind not in ACCUMULATE:
        return False, f"kind {p.kind!r} not in {tuple(ACCUMULATE)}"
    if p.acc not in ACCUMULATE[p.kind]:
        return False, f"accumulate {p.acc!r} not available for kind {p.kind!r}"
    if p.transa not in ("N", "T") or p.transb not in ("N", "T"):
        return False, f"transa/transb must be 'N' or 'T' (got {p.transa!r}, {p.transb!r})"
    if min(p.m, p.n, p.k, p.batch) < 1:
        return False, "m, n, k, batch must be >= 1 (degenerate shapes are answered above us)"
    if max(p.m, p.n, p.k) >= 2**31:
        return False, "m, n, k must be < 2^31"
    eb, cb = p.elem_bytes, p.c_bytes
    if p.a_ptr % eb or p.b_ptr % eb or p.c_ptr % cb:
        return False, "pointers must be aligned to their element size"
    rows_a = p.k if p.transa == "T" else p.m
    rows_b = p.n if p.transb == "T" else p.k
    if p.lda < rows_a or p.ldb < rows_b or p.ldc < p.m:
        return False, f"leading dimensions too small (lda={p.lda} ldb={p.ldb} ldc={p.ldc})"
    if p.kind == "s8" and not (isinstance(p.alpha, (int, np.integer)) and isinstance(p.beta, (int, np.integer))):
        return False, "s8 takes integer alpha and beta"
    return True, ""


def _device_info(dev):
    attrs = dev.attributes
    return attrs["MultiProcessorCount"], attrs.get("MaxSharedMemoryPerBlockOptin", 232448)


def _occupancy(kern, threads: int, smem: int) -> int:
    return occupancy(kern.kernel.ptr, threads, smem)


class PreparedLaunch:
    """A validated, compiled launch with its workspace: call it to enqueue the GEMM.

    Re-calling reuses the workspace (flags are re-zeroed each call), so calls on one stream
    are safe; calls on different streams concurrently are not (they would share workspace).
    """

    def __init__(self, problem, config, kern, red, geometry, smem):
        import cupy

        self.problem, self.config, self.kern, self.red, self.geometry, self.smem = (
            problem, config, kern, red, geometry, smem)
        p, g = problem, geometry
        self.ws = cupy.empty(g["ws_slots"] * config.bm * config.bn * 4, dtype=cupy.uint8) if g["ws_slots"] else None
        self.flags = cupy.empty(g["flags"], dtype=cupy.int32) if g["flags"] else None
        ws_ptr = self.ws.data.ptr if self.ws is not None else 0
        fl_ptr = self.flags.data.ptr if self.flags is not None else 0
        is_int = p.kind == "s8"
        falpha, fbeta = (0.0, 0.0) if is_int else (float(p.alpha), float(p.beta))
        ialpha, ibeta = (int(p.alpha), int(p.beta)) if is_int else (0, 0)
        i32, i64, f32, u64 = np.int32, np.int64, np.float32, np.uint64
        self.args = (u64(p.a_ptr), u64(p.b_ptr), u64(p.c_ptr), u64(ws_ptr), u64(fl_ptr),
                     i32(p.m), i32(p.n), i32(p.k), i64(p.lda), i64(p.ldb), i64(p.ldc),
                     i64(p.stride_a), i64(p.stride_b), i64(p.stride_c), i32(p.batch),
                     f32(falpha), f32(fbeta), i32(ialpha), i32(ibeta), i32(1 if p.c_vectorizable() else 0),
                     i32(config.group_m), i32(g["splits"]), i32(g["kt_per_split"]), i32(g["dp_tiles"]),
                     i32(g["sk_tiles"]), u64(0), u64(0), i32(0), u64(0), u64(0))  # no fused epilogue
        if config.decomposition == "splitk_parallel":
            nvec = g["tiles"] * config.bm * config.bn // 4
            self.red_grid = (-(-nvec // 256),)
            self.red_args = (u64(ws_ptr), u64(p.c_ptr), i32(p.m), i32(p.n), i64(p.ldc), i64(p.stride_c),
                             i32(p.batch), i32(g["splits"]), f32(falpha), f32(fbeta), i32(ialpha), i32(ibeta),
                             i32(config.group_m), u64(0), u64(0), i32(0), u64(0), u64(0))

    def __call__(self, stream=None):
        import cupy

        stream = stream if stream is not None else cupy.cuda.get_current_stream()
        with stream:
            if self.flags is not None:
                self.flags.fill(0)  # stream-ordered memset: zeroed before every launch
            self.kern(self.geometry["grid"], (self.config.threads,), self.args, shared_mem=self.smem)
            if self.red is not None:
                self.red(self.red_grid, (256,), self.red_args)


class _PreparedBound:
    """``PreparedLaunch``'s interface over a bound launch (the Hopper kernel): ``launch(stream)``
    runs the problem it was prepared with."""

    def __init__(self, bound, problem: KernelProblem):
        self.bound, self.problem = bound, problem
        self.config, self.geometry, self.smem = bound.config, bound.geometry, bound.smem

    def __call__(self, stream=None):
        p = self.problem
        self.bound(p.a_ptr, p.b_ptr, p.c_ptr, p.alpha, p.beta, stream)


def prepare(problem: KernelProblem, config: KernelConfig | None = None, stream=None, *,
            sm_count: int | None = None) -> PreparedLaunch:
    """Validate, pick/compile the kernel and allocate workspace; see :func:`run`.

    Example::

        launch = prepare(problem); launch(); launch()   # two launches, one set-up
    """
    import cupy

    ok, why = supports(problem)
    if not ok:
        raise ValueError(f"pyblasgemm kernels cannot run this problem: {why}")
    p = problem
    stream = stream if stream is not None else cupy.cuda.get_current_stream()
    dev = cupy.cuda.Device()
    dev_sms, max_smem = _device_info(dev)
    sm_count = min(sm_count, dev_sms) if sm_count else dev_sms  # never more CTAs than fit
    if config is None:
        config = default_config(p, sm_count)
    if not config.kernel_family.prepared_launch:
        return _PreparedBound(bind(p, config, sm_count=sm_count), p)
    if config.decomposition not in DECOMPOSITIONS:
        raise ValueError(f"unknown decomposition {config.decomposition!r}")
    ok, why = config.validate(p, max_smem=max_smem)
    if not ok:
        raise ValueError(f"config {config.name} is invalid for this problem: {why}")
    vec = p.operands_vectorizable()
    kern, red = get_kernels(config, p.kind, p.transa, p.transb, p.acc, vec)
    smem = config.smem_bytes(p.kind)
    occ = _occupancy(kern, config.threads, smem) if config.decomposition in ("streamk", "hybrid") else 1
    g = launch_geometry(p, config, sm_count, occ)
    with stream:
        return PreparedLaunch(p, config, kern, red, g, smem)


def run(problem: KernelProblem, config: KernelConfig | None = None, stream=None, *,
        sm_count: int | None = None) -> KernelConfig:
    """Compute ``problem`` on the GPU with our kernels; returns the config used.

    Picks :func:`default_config` when ``config`` is None; launches on ``stream`` (CuPy's
    current stream if None); workspace and flags come from CuPy's pool on that stream and go
    back to it after the launch (later work on the stream is ordered after the kernels).
    ``sm_count`` overrides the device's SM count in the grid arithmetic (tests use a small
    value to exercise the hybrid schedule's data-parallel waves on small problems).

    Raises ValueError (with the reason) when the problem is unsupported or a forced config
    is invalid for it; :class:`~pyblasgemm.kernels.jit.KernelCompileError` if NVRTC fails.

    Example::

        run(KernelProblem("f16", "N", "N", m, n, k, m, k, m, a.data.ptr, b.data.ptr, c.data.ptr))
    """
    launch = prepare(problem, config, stream, sm_count=sm_count)
    launch(stream)
    return launch.config


def bind(problem: KernelProblem, config: KernelConfig | None = None, *, sm_count: int | None = None,
         spec: LaunchSpec | None = None, epilogue: tuple = (0, None)) -> BoundLaunch:
    """A new :class:`BoundLaunch` for ``problem``'s class on the current device (not cached
    here: :func:`pyblasgemm.execute.launch_for` keeps the one launch of a plan, under one key of
    the plan cache, so that evicting it frees its workspace).

    Only the problem's class matters (:func:`~pyblasgemm.kernels.spec.problem_class`: shape,
    layout, leading dimensions, batch strides, kind/accumulate, the alignment class of its
    pointers); its pointer values, alpha and beta are passed per call. ``spec``: the plan's
    :class:`~pyblasgemm.kernels.spec.LaunchSpec`, launched as it is (ValueError when it is for
    another class, config or SM count), except where the device fits fewer co-resident CTAs
    than it assumed (see :mod:`~pyblasgemm.kernels.spec`); without one, ``config`` (or
    :func:`default_config`) is made into a spec here. Raises ValueError as :func:`prepare`
    does.

    ``epilogue``: (EPI, bias axis) of a fused epilogue (:func:`~pyblasgemm.kernels.jit.epilogue_code`;
    bias along ``'m'``, ``'n'`` or None) where :func:`fusable` allows it; the launch then takes
    ``bias=`` and ``pre=`` pointers per call (and ``scale_m=`` / ``scale_n=`` when it dequantizes
    an int8 product: mma.sync configs).

    Example::

        bl = bind(KernelProblem("f16", "N", "N", m, n, k, m, k, m, a.data.ptr, b.data.ptr, c.data.ptr))
        bl(a.data.ptr, b.data.ptr, c.data.ptr, 1.0, 0.0)        # ~µs of host time per call
    """
    from cupy.cuda import runtime

    dev_id = runtime.getDevice()
    cls = problem_class(problem)
    if spec is not None:
        if config is not None and config != spec.config:
            raise ValueError(f"bind: config {config.name} differs from the spec's {spec.config.name}")
        if spec.problem_class != cls:
            raise ValueError(f"bind: the spec is for problem class {spec.problem_class}, not {cls}")
        config = spec.config
    ok, why = supports(problem)
    if not ok:
        raise ValueError(f"pyblasgemm kernels cannot run this problem: {why}")
    import cupy

    dev = cupy.cuda.Device(dev_id)
    dev_sms, max_smem = _device_info(dev)
    sms = min(sm_count, dev_sms) if sm_count else dev_sms
    if spec is not None and spec.sm_count != sms:
        raise ValueError(f"bind: the spec was planned for {spec.sm_count} SMs, this launch has {sms}")
    cfg = config if config is not None else default_config(problem, sms)
    if cfg.decomposition not in DECOMPOSITIONS:
        raise ValueError(f"unknown decomposition {cfg.decomposition!r}")
    ok, why = cfg.validate(problem, max_smem=max_smem)
    if not ok:
        raise ValueError(f"config {cfg.name} is invalid for this problem: {why}")
    from .jit import EPI_DEQUANT, EPI_RESIDUE, residue_store_fits

    if epilogue[0] == EPI_RESIDUE:
        if not residue_store_fits(cfg, problem.kind):
            raise ValueError(f"bind: {cfg.name} ({problem.kind}) has no Ozaki digit store: see "
                             f"kernels.jit.residue_store_fits")
    elif epilogue[0] and not fusable(problem.kind, cfg, dequantize=bool(epilogue[0] & EPI_DEQUANT)):
        raise ValueError(f"bind: {cfg.name} ({problem.kind}) takes no fused epilogue: see "
                         f"kernels.launch.fusable")
    kern, red = get_kernels(cfg, problem.kind, problem.transa, problem.transb, problem.acc,
                            problem.operands_vectorizable(), epi=epilogue[0])
    family = cfg.kernel_family
    if family.ctas_per_sm is None and cfg.decomposition in ("streamk", "hybrid"):
        # stream-k CTAs wait on each other: every CTA of the grid must be resident at once
        occ = _occupancy(kern, cfg.threads, cfg.smem_bytes(problem.kind))
        if spec is None or spec.occupancy > occ:
            spec = launch_spec(problem, cfg, sms, occ)
    # a family with a fixed ctas_per_sm (the Hopper kernel: one; its ring takes most of shared
    # memory) runs a persistent grid of at most that many CTAs per SM whatever is passed here
    spec = spec or launch_spec(problem, cfg, sms, 1)
    return family.bound_launch(problem, spec, kern, red, dev_id, epilogue)


def fusable(kind: str, config: KernelConfig, dequantize: bool = False) -> bool:
    """Whether ``config`` runs a fused epilogue for ``kind`` (its family's rule,
    ``KernelFamily.fusable``): every mma.sync config of a kind
    of :data:`FUSED_KINDS` (the store is staged through shared memory: the epilogue adds no
    registers to the mainloop's; CI compiles the fused variants spill-free), and with
    ``dequantize`` its s8 configs (an int8 product scaled to float); a Hopper config with wgmma
    consumers on a kind of :data:`FUSED_KINDS`, or with ``dequantize`` on s8, except stream-k /
    hybrid on 256-wide tiles (their fused variants spill 12-300 bytes per thread: ptxas, 128
    accumulators beside the stream-k walker's state).

    >>> from pyblasgemm.kernels.config import SHIPPED_CONFIGS, SM90_CONFIGS_BY_TILE
    >>> fusable("f16", SM90_CONFIGS_BY_TILE["f16"][256]), fusable("s8", SM90_CONFIGS_BY_TILE["s8"][256])
    (True, False)
    >>> fusable("s8", SM90_CONFIGS_BY_TILE["s8"][256], dequantize=True)
    True
    >>> fusable("s8", SHIPPED_CONFIGS["s8"][0], dequantize=True), fusable("bf16", SHIPPED_CONFIGS["bf16"][0])
    (True, True)
    """
    return config.kernel_family.fusable(kind, config, dequantize)
