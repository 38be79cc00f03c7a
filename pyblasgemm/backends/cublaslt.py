"""The cuBLAS route's launch: ``cublasLtMatmul`` with everything but pointers built once.

Why cuBLASLt and not ``cublasGemmEx``: on an H100 host a bare ``cublasGemmEx`` costs 13.6 µs
per call (its algorithm heuristic runs every call) against 17.3 µs for the whole of
``torch.matmul(out=)`` (bench/results/host_primitives_h100_2026-11-24.json), so no form built on
it could be 0.8x torch's. cuBLASLt splits the heuristic from the call: the matmul descriptor,
the four matrix layouts and the chosen algorithm are made once per problem class (a
:class:`LtLaunch`, held by the plan cache) and a call is one ``cublasLtMatmul``. It is also the
route that CUDA-graph capture can record: cuBLAS's own handle-level calls refuse to run while a
stream captures, this call does not ask. (Same process, one H200 host, the held-out decode
shapes: ``cublasGemmEx`` 1.3-2.6 µs more host time a call than this call through ctypes, -0.8 to +1.0
µs (median +0.6) through nvmath-python's bindings; bench/results/lt_host_cost_h200_2026-11-28_79032c2.json.)

The binding (:func:`status` says which one this process uses):

* ``nvmath``: nvmath-python's public cuBLASLt bindings (``nvmath.bindings.cublasLt``), where
  nvmath-python is installed; the enum values and the heuristic-result struct are its own;
  (on one H200 host a call through it costs 1.3-2.3 µs less than through ctypes, same process:
  bench/results/lt_host_cost_h200_2026-11-28_79032c2.json; the CUDA 13 extras install it);
* ``ctypes``: otherwise, the eleven functions used here prototyped over the libcublasLt that
  cuda-pathfinder loads (the copy already in the process, CuPy's, when there is one; else the
  ``nvidia-cublas`` wheel's; else the system's), with the values of ``cublasLt.h`` below
  (:data:`DESC_ATTR` and its neighbours; tests/test_bindings.py checks them against nvmath's).

If cuBLASLt cannot be loaded at all, one :class:`CublasLtWarning` and a ``pyblasgemm`` log
record at WARNING say why and what it costs: the cuBLAS route then runs ``cublasGemmEx``
(13.6 µs more host time a call on an H100, and not capturable in CUDA graphs), never silently.
"""
from __future__ import annotations

import ctypes as ct
import threading
import warnings
from typing import NamedTuple

import numpy as np

from .._warnings import PyblasgemmWarning, log
from ..kinds import CUBLAS_COMPUTE, CUDA
from ..kernels.driver import is_capturing, make_context_current
from ..kernels.fp8 import BLOCK_SCALE_THREADS, BLOCK_SCALES_SOURCE, device_scale, kernel_lds

__all__ = ["LtLaunch", "LtEpilogueLaunch", "LtFp8Launch", "Fp8Desc", "make_launch", "fp8_launch", "LT_EPILOGUES",
           "LT_EPILOGUE_NAMES", "status", "version", "loaded_version", "CublasLtWarning", "LtUnavailable",
           "FP8_SCALE_MODE", "fp8_desc_of", "fp8_bind", "fp8_refusal", "fp8_line", "fp8_scales",
           "block_scales_readable", "block_scaled", "LtBlockScaled", "MAX_BLOCK_SCALE_STREAMS"]

# cublasLt.h's values, by the names nvmath.bindings.cublasLt gives them (one table per enum)
#: cublasLtMatmulDescAttributes_t
DESC_ATTR = {"TRANSA": 3, "TRANSB": 4, "EPILOGUE": 7, "BIAS_POINTER": 8, "EPILOGUE_AUX_POINTER": 11,
             "EPILOGUE_AUX_LD": 12, "EPILOGUE_AUX_BATCH_STRIDE": 13,
             # the float8 route's (LtFp8Launch): CUBLASLT_MATMUL_DESC_A_SCALE_POINTER = 17,
             # _B_SCALE_POINTER = 18 (device pointers to float32 scales), _FAST_ACCUM = 25 (int8_t),
             # _BIAS_DATA_TYPE = 26 (int32_t cudaDataType_t), _A_SCALE_MODE = 31, _B_SCALE_MODE = 32
             # (int32_t cublasLtMatmulMatrixScale_t; cuBLAS 12.9+)
             "A_SCALE_POINTER": 17, "B_SCALE_POINTER": 18, "FAST_ACCUM": 25, "BIAS_DATA_TYPE": 26,
             "A_SCALE_MODE": 31, "B_SCALE_MODE": 32}
#: cublasLtMatrixLayoutAttribute_t
LAYOUT_ATTR = {"BATCH_COUNT": 5, "STRIDED_BATCH_OFFSET": 6}
#: cublasLtMatmulPreferenceAttributes_t
PREF_ATTR = {"MAX_WORKSPACE_BYTES": 1, "MIN_ALIGNMENT_A_BYTES": 5, "MIN_ALIGNMENT_B_BYTES": 6,
             "MIN_ALIGNMENT_C_BYTES": 7, "MIN_ALIGNMENT_D_BYTES": 8}
#: cublasLtEpilogue_t: the epilogues used here
EPILOGUE = {"RELU": 2, "BIAS": 4, "RELU_BIAS": 6, "GELU": 32, "GELU_BIAS": 36, "GELU_AUX": 160,
            "GELU_AUX_BIAS": 164}
#: the bits of an epilogue code that ask for a bias vector and for the aux (pre-activation) output
_BIAS_BIT, _AUX_BIT = 4, 128
#: cublasLtMatmulMatrixScale_t: how a scale pointer is read. CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F
#: = 0 (one float32), _OUTER_VEC_32F = 3 (one float32 per row of op(A) / column of op(B)),
#: _VEC128_32F = 4 (one per 128 elements of the innermost dimension, K), _BLK128x128_32F = 5
#: (one per 128 x 128 block); the last three from cuBLAS 12.9 on
MATRIX_SCALE = {"SCALAR_32F": 0, "OUTER_VEC_32F": 3, "VEC128_32F": 4, "BLK128x128_32F": 5}
#: a float8 description's scale mode of a side (EpilogueSpec.scales, GemmDesc.block_scales) -> cuBLASLt's
FP8_SCALE_MODE = {"tensor": "SCALAR_32F", "vector": "OUTER_VEC_32F", "a_blocks": "VEC128_32F",
                  "b_blocks": "BLK128x128_32F"}
