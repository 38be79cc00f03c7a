"""cuBLAS backend: the fallback for whatever our kernels do not run, and their yardstick.

Two routes. ``bind`` gives a cuBLASLt launch (:mod:`~pyblasgemm.backends.cublaslt`: descriptors
and algorithm made once, the stream passed per call, capturable in CUDA graphs), which
``execute`` uses whenever it exists. ``run`` calls ``cublasGemmEx`` /
``cublasGemmStridedBatchedEx`` on CuPy's current stream, with host-side alpha/beta: for int8
problems that need the rearrangement below, and when cuBLASLt has no algorithm (or cannot be
loaded: warned, see :func:`~pyblasgemm.backends.cublaslt.status`).

cuBLAS itself has no binding in cuda.bindings: ``run`` calls it through nvmath-python's public
``nvmath.bindings.cublas`` where nvmath-python is installed, else through a ctypes binding of
the five functions it needs over the libcublas that cuda-pathfinder loads (CuPy's copy when it
loaded one, else the ``nvidia-cublas`` wheel's). One cuBLAS handle per device, its stream set
under a lock per call (this is the slow route; the handle is pyblasgemm's, not CuPy's).

int8: cuBLAS runs int8 (IMMA) only for the "TN" arrangement (A and B both K-contiguous)
with leading dimensions that are multiples of 4, and answers CUBLAS_STATUS_NOT_SUPPORTED for k
not a multiple of 4 (seen on an H100, cuBLAS 13). Problems in any other shape are
rearranged here into padded K-contiguous copies (an O(mk + kn) copy against O(mnk) work), so
the user never meets the restriction.
"""
from __future__ import annotations

import ctypes as ct
import threading

import numpy as np

from .. import _arrays
from .._types import TYPE_ROWS
from ..desc import GemmDesc
from ..constraints import backend_supports
from ..kinds import ROUTES, base_compute

NAME = "cublas"

_OPS = {"N": 0, "T": 1, "C": 2}
#: cublasGemmAlgo_t CUBLAS_GEMM_DEFAULT; cublasPointerMode_t CUBLAS_POINTER_MODE_HOST
CUBLAS_GEMM_DEFAULT = -1
_POINTER_MODE_HOST = 0

# (prefix, compute) -> (A/B type, C type, compute type, scalar dtype), from the kinds table
_TYPES = {key: (r.cuda_ab, r.cuda_c, r.cublas_compute,
                np.dtype(r.scale_dtype) if r.scale_dtype else TYPE_ROWS[r.prefix].scalar_dtype)
          for key, r in ROUTES.items() if r.cublas_compute is not None}


def supports(desc: GemmDesc):
    """(ok, reason): :func:`pyblasgemm.constraints.backend_supports` for cuBLAS."""
    return backend_supports(NAME, desc)


class _Scalars(threading.local):
    """Per-thread host buffers for alpha and beta, one pair per scalar dtype.

    With host pointer mode cuBLAS reads alpha and beta before the call returns, so a buffer
    can be reused by the next call; per thread, so concurrent callers never share one.
    """

    def __init__(self):
        self.buffers = {}

    def pointers(self, scalar, alpha, beta):
        entry = self.buffers.get(scalar)
        if entry is None:
            buf = np.empty(2, dtype=scalar)
            entry = self.buffers[scalar] = (buf, buf.ctypes.data, buf.ctypes.data + buf.itemsize)
        buf, pa, pb = entry
        buf[0] = alpha
        buf[1] = beta
        return pa, pb


_scalars = _Scalars()


class _NvmathBlas:
    """cuBLAS through nvmath-python's public bindings (they raise on a failed status)."""

    name = "nvmath"

    def __init__(self, cb):
        self.create, self.set_stream, self.set_pointer_mode = cb.create, cb.set_stream, cb.set_pointer_mode
        self.gemm_ex, self.gemm_strided_batched_ex = cb.gemm_ex, cb.gemm_strided_batched_ex


