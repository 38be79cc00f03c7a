"""Launch our GEMM kernels for a :class:`KernelProblem`.

``supports(problem)`` says whether these kernels can run a problem at all (the backend routes
the rest to cuBLAS); ``run(problem, config=None, stream=None)`` picks ``default_config`` when
no config is given, validates, allocates workspace/flags from CuPy's pool on the stream, and
launches. Unaligned pointers or leading dimensions are supported through a scalar
(non-cp.async) operand path and scalar C stores; only element alignment is required.
"""
from __future__ import annotations

import numpy as np

from .config import DECOMPOSITIONS, SM90_PREP_KINDS, KernelConfig, default_config, sm90_prep_shape
from .driver import _driver, _runtime, set_scales, stream_handle
from .jit import get_kernels, get_prep_kernel
from .problem import ACCUMULATE, KernelProblem
from ..plancache import get_plan_cache

__all__ = ["run", "supports", "prepare", "PreparedLaunch", "launch_geometry", "bind", "BoundLaunch",
           "clear_bind_cache"]


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


def launch_geometry(problem: KernelProblem, config: KernelConfig, sm_count: int, occupancy: int = 1) -> dict:
    """Grid and runtime parameters for ``config`` on ``problem`` (pure arithmetic, no GPU).

    ``ws_bytes`` is the workspace the launch needs. The Hopper kernel (``config.family ==
    'sm90a'``) runs a persistent grid of at most ``sm_count`` CTAs for every decomposition; its
    split-k partials are whole fp32/s32 matrices, one per split. Its fp32 kinds run the
    prepared "TN" problem (K tripled for 3xTF32): geometry of that, ``prep_bytes`` of prepared
    operands added to ``ws_bytes``.
    """
    if config.is_sm90 and problem.kind in SM90_PREP_KINDS:
        from .sm90 import prepared_problem

        g = _launch_geometry(prepared_problem(problem), config, sm_count, occupancy)
        g["prep_bytes"] = sm90_prep_shape(problem)[2]
        g["ws_bytes"] += g["prep_bytes"]
        return g
    return _launch_geometry(problem, config, sm_count, occupancy)


