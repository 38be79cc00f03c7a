"""The stateful form for loops: plan once, then launch with nothing but pointers.

``Matmul(a, b, out=c)`` does everything a call does except the launch: it checks the
arguments, describes the problem, plans it and binds the plan's launch (compiled kernel and
packed arguments, or the cuBLASLt descriptors and algorithm). ``execute()`` then enqueues the
product; ``execute(a=new_a, b=new_b, c=new_c)`` runs on other arrays of the same layout (same
dtype, shape and strides; pointers in the same alignment class), checked with a handful of
comparisons. ``free()`` (or leaving a ``with`` block) releases what it holds.
"""
from __future__ import annotations

from . import calls, streams
from ._types import ROW_BY_DTYPE, resolve_compute
from .desc import check_backend
from .matmul import matmul as _matmul

__all__ = ["Matmul"]


class Matmul:
    """``out = a @ b`` (``numpy.matmul`` semantics on CuPy arrays), planned once.

    The product must run as one launch on the arrays' own memory (what C-contiguous,
    F-contiguous or transposed operands and mergeable batches give); otherwise ValueError
    says why and :func:`pyblasgemm.matmul` is the form to use.

    Parameters
    ----------
    a, b : cupy.ndarray
        Operands with 2 or more dimensions (batch dimensions broadcast), one dtype among
        float16, bfloat16, float32, float64, complex64, complex128.
    out : cupy.ndarray, optional
        The result array; allocated (C-ordered) when not given, and reused by every execute.
    compute, backend, stream : optional
        As for :func:`pyblasgemm.matmul`; ``stream`` is the default of :meth:`execute`.
    bias, activation, preactivation_out : optional
        An epilogue, as for :func:`pyblasgemm.matmul` (:mod:`pyblasgemm.epilogue`): the
        product then goes into an accumulation-type array this object holds, and each
        execute adds the epilogue pass (the arrays given here are the ones it uses).

    Examples
    --------
    On a GPU:

    >>> mm = pyblasgemm.Matmul(a, b, out=c)            # doctest: +SKIP
    >>> for step in range(1000):                       # doctest: +SKIP
    ...     mm.execute()                               # c = a @ b, ~5 µs of host time
    >>> mm.execute(a=a2)                               # doctest: +SKIP
    >>> mm.free()                                      # doctest: +SKIP
    """

    def __init__(self, a, b, out=None, *, compute=None, backend=None, stream=None, bias=None,
                 activation=None, preactivation_out=None):
        cupy_nd = calls.cupy_type()
        if cupy_nd is None or type(a) is not cupy_nd or type(b) is not cupy_nd:
            raise TypeError(f"Matmul: a and b must be CuPy arrays, not {type(a).__name__} and "
                            f"{type(b).__name__} (NumPy arrays: use pyblasgemm.matmul)")
        if a.ndim < 2 or b.ndim < 2:
            raise ValueError(f"Matmul: a and b need 2 or more dimensions (got {a.ndim} and "
                             f"{b.ndim}); use pyblasgemm.matmul for vectors")
        if a.dtype != b.dtype or a.dtype not in ROW_BY_DTYPE or a.dtype.kind == "i":
            raise TypeError(f"Matmul: a and b must share one floating dtype, got {a.dtype} and "
                            f"{b.dtype}")
        row = ROW_BY_DTYPE[a.dtype]
        resolve_compute(row, compute, "Matmul")
        check_backend("Matmul", backend)
        self._stream = streams.handle(stream)
        self._epilogue = None
        if bias is not None or activation is not None or preactivation_out is not None:
            self._epilogue = _epilogue_state(a, b, out, row, bias, activation, preactivation_out)
        if out is None:
            out = cupy_nd(_matmul_shape(a, b), row.c_dtype) if self._epilogue else \
                _matmul(a, b, compute=compute, backend=backend, stream=self._stream)
        elif type(out) is not cupy_nd:
            raise TypeError(f"Matmul: out must be a CuPy array, not {type(out).__name__}")
        # plan and bind through the ordinary call (its checks and messages), then keep the
        # launch it ran: the one-launch route is what execute() repeats
        target = out if self._epilogue is None else self._epilogue[1]
        ran = _one_launch(a, b, target, compute, backend, self._stream,
                          accumulate_into=self._epilogue is not None)
        if ran is None:
            raise ValueError("Matmul: this product does not run as one launch on the arrays' "
                             "own memory (it needs copies, a temporary or a loop over batch "
                             "dimensions); use pyblasgemm.matmul")
        self._launch, self._swap = ran
        self.a, self.b, self.out = a, b, out
        self._layout = tuple((x.dtype, x.shape, x.strides) for x in (a, b, out))
        self._ptrs = (a.data.ptr, b.data.ptr, target.data.ptr)
        self._mask = _align_mask(self._launch)

    def execute(self, a=None, b=None, c=None, *, stream=None):
        """Enqueue ``c = a @ b`` (the arrays given at construction unless others are passed;
        they must have the same dtype, shape and strides). Returns the result array."""
        pa, pb, pc = self._ptrs
        if a is not None or b is not None or c is not None:
            pa, pb, pc, c = self._check_new(a, b, c)
            if self._epilogue is not None:
                pc = self._ptrs[2]         # the product still goes into the held array
        else:
            c = self.out
        sptr = (self._stream if stream is None else streams.handle(stream))
        if sptr is None:
            sptr = streams.current()
        if self._swap:
            self._launch(pb, pa, pc, self._one, self._zero, sptr)
        else:
            self._launch(pa, pb, pc, self._one, self._zero, sptr)
        if self._epilogue is not None:
            from .epilogue import apply

            epi, t, bias, pre = self._epilogue
            with streams.on(sptr):
                apply(epi, t, None, None, None, bias, None, None, pre, c)
        return c

    _one, _zero = 1.0, 0.0

    def _check_new(self, a, b, c):
        arrays = [self.a if a is None else a, self.b if b is None else b,
                  self.out if c is None else c]
        for name, x, (dtype, shape, strides) in zip("abc", arrays, self._layout):
            if type(x) is not type(self.a) or x.dtype != dtype or x.shape != shape \
                    or x.strides != strides:
                raise ValueError(f"Matmul.execute: {name} must have dtype {dtype}, shape "
                                 f"{shape} and strides {strides} like the array it replaces "
                                 f"(got {getattr(x, 'dtype', None)}, {getattr(x, 'shape', None)}, "
                                 f"{getattr(x, 'strides', None)}); make a new Matmul for it")
            if x.data.device_id != self.a.data.device_id:
                raise ValueError(f"Matmul.execute: {name} is on GPU {x.data.device_id}, the "
                                 f"plan on GPU {self.a.data.device_id}")
        pa, pb, pc = (x.data.ptr for x in arrays)
        if (pa | pb | pc) & self._mask:
            raise ValueError(f"Matmul.execute: pointers 0x{pa:x}, 0x{pb:x}, 0x{pc:x} are less "
                             f"aligned than the planned arrays' ({self._mask + 1} bytes)")
        a_, b_, c_ = arrays
        for name, x in (("a", a_), ("b", b_)):
            if _overlap(c_, x):
                raise ValueError(f"Matmul.execute: c overlaps {name} in memory")
        return pa, pb, pc, c_

    def free(self) -> None:
        """Drop the launch and the arrays (the plan cache may still hold the launch)."""
        self._launch = None
        self.a = self.b = self.out = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.free()
        return False