#: cudaDataType_t of the float8 route's matrices, by NumPy name (the values: kinds.CUDA)
FP8_DATA_TYPE = {"float8_e4m3fn": CUDA["R_8F_E4M3"], "float8_e5m2": CUDA["R_8F_E5M2"], "float16": CUDA["R_16F"],
                 "bfloat16": CUDA["R_16BF"], "float32": CUDA["R_32F"]}
#: CUBLAS_COMPUTE_32F: the one compute type cuBLASLt's FP8 GEMM takes (with scale type
#: CUDA_R_32F for alpha and beta)
COMPUTE_32F = CUBLAS_COMPUTE["32F"]
#: CUBLASLT_MATMUL_DESC_FAST_ACCUM's value on the float8 route: 0, cuBLASLt's default and
#: ``torch._scaled_mm``'s (use_fast_accum=False). With 1 sm_90's float8 tensor core keeps adding
#: k32 steps into its ~14-bit-mantissa accumulator for the whole K (cublasLt.h: "intermediate
#: results will not periodically be promoted"); with 0 they are promoted to float32 registers
#: periodically, the error bound the GPU tests hold (2^-9 of the terms' magnitude).
FAST_ACCUM = 0
#: cuBLASLt versions from which the outer-vector and 128-block scale modes exist (cuBLAS 12.9)
FP8_SCALE_MODES_VERSION = 120900
#: bound launches of float8 products kept (each owns its descriptors and per-stream
#: workspace); the oldest is dropped past this
MAX_FP8_LAUNCHES = 64
#: cublasOperation_t
_OPS = {"N": 0, "T": 1, "C": 2}
#: cublasStatus_t CUBLAS_STATUS_EXECUTION_FAILED: what cuBLASLt answers when its kernel launch fails
_EXECUTION_FAILED = 13

#: (activation, bias, pre-activation out) -> cublasLtEpilogue_t: what cuBLASLt fuses. Its GELU
#: is the tanh approximation (cuBLAS docs, footnote on GELU), so it serves 'gelu_tanh' only;
#: RELU_AUX writes a bit mask, not the pre-activation values, so relu has no aux form here.
LT_EPILOGUES = {(None, True, False): EPILOGUE["BIAS"], ("relu", False, False): EPILOGUE["RELU"],
                ("relu", True, False): EPILOGUE["RELU_BIAS"], ("gelu_tanh", False, False): EPILOGUE["GELU"],
                ("gelu_tanh", True, False): EPILOGUE["GELU_BIAS"], ("gelu_tanh", False, True): EPILOGUE["GELU_AUX"],
                ("gelu_tanh", True, True): EPILOGUE["GELU_AUX_BIAS"]}
#: cublasLtEpilogue_t -> its name (what a route report says)
LT_EPILOGUE_NAMES = {code: name for name, code in EPILOGUE.items()}
#: the bias / pre-activation alignment the algorithm is chosen for (bytes): a call with pointers
#: that are less aligned is refused by LtEpilogueLaunch.fits
EPILOGUE_ALIGN = 16
#: cuBLAS's own recommendation for Hopper's workspace (cuBLAS docs, cublasSetWorkspace)
MAX_WORKSPACE_BYTES = 32 << 20
_vp, _sz = ct.c_void_p, ct.c_size_t


class _HeuristicResult(ct.Structure):
    # cublasLtMatmulHeuristicResult_t: a 64-byte opaque algorithm, then its needs (96 bytes)
    _fields_ = [("algo", ct.c_uint64 * 8), ("workspace_size", ct.c_size_t), ("state", ct.c_int),
                ("waves", ct.c_float), ("reserved", ct.c_int * 4)]


class LtUnavailable(RuntimeError):
    """cuBLASLt cannot be loaded, or has no algorithm for a problem (the caller falls back)."""


class CublasLtWarning(PyblasgemmWarning):
    """cuBLASLt could not be loaded: the cuBLAS route runs ``cublasGemmEx`` (slower per call,
    not capturable in CUDA graphs)."""


class _NeverRaised(Exception):
    """The ctypes binding reports failures by status: nothing raises this."""


class _Binding:
    """The cuBLASLt calls the launches make, in one form for either binding: ints in, ints out
    (handles and descriptors as addresses); ``matmul`` is the raw call (it returns the status,
    or raises ``error`` carrying it in ``.status``)."""

    name = ""
    library: str | None = None
    error: type = _NeverRaised
    #: how a handle, descriptor or layout is passed to ``matmul`` (made once per launch)
    arg = staticmethod(int)

    def __init__(self, desc_attr: dict, layout_attr: dict, pref_attr: dict):
        self.desc_attr, self.layout_attr, self.pref_attr = desc_attr, layout_attr, pref_attr

    def set_cell(self, setter, obj: int, attr: int, cell) -> None:
        """``setter(obj, attr, &cell, sizeof cell)`` for a ctypes value ``cell``."""
        self._status(setter(obj, attr, ct.addressof(cell), ct.sizeof(cell)), setter)

    def _status(self, status, fn) -> None:
        if status:
            raise LtUnavailable(f"{getattr(fn, '__name__', fn)} returned cuBLAS status {status}")


class _NvmathBinding(_Binding):
    name = "nvmath"

    def __init__(self, lt):
        # (an nvmath older than cuBLAS 12.9's scale modes lacks their names: cublasLt.h's values)
        super().__init__({k: int(getattr(lt.MatmulDescAttribute, k, v)) for k, v in DESC_ATTR.items()},
                         {k: int(getattr(lt.MatrixLayoutAttribute, k)) for k in LAYOUT_ATTR},
                         {k: int(getattr(lt.MatmulPreferenceAttribute, k)) for k in PREF_ATTR})
        self._lt, self.error, self.matmul = lt, lt.cuBLASLtError, lt.matmul
        self.version = self._guard(lt.get_version)()       # loads the library (raises if absent)
        try:
            from cuda.pathfinder import load_nvidia_dynamic_lib

            self.library = load_nvidia_dynamic_lib("cublasLt").abs_path   # the copy nvmath loaded
        except Exception:     # the path is only reported
            self.library = None
        for name in ("create", "matmul_desc_create", "matmul_desc_set_attribute", "matmul_desc_destroy",
                     "matrix_layout_create", "matrix_layout_set_attribute", "matrix_layout_destroy",
                     "matmul_preference_create", "matmul_preference_set_attribute",
                     "matmul_preference_destroy"):
            setattr(self, name, self._guard(getattr(lt, name)))

    def _guard(self, fn):
        """``fn`` with nvmath's exception turned into :class:`LtUnavailable` (set-up calls)."""
        error = self.error

        def call(*args):
            try:
                return fn(*args)
            except error as e:
                raise LtUnavailable(f"{fn.__name__} returned cuBLAS status {e.status}") from e
        call.__name__ = fn.__name__
        return call

    def set_cell(self, setter, obj: int, attr: int, cell) -> None:
        setter(obj, attr, ct.addressof(cell), ct.sizeof(cell))   # raises LtUnavailable itself

    def heuristic(self, handle: int, desc: int, layouts, pref: int):
        """(result, algo address, workspace bytes) of cuBLASLt's first choice, or None."""
        result, count = self._lt.MatmulHeuristicResult(), np.zeros(1, np.int32)
        try:
            self._lt.matmul_algo_get_heuristic(handle, desc, layouts[0], layouts[1], layouts[2], layouts[2], pref,
                                               1, result.ptr, count.ctypes.data)
        except self.error:
            return None
        return (result, result.ptr, int(result.workspace_size)) if count[0] >= 1 else None


