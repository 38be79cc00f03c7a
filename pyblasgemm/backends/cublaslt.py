"""The cuBLAS route's launch: ``cublasLtMatmul`` with everything but pointers built once.

Why cuBLASLt and not ``cublasGemmEx``: on an H100 host a bare ``cublasGemmEx`` through CuPy's
binding costs 13.6 µs per call (its algorithm heuristic runs every call) against 17.3 µs for
the whole of ``torch.matmul(out=)`` (bench/results/host_primitives_h100_2026-11-24.json), so no
form built on it could be 0.8x torch's. cuBLASLt splits the heuristic from the call: the
matmul descriptor, the four matrix layouts and the chosen algorithm are made once per problem
class (a :class:`LtLaunch`, held by the plan cache) and a call is one ``cublasLtMatmul``.
It is also the route that CUDA-graph capture can record: CuPy's cuBLAS bindings refuse to run
while a stream captures, this call does not ask.

The library is the one CuPy already loaded (found in ``/proc/self/maps``), called through
ctypes; the enum values are cublasLt.h's.
"""
from __future__ import annotations

import ctypes as ct
import threading

import numpy as np

from ..kernels.driver import make_context_current

__all__ = ["LtLaunch", "LtEpilogueLaunch", "make_launch", "LT_EPILOGUES", "LT_EPILOGUE_NAMES"]

#: (activation, bias, pre-activation out) -> cublasLtEpilogue_t: what cuBLASLt fuses. Its GELU
#: is the tanh approximation (cuBLAS docs, footnote on GELU), so it serves 'gelu_tanh' only;
#: RELU_AUX writes a bit mask, not the pre-activation values, so relu has no aux form here.
LT_EPILOGUES = {(None, True, False): 4, ("relu", False, False): 2, ("relu", True, False): 6,
                ("gelu_tanh", False, False): 32, ("gelu_tanh", True, False): 36,
                ("gelu_tanh", False, True): 160, ("gelu_tanh", True, True): 164}
#: cublasLtEpilogue_t codes by name (CUBLASLT_EPILOGUE_<name>), for the route's description
LT_EPILOGUE_NAMES = {4: "BIAS", 2: "RELU", 6: "RELU_BIAS", 32: "GELU", 36: "GELU_BIAS", 160: "GELU_AUX",
                     164: "GELU_AUX_BIAS"}
#: the bias / pre-activation alignment the algorithm is chosen for (bytes): a call with pointers
#: that are less aligned is refused by LtEpilogueLaunch.fits
EPILOGUE_ALIGN = 16

# cublasLtMatmulDescAttributes_t, cublasLtMatrixLayoutAttribute_t, preference attributes
_DESC_TRANSA, _DESC_TRANSB = 3, 4
_DESC_EPILOGUE, _DESC_BIAS_POINTER, _DESC_AUX_POINTER, _DESC_AUX_LD, _DESC_AUX_BATCH_STRIDE = 7, 8, 11, 12, 13
_LAYOUT_BATCH_COUNT, _LAYOUT_STRIDED_BATCH_OFFSET = 5, 6
_PREF_MAX_WORKSPACE_BYTES = 1
_PREF_MIN_ALIGNMENT = {"A": 5, "B": 6, "C": 7, "D": 8}
#: cuBLAS's own recommendation for Hopper's workspace (cuBLAS docs, cublasSetWorkspace)
MAX_WORKSPACE_BYTES = 32 << 20
_OPS = {"N": 0, "T": 1, "C": 2}
#: cublasStatus_t CUBLAS_STATUS_EXECUTION_FAILED: what cuBLASLt answers when its kernel launch fails
_EXECUTION_FAILED = 13
_vp, _sz = ct.c_void_p, ct.c_size_t