def _epilogue_state(a, b, out, row, bias, activation, preactivation_out):
    """(Epilogue, the held accumulation-type product array, bias, pre-activation array)."""
    import cupy

    from . import epilogue
    from ._types import ROW_BY_DTYPES

    shape = _matmul_shape(a, b)
    out_dtype = row.c_dtype
    if out is not None and (getattr(out, "dtype", None) != out_dtype or getattr(out, "shape", None) != shape):
        raise ValueError(f"Matmul: out must have dtype {out_dtype} and shape {shape}, got "
                         f"{getattr(out, 'dtype', None)} and {getattr(out, 'shape', None)}")
    epi = epilogue.check("Matmul", shape, shape[-2:], out_dtype, "cupy", bias, activation,
                         preactivation_out, None, None, a.dtype)
    acc = epilogue.acc_dtype(out_dtype)
    if acc != row.c_dtype and (a.dtype, acc) not in ROW_BY_DTYPES:
        raise TypeError(f"Matmul: no {acc} accumulation route for {a.dtype} operands")
    return epi, cupy.empty(shape, acc), bias, preactivation_out


def _one_launch(a, b, out, compute, backend, stream, accumulate_into=False):
    """Run ``matmul(a, b, out=out)`` through the full path and return ``(launch, swapped)`` if
    it ran as one launch on the arrays' memory, else None."""
    from .matmul import _batched
    from ._layout import may_overlap
    from ._types import ROW_BY_DTYPES

    row = ROW_BY_DTYPE[a.dtype]
    if accumulate_into and out.dtype != row.c_dtype:   # an epilogue's float32 product (shgemm, sbgemm)
        row = ROW_BY_DTYPES.get((a.dtype, out.dtype), row)
    if out.dtype != row.c_dtype or out.shape != _matmul_shape(a, b):
        raise ValueError(f"Matmul: out must have dtype {row.c_dtype} and shape "
                         f"{_matmul_shape(a, b)}, got {out.dtype} and {out.shape}")
    if may_overlap(out, a) or may_overlap(out, b):
        raise ValueError("Matmul: out overlaps a or b in memory")
    with streams.on(stream):
        return _batched(row, resolve_compute(row, compute, "Matmul"),
                        check_backend("Matmul", backend), a, b, out, None, stream)


def _matmul_shape(a, b):
    import numpy as np

    try:
        batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    except ValueError:
        raise ValueError(f"Matmul: batch dimensions {a.shape[:-2]} and {b.shape[:-2]} do not "
                         f"broadcast") from None
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(f"Matmul: a is {a.shape[-2]} x {a.shape[-1]} but b is "
                         f"{b.shape[-2]} x {b.shape[-1]}")
    return batch + (a.shape[-2], b.shape[-1])


def _align_mask(launch) -> int:
    """Pointer bits that must be zero for the launch (its bound alignment class)."""
    align = max(getattr(launch, "a_align", 1), getattr(launch, "c_align", 1),
                getattr(launch, "align", 1))
    return align - 1


def _overlap(x, y) -> bool:
    from ._layout import may_overlap

    return may_overlap(x, y)