class _CtypesBinding(_Binding):
    name = "ctypes"
    # a c_void_p passes as it is; an int is converted on every call (0.2-0.7 µs over the six
    # handle arguments of cublasLtMatmul, measured on this package's host)
    arg = staticmethod(_vp)

    def __init__(self, path: str):
        super().__init__(dict(DESC_ATTR), dict(LAYOUT_ATTR), dict(PREF_ATTR))
        lib = ct.CDLL(path)
        for name, args in {
            "cublasLtGetVersion": [],
            "cublasLtCreate": [ct.POINTER(_vp)],
            "cublasLtMatmulDescCreate": [ct.POINTER(_vp), ct.c_int, ct.c_int],
            "cublasLtMatmulDescSetAttribute": [_vp, ct.c_int, _vp, _sz],
            "cublasLtMatmulDescDestroy": [_vp],
            "cublasLtMatrixLayoutCreate": [ct.POINTER(_vp), ct.c_int, ct.c_uint64, ct.c_uint64, ct.c_int64],
            "cublasLtMatrixLayoutSetAttribute": [_vp, ct.c_int, _vp, _sz],
            "cublasLtMatrixLayoutDestroy": [_vp],
            "cublasLtMatmulPreferenceCreate": [ct.POINTER(_vp)],
            "cublasLtMatmulPreferenceSetAttribute": [_vp, ct.c_int, _vp, _sz],
            "cublasLtMatmulPreferenceDestroy": [_vp],
            "cublasLtMatmulAlgoGetHeuristic": [_vp, _vp, _vp, _vp, _vp, _vp, _vp, ct.c_int, _vp, _vp],
            "cublasLtMatmul": [_vp] * 14 + [_sz, _vp],
        }.items():
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = args, ct.c_int
        lib.cublasLtGetVersion.restype = ct.c_size_t
        self._lib, self.library = lib, path
        self.version = int(lib.cublasLtGetVersion())
        self.matmul = lib.cublasLtMatmul
        self.matmul_desc_set_attribute = lib.cublasLtMatmulDescSetAttribute
        self.matrix_layout_set_attribute = lib.cublasLtMatrixLayoutSetAttribute
        self.matmul_preference_set_attribute = lib.cublasLtMatmulPreferenceSetAttribute

    def _create(self, fn, *args) -> int:
        out = _vp()
        self._status(fn(ct.byref(out), *args), fn)
        return out.value or 0

    def create(self) -> int:
        return self._create(self._lib.cublasLtCreate)

    def matmul_desc_create(self, compute_type: int, scale_type: int) -> int:
        return self._create(self._lib.cublasLtMatmulDescCreate, compute_type, scale_type)

    def matrix_layout_create(self, dtype: int, rows: int, cols: int, ld: int) -> int:
        return self._create(self._lib.cublasLtMatrixLayoutCreate, dtype, rows, cols, ld)

    def matmul_preference_create(self) -> int:
        return self._create(self._lib.cublasLtMatmulPreferenceCreate)

    def matmul_desc_destroy(self, obj: int) -> None:
        self._lib.cublasLtMatmulDescDestroy(obj)

    def matrix_layout_destroy(self, obj: int) -> None:
        self._lib.cublasLtMatrixLayoutDestroy(obj)

    def matmul_preference_destroy(self, obj: int) -> None:
        self._lib.cublasLtMatmulPreferenceDestroy(obj)

    def heuristic(self, handle: int, desc: int, layouts, pref: int):
        result, count = _HeuristicResult(), ct.c_int(0)
        status = self._lib.cublasLtMatmulAlgoGetHeuristic(handle, desc, layouts[0], layouts[1], layouts[2],
                                                          layouts[2], pref, 1, ct.addressof(result),
                                                          ct.addressof(count))
        if status or count.value < 1:
            return None
        return result, ct.addressof(result), int(result.workspace_size)


def _load_nvmath():
    """The nvmath binding, or None when nvmath-python is not installed."""
    try:
        import nvmath.bindings.cublasLt as lt
    except ImportError:
        return None
    try:
        return _NvmathBinding(lt)
    except LtUnavailable:
        raise
    except Exception as e:     # its loader's own errors (no CUDA driver, no library): the message says
        raise LtUnavailable(f"{type(e).__name__}: {e}") from e


def _load_ctypes():
    """The ctypes binding over the libcublasLt cuda-pathfinder finds."""
    try:
        from cuda.pathfinder import load_nvidia_dynamic_lib
    except ImportError as e:
        raise LtUnavailable(f"cuda-pathfinder is not installed ({e})") from e
    try:
        path = load_nvidia_dynamic_lib("cublasLt").abs_path
    except Exception as e:        # DynamicLibNotFoundError and its kin: the reason is the message
        raise LtUnavailable(f"cuda-pathfinder found no libcublasLt: {e}") from e
    try:
        return _CtypesBinding(path)
    except (OSError, AttributeError) as e:
        raise LtUnavailable(f"{path} could not be used: {e}") from e


#: the binding's loaders, in the order they are tried ("auto"); use_binding() picks one
_LOADERS = {"nvmath": _load_nvmath, "ctypes": _load_ctypes}

_lib = None
#: why cuBLASLt could not be loaded (the binding is then None and make_launch answers None)
_load_error: str | None = None
_prefer = "auto"
_lib_lock = threading.Lock()
_handles: dict = {}
#: making a launch (the handle, descriptors, layouts, cuBLASLt's heuristic) takes turns: one
#: handle serves every thread, and concurrent first calls under Dask's threaded scheduler gave
#: wrong float32 blocks (H100) while the same calls made one at a time did not. Once per
#: problem class, so the calls themselves never wait on it.
_make_lock = threading.Lock()