class _HeuristicResult(ct.Structure):
    # cublasLtMatmulHeuristicResult_t: a 64-byte opaque algorithm, then its needs (96 bytes)
    _fields_ = [("algo", ct.c_uint64 * 8), ("workspace_size", ct.c_size_t), ("state", ct.c_int),
                ("waves", ct.c_float), ("reserved", ct.c_int * 4)]


class LtUnavailable(RuntimeError):
    """cuBLASLt cannot be loaded, or has no algorithm for a problem (the caller falls back)."""


_lib = None
_lib_lock = threading.Lock()
_handles: dict = {}
#: making a launch (the handle, descriptors, layouts, cuBLASLt's heuristic) takes turns: one
#: handle serves every thread, and concurrent first calls under Dask's threaded scheduler gave
#: wrong float32 blocks (H100) while the same calls made one at a time did not. Once per
#: problem class, so the calls themselves never wait on it.
_make_lock = threading.Lock()


def _find_library():
    """The libcublasLt CuPy's cuBLAS loaded (same copy, same version), else by soname."""
    import cupy_backends.cuda.libs.cublas  # noqa: F401  (loads libcublas and its libcublasLt)

    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "libcublasLt.so" in line}
    except OSError:
        paths = set()
    for path in sorted(paths) + ["libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"]:
        try:
            return ct.CDLL(path)
        except OSError:
            continue
    raise LtUnavailable("libcublasLt could not be loaded")


def _library():
    global _lib
    if _lib is None:
        with _lib_lock:
            if _lib is None:
                lib = _find_library()
                for name, args in {
                    "cublasLtCreate": [ct.POINTER(_vp)],
                    "cublasLtMatmulDescCreate": [ct.POINTER(_vp), ct.c_int, ct.c_int],
                    "cublasLtMatmulDescSetAttribute": [_vp, ct.c_int, _vp, _sz],
                    "cublasLtMatmulDescDestroy": [_vp],
                    "cublasLtMatrixLayoutCreate": [ct.POINTER(_vp), ct.c_int, ct.c_uint64,
                                                   ct.c_uint64, ct.c_int64],
                    "cublasLtMatrixLayoutSetAttribute": [_vp, ct.c_int, _vp, _sz],
                    "cublasLtMatrixLayoutDestroy": [_vp],
                    "cublasLtMatmulPreferenceCreate": [ct.POINTER(_vp)],
                    "cublasLtMatmulPreferenceSetAttribute": [_vp, ct.c_int, _vp, _sz],
                    "cublasLtMatmulPreferenceDestroy": [_vp],
                    "cublasLtMatmulAlgoGetHeuristic": [_vp, _vp, _vp, _vp, _vp, _vp, _vp, ct.c_int,
                                                       ct.POINTER(_HeuristicResult),
                                                       ct.POINTER(ct.c_int)],
                    "cublasLtMatmul": [_vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp,
                                       _vp, _vp, _sz, _vp],
                }.items():
                    fn = getattr(lib, name)
                    fn.argtypes, fn.restype = args, ct.c_int
                _lib = lib
    return _lib


def _check(status: int, what: str) -> None:
    if status != 0:
        raise LtUnavailable(f"{what} returned cuBLAS status {status}")


def _handle(device: int):
    """One cuBLASLt handle per device (it holds no stream: the stream is passed per call)."""
    h = _handles.get(device)
    if h is None:
        h = _vp()
        _check(_library().cublasLtCreate(ct.byref(h)), "cublasLtCreate")
        _handles[device] = h
    return h


def _set(fn, obj, attr: int, value, ctype) -> None:
    cell = ctype(value)
    _check(fn(obj, attr, ct.byref(cell), ct.sizeof(cell)), fn.__name__)