def _launch_geometry(problem: KernelProblem, config: KernelConfig, sm_count: int, occupancy: int) -> dict:
    g = _geometry(problem, config, sm_count, 1 if config.is_sm90 else occupancy)
    p, c = problem, config
    if c.is_sm90:
        if c.decomposition == "sliced" and c.cluster > 1:
            # units of `cluster` tile rows along n (the pair shares its m-side operand)
            units = -(-(-(-p.n // c.bn)) // c.cluster) * -(-p.m // c.bm) * p.batch
            # at least one cluster, even when a test's sm_count override is below its size
            g.update(grid=(c.cluster * max(1, min(units, sm_count // c.cluster)), 1, 1))
        elif c.decomposition == "sliced":
            g.update(grid=(min(g["tiles"], sm_count), 1, 1))
        elif c.decomposition == "splitk_parallel":
            g.update(grid=(min(g["tiles"] * g["splits"], sm_count), 1, 1), ws_slots=0)
            g["ws_bytes"] = g["splits"] * p.batch * p.m * p.n * 4
            return g
    g["ws_bytes"] = g["ws_slots"] * c.bm * c.bn * 4
    return g


def _geometry(problem: KernelProblem, config: KernelConfig, sm_count: int, occupancy: int) -> dict:
    p, c = problem, config
    tiles_m, tiles_n = -(-p.m // c.bm), -(-p.n // c.bn)
    tpb = tiles_m * tiles_n
    tiles = tpb * p.batch
    kt = -(-p.k // c.bk)
    g = dict(grid=(tpb, 1, p.batch), splits=1, kt_per_split=kt, dp_tiles=0, sk_tiles=0,
             ws_slots=0, flags=0, tiles=tiles, kt=kt)
    d = c.decomposition
    if d.startswith("splitk"):
        splits = c.splits or max(2, min(kt // 4 if kt >= 8 else kt, -(-sm_count // tiles)))
        splits = max(1, min(splits, kt))
        kps = -(-kt // splits)
        splits = -(-kt // kps)  # no empty splits
        g.update(grid=(tpb, splits, p.batch), splits=splits, kt_per_split=kps)
        if d == "splitk_serial":
            g.update(ws_slots=tiles, flags=tiles)
        else:
            g.update(ws_slots=tiles * splits)
    elif d in ("streamk", "hybrid"):
        G = max(1, sm_count * max(1, occupancy))
        if d == "hybrid":
            rem = tiles % G
            sk = 0 if rem == 0 else (rem + G if tiles >= 2 * G else tiles)
        else:
            sk = tiles
        dp = tiles - sk
        # every stream-k CTA needs >= 1 MAC iteration (the owner waits on each in between)
        ctas = G if sk == 0 else min(G, sk * kt)
        if dp and ctas < G:
            ctas = G
        if dp % ctas:
            # data-parallel tiles must be a whole number of waves of this grid
            sk, dp = tiles, 0
            ctas = min(G, sk * kt)
        g.update(grid=(ctas, 1, 1), dp_tiles=dp, sk_tiles=sk, ws_slots=ctas, flags=ctas)
    return g


def _occupancy(kern, threads: int, smem: int) -> int:
    try:
        from cupy_backends.cuda.api import driver

        return max(1, driver.occupancyMaxActiveBlocksPerMultiprocessor(kern.kernel.ptr, threads, smem))
    except Exception:  # pragma: no cover - older CuPy: one CTA per SM is always co-resident
        return 1


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
                     i32(g["sk_tiles"]))
        if config.decomposition == "splitk_parallel":
            nvec = g["tiles"] * config.bm * config.bn // 4
            self.red_grid = (-(-nvec // 256),)
            self.red_args = (u64(ws_ptr), u64(p.c_ptr), i32(p.m), i32(p.n), i64(p.ldc), i64(p.stride_c),
                             i32(p.batch), i32(g["splits"]), f32(falpha), f32(fbeta), i32(ialpha), i32(ibeta),
                             i32(config.group_m))

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
    if config.is_sm90:
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


# ---------------------------------------------------------------------------------------------
# Fast per-call path: bind once per (device, shape/layout/alignment class, config), then call
# with fresh pointers. The call packs the changed arguments into a ctypes buffer that is handed
# straight to cuLaunchKernel (no per-argument type dispatch).

_ARG_TYPES = None


def _arg_ctypes():
    import ctypes as ct

    # (name, ctype) in the order of gemm_kernel's parameters.
    return [("a", ct.c_uint64), ("b", ct.c_uint64), ("c", ct.c_uint64), ("ws", ct.c_uint64), ("flags", ct.c_uint64),
            ("m", ct.c_int32), ("n", ct.c_int32), ("k", ct.c_int32), ("lda", ct.c_int64), ("ldb", ct.c_int64),
            ("ldc", ct.c_int64), ("sa", ct.c_int64), ("sb", ct.c_int64), ("sc", ct.c_int64), ("batch", ct.c_int32),
            ("alpha", ct.c_float), ("beta", ct.c_float), ("ialpha", ct.c_int32), ("ibeta", ct.c_int32),
            ("c_vec", ct.c_int32), ("group_m", ct.c_int32), ("splits", ct.c_int32), ("kt_per_split", ct.c_int32),
            ("dp_tiles", ct.c_int32), ("sk_tiles", ct.c_int32)]


def _red_ctypes():
    import ctypes as ct

    return [("ws", ct.c_uint64), ("c", ct.c_uint64), ("m", ct.c_int32), ("n", ct.c_int32), ("ldc", ct.c_int64),
            ("sc", ct.c_int64), ("batch", ct.c_int32), ("splits", ct.c_int32), ("alpha", ct.c_float),
            ("beta", ct.c_float), ("ialpha", ct.c_int32), ("ibeta", ct.c_int32), ("group_m", ct.c_int32)]


class _ArgPack:
    """Kernel arguments as ctypes storage plus the void* array cuLaunchKernel reads."""

    def __init__(self, fields, values):
        import ctypes as ct

        self.cells = {}
        for name, typ in fields:
            self.cells[name] = typ(values[name])
        self.ptrs = (ct.c_void_p * len(fields))(*[ct.addressof(self.cells[n]) for n, _ in fields])
        self.addr = ct.addressof(self.ptrs)


class BoundLaunch:
    """A compiled, validated launch of one problem class; call it with the operand pointers.

    ``bl(a_ptr, b_ptr, c_ptr, alpha=1.0, beta=0.0, stream=None)`` enqueues
    ``C = alpha * op(A) op(B) + beta * C`` on ``stream`` (a CuPy stream, a raw ``cudaStream_t``
    int, or None for CuPy's current stream). The pointers must be in the alignment class the
    launch was bound for (``a_align``/``b_align``/``c_align`` bytes; ValueError otherwise).
    Workspace and flags (split-k, stream-k) are owned by the BoundLaunch, one set per stream:
    back-to-back calls on one stream are ordered by the stream; calls on different streams
    use different workspace. Flags are zeroed with a stream-ordered memset before each launch.
    """

    __slots__ = ("problem", "config", "geometry", "smem", "kern", "red", "_fptr", "_rptr", "_grid", "_block",
                 "_rgrid", "_int", "_amask", "_cmask", "_ws", "_fields", "_rfields", "_base", "_rbase",
                 "_dev", "a_align", "b_align", "c_align", "_last", "_launch", "__weakref__")

    def __init__(self, problem: KernelProblem, config: KernelConfig, kern, red, geometry: dict, smem: int, dev: int):
        self.problem, self.config, self.geometry, self.smem, self.kern, self.red = (
            problem, config, geometry, smem, kern, red)
        self._dev = dev
        self._fptr = kern.kernel.ptr
        self._rptr = red.kernel.ptr if red is not None else 0
        self._grid = tuple(int(x) for x in geometry["grid"])
        self._block = config.threads
        p, g = problem, geometry
        self._int = p.kind == "s8"
        vec, cvec = p.operands_vectorizable(), p.c_vectorizable()
        self.a_align = self.b_align = 16 if vec else p.elem_bytes
        self.c_align = 16 if cvec else p.c_bytes
        self._amask = self.a_align - 1
        self._cmask = self.c_align - 1
        self._fields = _arg_ctypes()
        self._base = dict(a=0, b=0, c=0, ws=0, flags=0, m=p.m, n=p.n, k=p.k, lda=p.lda, ldb=p.ldb, ldc=p.ldc,
                          sa=p.stride_a, sb=p.stride_b, sc=p.stride_c, batch=p.batch, alpha=0.0, beta=0.0,
                          ialpha=0, ibeta=0, c_vec=1 if cvec else 0, group_m=config.group_m,
                          splits=g["splits"], kt_per_split=g["kt_per_split"], dp_tiles=g["dp_tiles"],
                          sk_tiles=g["sk_tiles"])
        if config.decomposition == "splitk_parallel":
            nvec = g["tiles"] * config.bm * config.bn // 4
            self._rgrid = -(-nvec // 256)
            self._rfields = _red_ctypes()
            self._rbase = dict(ws=0, c=0, m=p.m, n=p.n, ldc=p.ldc, sc=p.stride_c, batch=p.batch,
                               splits=g["splits"], alpha=0.0, beta=0.0, ialpha=0, ibeta=0, group_m=config.group_m)
        else:
            self._rgrid, self._rfields, self._rbase = 0, None, None
        self._ws = {}  # stream handle -> (ws array, flags array, flags bytes, gemm pack, reduce pack)
        self._last = None
        self._launch = _driver().launchKernel

    @property
    def workspace_nbytes(self) -> int:
        """GPU bytes of workspace and flags this launch owns, over all streams it ran on."""
        return sum((s[0].nbytes if s[0] is not None else 0) + (s[1].nbytes if s[1] is not None else 0)
                   for s in self._ws.values())

    def _slot(self, sptr: int):
        """Per-stream workspace and argument buffers (created on first use of that stream)."""
        import cupy

        g, c = self.geometry, self.config
        with cupy.cuda.Device(self._dev):
            ws = cupy.empty(g["ws_slots"] * c.bm * c.bn * 4, dtype=cupy.uint8) if g["ws_slots"] else None
            fl = cupy.zeros(g["flags"], dtype=cupy.int32) if g["flags"] else None
        vals = dict(self._base, ws=ws.data.ptr if ws is not None else 0, flags=fl.data.ptr if fl is not None else 0)
        pack = _ArgPack(self._fields, vals)
        rpack = None
        if self._rfields is not None:
            rpack = _ArgPack(self._rfields, dict(self._rbase, ws=vals["ws"]))
        # [10]: the scales last written into the cells (a NaN pair compares unequal to any)
        slot = (ws, fl, fl.data.ptr if fl is not None else 0, 4 * g["flags"], pack.cells, pack.addr,
                rpack.cells if rpack else None, rpack.addr if rpack else 0, pack, rpack,
                [(float("nan"), float("nan"))])
        self._ws[sptr] = slot
        return slot

    def __call__(self, a_ptr: int, b_ptr: int, c_ptr: int, alpha=1.0, beta=0.0, stream=None) -> None:
        sptr = stream if type(stream) is int else stream_handle(stream)
        last = self._last
        if last is not None and last[0] == sptr:
            slot = last[1]
        else:
            slot = self._ws.get(sptr)
            if slot is None:
                slot = self._slot(sptr)
            self._last = (sptr, slot)
        if (a_ptr | b_ptr) & self._amask or c_ptr & self._cmask:
            raise ValueError(f"pointers 0x{a_ptr:x}, 0x{b_ptr:x}, 0x{c_ptr:x} are outside the bound alignment class "
                             f"(A/B {self.a_align} B, C {self.c_align} B): bind() again for them")
        cells = slot[4]
        cells["a"].value = a_ptr
        cells["b"].value = b_ptr
        cells["c"].value = c_ptr
        scales = (alpha, beta)
        if scales != slot[10][0]:      # the cells keep the last scales: (1, 0) is written once
            set_scales(cells, self._int, alpha, beta)
            slot[10][0] = scales
        if slot[2]:
            _runtime().memsetAsync(slot[2], 0, slot[3], sptr)
        gx, gy, gz = self._grid
        self._launch(self._fptr, gx, gy, gz, self._block, 1, 1, self.smem, sptr, slot[5], 0)
        if self._rptr:
            rc = slot[6]
            rc["c"].value = c_ptr
            set_scales(rc, self._int, alpha, beta)
            self._launch(self._rptr, self._rgrid, 1, 1, 256, 1, 1, 0, sptr, slot[7], 0)


_cache = get_plan_cache()


def _bind_key(p: KernelProblem, config, sm_count, dev_id):
    return ("bind", dev_id, p.kind, p.acc, p.transa, p.transb, p.m, p.n, p.k, p.lda, p.ldb, p.ldc, p.batch, p.stride_a,
            p.stride_b, p.stride_c, p.operands_vectorizable(), p.c_vectorizable(), config, sm_count)


def bind(problem: KernelProblem, config: KernelConfig | None = None, *, sm_count: int | None = None) -> BoundLaunch:
    """A cached :class:`BoundLaunch` for ``problem``'s class on the current device.

    Only the problem's shape, layout, leading dimensions, batch strides, kind/accumulate and
    the *alignment class* of its pointers (16-byte vectorizable or not, for A/B and for C)
    matter; its pointer values, alpha and beta are ignored (they are passed per call).
    Cached per (device, that class, config, sm_count); ``config=None`` picks
    :func:`default_config`. Raises ValueError as :func:`prepare` does.

    Example::

        bl = bind(KernelProblem("f16", "N", "N", m, n, k, m, k, m, a.data.ptr, b.data.ptr, c.data.ptr))
        bl(a.data.ptr, b.data.ptr, c.data.ptr, 1.0, 0.0)        # ~µs of host time per call
    """
    from cupy.cuda import runtime

    dev_id = runtime.getDevice()
    key = _bind_key(problem, config, sm_count, dev_id)
    bl = _cache.get(key)
    if bl is not None:
        return bl
    ok, why = supports(problem)
    if not ok:
        raise ValueError(f"pyblasgemm kernels cannot run this problem: {why}")
    import cupy

    dev = cupy.cuda.Device(dev_id)
    dev_sms, max_smem = _device_info(dev)
    sms = min(sm_count, dev_sms) if sm_count else dev_sms
    cfg = config if config is not None else default_config(problem, sms)
    if cfg.decomposition not in DECOMPOSITIONS:
        raise ValueError(f"unknown decomposition {cfg.decomposition!r}")
    ok, why = cfg.validate(problem, max_smem=max_smem)
    if not ok:
        raise ValueError(f"config {cfg.name} is invalid for this problem: {why}")
    kern, red = get_kernels(cfg, problem.kind, problem.transa, problem.transb, problem.acc,
                            problem.operands_vectorizable())
    smem = cfg.smem_bytes(problem.kind)
    if cfg.is_sm90:
        from .sm90 import Sm90Launch, Sm90PrepLaunch

        # one CTA per SM (the ring takes most of shared memory): the persistent grid is <= SMs
        g = launch_geometry(problem, cfg, sms, 1)
        if problem.kind in SM90_PREP_KINDS:
            prep = get_prep_kernel(cfg, problem.kind, problem.transa, problem.transb)
            bl = Sm90PrepLaunch(problem, cfg, kern, red, prep, g, smem, dev_id)
        else:
            bl = Sm90Launch(problem, cfg, kern, red, g, smem, dev_id)
        _cache.put(key, bl)
        return bl
    occ = _occupancy(kern, cfg.threads, smem) if cfg.decomposition in ("streamk", "hybrid") else 1
    g = launch_geometry(problem, cfg, sms, occ)
    bl = BoundLaunch(problem, cfg, kern, red, g, smem, dev_id)
    _cache.put(key, bl)
    return bl


def clear_bind_cache() -> None:
    """Drop every cached BoundLaunch (and with them their workspace) from the plan cache."""
    _cache.discard_where(lambda k: k[0] == "bind")