def _load():
    """The first binding that loads, in :data:`_LOADERS`' order (or the one asked for)."""
    names = list(_LOADERS) if _prefer == "auto" else [_prefer]
    reasons = []
    for name in names:
        try:
            binding = _LOADERS[name]()
        except LtUnavailable as e:
            reasons.append(f"{name}: {e}")
            continue
        if binding is None:
            reasons.append(f"{name}: not installed")
            continue
        return binding
    raise LtUnavailable("; ".join(reasons))


def _library():
    """The cuBLASLt binding; :class:`LtUnavailable` once it failed to load (warned once)."""
    global _lib, _load_error
    if _lib is None:
        with _lib_lock:
            if _lib is None and _load_error is None:
                try:
                    _lib = _load()
                    log.info("cuBLASLt %s through %s (%s)", _lib.version, _lib.name, _lib.library)
                except LtUnavailable as e:
                    _load_error = str(e)
                    _warn_unavailable(_load_error)
    if _lib is None:
        raise LtUnavailable(f"cuBLASLt could not be loaded: {_load_error}")
    return _lib


def _warn_unavailable(reason: str) -> None:
    message = (f"pyblasgemm: cuBLASLt could not be loaded ({reason}); the cuBLAS route runs "
               f"cublasGemmEx instead: about 14 µs more host time per call (H100) and no CUDA-graph "
               f"capture. Install nvmath-python, or the nvidia-cublas wheel (pyblasgemm[cuda13]).")
    log.warning("%s", message)
    warnings.warn(message, CublasLtWarning, stacklevel=4)


def use_binding(name: str = "auto") -> None:
    """Load cuBLASLt through ``name`` ('nvmath', 'ctypes', or 'auto': the first that loads) from
    the next launch made on; launches already made keep theirs. For tests and benchmarks.

    Example::

        use_binding("ctypes"); status()["binding"]       # 'ctypes'
    """
    global _lib, _load_error, _prefer
    if name != "auto" and name not in _LOADERS:
        raise ValueError(f"use_binding: name={name!r} is not 'auto' or one of {tuple(_LOADERS)}")
    with _lib_lock:
        _lib, _load_error, _prefer = None, None, name
        _handles.clear()


def status() -> dict:
    """Which cuBLASLt this process uses and so which route the cuBLAS backend takes:
    ``binding`` ('nvmath', 'ctypes' or None), ``library`` (its file), ``version``, ``route``
    ('cublasLt', or 'cublasGemmEx' when it cannot be loaded) and ``error`` (why not). Loads
    the library (once), never a CUDA context.

    Example::

        status()   # {'binding': 'ctypes', 'library': '.../libcublasLt.so.13', 'version': 131000,
                   #  'route': 'cublasLt', 'error': None}
    """
    try:
        lib = _library()
    except LtUnavailable:
        return {"binding": None, "library": None, "version": None, "route": "cublasGemmEx",
                "error": _load_error}
    return {"binding": lib.name, "library": lib.library, "version": lib.version, "route": "cublasLt",
            "error": None}


def version() -> int | None:
    """cuBLASLt's version (cuBLAS's: ``13.1.0`` is 131000), or None when it cannot be loaded."""
    return status()["version"]


_loaded_version: list = []


def loaded_version() -> int | None:
    """:func:`version`, asked once (a machine fact the float8 plans are keyed by)."""
    if not _loaded_version:
        _loaded_version.append(version())
    return _loaded_version[0]


def _handle(device: int):
    """One cuBLASLt handle per device (it holds no stream: the stream is passed per call)."""
    h = _handles.get(device)
    if h is None:
        h = _handles[device] = _library().create()
    return h