class LtLaunch:
    """One problem class on cuBLASLt: ``launch(a_ptr, b_ptr, c_ptr, alpha, beta, stream)``
    enqueues ``C = alpha op(A) op(B) + beta C`` on the raw stream handle ``stream``.

    Pointers must have at least the alignment the class was built for (``align`` bytes: the
    algorithm was chosen under that promise). Workspace, when the algorithm needs any, is owned
    here, one buffer per stream (concurrent streams never share it), and freed with the launch.
    Calls from several threads take turns (a per-launch lock around the call).
    """

    __slots__ = ("_lib", "_handle", "_desc", "_layouts", "_algo", "_capture_algo", "_ws_size",
                 "_ws", "_lock", "_scalar", "_one_zero", "_local", "_dev", "_align", "align",
                 "workspace_nbytes", "__weakref__")

    def __init__(self, desc, types, device: int, epilogue: int = 0):
        ab_type, c_type, compute_type, scalar = types
        self._desc, self._layouts = None, []
        lib = self._lib = _library()
        self._dev, self.align = device, desc.align
        self._scalar = np.dtype(scalar)
        self._handle = _handle(device)
        mdesc = _vp()
        _check(lib.cublasLtMatmulDescCreate(ct.byref(mdesc), compute_type,
                                            _SCALE_TYPE[self._scalar.char]), "MatmulDescCreate")
        self._desc = mdesc
        _set(lib.cublasLtMatmulDescSetAttribute, mdesc, _DESC_TRANSA, _OPS[desc.transa], ct.c_int32)
        _set(lib.cublasLtMatmulDescSetAttribute, mdesc, _DESC_TRANSB, _OPS[desc.transb], ct.c_int32)
        a_rows, a_cols = desc.a_shape()
        b_rows, b_cols = desc.b_shape()
        self._layout(ab_type, a_rows, a_cols, desc.lda, desc.batch, desc.stride_a)
        self._layout(ab_type, b_rows, b_cols, desc.ldb, desc.batch, desc.stride_b)
        self._layout(c_type, desc.m, desc.n, desc.ldc, desc.batch, desc.stride_c)
        self._align = desc.align
        if epilogue:
            # before the heuristic: the epilogue and the bias/aux pointers' alignment (their
            # values, here stand-ins with EPILOGUE_ALIGN's alignment) choose the algorithm
            _set(lib.cublasLtMatmulDescSetAttribute, mdesc, _DESC_EPILOGUE, epilogue, ct.c_uint32)
            if epilogue & 4:
                _set(lib.cublasLtMatmulDescSetAttribute, mdesc, _DESC_BIAS_POINTER, EPILOGUE_ALIGN,
                     ct.c_uint64)
            if epilogue & 128:
                _set(lib.cublasLtMatmulDescSetAttribute, mdesc, _DESC_AUX_POINTER, EPILOGUE_ALIGN,
                     ct.c_uint64)
                _set(lib.cublasLtMatmulDescSetAttribute, mdesc, _DESC_AUX_LD, desc.ldc, ct.c_int64)
                _set(lib.cublasLtMatmulDescSetAttribute, mdesc, _DESC_AUX_BATCH_STRIDE, desc.stride_c,
                     ct.c_int64)
        result = self._heuristic(MAX_WORKSPACE_BYTES)
        if result is None:
            self._destroy()
            raise LtUnavailable("cuBLASLt has no algorithm for this problem")
        self._algo = ct.byref(result.algo)     # made once: a call passes it as is
        self._ws_size = int(result.workspace_size)
        # for a stream first met while it captures a CUDA graph (no allocation is allowed
        # there): the best algorithm that needs no workspace
        capture = result if not self._ws_size else self._heuristic(0)
        self._capture_algo = None if capture is None else ct.byref(capture.algo)
        self._ws = {}
        # one caller at a time: calls on one stream share the workspace, and a cuBLASLt call
        # may queue more than one operation on it (a split-K algorithm's reset and its
        # kernel): two threads' calls interleaved there (H100, Dask's threaded scheduler:
        # one float32 block off by a partial product)
        self._lock = threading.Lock()
        self.workspace_nbytes = 0
        one_zero = np.array([1, 0], dtype=self._scalar)
        self._one_zero = (one_zero, one_zero.ctypes.data, one_zero.ctypes.data + one_zero.itemsize)
        self._local = threading.local()

    def _heuristic(self, max_workspace: int):
        """cuBLASLt's first choice within ``max_workspace`` bytes, or None."""
        lib = self._lib
        pref = _vp()
        _check(lib.cublasLtMatmulPreferenceCreate(ct.byref(pref)), "PreferenceCreate")
        try:
            set_pref = lib.cublasLtMatmulPreferenceSetAttribute
            _set(set_pref, pref, _PREF_MAX_WORKSPACE_BYTES, max_workspace, ct.c_uint64)
            for attr in _PREF_MIN_ALIGNMENT.values():
                # the heuristic otherwise assumes 256-byte aligned pointers
                _set(set_pref, pref, attr, self._align, ct.c_uint32)
            result, count = _HeuristicResult(), ct.c_int(0)
            lay = self._layouts
            status = lib.cublasLtMatmulAlgoGetHeuristic(self._handle, self._desc, lay[0],
                                                        lay[1], lay[2], lay[2], pref, 1,
                                                        ct.byref(result), ct.byref(count))
        finally:
            lib.cublasLtMatmulPreferenceDestroy(pref)
        return result if status == 0 and count.value >= 1 else None

    def _layout(self, dtype: int, rows: int, cols: int, ld: int, batch: int, stride: int):
        lib = self._lib
        layout = _vp()
        _check(lib.cublasLtMatrixLayoutCreate(ct.byref(layout), dtype, rows, cols, ld),
               "MatrixLayoutCreate")
        self._layouts.append(layout)
        if batch > 1:
            set_attr = lib.cublasLtMatrixLayoutSetAttribute
            _set(set_attr, layout, _LAYOUT_BATCH_COUNT, batch, ct.c_int32)
            _set(set_attr, layout, _LAYOUT_STRIDED_BATCH_OFFSET, stride, ct.c_int64)
        return layout

    def _workspace(self, stream: int) -> int:
        """This stream's workspace, made on its first call (under the call's lock)."""
        import cupy

        with cupy.cuda.Device(self._dev):
            buf = cupy.empty(self._ws_size, dtype=cupy.uint8)
        self._ws[stream] = (buf, buf.data.ptr)
        self.workspace_nbytes += self._ws_size
        return buf.data.ptr

    def _scalars(self, alpha, beta):
        """Host pointers to alpha and beta: a constant pair for (1, 0), else this thread's
        buffer (host pointer mode: cuBLASLt reads them before the call returns)."""
        if alpha == 1 and beta == 0:
            return self._one_zero[1], self._one_zero[2]
        buf = getattr(self._local, "buf", None)
        if buf is None:
            buf = self._local.buf = np.empty(2, dtype=self._scalar)
        buf[0] = alpha
        buf[1] = beta
        addr = buf.ctypes.data
        return addr, addr + buf.itemsize

    def __call__(self, a_ptr: int, b_ptr: int, c_ptr: int, alpha=1.0, beta=0.0, stream: int = 0):
        with self._lock:
            self._matmul(a_ptr, b_ptr, c_ptr, alpha, beta, stream)

    def _matmul(self, a_ptr, b_ptr, c_ptr, alpha, beta, stream) -> None:
        """cublasLtMatmul on this class; the caller holds ``self._lock``."""
        pal, pbe = self._scalars(alpha, beta)
        algo, ws, ws_size = self._algo, None, self._ws_size
        if ws_size:
            slot = self._ws.get(stream)
            if slot is not None:
                ws = slot[1]
            elif _capturing(stream):
                if self._capture_algo is None:
                    raise RuntimeError("cuBLASLt needs workspace for this problem and the stream "
                                       "is capturing a CUDA graph: call once on this stream "
                                       "before capturing (the workspace is allocated then)")
                algo, ws_size = self._capture_algo, 0
            else:
                ws = self._workspace(stream)
        lay = self._layouts
        status = self._lib.cublasLtMatmul(self._handle, self._desc, pal, a_ptr, lay[0], b_ptr,
                                          lay[1], pbe, c_ptr, lay[2], c_ptr, lay[2],
                                          algo, ws, ws_size, stream)
        if status == _EXECUTION_FAILED and make_context_current(self._dev):
            # a fresh thread without a current context: cuBLASLt's own launch failed
            status = self._lib.cublasLtMatmul(self._handle, self._desc, pal, a_ptr, lay[0], b_ptr,
                                              lay[1], pbe, c_ptr, lay[2], c_ptr, lay[2],
                                              algo, ws, ws_size, stream)
        if status != 0:
            raise RuntimeError(f"cublasLtMatmul failed with cuBLAS status {status}")

    def _destroy(self) -> None:
        lib = self._lib
        for layout in self._layouts:
            lib.cublasLtMatrixLayoutDestroy(layout)
        self._layouts = []
        if self._desc:
            lib.cublasLtMatmulDescDestroy(self._desc)
            self._desc = None

    def __del__(self):
        try:
            self._destroy()
        except Exception:     # interpreter shutdown: the library may be gone already
            pass