class _CtypesBlas:
    """cuBLAS through ctypes over the library cuda-pathfinder loads; a failed status raises."""

    name = "ctypes"

    def __init__(self, path: str):
        lib = ct.CDLL(path)
        i32, i64, vp = ct.c_int, ct.c_longlong, ct.c_void_p
        for name, args in {
            "cublasCreate_v2": [ct.POINTER(vp)],
            "cublasSetStream_v2": [vp, vp],
            "cublasSetPointerMode_v2": [vp, i32],
            "cublasGemmEx": [vp, i32, i32, i32, i32, i32, vp, vp, i32, i32, vp, i32, i32, vp, vp, i32, i32, i32, i32],
            "cublasGemmStridedBatchedEx": [vp, i32, i32, i32, i32, i32, vp, vp, i32, i32, i64, vp, i32, i32, i64, vp,
                                           vp, i32, i32, i64, i32, i32, i32],
        }.items():
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = args, i32
        self._lib = lib

    def _check(self, status: int, call: str) -> None:
        if status:
            raise RuntimeError(f"{call} failed with cuBLAS status {status}")

    def create(self) -> int:
        h = ct.c_void_p()
        self._check(self._lib.cublasCreate_v2(ct.byref(h)), "cublasCreate")
        return h.value

    def set_stream(self, handle: int, stream: int) -> None:
        self._check(self._lib.cublasSetStream_v2(handle, stream), "cublasSetStream")

    def set_pointer_mode(self, handle: int, mode: int) -> None:
        self._check(self._lib.cublasSetPointerMode_v2(handle, mode), "cublasSetPointerMode")

    def gemm_ex(self, *args) -> None:
        self._check(self._lib.cublasGemmEx(*args), "cublasGemmEx")

    def gemm_strided_batched_ex(self, *args) -> None:
        self._check(self._lib.cublasGemmStridedBatchedEx(*args), "cublasGemmStridedBatchedEx")


_blas = None
_blas_lock = threading.Lock()
_blas_handles: dict = {}


def _blas_binding():
    """cuBLAS's binding (nvmath-python's where installed, else ctypes), made once."""
    global _blas
    if _blas is None:
        try:
            import nvmath.bindings.cublas as cb
            binding = _NvmathBlas(cb)
        except ImportError:
            from cuda.pathfinder import load_nvidia_dynamic_lib

            binding = _CtypesBlas(load_nvidia_dynamic_lib("cublas").abs_path)
        _blas = binding
    return _blas


def _blas_handle(blas, device: int) -> int:
    """pyblasgemm's cuBLAS handle on ``device`` (host pointer mode), made on first use; the
    caller holds ``_blas_lock``."""
    h = _blas_handles.get(device)
    if h is None:
        import cupy

        with cupy.cuda.Device(device):
            h = blas.create()
        blas.set_pointer_mode(h, _POINTER_MODE_HOST)
        _blas_handles[device] = h
    return h


def lt_types(desc: GemmDesc):
    """(A/B type, C type, compute type, scalar type) of ``desc`` for cuBLAS / cuBLASLt, or None
    when cuBLAS has no such mode."""
    return _TYPES.get((desc.prefix, base_compute(desc.compute)))


def bind(desc: GemmDesc, plan=None):
    """The launch of ``desc``'s class: a :class:`~pyblasgemm.backends.cublaslt.LtLaunch` called
    with pointers, or None when the problem needs :func:`run` (int8 in a layout cuBLAS's
    integer kernels refuse, which takes copies; or no cuBLASLt algorithm). A description with
    an epilogue whose plan routes it through cuBLASLt's (``plan.epilogue.code``) gets an
    :class:`~pyblasgemm.backends.cublaslt.LtEpilogueLaunch` (``bias=`` / ``pre=`` pointers per
    call). A float8 description gets cuBLASLt's FP8 launch
    (:func:`~pyblasgemm.backends.cublaslt.fp8_bind`: ``scale_m=`` / ``scale_n=`` per call)."""
    route = getattr(plan, "epilogue", None)
    if desc.row.b_dtype is not None:        # a float8 pair: cuBLASLt's FP8 GEMM, its scales per call
        from .cublaslt import fp8_bind

        return fp8_bind(desc, plan)
    if desc.epilogue is not None:
        if route is None or route.kind != "cublaslt":
            return None
        from .cublaslt import make_epilogue_launch

        types = lt_types(desc)
        return None if types is None else make_epilogue_launch(desc.product, types, desc.device,
                                                               route.code)
    if desc.prefix == "i" and not (desc.transa == "T" and desc.transb == "N" and desc.k % 4 == 0
                                   and desc.lda % 4 == 0 and desc.ldb % 4 == 0
                                   and desc.ldc % 4 == 0 and desc.align >= 4):
        return None
    from .cublaslt import make_launch

    return make_launch(desc, _TYPES[(desc.prefix, base_compute(desc.compute))], desc.device)