class LtLaunch:
    """One problem class on cuBLASLt: ``launch(a_ptr, b_ptr, c_ptr, alpha, beta, stream)``
    enqueues ``C = alpha op(A) op(B) + beta C`` on the raw stream handle ``stream``.

    Pointers must have at least the alignment the class was built for (``align`` bytes: the
    algorithm was chosen under that promise). Workspace, when the algorithm needs any, is owned
    here, one buffer per stream (concurrent streams never share it), and freed with the launch.
    Calls from several threads take turns (a per-launch lock around the call).
    """

    __slots__ = ("_lib", "_mm", "_err", "_handle", "_desc", "_layouts", "_results", "_algo", "_capture_algo",
                 "_ws_size", "_ws", "_lock", "_scalar", "_one_zero", "_local", "_dev", "_align", "align",
                 "workspace_nbytes", "_args", "__weakref__")

    def __init__(self, desc, types, device: int, epilogue: int = 0):
        ab_type, c_type, compute_type, scalar = types
        a_type, b_type = ab_type if isinstance(ab_type, tuple) else (ab_type, ab_type)
        self._desc, self._layouts, self._results = None, [], []
        lib = self._lib = _library()
        self._mm, self._err = lib.matmul, lib.error      # the call, as the binding gives it
        self._dev, self.align = device, desc.align
        self._scalar = np.dtype(scalar)
        self._handle = _handle(device)
        self._desc = lib.matmul_desc_create(compute_type, _SCALE_TYPE[self._scalar.char])
        self._set_desc("TRANSA", ct.c_int32(_OPS[desc.transa]))
        self._set_desc("TRANSB", ct.c_int32(_OPS[desc.transb]))
        a_rows, a_cols = desc.a_shape()
        b_rows, b_cols = desc.b_shape()
        self._layout(a_type, a_rows, a_cols, desc.lda, desc.batch, desc.stride_a)
        self._layout(b_type, b_rows, b_cols, desc.ldb, desc.batch, desc.stride_b)
        self._layout(c_type, desc.m, desc.n, desc.ldc, desc.batch, desc.stride_c)
        self._align = desc.align
        if epilogue:
            # before the heuristic: the epilogue and the bias/aux pointers' alignment (their
            # values, here stand-ins with EPILOGUE_ALIGN's alignment) choose the algorithm
            self._set_desc("EPILOGUE", ct.c_uint32(epilogue))
            if epilogue & _BIAS_BIT:
                self._set_desc("BIAS_POINTER", ct.c_uint64(EPILOGUE_ALIGN))
            if epilogue & _AUX_BIT:
                self._set_desc("EPILOGUE_AUX_POINTER", ct.c_uint64(EPILOGUE_ALIGN))
                self._set_desc("EPILOGUE_AUX_LD", ct.c_int64(desc.ldc))
                self._set_desc("EPILOGUE_AUX_BATCH_STRIDE", ct.c_int64(desc.stride_c))
        self._configure(desc)
        result = self._heuristic(MAX_WORKSPACE_BYTES)
        if result is None:
            self._destroy()
            raise LtUnavailable("cuBLASLt has no algorithm for this problem")
        self._algo, self._ws_size = result[1], result[2]     # made once: a call passes them as is
        # (handle, descriptor, A, B and C layouts) in the form the binding's call takes fastest
        self._args = tuple(lib.arg(x) for x in (self._handle, self._desc, *self._layouts))
        # for a stream first met while it captures a CUDA graph (no allocation is allowed
        # there): the best algorithm that needs no workspace
        capture = result if not self._ws_size else self._heuristic(0)
        self._capture_algo = None if capture is None else capture[1]
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

    def _configure(self, desc) -> None:
        """More descriptor attributes before the heuristic (none here; the float8 launch's
        scale modes)."""

    def _set_desc(self, name: str, cell) -> None:
        lib = self._lib
        lib.set_cell(lib.matmul_desc_set_attribute, self._desc, lib.desc_attr[name], cell)

    def _heuristic(self, max_workspace: int):
        """cuBLASLt's first choice within ``max_workspace`` bytes: (result, algo address,
        workspace bytes), the result kept alive with the launch; or None."""
        lib = self._lib
        pref = lib.matmul_preference_create()
        try:
            attr = lib.pref_attr
            lib.set_cell(lib.matmul_preference_set_attribute, pref, attr["MAX_WORKSPACE_BYTES"],
                         ct.c_uint64(max_workspace))
            for side in "ABCD":
                # the heuristic otherwise assumes 256-byte aligned pointers
                lib.set_cell(lib.matmul_preference_set_attribute, pref, attr[f"MIN_ALIGNMENT_{side}_BYTES"],
                             ct.c_uint32(self._align))
            found = lib.heuristic(self._handle, self._desc, self._layouts, pref)
        finally:
            lib.matmul_preference_destroy(pref)
        if found is not None:
            self._results.append(found[0])
        return found

    def _layout(self, dtype: int, rows: int, cols: int, ld: int, batch: int, stride: int) -> int:
        lib = self._lib
        layout = lib.matrix_layout_create(dtype, rows, cols, ld)
        self._layouts.append(layout)
        if batch > 1:
            set_attr = lib.matrix_layout_set_attribute
            lib.set_cell(set_attr, layout, lib.layout_attr["BATCH_COUNT"], ct.c_int32(batch))
            lib.set_cell(set_attr, layout, lib.layout_attr["STRIDED_BATCH_OFFSET"], ct.c_int64(stride))
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
        algo, ws, ws_size = self._algo, 0, self._ws_size
        if ws_size:
            slot = self._ws.get(stream)
            if slot is not None:
                ws = slot[1]
            elif is_capturing(self._dev, stream):
                if self._capture_algo is None:
                    raise RuntimeError("cuBLASLt needs workspace for this problem and the stream "
                                       "is capturing a CUDA graph: call once on this stream "
                                       "before capturing (the workspace is allocated then)")
                algo, ws_size = self._capture_algo, 0
            else:
                ws = self._workspace(stream)
        h, d, la, lb, lc = self._args
        try:
            # ctypes returns the status; nvmath's binding returns None, or raises it
            status = self._mm(h, d, pal, a_ptr, la, b_ptr, lb, pbe, c_ptr, lc, c_ptr, lc, algo, ws, ws_size, stream)
        except self._err as e:
            status = e.status
        if status:
            self._failed(status, pal, a_ptr, b_ptr, pbe, c_ptr, algo, ws, ws_size, stream)

    def _failed(self, status, *args) -> None:
        """A call that failed: once more on a fresh thread given a context, else RuntimeError."""
        pal, a_ptr, b_ptr, pbe, c_ptr, algo, ws, ws_size, stream = args
        if status == _EXECUTION_FAILED and make_context_current(self._dev):
            # a fresh thread without a current context: cuBLASLt's own launch failed
            h, d, la, lb, lc = self._args
            try:
                status = self._mm(h, d, pal, a_ptr, la, b_ptr, lb, pbe, c_ptr, lc, c_ptr, lc, algo, ws, ws_size, stream)
            except self._err as e:
                status = e.status
        if status:
            raise RuntimeError(f"cublasLtMatmul failed with cuBLAS status {status}")

    def _destroy(self) -> None:
        lib = self._lib
        for layout in self._layouts:
            lib.matrix_layout_destroy(layout)
        self._layouts = []
        if self._desc:
            lib.matmul_desc_destroy(self._desc)
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

    __slots__ = ("epilogue", "_bias_cell", "_aux_cell")

    def __init__(self, desc, types, device: int, epilogue: int):
        super().__init__(desc, types, device, epilogue)
        self.epilogue = epilogue
        self._bias_cell, self._aux_cell = ct.c_uint64(0), ct.c_uint64(0)

    def __call__(self, a_ptr, b_ptr, c_ptr, alpha=1.0, beta=0.0, stream: int = 0, bias: int = 0,
                 pre: int = 0, scale_m: int = 0, scale_n: int = 0):
        if scale_m or scale_n:
            raise ValueError("cuBLASLt's epilogue launch takes no dequantizing scales")
        with self._lock:
            if self.epilogue & _BIAS_BIT:
                self._bias_cell.value = bias
                self._set_desc("BIAS_POINTER", self._bias_cell)
            if self.epilogue & _AUX_BIT:
                self._aux_cell.value = pre
                self._set_desc("EPILOGUE_AUX_POINTER", self._aux_cell)
            self._matmul(a_ptr, b_ptr, c_ptr, alpha, beta, stream)


def make_epilogue_launch(desc, types, device: int, epilogue: int):
    """An :class:`LtEpilogueLaunch`, or None when cuBLASLt has no algorithm with that epilogue
    (or cannot be loaded: warned once, see :func:`status`)."""
    try:
        with _make_lock:
            return LtEpilogueLaunch(desc, types, device, epilogue)
    except LtUnavailable as e:
        log.info("cuBLASLt epilogue %s: %s", LT_EPILOGUE_NAMES.get(epilogue, epilogue), e)
        return None


#: cudaDataType_t of the scale (alpha/beta) type, by NumPy type character
_SCALE_TYPE = {"e": 2, "f": 0, "d": 1, "i": 10, "F": 4, "D": 5}


def make_launch(desc, types, device: int):
    """An :class:`LtLaunch` for ``desc``, or None when cuBLASLt cannot run it (no algorithm for
    the problem: logged; or no library: warned once, see :func:`status`): the caller then uses
    the cublasGemmEx path."""
    try:
        with _make_lock:
            return LtLaunch(desc, types, device)
    except LtUnavailable as e:
        log.info("cuBLAS route: cublasGemmEx for m=%d n=%d k=%d (%s)", desc.m, desc.n, desc.k, e)
        return None


