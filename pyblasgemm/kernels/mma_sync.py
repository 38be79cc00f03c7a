"""The mma.sync kernels' launcher: a :class:`BoundLaunch` is one compiled, validated problem
class whose call refills three pointers (and the scales when they change) in a pre-packed
argument block handed straight to ``cuLaunchKernelEx`` with a launch config made once per
stream; :meth:`BoundLaunch.replay` is that call as a call-signature replay makes it. (The Hopper
kernels' launchers are in
:mod:`~pyblasgemm.kernels.sm90`; :func:`~pyblasgemm.kernels.launch.bind` makes either.)"""
from __future__ import annotations

import threading

from .config import KernelConfig
from .driver import (bindings, device_pointer, function, launch_config, launch_kernel, memset_words_async,
                     recover, set_scales, stream, stream_handle)
from .problem import KernelProblem

__all__ = ["BoundLaunch", "kernel_args"]


# ---------------------------------------------------------------------------------------------
# Fast per-call path: bind once per (device, shape/layout/alignment class, config), then call
# with fresh pointers. The call packs the changed arguments into a ctypes buffer that is handed
# straight to cuLaunchKernel (no per-argument type dispatch).

def _arg_ctypes():
    import ctypes as ct

    # (name, ctype) in the order of gemm_kernel's parameters.
    return [("a", ct.c_uint64), ("b", ct.c_uint64), ("c", ct.c_uint64), ("ws", ct.c_uint64), ("flags", ct.c_uint64),
            ("m", ct.c_int32), ("n", ct.c_int32), ("k", ct.c_int32), ("lda", ct.c_int64), ("ldb", ct.c_int64),
            ("ldc", ct.c_int64), ("sa", ct.c_int64), ("sb", ct.c_int64), ("sc", ct.c_int64), ("batch", ct.c_int32),
            ("alpha", ct.c_float), ("beta", ct.c_float), ("ialpha", ct.c_int32), ("ibeta", ct.c_int32),
            ("c_vec", ct.c_int32), ("group_m", ct.c_int32), ("splits", ct.c_int32), ("kt_per_split", ct.c_int32),
            ("dp_tiles", ct.c_int32), ("sk_tiles", ct.c_int32)] + _epi_ctypes()


def _epi_ctypes():
    """The fused epilogue's parameters, last in both kernels (0 / null: none)."""
    import ctypes as ct

    return [("bias", ct.c_uint64), ("pre", ct.c_uint64), ("bias_mode", ct.c_int32), ("scale_m", ct.c_uint64),
            ("scale_n", ct.c_uint64)]


#: bias_mode of the fused epilogue (epilogue/sm80_smem_epilogue.cuh): one value per C row
#: (the description's m index), or per C column (n)
BIAS_MODE = {None: 0, "m": 1, "n": 2}


def _red_ctypes():
    import ctypes as ct

    return [("ws", ct.c_uint64), ("c", ct.c_uint64), ("m", ct.c_int32), ("n", ct.c_int32), ("ldc", ct.c_int64),
            ("sc", ct.c_int64), ("batch", ct.c_int32), ("splits", ct.c_int32), ("alpha", ct.c_float),
            ("beta", ct.c_float), ("ialpha", ct.c_int32), ("ibeta", ct.c_int32), ("group_m", ct.c_int32)] + _epi_ctypes()