def run(desc: GemmDesc, a, b, c, plan=None) -> None:
    """``cublasGemmEx`` / ``cublasGemmStridedBatchedEx`` on CuPy's current stream (the route
    for what :func:`bind` leaves: see the module's docstring)."""
    from cupy.cuda import get_current_stream

    blas = _blas_binding()
    c_final = None
    if desc.prefix == "i":
        desc, a, b, c, c_final = _arrange_int8(desc, a, b, c)
    ab_type, c_type, compute_type, scalar = _TYPES[(desc.prefix, base_compute(desc.compute))]
    alpha, beta = _scalars.pointers(scalar, desc.alpha, desc.beta)
    ta, tb = _OPS[desc.transa], _OPS[desc.transb]
    with _blas_lock:     # one handle per device: its stream is set for this call only
        handle = _blas_handle(blas, desc.device)
        blas.set_stream(handle, get_current_stream().ptr)
        if desc.batch == 1:
            blas.gemm_ex(handle, ta, tb, desc.m, desc.n, desc.k, alpha,
                         a.data.ptr, ab_type, desc.lda, b.data.ptr, ab_type, desc.ldb,
                         beta, c.data.ptr, c_type, desc.ldc, compute_type, CUBLAS_GEMM_DEFAULT)
        else:
            blas.gemm_strided_batched_ex(
                handle, ta, tb, desc.m, desc.n, desc.k, alpha,
                a.data.ptr, ab_type, desc.lda, desc.stride_a, b.data.ptr, ab_type, desc.ldb,
                desc.stride_b, beta, c.data.ptr, c_type, desc.ldc, desc.stride_c,
                desc.batch, compute_type, CUBLAS_GEMM_DEFAULT)
    if c_final is not None:
        dst, view = c_final
        dst[...] = view


def _round4(x: int) -> int:
    return (x + 3) & ~3


def _arrange_int8(desc: GemmDesc, a, b, c):
    """Bring an int8 problem into cuBLAS's tensor-core arrangement (see module docstring)."""
    # k must be a multiple of 4 too: when it is not, both operands are copied with K
    # zero-padded to the next multiple, which leaves the product unchanged.
    k_ok = desc.k % 4 == 0
    a_ok = (k_ok and desc.transa == "T" and desc.lda % 4 == 0
            and _arrays.data_ptr(a) % 4 == 0)
    b_ok = (k_ok and desc.transb == "N" and desc.ldb % 4 == 0
            and _arrays.data_ptr(b) % 4 == 0)
    lda, sa, ldb, sb = desc.lda, desc.stride_a, desc.ldb, desc.stride_b
    if not a_ok:
        a, lda, sa = _a_copy(a, desc)
    if not b_ok:
        b, ldb, sb = _b_copy(b, desc)
    c_final = None
    ldc, sc = desc.ldc, desc.stride_c
    if desc.ldc % 4:
        import cupy
        ldc = _round4(desc.m)
        tmp = cupy.empty((desc.batch, desc.n, ldc), dtype=c.dtype)
        dst = _arrays.strided_view(c, (desc.batch, desc.n, desc.m), (desc.stride_c, desc.ldc, 1))
        if desc.beta != 0:
            tmp[:, :, : desc.m] = dst
        c_final = (dst, tmp[:, :, : desc.m])
        c, sc = tmp, desc.n * ldc
    new = desc._replace(transa="T", transb="N", k=_round4(desc.k), lda=lda, ldb=ldb, ldc=ldc,
                        stride_a=sa, stride_b=sb, stride_c=sc)
    return new, a, b, c, c_final


def _k_major_copy(x, stored_shape, ld, stride, k_first, outer, k, batch):
    """Copy op(X) into a zero-padded (copies, outer, round4(k)) buffer whose rows are K-vectors
    (row i of A's copy is op(A)[i, :]; row j of B's is op(B)[:, j]). ``k_first``: the stored
    matrix has K as its rows. A broadcast operand (stride 0) is copied once and stays so.
    Returns (buffer, ld, batch stride) for cuBLAS ('T' for A, 'N' for B)."""
    import cupy

    copies = 1 if stride == 0 else batch
    ldp = _round4(k)
    buf = cupy.zeros((copies, outer, ldp), dtype=x.dtype)
    stored = _arrays.strided_view(x, (copies,) + stored_shape, (stride, 1, ld))
    buf[:, :, :k] = stored.swapaxes(1, 2) if k_first else stored
    return buf, ldp, (0 if copies == 1 else outer * ldp)


def _a_copy(a, desc: GemmDesc):
    return _k_major_copy(a, desc.a_shape(), desc.lda, desc.stride_a, desc.transa != "N",
                         desc.m, desc.k, desc.batch)


def _b_copy(b, desc: GemmDesc):
    return _k_major_copy(b, desc.b_shape(), desc.ldb, desc.stride_b, desc.transb == "N",
                         desc.n, desc.k, desc.batch)