class Fp8Desc(NamedTuple):
    """One float8 problem as cuBLASLt sees it (column-major; what :class:`LtFp8Launch` binds):
    ``D (m x n) = alpha · op(A) op(B) + beta · C`` with op(A) = A^T (A stored k x m) and op(B) = B
    (stored k x n): the "TN" form, the one cuBLASLt's FP8 GEMM takes on sm_89 / sm_90. C and D
    are one matrix of the output type (``out``: 'float32', 'float16', 'bfloat16').
    ``scale_modes``: the :data:`MATRIX_SCALE` names of A's and B's scales; ``epilogue``: a
    cublasLtEpilogue_t code of :data:`LT_EPILOGUES` or 0."""

    m: int
    n: int
    k: int
    lda: int
    ldb: int
    ldc: int
    a_type: str
    b_type: str
    out: str
    scale_modes: tuple
    epilogue: int = 0
    transa: str = "T"
    transb: str = "N"
    batch: int = 1
    stride_a: int = 0
    stride_b: int = 0
    stride_c: int = 0
    #: the pointer alignment (bytes) the algorithm is chosen for: cuBLASLt's FP8 kernels need 16
    align: int = 16

    def a_shape(self) -> tuple:
        """(rows, cols) of A as stored: k x m (op(A) = A^T)."""
        return (self.k, self.m)

    def b_shape(self) -> tuple:
        """(rows, cols) of B as stored: k x n."""
        return (self.k, self.n)


class LtFp8Launch(LtLaunch):
    """A float8 product on cuBLASLt (:class:`Fp8Desc`): ``launch(a, b, c, alpha, beta, stream,
    bias=, scale_a=, scale_b=)`` with ``scale_a`` / ``scale_b`` device pointers to cuBLASLt's A
    and B scales in their modes' layouts (float32). The scale and bias pointers are descriptor
    attributes set before each call under the launch's lock: cuBLASLt copies them into the
    kernel's parameters when the call is queued, and the kernel reads the scales themselves on
    the device, so a CUDA graph that captured the call replays whatever they hold then.

    Example (on an H100, pointers of 16-byte aligned CuPy arrays)::

        launch = LtFp8Launch(Fp8Desc(4096, 16, 4096, 4096, 4096, 4096, "float8_e4m3fn",
                                     "float8_e4m3fn", "bfloat16", ("SCALAR_32F", "SCALAR_32F")), 0)
        launch(w.data.ptr, x.data.ptr, y.data.ptr, 1.0, 0.0, 0, scale_a=sw.data.ptr, scale_b=sx.data.ptr)
    """

    __slots__ = ("epilogue", "scale_modes", "_scale_cells", "_bias_cell", "_held")

    def __init__(self, desc: Fp8Desc, device: int):
        self.epilogue, self.scale_modes = desc.epilogue, desc.scale_modes
        self._scale_cells = (ct.c_uint64(0), ct.c_uint64(0))
        self._bias_cell = ct.c_uint64(0)
        #: the A scale, B scale and bias pointers the descriptor holds now (None: a stand-in;
        #: 0 for the bias of an epilogue without one): a call sets only the ones that changed
        self._held = [None, None, None if desc.epilogue & _BIAS_BIT else 0]
        types = ((FP8_DATA_TYPE[desc.a_type], FP8_DATA_TYPE[desc.b_type]), FP8_DATA_TYPE[desc.out], COMPUTE_32F,
                 np.float32)
        super().__init__(desc, types, device, desc.epilogue)

    def _configure(self, desc: Fp8Desc) -> None:
        for side, mode in zip("AB", desc.scale_modes):
            if mode != "SCALAR_32F":      # (the default: cuBLASLt before 12.9 has no such attribute)
                self._set_desc(f"{side}_SCALE_MODE", ct.c_int32(MATRIX_SCALE[mode]))
            # a stand-in with EPILOGUE_ALIGN's alignment: the heuristic chooses for scaled operands
            self._set_desc(f"{side}_SCALE_POINTER", ct.c_uint64(EPILOGUE_ALIGN))
        self._set_desc("FAST_ACCUM", ct.c_int8(FAST_ACCUM))
        if desc.epilogue & _BIAS_BIT:     # the output's type (a float32 output's bias is refused)
            self._set_desc("BIAS_DATA_TYPE", ct.c_int32(FP8_DATA_TYPE[desc.out]))

    def _repoint(self, scale_a: int, scale_b: int, bias: int) -> None:
        """Set the descriptor's scale (and bias) pointers that differ from those it holds; the
        caller holds the lock. Each is noted as held only once set (a failed set is retried)."""
        held = self._held
        cell_a, cell_b = self._scale_cells
        if scale_a != held[0]:
            cell_a.value = scale_a
            self._set_desc("A_SCALE_POINTER", cell_a)
            held[0] = scale_a
        if scale_b != held[1]:
            cell_b.value = scale_b
            self._set_desc("B_SCALE_POINTER", cell_b)
            held[1] = scale_b
        if bias != held[2] and self.epilogue & _BIAS_BIT:
            self._bias_cell.value = bias
            self._set_desc("BIAS_POINTER", self._bias_cell)
            held[2] = bias

    def __call__(self, a_ptr, b_ptr, c_ptr, alpha=1.0, beta=0.0, stream: int = 0, bias: int = 0,
                 scale_a: int = 0, scale_b: int = 0):
        with self._lock:
            held = self._held
            # (the pointers are attributes of the descriptor, which cuBLASLt reads when the call
            # is queued: set only when they change, three cublasLtMatmulDescSetAttribute calls
            # through the binding a call before)
            if scale_a != held[0] or scale_b != held[1] or bias != held[2]:
                self._repoint(scale_a, scale_b, bias)
            self._matmul(a_ptr, b_ptr, c_ptr, alpha, beta, stream)

    def kernel_order(self, pm, pn, pc, alpha, beta, stream, bias=0, pre=0, scale_m=0, scale_n=0):
        """The call in our kernels' bound-launch convention (what a recorded float8 product
        replays, :func:`fp8_bind`'s): ``scale_m`` / ``scale_n`` are
        cuBLASLt's A and B scales, ``pre`` is not taken (no recorded float8 product has one)."""
        with self._lock:
            held = self._held
            if scale_m != held[0] or scale_n != held[1] or bias != held[2]:
                self._repoint(scale_m, scale_n, bias)
            self._matmul(pm, pn, pc, alpha, beta, stream)


#: (device, Fp8Desc) -> LtFp8Launch, or the reason cuBLASLt refused it (str): refusals are kept
#: too, so a refused class asks the heuristic once
_fp8_launches: dict = {}