class LtEpilogueLaunch(LtLaunch):
    """An :class:`LtLaunch` whose matmul descriptor carries a cuBLASLt epilogue (a code of
    :data:`LT_EPILOGUES`): ``launch(a, b, c, alpha, beta, stream, bias=, pre=)``, the calling
    convention of our kernels' fused launches (``scale_m`` / ``scale_n`` are not cuBLASLt's:
    refused). The bias and pre-activation pointers are descriptor attributes, set before each
    call under the launch's lock (cuBLASLt reads the descriptor when the call is queued)."""

    __slots__ = ("epilogue",)

    def __init__(self, desc, types, device: int, epilogue: int):
        super().__init__(desc, types, device, epilogue)
        self.epilogue = epilogue

    def __call__(self, a_ptr, b_ptr, c_ptr, alpha=1.0, beta=0.0, stream: int = 0, bias: int = 0,
                 pre: int = 0, scale_m: int = 0, scale_n: int = 0):
        if scale_m or scale_n:
            raise ValueError("cuBLASLt's epilogue launch takes no dequantizing scales")
        set_attr = self._lib.cublasLtMatmulDescSetAttribute
        with self._lock:
            if self.epilogue & 4:
                _set(set_attr, self._desc, _DESC_BIAS_POINTER, bias, ct.c_uint64)
            if self.epilogue & 128:
                _set(set_attr, self._desc, _DESC_AUX_POINTER, pre, ct.c_uint64)
            self._matmul(a_ptr, b_ptr, c_ptr, alpha, beta, stream)


def make_epilogue_launch(desc, types, device: int, epilogue: int):
    """An :class:`LtEpilogueLaunch`, or None when cuBLASLt has no algorithm with that epilogue."""
    try:
        with _make_lock:
            return LtEpilogueLaunch(desc, types, device, epilogue)
    except LtUnavailable:
        return None


def _capturing(stream: int) -> bool:
    from cupy_backends.cuda.api import runtime

    return bool(runtime.streamIsCapturing(stream))


#: cudaDataType_t of the scale (alpha/beta) type, by NumPy type character
_SCALE_TYPE = {"e": 2, "f": 0, "d": 1, "i": 10, "F": 4, "D": 5}


def make_launch(desc, types, device: int):
    """An :class:`LtLaunch` for ``desc``, or None when cuBLASLt cannot run it (no library, no
    algorithm): the caller then uses the cublasGemmEx path."""
    try:
        with _make_lock:
            return LtLaunch(desc, types, device)
    except LtUnavailable:
        return None