def kernel_args(p: KernelProblem, config: KernelConfig, g: dict):
    """(GEMM kernel argument values, split-k reduce kernel's or None) of ``config`` on ``p``
    with geometry ``g``: everything but the pointers and the scales (left 0), in the names of
    :func:`_arg_ctypes` / :func:`_red_ctypes`. Pure; the plan's
    :class:`~pyblasgemm.kernels.spec.LaunchSpec` holds the result."""
    args = dict(a=0, b=0, c=0, ws=0, flags=0, m=p.m, n=p.n, k=p.k, lda=p.lda, ldb=p.ldb, ldc=p.ldc,
                sa=p.stride_a, sb=p.stride_b, sc=p.stride_c, batch=p.batch, alpha=0.0, beta=0.0,
                ialpha=0, ibeta=0, c_vec=1 if p.c_vectorizable() else 0, group_m=config.group_m,
                splits=g["splits"], kt_per_split=g["kt_per_split"], dp_tiles=g["dp_tiles"],
                sk_tiles=g["sk_tiles"], bias=0, pre=0, bias_mode=0, scale_m=0, scale_n=0)
    red = None
    if config.decomposition == "splitk_parallel":
        red = dict(ws=0, c=0, m=p.m, n=p.n, ldc=p.ldc, sc=p.stride_c, batch=p.batch,
                   splits=g["splits"], alpha=0.0, beta=0.0, ialpha=0, ibeta=0,
                   group_m=config.group_m, bias=0, pre=0, bias_mode=0, scale_m=0, scale_n=0)
    return args, red


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

    __slots__ = ("_lock", "problem", "spec", "config", "geometry", "smem", "kern", "red", "_fptr", "_rptr", "_grid", "_block",
                 "_rgrid", "_int", "_amask", "_cmask", "_ws", "_fields", "_rfields", "_base", "_rbase",
                 "_dev", "a_align", "b_align", "c_align", "_last", "epilogue", "_fused", "_dequant",
                 "__weakref__")

    def __init__(self, problem: KernelProblem, spec, kern, red, dev: int, epilogue: tuple = (0, None)):
        # calls from several threads take turns: the per-stream argument cells (and prepared
        # operands) are filled and the kernels launched under it (cuLaunchKernel copies the values)
        self._lock = threading.Lock()
        config, geometry = spec.config, dict(spec.geometry)
        self.problem, self.spec, self.config, self.geometry, self.smem, self.kern, self.red = (
            problem, spec, config, geometry, spec.smem, kern, red)
        self._dev = dev
        # driver handles made once: cuda.bindings converts a bare int on every call
        self._fptr = function(kern.kernel.ptr)
        self._rptr = function(red.kernel.ptr) if red is not None else None
        self._grid = tuple(int(x) for x in geometry["grid"])
        self._block = config.threads
        p = problem
        from .jit import EPI_DEQUANT

        self.epilogue = epilogue
        self._fused = bool(epilogue[0])
        self._dequant = bool(epilogue[0] & EPI_DEQUANT)
        self._int = p.kind == "s8" and not self._dequant     # a dequantized product takes float scales
        vec, cvec = p.operands_vectorizable(), p.c_vectorizable()
        self.a_align = self.b_align = 16 if vec else p.elem_bytes
        self.c_align = 16 if cvec else p.c_bytes
        self._amask = self.a_align - 1
        self._cmask = self.c_align - 1
        self._fields = _arg_ctypes()
        self._base = dict(spec.args, bias_mode=BIAS_MODE[epilogue[1]])   # all but pointers and scales
        if self._dequant:
            self.c_align, self._cmask = 16, 15
        if spec.red_args is not None:
            nvec = geometry["tiles"] * config.bm * config.bn // 4
            self._rgrid = -(-nvec // 256)
            self._rfields = _red_ctypes()
            self._rbase = dict(spec.red_args, bias_mode=BIAS_MODE[epilogue[1]])
        else:
            self._rgrid, self._rfields, self._rbase = 0, None, None
        self._ws = {}  # stream handle -> (ws array, flags array, flags bytes, gemm pack, reduce pack)
        self._last = None

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
        # [2], [3]: the flags' CUdeviceptr (None: no flags) and 32-bit words; [10]: the scales
        # last written into the cells (a NaN pair compares unequal to any); [11]: the CUstream
        slot = (ws, fl, device_pointer(fl.data.ptr) if fl is not None else None, g["flags"], pack.cells,
                pack.addr, rpack.cells if rpack else None, rpack.addr if rpack else 0, pack, rpack,
                [(float("nan"), float("nan"))], stream(sptr))
        # [12]: the GEMM's CUlaunchConfig on this stream, [13]: cuLaunchKernelEx
        slot += (launch_config(self._grid, (self._block, 1, 1), self.smem, slot[11]),
                 bindings().cuLaunchKernelEx)
        self._ws[sptr] = slot
        return slot

    def replay(self, swap: bool = False):
        """This launch as a call-signature replay calls it (:func:`pyblasgemm.calls.ordered`):
        ``run(pa, pb, pc, alpha, beta, stream)``, ``stream`` a raw handle, the operand pointers
        in the caller's order (``swap``: the problem runs as Cᵀ = op(B)ᵀ op(A)ᵀ, so the
        kernel's A is ``pb``: the two cells are bound the other way round, no reordering call).
        A plain function holding everything it reads, so a replay is one Python call and one
        driver call. None where the launch is more than one kernel on three pointers (a fused
        epilogue, stream-k flags, a split-k reduce): the replay calls the launch itself.

        The caller has proved the pointers' alignment class, which ``run`` does not check again
        (``__call__`` does): a signature key holds it (``calls.key``'s ``align & 15``: the OR of
        the pointers, from which the bound class was read, and a fresh result's ``c_mask``),
        and :class:`pyblasgemm.Matmul` checks its pointers against the launch's ``a_align`` /
        ``c_align``. (The check cost 0.06-0.11 µs a call: pointers are multi-digit ints.)

        (2-core dev host, bench/replay_host.py with its stand-in libcuda, medians of 4 processes,
        Python 3.11: 0.66 µs a call with the check, the driver call included, against 1.03 µs
        for ``swapped`` calling ``__call__`` with cuLaunchKernel behind ``launch_kernel``, and
        0.81 µs for the tree before the public bindings, 25a6ec1, whose CuPy-internal launch
        costs 0.2 µs less.)

        Example::

            run = bound.replay(swap=True)
            run(a.data.ptr, b.data.ptr, c.data.ptr, 1.0, 0.0, cupy.cuda.get_current_stream().ptr)
        """
        if self._fused or self._rptr is not None or self.geometry["flags"]:
            return None
        lock, is_int, dev, fn = self._lock, self._int, self._dev, self._fptr
        first, second = ("b", "a") if swap else ("a", "b")
        # stream handle -> (first, second and C cells, cells, scales memo, config, params, launch)
        fast: dict = {}

        def run(pa, pb, pc, alpha, beta, stream):
            lock.acquire()      # (against ``with``: 0.05 µs a call)
            try:
                f = fast.get(stream)
                if f is None:
                    slot = self._ws.get(stream) or self._slot(stream)
                    cells = slot[4]
                    f = fast[stream] = (cells[first], cells[second], cells["c"], cells, slot[10], slot[12],
                                        slot[5], slot[13])
                ca, cb, cc, cells, scales, cfg, params, launch = f
                ca.value = pa
                cb.value = pb
                cc.value = pc
                if scales[0] != (alpha, beta):      # the cells keep the last scales (as __call__'s)
                    set_scales(cells, is_int, alpha, beta)
                    scales[0] = (alpha, beta)
                err, = launch(cfg, fn, params, 0)
                if err:
                    recover(err, dev, "cuLaunchKernelEx", launch, cfg, fn, params, 0)
            finally:
                lock.release()

        return run

    def __call__(self, a_ptr: int, b_ptr: int, c_ptr: int, alpha=1.0, beta=0.0, stream=None, bias: int = 0,
                 pre: int = 0, scale_m: int = 0, scale_n: int = 0) -> None:
        with self._lock:   # one caller at a time: the cells are shared (see __init__)
            if (bias or pre or scale_m or scale_n) and not self._fused:
                raise ValueError("bias= / pre= / scale_m= / scale_n= need a launch bound with a fused epilogue")
            if self._dequant and not (scale_m and scale_n):
                raise ValueError("a dequantizing launch needs scale_m= and scale_n= pointers")
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
            if self._fused:
                cells["bias"].value, cells["pre"].value = bias, pre
                cells["scale_m"].value, cells["scale_n"].value = scale_m, scale_n
            scales = (alpha, beta)
            if scales != slot[10][0]:      # the cells keep the last scales: (1, 0) is written once
                set_scales(cells, self._int, alpha, beta)
                slot[10][0] = scales
            cs = slot[11]
            if slot[2] is not None:
                memset_words_async(self._dev, slot[2], slot[3], cs)
            launch = slot[13]
            err, = launch(slot[12], self._fptr, slot[5], 0)
            if err:
                recover(err, self._dev, "cuLaunchKernelEx", launch, slot[12], self._fptr, slot[5], 0)
            if self._rptr is not None:
                rc = slot[6]
                rc["c"].value = c_ptr
                if self._fused:
                    rc["bias"].value, rc["pre"].value = bias, pre
                    rc["scale_m"].value, rc["scale_n"].value = scale_m, scale_n
                set_scales(rc, self._int, alpha, beta)
                launch_kernel(self._dev, self._rptr, self._rgrid, 1, 1, 256, 1, 1, 0, cs, slot[7])