def fp8_launch(desc: Fp8Desc, device: int) -> LtFp8Launch:
    """The bound :class:`LtFp8Launch` of ``desc`` on ``device`` (made once, kept in a cache of
    :data:`MAX_FP8_LAUNCHES`), or :class:`LtUnavailable` saying why cuBLASLt cannot run it
    (no library, no algorithm for this problem): the caller falls back to our kernels.

    Example::

        try:
            launch = fp8_launch(desc, 0)
        except LtUnavailable as why:
            ...     # our kernels, str(why) in the route's line
    """
    key = (device, desc)
    hit = _fp8_launches.get(key)
    if hit is None:
        try:
            with _make_lock:
                hit = LtFp8Launch(desc, device)
        except LtUnavailable as e:
            hit = f"cuBLASLt refused it: {e}"
            log.info("cuBLASLt float8 %s: %s", desc, hit)
        with _make_lock:
            if len(_fp8_launches) >= MAX_FP8_LAUNCHES:
                _fp8_launches.pop(next(iter(_fp8_launches)))
            _fp8_launches[key] = hit
    if isinstance(hit, str):
        raise LtUnavailable(hit)
    return hit


# ------------------------------------------------------------------------------------------
# The float8 description's binding (pyblasgemm.execute.execute_fp8 binds and runs it)
# ------------------------------------------------------------------------------------------

def fp8_desc_of(desc) -> Fp8Desc:
    """The :class:`Fp8Desc` of a float8 description (:func:`pyblasgemm.desc.describe_fp8`) on
    the cuBLASLt route: its own orientation (the described A is cuBLASLt's A: the call's b when
    ``desc.swap``), TN, the leading dimensions the kernels take (``kernels.fp8.kernel_lds``), each
    side's scale mode (:data:`FP8_SCALE_MODE`) and the epilogue of its activation and bias.

    >>> from pyblasgemm.desc import describe_fp8
    >>> d = describe_fp8("doc", "float8_e4m3fn", "float8_e5m2", ("row", 256), ("col", 256), "row", 16, 48, 256, 48,
    ...                  ("blocks", "blocks"), "bfloat16", "relu", "cols", False, "cupy", 0, (256,), 1.0, 0.0)
    >>> f = fp8_desc_of(d); (f.m, f.n, f.a_type, f.scale_modes), f.epilogue == EPILOGUE["RELU_BIAS"]
    ((48, 16, 'float8_e5m2', ('BLK128x128_32F', 'VEC128_32F')), True)
    """
    epi, row = desc.epilogue, desc.row
    lda, ldb = kernel_lds(desc)
    modes = tuple(FP8_SCALE_MODE[side] for side in desc.block_scales or epi.scales)
    return Fp8Desc(desc.m, desc.n, desc.k, lda, ldb, desc.ldc, row.ab_dtype.name, row.b_dtype.name, epi.dequantize,
                   modes, LT_EPILOGUES.get((epi.activation, epi.bias is not None, False), 0))


def fp8_bind(desc, plan=None):
    """The bound cuBLASLt launch of a float8 description, in our kernels' bound-launch
    convention (:meth:`LtFp8Launch.kernel_order`: ``scale_m`` / ``scale_n`` cuBLASLt's A and B
    scales), or None where cuBLASLt cannot run it (:func:`fp8_refusal` says why)."""
    try:
        return fp8_launch(fp8_desc_of(desc), desc.device).kernel_order
    except LtUnavailable:
        return None


def fp8_refusal(desc) -> str | None:
    """Why cuBLASLt cannot bind a float8 description (no library, no algorithm; asked of
    :func:`fp8_launch`'s cache), or None."""
    try:
        fp8_launch(fp8_desc_of(desc), desc.device)
    except LtUnavailable as e:
        return str(e)
    return None


def fp8_line(desc) -> str:
    """The route report's words for a float8 description on cuBLASLt (before the plan's reason).

    >>> from pyblasgemm.desc import describe_fp8
    >>> fp8_line(describe_fp8("doc", "float8_e4m3fn", "float8_e4m3fn", ("row", 64), ("col", 64), "row", 16, 48,
    ...                       64, 48, ("tensor", "tensor"), "bfloat16", None, None, False, "cupy", 0, (256,), 1.0, 0.0))
    'cuBLASLt: float8 TN (cublasLtMatmul, scales SCALAR_32F x SCALAR_32F, epilogue none, fast accumulation 0)'
    """
    lt_desc = fp8_desc_of(desc)
    return (f"cuBLASLt: float8 TN (cublasLtMatmul, scales {lt_desc.scale_modes[0]} x {lt_desc.scale_modes[1]}, "
            f"epilogue {LT_EPILOGUE_NAMES.get(lt_desc.epilogue, 'none')}, fast accumulation {FAST_ACCUM})")


def _call_sizes(desc) -> tuple:
    """``(m, n, k)`` of a float8 description in the call's terms (a's rows, b's columns)."""
    return (desc.n, desc.m, desc.k) if desc.swap else (desc.m, desc.n, desc.k)


def fp8_scales(cp, desc, scale_a, scale_b) -> tuple:
    """(cuBLASLt's A scale, B scale) of the call's ``scale_a`` / ``scale_b`` as device float32
    arrays in their modes' layouts: one value, a contiguous vector at a 16-byte aligned address
    (cuBLASLt reads scale vectors in 16 bytes), or the block scales rearranged as cuBLASLt reads
    them into per-call temporaries (which a CUDA graph cannot hold: the scales
    :class:`LtBlockScaled` cannot read in place come here): the 1 x 128 scales of ``a``
    (VEC128_32F, m x kb) M-contiguous, element (i, q) at q·m + i; the 128 x 128 scales of ``b``
    (BLK128x128_32F, kb x nb) K-block-contiguous, element (q, j) at j·ldq + q with ldq = kb
    rounded up to 4 (16-byte rows) -- the layouts ``torch._scaled_mm`` hands cuBLASLt. cuBLASLt's
    A is the call's b when ``desc.swap``."""
    if desc.block_scales:           # (cuBLASLt takes blocks on both sides or on neither)
        _, n, k = _call_sizes(desc)
        kb, nb = -(-k // 128), -(-n // 128)
        sa = cp.ascontiguousarray(cp.asarray(scale_a).T)                 # (kb, m)
        sb = cp.zeros((nb, -(-kb // 4) * 4), np.float32)
        sb[:, :kb] = cp.asarray(scale_b).T
        scales = (sa, sb)
    else:
        scales = tuple(_aligned16(device_scale(cp, s)) for s in (scale_a, scale_b))
    return scales[::-1] if desc.swap else scales


def _aligned16(x):
    """``x`` or a copy of it at a 16-byte aligned address (cuBLASLt reads scale vectors in 16 bytes)."""
    return x if x.data.ptr % 16 == 0 else x.copy()


def block_scales_readable(cp, desc, scale_a, scale_b) -> bool:
    """Whether :class:`LtBlockScaled` can read a block-scaled call's scales where the caller holds
    them: CuPy float32 arrays of the block shapes with element strides, on the description's
    device (else :func:`fp8_scales`' temporaries)."""
    m, n, k = _call_sizes(desc)
    kb, nb = -(-k // 128), -(-n // 128)
    return all(isinstance(s, cp.ndarray) and s.dtype == np.float32 and s.shape == shape and s.strides[0] % 4 == 0
               and s.strides[1] % 4 == 0 and s.data.device_id == desc.device
               for s, shape in ((scale_a, (m, kb)), (scale_b, (kb, nb))))


def block_scaled(desc, lt_launch, strides_a: tuple, strides_b: tuple):
    """A new :class:`LtBlockScaled` of a block-scaled float8 description on its bound cuBLASLt
    launch (``lt_launch``: :func:`fp8_bind`'s, or the :class:`LtFp8Launch` itself), for scales
    of these strides (bytes)."""
    m, n, k = _call_sizes(desc)
    return LtBlockScaled(getattr(lt_launch, "__self__", lt_launch), desc.device, m, n, k, strides_a, strides_b,
                         desc.swap)


#: the most streams one launch keeps relayout buffers for (a stream beyond them gets the
#: per-call temporaries, and no replay)
MAX_BLOCK_SCALE_STREAMS = 8


class LtBlockScaled:
    """cuBLASLt's block-scaled float8 launch that reads the caller's scales where they are:
    ``launch(pm, pn, pc, alpha, beta, stream, bias=, scale_m=, scale_n=)`` (the operands and
    scales in the kernel's order: b's first when ``swap``, the plan
    computing c^T = b^T a^T) enqueues, on ``stream``, the relayout of a's (m, kb) and b's
    (kb, nb) float32 scales (strides in elements, fixed per launch) into buffers it owns, then
    the cuBLASLt call that reads them (cuBLASLt's A scale b's when swapped):
    two launches on stable memory, so a CUDA graph captures both, and a repeated call replays
    them on new pointers (against ``torch._scaled_mm``'s and the per-call route's temporaries,
    which a graph cannot hold). One pair of buffers per stream (at most
    :data:`MAX_BLOCK_SCALE_STREAMS`): calls on two streams never share one.

    Example (on a GPU with cuBLASLt 12.9+)::

        launch = LtBlockScaled(fp8_launch(desc, 0), 0, m, n, k, sa.strides, sb.strides, swap=False)
        launch(a.data.ptr, b.data.ptr, c.data.ptr, 1.0, 0.0, sptr, scale_m=sa.data.ptr, scale_n=sb.data.ptr)
    """

    __slots__ = ("lt_launch", "swap", "_dev", "_fptr", "_grid", "_pack", "_lock", "_buffers", "workspace_nbytes",
                 "__weakref__")

    def __init__(self, lt_launch, device: int, m: int, n: int, k: int, strides_a: tuple, strides_b: tuple,
                 swap: bool):
        import cupy

        from ..kernels.jit import raw_function
        from ..kernels.mma_sync import _ArgPack

        kb, nb = -(-k // 128), -(-n // 128)
        ldq = -(-kb // 4) * 4
        self.lt_launch, self.swap, self._dev = lt_launch, swap, device
        self._fptr = raw_function(BLOCK_SCALES_SOURCE, "pyblasgemm_fp8_lt_block_scales", device)
        sms = cupy.cuda.Device(device).attributes["MultiProcessorCount"]
        self._grid = max(1, min(-(-(m * kb + nb * ldq) // BLOCK_SCALE_THREADS), 2 * sms))
        ll, vp = ct.c_longlong, ct.c_void_p
        fields = [("sa", vp), ("sa_row", ll), ("sa_col", ll), ("sa_out", vp), ("m", ll), ("kb", ll),
                  ("sb", vp), ("sb_row", ll), ("sb_col", ll), ("sb_out", vp), ("nb", ll), ("ldq", ll)]
        self._pack = _ArgPack(fields, dict(sa=0, sa_row=strides_a[0] // 4, sa_col=strides_a[1] // 4, sa_out=0,
                                           m=m, kb=kb, sb=0, sb_row=strides_b[0] // 4, sb_col=strides_b[1] // 4,
                                           sb_out=0, nb=nb, ldq=ldq))
        self._lock = threading.Lock()
        self._buffers: dict = {}        # stream handle -> (a's buffer, b's buffer), CuPy arrays
        self.workspace_nbytes = 0

    def buffers(self, stream: int):
        """This stream's (a's, b's) relayout buffers, made on its first call; None past
        :data:`MAX_BLOCK_SCALE_STREAMS` streams."""
        held = self._buffers.get(stream)
        if held is None:
            import cupy

            with self._lock:
                if len(self._buffers) >= MAX_BLOCK_SCALE_STREAMS:
                    return None
                cells = self._pack.cells
                with cupy.cuda.Device(self._dev):
                    held = (cupy.empty((cells["kb"].value, cells["m"].value), np.float32),
                            cupy.empty((cells["nb"].value, cells["ldq"].value), np.float32))
                self._buffers[stream] = held
                self.workspace_nbytes += held[0].nbytes + held[1].nbytes
        return held

    def __call__(self, pm, pn, pc, alpha, beta, stream, bias=0, pre=0, scale_m=0, scale_n=0):
        from ..kernels.driver import launch_kernel, stream as cu_stream

        held = self.buffers(stream)
        if held is None:
            raise RuntimeError(f"LtBlockScaled: more than {MAX_BLOCK_SCALE_STREAMS} streams")
        sa_out, sb_out = held[0].data.ptr, held[1].data.ptr
        if self.swap:
            scale_m, scale_n = scale_n, scale_m         # a's and b's, as the relayout reads them
        cells = self._pack.cells
        with self._lock:            # (cuLaunchKernel copies the argument cells)
            cells["sa"].value, cells["sb"].value = scale_m, scale_n
            cells["sa_out"].value, cells["sb_out"].value = sa_out, sb_out
            launch_kernel(self._dev, self._fptr, self._grid, 1, 1, BLOCK_SCALE_THREADS, 1, 1, 0,
                          cu_stream(stream), self._pack.addr)
        if self.swap:
            self.lt_launch(pm, pn, pc, alpha, beta, stream, bias=bias, scale_a=sb_out, scale_b=sa_out)
        else:
            self.lt_launch(pm, pn, pc, alpha, beta, stream, bias=bias, scale_a=sa_out, scale_b=sb_out)
