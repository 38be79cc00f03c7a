"""Grouped GEMM: many independent products in one call.

Three forms, as mixture-of-experts layers and batched solvers need them:

* **a list of problems** of different sizes: ``grouped_matmul([a0, a1, ...], [b0, b1, ...])``
  returns ``[a0 @ b0, a1 @ b1, ...]``;
* **the mixture-of-experts form** (contiguous layout): the tokens of all experts as the rows of
  one ``a`` (``(M, k)``, expert after expert), one weight per expert in ``b`` (``(groups, k,
  n)``) and ``offsets``, each expert's end row (int, non-decreasing, the last one ``M``: the
  convention of ``torch._grouped_mm``'s ``offs``); rows ``offsets[g-1]:offsets[g]`` are
  multiplied by ``b[g]``, and an expert may have no rows;
* **the masked layout** (DeepGEMM's ``m_grouped_*_masked``): ``a`` is ``(groups, max_m, k)``,
  each expert's tokens padded to ``max_m`` rows, ``b`` ``(groups, k, n)``, and ``masked_m``
  each expert's valid row count (``0 <= masked_m[g] <= max_m``); the result is ``(groups,
  max_m, n)`` with ``out[g, :masked_m[g]] = a[g, :masked_m[g]] @ b[g]``. Rows at and past
  ``masked_m[g]`` are neither read into a result nor written: they keep what ``out`` held
  (given ``out=``), or whatever the new array's memory held (unspecified) when the call
  allocates it.

Every problem is :func:`pyblasgemm.gemm`'s product and takes its epilogue keywords (one
``bias`` per group: a list in the list form, a ``(groups, n)`` array in the expert forms).
Types: float16 and bfloat16 (16-bit results, as ``torch._grouped_mm``), float32, float64,
int8 (an int32 result, or dequantized with ``scale_a`` / ``scale_b`` to float), and float8
(``float8_e4m3fn`` / ``float8_e5m2`` with their scales: the float8 guide's "Grouped float8
products").

How it runs: on a GPU, float16 / bfloat16 / int8 / float8 groups of row-major operands (unit
stride along rows, 16-byte aligned rows or not) can run as **one persistent launch** of our
mma.sync kernel walking a device-side table of the problems (:mod:`pyblasgemm.kernels.grouped`),
or on sm_90, for float16 / bfloat16 with the sizes on the GPU, of the wgmma/TMA kernel's grouped
walk (docs/design/hopper-grouped-walk.md), with the epilogue (bias, activation, int8 and float8
dequantization) fused in its store, where the model puts
it below the loop (many small groups: the loop's host cost per group is the larger; few large
ones stay a loop of cuBLAS-speed GEMMs) and always with ``backend="tensorcore"``;
:func:`pyblasgemm.epilogue.last_route` says which route ran. Everything else (other types, other
layouts, ``backend="cublas"``, a ``compute=`` mode, a result type the kernel does not write)
runs one planned GEMM per non-empty group, in order, on the arrays' device (nothing is
copied). Both give gemm's results: each product accumulates in float32 (int32) and is
rounded once.

Example
-------
>>> import numpy as np, pyblasgemm
>>> a = np.arange(8, dtype=np.float32).reshape(4, 2)            # 4 tokens: 1 for expert 0, 3 for 1
>>> b = np.stack([np.eye(2, dtype=np.float32), 2 * np.eye(2, dtype=np.float32)])
>>> pyblasgemm.grouped_matmul(a, b, offsets=[1, 4])
array([[ 0.,  1.],
       [ 4.,  6.],
       [ 8., 10.],
       [12., 14.]], dtype=float32)

The same tokens in the masked layout (expert 0's block of 3 rows holds 1 valid token; the
rows past it keep ``out``'s values, here -1):

>>> x = np.zeros((2, 3, 2), np.float32); x[0, :1] = a[:1]; x[1] = a[1:]
>>> y = pyblasgemm.grouped_matmul(x, b, masked_m=[1, 3], out=np.full((2, 3, 2), -1, np.float32))
>>> y[0]
array([[ 0.,  1.],
       [-1., -1.],
       [-1., -1.]], dtype=float32)
"""
from __future__ import annotations

import sys
import threading

import numpy as np

from typing import TYPE_CHECKING, Any, NamedTuple, overload

if TYPE_CHECKING:     # types only: importing pyblasgemm imports none of these
    from collections.abc import Sequence

    import cupy  # type: ignore[import-not-found, import-untyped, unused-ignore]
    import jax
    import torch

    from ._typing import Activation, Backend, Compute, NDArray

from . import _arrays, _grouped_fp8, arrays, calls, streams
from ._layout import may_overlap
from ._types import ROW_BY_DTYPE, ROW_BY_DTYPES, dtype_text, resolve_compute
from .desc import GroupSpec, alignment, check_backend, check_epilogue, check_same_place, describe
from .epilogue import EpilogueSpec, note_route
from .execute import execute_group, execute_group_offsets
from .gemm import check_operands, gemm
from .kernels.grouped import PROBLEM_ROW
from .kernels.jit import DEQUANT_OUT
from .planner.overrides import check_forced_backend, current_settings, resolve_invariant
from .planner.routes import GROUPED_KINDS

__all__ = ["grouped_matmul"]


def _check_offsets(offsets, rows: int, groups: int) -> list[int]:
    """The end offsets as Python ints, or a ValueError naming the first bad one."""
    try:
        ends = [int(v) for v in (offsets.tolist() if hasattr(offsets, "tolist") else offsets)]
    except (TypeError, ValueError):
        raise TypeError(f"grouped_matmul: offsets must be a sequence of ints, got {offsets!r}") from None
    if len(ends) != groups:
        raise ValueError(f"grouped_matmul: offsets has {len(ends)} entries; b holds {groups} groups")
    prev = 0
    for g, end in enumerate(ends):
        if end < prev:
            raise ValueError(f"grouped_matmul: offsets[{g}]={end} is below offsets[{g - 1}]={prev} "
                             f"(end rows must not decrease)" if g else
                             f"grouped_matmul: offsets[0]={end} must be >= 0")
        prev = end
    if groups and ends[-1] != rows:
        raise ValueError(f"grouped_matmul: offsets[-1]={ends[-1]} must equal a's row count {rows}")
    return ends


def _result_dtype(a_dtype, dtype, dequant: bool):
    """gemm's result type for these operands (16-bit stay 16-bit, int8 gives int32), float32
    for a dequantized int8 product, or ``dtype`` when given: for a product that is not
    dequantized, one gemm writes (the operands' own result type, or float32 for 16-bit
    operands); a dequantized one's is checked with the epilogue."""
    row = ROW_BY_DTYPE.get(np.dtype(a_dtype))
    if row is None:
        raise TypeError(f"grouped_matmul: dtype {np.dtype(a_dtype).name} is not supported")
    if dtype is not None:
        try:
            want = np.dtype(dtype)
        except TypeError as exc:
            raise TypeError(f"grouped_matmul: dtype={dtype!r} is not a dtype ({exc})") from None
        if not dequant and want != row.c_dtype and not (row.ab_dtype.itemsize == 2 and want == np.float32):
            raise TypeError(f"grouped_matmul: dtype={want.name} is not a result type of "
                            f"{row.ab_dtype.name} operands ({row.c_dtype.name}"
                            + (" or float32)" if row.ab_dtype.itemsize == 2 else ")"))
        return want
    if dequant:
        return np.dtype(np.float32)
    return row.c_dtype


def _check_target(at, x, n, row, target, given, bias, scale_a, scale_b, activation):
    """gemm's checks of a problem's output and epilogue (the whole of the expert form: ``at``
    empty; problem ``g`` of the list form: ``at`` ``'[g]'``), raised before any product runs
    and naming the arguments as the caller gave them (``out[1]``, ``bias[1]``: each problem's
    gemm would name its own ``out``, ``bias``)."""
    r, name, m = "grouped_matmul", f"out{at}", x.shape[0]
    dequant = scale_a is not None or scale_b is not None
    if given:
        if _arrays.array_module_name(target) is None:
            raise TypeError(f"{r}: {name} must be a NumPy or CuPy array, not {type(target).__name__}")
        check_same_place(r, [(f"a{at}", x), (name, target)])
        if target.shape != (m, n):
            raise ValueError(f"{r}: {name} has shape {target.shape}; expected {(m, n)}")
        gemm_types = (row.c_dtype,) + ((np.dtype(np.float32),) if row.ab_dtype.itemsize == 2 else ())
        if not target.dtype.isnative or (not dequant and target.dtype not in gemm_types):
            raise TypeError(f"{r}: {name} has dtype {dtype_text(target.dtype)}; expected "
                            f"{' or '.join(d.name for d in gemm_types)}")
        if not _arrays.is_writeable(target):
            raise ValueError(f"{r}: {name} is read-only")
    if bias is not None or activation is not None or dequant:
        check_epilogue(r, (m, n), (m, n), target.dtype, _arrays.array_module_name(x), bias,
                        activation, None, scale_a, scale_b, x.dtype,
                        names={"bias": f"bias{at}", "scale_a": f"scale_a{at}", "scale_b": f"scale_b{at}"})


def _offsets_of_sizes(group_sizes, a, b) -> list[int]:
    """JAX's ``group_sizes`` (rows per group) as end offsets, or the error naming it."""
    try:
        sizes = [int(v) for v in (group_sizes.tolist() if hasattr(group_sizes, "tolist")
                                  else group_sizes)]
    except (TypeError, ValueError):
        raise TypeError(f"grouped_matmul: group_sizes must be a sequence of ints, got "
                        f"{group_sizes!r}") from None
    groups = b.shape[0] if getattr(b, "ndim", None) == 3 else None
    if groups is not None and len(sizes) != groups:
        raise ValueError(f"grouped_matmul: group_sizes has {len(sizes)} entries; b holds {groups} groups")
    ends, total = [], 0
    for g, size in enumerate(sizes):
        if size < 0:
            raise ValueError(f"grouped_matmul: group_sizes[{g}]={size} must be >= 0")
        total += size
        ends.append(total)
    rows = a.shape[0] if getattr(a, "ndim", None) == 2 else None
    if rows is not None and total != rows:
        raise ValueError(f"grouped_matmul: group_sizes sums to {total}; it must equal a's row "
                         f"count {rows}")
    return ends


# the arrays' framework in gives it out (pyblasgemm._typing): lists of problems give a list,
# the expert form one array
@overload
def grouped_matmul(a: Sequence[NDArray], b: Sequence[NDArray], *, offsets: None = None,
                   out: Sequence[NDArray] | None = None, dtype: Any = None,
                   bias: Any = None, activation: Activation | None = None, scale_a: Any = None,
                   scale_b: Any = None, compute: Compute | None = None,
                   backend: Backend | None = None, stream: Any = None,
                   group_sizes: None = None) -> list[NDArray]: ...


@overload
def grouped_matmul(a: NDArray, b: NDArray, *, offsets: Any = None,
                   out: NDArray | None = None, dtype: Any = None,
                   bias: Any = None, activation: Activation | None = None, scale_a: Any = None,
                   scale_b: Any = None, compute: Compute | None = None,
                   backend: Backend | None = None, stream: Any = None,
                   group_sizes: Any = None, invariant: bool | None = None,
                   masked_m: Any = None, expected_m: int | None = None) -> NDArray: ...


@overload
def grouped_matmul(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor], *, offsets: None = None,
                   out: Sequence[torch.Tensor] | None = None, dtype: Any = None,
                   bias: Any = None, activation: Activation | None = None, scale_a: Any = None,
                   scale_b: Any = None, compute: Compute | None = None,
                   backend: Backend | None = None, stream: Any = None,
                   group_sizes: None = None) -> list[torch.Tensor]: ...


@overload
def grouped_matmul(a: torch.Tensor, b: torch.Tensor, *, offsets: Any = None,
                   out: torch.Tensor | None = None, dtype: Any = None,
                   bias: Any = None, activation: Activation | None = None, scale_a: Any = None,
                   scale_b: Any = None, compute: Compute | None = None,
                   backend: Backend | None = None, stream: Any = None,
                   group_sizes: Any = None, invariant: bool | None = None,
                   masked_m: Any = None, expected_m: int | None = None) -> torch.Tensor: ...


@overload
def grouped_matmul(a: Sequence[jax.Array], b: Sequence[jax.Array], *, offsets: None = None,
                   out: Sequence[jax.Array] | None = None, dtype: Any = None,
                   bias: Any = None, activation: Activation | None = None, scale_a: Any = None,
                   scale_b: Any = None, compute: Compute | None = None,
                   backend: Backend | None = None, stream: Any = None,
                   group_sizes: None = None) -> list[jax.Array]: ...


@overload
def grouped_matmul(a: jax.Array, b: jax.Array, *, offsets: Any = None,
                   out: jax.Array | None = None, dtype: Any = None,
                   bias: Any = None, activation: Activation | None = None, scale_a: Any = None,
                   scale_b: Any = None, compute: Compute | None = None,
                   backend: Backend | None = None, stream: Any = None,
                   group_sizes: Any = None, invariant: bool | None = None,
                   masked_m: Any = None, expected_m: int | None = None) -> jax.Array: ...


@overload
def grouped_matmul(a: Sequence[cupy.ndarray], b: Sequence[cupy.ndarray], *, offsets: None = None,
                   out: Sequence[cupy.ndarray] | None = None, dtype: Any = None,
                   bias: Any = None, activation: Activation | None = None, scale_a: Any = None,
                   scale_b: Any = None, compute: Compute | None = None,
                   backend: Backend | None = None, stream: Any = None,
                   group_sizes: None = None) -> list[cupy.ndarray]: ...


@overload
def grouped_matmul(a: cupy.ndarray, b: cupy.ndarray, *, offsets: Any = None,
                   out: cupy.ndarray | None = None, dtype: Any = None,
                   bias: Any = None, activation: Activation | None = None, scale_a: Any = None,
                   scale_b: Any = None, compute: Compute | None = None,
                   backend: Backend | None = None, stream: Any = None,
                   group_sizes: Any = None, invariant: bool | None = None,
                   masked_m: Any = None, expected_m: int | None = None) -> cupy.ndarray: ...


@overload
def grouped_matmul(a: Any, b: Any, *, offsets: Any = None, out: Any = None, dtype: Any = None,
                   bias: Any = None, activation: Activation | None = None, scale_a: Any = None,
                   scale_b: Any = None, compute: Compute | None = None,
                   backend: Backend | None = None, stream: Any = None,
                   group_sizes: Any = None, invariant: bool | None = None,
                   masked_m: Any = None, expected_m: int | None = None) -> Any: ...


def grouped_matmul(a: Any, b: Any, *, offsets: Any = None, out: Any = None, dtype: Any = None,
                   bias: Any = None, activation: Activation | None = None, scale_a: Any = None,
                   scale_b: Any = None, compute: Compute | None = None,
                   backend: Backend | None = None, stream: Any = None,
                   group_sizes: Any = None, invariant: bool | None = None,
                   masked_m: Any = None, expected_m: int | None = None) -> Any:
    """The products of many independent problems (see the module docstring for both forms).

    Each product is :func:`pyblasgemm.gemm`'s ``'N', 'N'`` product with its epilogue: the
    result has the operands' type (float16 and bfloat16 stay 16-bit, int8 gives int32), or
    float32 (or ``dtype``) for a dequantized int8 product.

    Parameters
    ----------
    a, b : lists of 2-D arrays, or ``a`` (M, k) and ``b`` (groups, k, n) with ``offsets``
        NumPy or CuPy arrays, or PyTorch tensors, JAX arrays and DLPack objects (the results
        in their framework).
    offsets : sequence of int, or a 1-D int32 / int64 GPU array, optional
        Each group's end row in ``a`` (the expert form). On the GPU (a CuPy array, a CUDA
        tensor: ``torch._grouped_mm``'s ``offs``, or a JAX GPU array) the offsets are never read on the host: the
        grouped kernel's CTAs scan them on the device (a table kernel builds the problems
        first past 512 groups), so the call may be captured in a CUDA graph and replayed with
        new sizes. The values are not checked then (that would read them): a group ends at the
        largest offset so far, clamped to ``a``'s rows, so any values stay inside the arrays,
        and rows past the last offset are not written. Where the call cannot be one launch (an
        invariant call, a layout off the kernel) they are read back and checked as host
        offsets.
    group_sizes : sequence of int, optional
        Instead of ``offsets``: each group's row count (JAX's ``ragged_dot`` word; must sum
        to ``a``'s rows). ``group_sizes=[1, 3]`` is ``offsets=[1, 4]``.
    masked_m : sequence of int, or a 1-D int32 / int64 GPU array, optional
        The masked layout (instead of ``offsets``): ``a`` is ``(groups, max_m, k)``, the result
        ``(groups, max_m, n)``, and group ``g`` multiplies its first ``masked_m[g]`` rows; its
        other rows are not read into a result and not written (see the module docstring). Host
        values (a sequence, a NumPy array) are checked before any work: a count below 0 or
        above ``max_m`` is refused, naming it (a count past its block is a caller's bug, and a
        check costs nothing there). Values on the GPU (a CuPy array, a CUDA tensor, a JAX GPU
        array) are never
        read on the host, as device ``offsets`` are not: the call may be captured in a CUDA
        graph and replayed with new counts, and each count is clamped to ``[0, max_m]`` on the
        device (refusing would need the read the layout exists to avoid; clamped, a count can
        only reach rows of its own group's block). Where the call cannot be one launch (an
        invariant call, a layout off the kernel, the planner's loop) they are read back and
        checked as host values.
    expected_m : int, optional
        With ``masked_m`` on the GPU: the rows a group is expected to hold (DeepGEMM's hint,
        ``0 <= expected_m <= max_m``; default ``max_m``): the plan (one launch or a loop) and
        the grouped tile are chosen for groups of that many rows. It never changes which rows
        are computed.
    out : list of arrays, or an (M, n) array in the expert form, optional
    dtype : the result type of a dequantized int8 or a float8 product (float16, bfloat16, float32)
    bias, activation, scale_a, scale_b, compute, backend, stream
        As for :func:`pyblasgemm.gemm` (``stream``: where the GPU work is enqueued, default
        the current stream of the arrays' framework), per group: ``bias``, ``scale_a``, ``scale_b`` are
        lists in the list form; in the expert form ``bias`` and ``scale_b`` are
        ``(groups, n)`` arrays and ``scale_a`` an ``(M,)`` array (one scale per token).
        float8 operands take the float8 scale layouts per group (the float8 guide, "Grouped
        float8 products").
    invariant : bool, optional
        Batch-invariant: each row of every result has the bits :func:`pyblasgemm.gemm`
        with ``invariant=True`` gives it alone, whatever the groups' sizes (the problems then
        run one by one, never as one grouped launch). None: ``PYBLASGEMM_INVARIANT``.

    Returns
    -------
    list of arrays (list form), one (M, n) array (expert form) or one (groups, max_m, n)
    array (masked layout)

    Examples
    --------
    >>> import numpy as np, pyblasgemm
    >>> a = [np.ones((2, 3), np.float32), np.ones((1, 2), np.float32)]
    >>> b = [np.ones((3, 4), np.float32), np.full((2, 1), 2, np.float32)]
    >>> [r.shape for r in pyblasgemm.grouped_matmul(a, b)]
    [(2, 4), (1, 1)]
    >>> pyblasgemm.grouped_matmul(a, b)[1]
    array([[4.]], dtype=float32)
    >>> x = np.ones((4, 2), np.float32); w = np.stack([np.eye(2, dtype=np.float32)] * 2)
    >>> pyblasgemm.grouped_matmul(x, w, group_sizes=[1, 3]).shape     # JAX's ragged_dot word
    (4, 2)
    >>> pyblasgemm.grouped_matmul(x.reshape(2, 2, 2), w, masked_m=[2, 1])[1, :1]    # masked layout
    array([[1., 1.]], dtype=float32)
    >>> pyblasgemm.grouped_matmul(x.reshape(2, 2, 2), w, masked_m=[2, 3])
    Traceback (most recent call last):
    ValueError: grouped_matmul: masked_m[1]=3 is above max_m=2 (a.shape[1])
    """
    if masked_m is not None and (offsets is not None or group_sizes is not None):
        raise TypeError("grouped_matmul: give masked_m= (the masked layout) or offsets= / "
                        "group_sizes= (the contiguous one), not both")
    if expected_m is not None and masked_m is None:
        raise TypeError("grouped_matmul: expected_m= is a hint of the masked layout: give it with masked_m=")
    if group_sizes is not None:
        if offsets is not None:
            raise TypeError("grouped_matmul: give offsets= or group_sizes=, not both")
        offsets = _offsets_of_sizes(group_sizes, a, b)
    door = _foreign(a, b, offsets, out, dtype, bias, activation, scale_a, scale_b, compute,
                    backend, stream, invariant, masked_m, expected_m)
    if door is not None:
        return door[0]
    if _grouped_fp8.is_fp8_call(a, b):
        return _fp8(a, b, offsets, masked_m, out, dtype, bias, activation, scale_a, scale_b, compute,
                    backend, stream, invariant)
    kw = dict(activation=activation, compute=compute, backend=backend, stream=stream,
              invariant=invariant)
    # one grouped launch tiles the problems together: an invariant call runs them one by one
    one_launch = not resolve_invariant("grouped_matmul", invariant)
    dequant = scale_a is not None or scale_b is not None
    if masked_m is not None:
        return _masked(a, b, masked_m, expected_m, out, dtype, bias, activation, scale_a, scale_b,
                       compute, backend, stream, one_launch, kw)
    if offsets is None:
        if not isinstance(a, (list, tuple)) or not isinstance(b, (list, tuple)):
            raise TypeError("grouped_matmul: give a and b as lists of 2-D arrays, or a (M, k) a, a "
                            "(groups, k, n) b and offsets=")
        if len(a) != len(b):
            raise ValueError(f"grouped_matmul: a has {len(a)} problems and b {len(b)}")
        per = {"bias": bias, "scale_a": scale_a, "scale_b": scale_b, "out": out}
        for name, v in per.items():
            if v is not None and (not isinstance(v, (list, tuple)) or len(v) != len(a)):
                raise ValueError(f"grouped_matmul: {name} must be a list with one entry per problem "
                                 f"({len(a)})")
        for g, (x, y) in enumerate(zip(a, b)):
            if getattr(x, "ndim", None) != 2 or getattr(y, "ndim", None) != 2:
                raise ValueError(f"grouped_matmul: problem {g}: a and b must be 2-D arrays")
            if x.shape[1] != y.shape[0]:
                raise ValueError(f"grouped_matmul: problem {g}: a is {x.shape} and b is {y.shape}")
        targets = []
        for g, (x, y) in enumerate(zip(a, b)):
            # every problem checked before any runs (gemm's checks, named as given here)
            xp_name, row = check_operands("grouped_matmul", x, y, names=(f"a[{g}]", f"b[{g}]"))
            targets.append(out[g] if out is not None else _arrays.xp_of(xp_name).empty(
                (x.shape[0], y.shape[1]), _result_dtype(x.dtype, dtype, dequant)))
            _check_target(f"[{g}]", x, y.shape[1], row, targets[g], out is not None,
                          None if bias is None else bias[g], None if scale_a is None else scale_a[g],
                          None if scale_b is None else scale_b[g], activation)
            if g == 0:
                _check_modes(row, compute, backend, xp_name)
        if one_launch and a and _arrays.array_module_name(a[0]) == "cupy":
            # (every problem checked above, as gemm checks it, before any launch)
            sizes = tuple((y.shape[1], x.shape[0], x.shape[1]) for x, y in zip(a, b))
            blocker = _blocker(a[0], targets[0].dtype, dequant, compute, b[0])
            cols = None if blocker else _list_columns(list(zip(a, b)), targets, bias, scale_a, scale_b,
                                                      targets[0].dtype)
            if cols is None and not blocker:
                blocker = _LAYOUT
            desc = _describe("list", a[0], targets[0].dtype, sizes, cols, blocker, activation,
                             bias is not None, dequant, compute)
            if execute_group(desc, cols, backend, streams.handle(stream)) is not None:
                return targets
        results = []
        for g, (x, y) in enumerate(zip(a, b)):
            target = targets[g]
            results.append(gemm("N", "N", x, y, target, **kw,
                                bias=None if bias is None else bias[g],
                                scale_a=None if scale_a is None else scale_a[g],
                                scale_b=None if scale_b is None else scale_b[g]))
        return results
    xp_name = _arrays.array_module_name(a)
    if xp_name is None or _arrays.array_module_name(b) != xp_name:
        raise TypeError("grouped_matmul: the expert form takes a and b as NumPy arrays or CuPy "
                        "arrays (both of one kind)")
    if a.ndim != 2 or b.ndim != 3 or a.shape[1] != b.shape[1]:
        raise ValueError(f"grouped_matmul: the expert form needs a (M, k) and b (groups, k, n); got "
                         f"{a.shape} and {b.shape}")
    groups, n = b.shape[0], b.shape[2]
    on_device = _device_offsets(offsets, groups, xp_name)
    ends = None if on_device is not None else _check_offsets(offsets, a.shape[0], groups)
    for name, v, shape in (("bias", bias, (groups, n)), ("scale_b", scale_b, (groups, n)),
                           ("scale_a", scale_a, (a.shape[0],))):
        if v is not None and _arrays.array_module_name(v) is None:
            # (a list of per-group vectors is the list form's; .shape was an AttributeError)
            raise TypeError(f"grouped_matmul: {name} must be one {xp_name} array of shape {shape} "
                            f"in the expert form, not {type(v).__name__}")
        if v is not None and v.shape != shape:
            raise ValueError(f"grouped_matmul: {name} has shape {v.shape}; the expert form needs {shape}")
    result_dtype = _result_dtype(a.dtype, dtype, dequant)
    xp = _arrays.xp_of(xp_name)
    out_given = out is not None
    if out is None:
        out = xp.empty((a.shape[0], n), result_dtype)
    elif out.shape != (a.shape[0], n) or out.dtype != result_dtype:
        raise ValueError(f"grouped_matmul: out has shape {out.shape} and dtype {out.dtype.name}; the "
                         f"result is {(a.shape[0], n)} {result_dtype.name}")
    key = None
    if on_device is not None and one_launch:
        # a repeated call: its signature (the offsets' type and count, not their values; every
        # fact the whole-call checks below read: types, shapes, strides, devices, keywords)
        # maps to the launch pair and the table kernel's values, the arrays' bases read again.
        # Looked up before those checks, as the masked layout does: they cost more than the
        # replay (H200, 64 experts of <= 64 tokens: a 96 us call around a 44 us kernel)
        _check_modes(ROW_BY_DTYPE[np.dtype(a.dtype)], compute, backend, xp_name)   # (a known type: _result_dtype)
        key = _expert_signature(a, b, ("on the GPU", on_device[1]), out, out_given, bias, scale_a, scale_b,
                                activation, dtype, compute, backend)
        ran = None if key is None else calls.get(key)
        if ran is not None and on_device[2] == ran.device and (
                not out_given or not (_overlaps(out, a) or _overlaps(out, b))):
            values = dict(ran.values, **_expert_bases(a, b, out, bias, scale_a, scale_b))
            with streams.on(None if stream is None else streams.handle(stream)):
                ran.launch.launch_offsets(groups, on_device[0], on_device[1], values)
            note_route(ran.route)
            _last_device_run.ran = ran
            return out
    if groups:
        # gemm's checks of the whole, named as given, before any group runs (each group's
        # vectors are rows of bias / scale_b: the first stands for all)
        _, row = check_operands("grouped_matmul", a, b[0], names=("a", "b"))
        _check_target("", a, n, row, out, out_given, None if bias is None else bias[0], scale_a,
                      None if scale_b is None else scale_b[0], activation)
        _check_modes(row, compute, backend, xp_name)
    if on_device is not None:
        ran = None
        if one_launch and groups and a.shape[0]:
            ran = _on_device(a, b, on_device, out, bias, scale_a, scale_b, activation, dequant, compute,
                             backend, stream)
        if ran is not None:
            done = _DeviceRan(ran[0], ran[1], ran[2], on_device[2])
            if key is not None:
                calls.put(key, done, refers_to=ran[0])
            _last_device_run.ran = done     # (the torch door records it under the tensors' key)
            return out
        # the loop over groups (or an invariant call) needs the sizes on the host: one read back
        ends = _check_offsets(offsets, a.shape[0], groups)
    key = None if not one_launch else _expert_signature(a, b, ends, out, out_given, bias, scale_a,
                                                         scale_b, activation, dtype, compute, backend)
    if key is not None:
        ran = calls.get(key)
        if ran is not None and (not out_given or not (_overlaps(out, a) or _overlaps(out, b))):
            _replay(ran, a, b, out, bias, scale_a, scale_b, stream)
            return out
    if one_launch and groups and a.shape[0] and xp_name == "cupy":
        # (the whole checked above, as gemm checks it: the per-group vectors share their shapes)
        starts = [0] + ends[:-1]
        sizes = tuple((n, e - s0, a.shape[1]) for s0, e in zip(starts, ends))
        # (_blocker found the operand pair's kind: the types are one pair of it)
        blocker = _blocker(a, out.dtype, dequant, compute, b) or (
            "" if _arrays.device_id(b) == _arrays.device_id(out) == _arrays.device_id(a)
            else "a, b and out are not on one device")
        cols = None if blocker else _expert_columns(a, b, ends, out, bias, scale_a, scale_b)
        if cols is None and not blocker:
            blocker = _LAYOUT
        desc = _describe("experts", a, out.dtype, sizes, cols, blocker, activation, bias is not None,
                         dequant, compute)
        ran = execute_group(desc, cols, backend, streams.handle(stream))
        if ran is not None:
            if key is not None:
                _remember(key, _Ran(*ran), a, b, out, bias, scale_a, scale_b)
            return out
    start = 0
    for g, end in enumerate(ends):
        if end > start:
            gemm("N", "N", a[start:end], b[g], out[start:end], **kw,
                 bias=None if bias is None else bias[g],
                 scale_a=None if scale_a is None else scale_a[start:end],
                 scale_b=None if scale_b is None else scale_b[g])
        start = end
    return out


def _check_masked_m(masked_m, groups: int, max_m: int) -> list[int]:
    """The masked layout's host row counts as Python ints, or the error naming the first bad
    one: every count an integer in ``[0, max_m]`` (refused, not clamped: see
    :func:`grouped_matmul`'s ``masked_m``).

    >>> _check_masked_m([0, 3], 2, 3)
    [0, 3]
    >>> _check_masked_m([0, -1], 2, 3)
    Traceback (most recent call last):
    ValueError: grouped_matmul: masked_m[1]=-1 is below 0
    """
    try:
        values = masked_m.tolist() if hasattr(masked_m, "tolist") else list(masked_m)
    except TypeError:
        raise TypeError(f"grouped_matmul: masked_m must be a sequence of ints, got {masked_m!r}") from None
    if not isinstance(values, list):
        values = [values]           # (a 0-d array's tolist is its one value: refused by length)
    if len(values) != groups:
        raise ValueError(f"grouped_matmul: masked_m has {len(values)} entries; b holds {groups} groups")
    counts = []
    for g, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise TypeError(f"grouped_matmul: masked_m[{g}]={v!r} is not an int")
        v = int(v)
        if v < 0:
            raise ValueError(f"grouped_matmul: masked_m[{g}]={v} is below 0")
        if v > max_m:
            raise ValueError(f"grouped_matmul: masked_m[{g}]={v} is above max_m={max_m} (a.shape[1])")
        counts.append(v)
    return counts


def _rows_of_blocks(x):
    """A ``(groups, rows, ...)`` array as ``(groups * rows, ...)`` sharing its memory (the
    masked layout's blocks as the rows the grouped kernel walks), or None where its strides
    cannot be one row stride (the call then runs a loop over the groups)."""
    groups, rows = x.shape[:2]
    if rows == 1:
        return x[:, 0]
    if groups > 1 and rows > 1 and x.strides[0] != rows * x.strides[1]:
        return None
    flat = x.reshape((groups * rows,) + x.shape[2:])
    # (NumPy and CuPy reshape without a copy where strides allow: a copy would not be written)
    return flat if _arrays.data_ptr(flat) == _arrays.data_ptr(x) else None


def _masked(a, b, masked_m, expected_m, out, dtype, bias, activation, scale_a, scale_b, compute,
            backend, stream, one_launch, kw):
    """:func:`grouped_matmul`'s masked layout (its ``masked_m``): every argument checked before
    any work, then, on a GPU, the blocks seen as rows of one expert-form call (group ``g``'s
    rows start at ``g * max_m``) as one launch: with the counts on the device their scan reads
    them there (``group_rows``, impls/grouped_offsets.cuh), with host counts the packed table
    holds them; else one planned GEMM per group with rows."""
    xp_name = _arrays.array_module_name(a)
    if xp_name is None or _arrays.array_module_name(b) != xp_name:
        raise TypeError("grouped_matmul: the masked layout takes a and b as NumPy arrays or CuPy "
                        "arrays (both of one kind)")
    if a.ndim != 3 or b.ndim != 3 or a.shape[0] != b.shape[0] or a.shape[2] != b.shape[1]:
        raise ValueError(f"grouped_matmul: the masked layout needs a (groups, max_m, k) and b "
                         f"(groups, k, n); got {a.shape} and {b.shape}")
    groups, max_m, n = a.shape[0], a.shape[1], b.shape[2]
    if expected_m is not None:
        if isinstance(expected_m, bool) or not isinstance(expected_m, (int, np.integer)):
            raise TypeError(f"grouped_matmul: expected_m={expected_m!r} is not an int")
        if not 0 <= expected_m <= max_m:
            raise ValueError(f"grouped_matmul: expected_m={expected_m} is outside [0, max_m={max_m}]")
    on_device = _device_offsets(masked_m, groups, xp_name, "masked_m")
    counts = None if on_device is not None else _check_masked_m(masked_m, groups, max_m)
    for name, v, shape in (("bias", bias, (groups, n)), ("scale_b", scale_b, (groups, n)),
                           ("scale_a", scale_a, (groups, max_m))):
        if v is not None and _arrays.array_module_name(v) is None:
            raise TypeError(f"grouped_matmul: {name} must be one {xp_name} array of shape {shape} "
                            f"in the masked layout, not {type(v).__name__}")
        if v is not None and v.shape != shape:
            raise ValueError(f"grouped_matmul: {name} has shape {v.shape}; the masked layout needs {shape}")
    dequant = scale_a is not None or scale_b is not None
    result_dtype = _result_dtype(a.dtype, dtype, dequant)
    out_given = out is not None
    if out is None:
        # (rows past a group's count are never written: a new result's are unspecified, and
        # zeroing them would cost a pass over groups x max_m x n outputs)
        out = _arrays.xp_of(xp_name).empty((groups, max_m, n), result_dtype)
    elif _arrays.array_module_name(out) is None:
        raise TypeError(f"grouped_matmul: out must be a NumPy or CuPy array, not {type(out).__name__}")
    elif out.shape != (groups, max_m, n) or out.dtype != result_dtype:
        raise ValueError(f"grouped_matmul: out has shape {out.shape} and dtype {out.dtype.name}; the "
                         f"result is {(groups, max_m, n)} {result_dtype.name}")
    launchable = one_launch and groups and max_m and n and xp_name == "cupy"
    expected = max_m if expected_m is None else int(expected_m)
    key = None
    if launchable:
        # a repeated call: its key holds every fact the checks below read (types, shapes,
        # strides, devices, the keywords; the counts' values or their type on the GPU), so a
        # hit replays its launch before them (the three views they take cost more than the
        # replay: H200, 64 experts of <= 64 rows)
        _check_modes(ROW_BY_DTYPE[np.dtype(a.dtype)], compute, backend, xp_name)   # (a known type: _result_dtype)
        words = (("masked on the GPU", on_device[1], max_m, expected) if on_device is not None
                 else ("masked", max_m, *counts))
        key = _expert_signature(a, b, words, out, out_given, bias, scale_a, scale_b, activation, dtype, compute,
                                backend)
        ran = None if key is None else calls.get(key)
        if ran is not None and not (out_given and (_overlaps(out, a) or _overlaps(out, b))):
            if on_device is None:
                _replay(ran, a, b, out, bias, scale_a, scale_b, stream)
                return out
            if on_device[2] == ran.device:
                values = dict(ran.values, **_expert_bases(a, b, out, bias, scale_a, scale_b))
                with streams.on(None if stream is None else streams.handle(stream)):
                    ran.launch.launch_offsets(groups, on_device[0], on_device[1], values)
                note_route(ran.route)
                return out
    # the blocks as the rows of one array (None where their strides cannot be), the views the
    # checks and the launch share
    x, y = _rows_of_blocks(a), _rows_of_blocks(out)
    sa = None if scale_a is None else _rows_of_blocks(scale_a)
    rows_view = x is not None and y is not None and (scale_a is None or sa is not None)
    if groups:
        # gemm's checks of the whole, named as given: on the rows' views, or on group 0 (whose
        # vectors stand for all: the blocks share their shapes)
        x0, y0, sa0 = (x, y, sa) if rows_view else (a[0], out[0], None if scale_a is None else scale_a[0])
        _, row = check_operands("grouped_matmul", x0, b[0], names=("a", "b"))
        _check_target("", x0, n, row, y0, out_given, None if bias is None else bias[0], sa0,
                      None if scale_b is None else scale_b[0], activation)
        _check_modes(row, compute, backend, xp_name)
    if launchable and rows_view and _masked_launch(a, b, x, y, sa, counts, on_device, expected, key, bias,
                                                   activation, scale_b, dequant, compute, backend, stream):
        return out
    if counts is None:
        if not (groups and max_m and n):
            return out              # nothing to write: the device's counts are not read
        # the loop over groups (or an invariant call) needs the counts on the host: one read back
        counts = _check_masked_m(masked_m, groups, max_m)
    for g, rows in enumerate(counts):
        if rows:
            gemm("N", "N", a[g, :rows], b[g], out[g, :rows], **kw,
                 bias=None if bias is None else bias[g],
                 scale_a=None if scale_a is None else scale_a[g, :rows],
                 scale_b=None if scale_b is None else scale_b[g])
    return out


def _fp8(a, b, offsets, masked_m, out, dtype, bias, activation, scale_a, scale_b, compute, backend, stream,
         invariant):
    """:func:`grouped_matmul` on float8 operands (:mod:`pyblasgemm._grouped_fp8`): the form's
    arguments checked as for the other types, GPU offsets or counts read back, then the groups'
    scaled products."""
    if compute is not None:
        raise ValueError(f"grouped_matmul: compute={compute!r} does not apply to float8 operands (their "
                         f"products accumulate in float32)")
    invariant = resolve_invariant("grouped_matmul", invariant)
    kw = dict(out=out, dtype=dtype, bias=bias, activation=activation, scale_a=scale_a, scale_b=scale_b,
              backend=backend, stream=stream, invariant=invariant)
    if offsets is None and masked_m is None:
        if not isinstance(a, (list, tuple)) or not isinstance(b, (list, tuple)) or len(a) != len(b):
            raise TypeError("grouped_matmul: give a and b as lists of 2-D arrays of one length, or a (M, k) "
                            "a, a (groups, k, n) b and offsets=")
        for name, v in (("bias", bias), ("scale_a", scale_a), ("scale_b", scale_b), ("out", out)):
            if v is not None and (not isinstance(v, (list, tuple)) or len(v) != len(a)):
                raise ValueError(f"grouped_matmul: {name} must be a list with one entry per problem "
                                 f"({len(a)})")
        return _grouped_fp8.grouped_fp8(a, b, **kw)
    if getattr(b, "ndim", None) != 3 or getattr(a, "ndim", None) != (2 if masked_m is None else 3) or \
            a.shape[-1] != b.shape[1] or (masked_m is not None and a.shape[0] != b.shape[0]):
        form = ("a (M, k) and b (groups, k, n)" if masked_m is None else
                "a (groups, max_m, k) and b (groups, k, n)")
        raise ValueError(f"grouped_matmul: the {'expert form' if masked_m is None else 'masked layout'} needs "
                         f"{form}; got {getattr(a, 'shape', None)} and {getattr(b, 'shape', None)}")
    masked = masked_m is not None
    xp_name = _arrays.array_module_name(a)
    on_device = _device_offsets(masked_m if masked else offsets, b.shape[0], xp_name,
                                "masked_m" if masked else "offsets")
    if xp_name == "cupy" and not invariant:
        want = _grouped_fp8._out_dtype(dtype, out)
        out, _, _ = _grouped_fp8.check_stacked(a, b, masked, out, want, bias, scale_a, scale_b)
        kw["out"] = out
        if _fp8_launch(a, b, masked, on_device, masked_m, offsets, out, bias, activation, scale_a, scale_b,
                       backend, stream):
            return out
    # the groups as separate products: sizes on the GPU are read back here
    if masked:
        return _grouped_fp8.grouped_fp8(a, b, counts=_check_masked_m(masked_m, b.shape[0], a.shape[1]), **kw)
    return _grouped_fp8.grouped_fp8(a, b, ends=_check_offsets(offsets, a.shape[0], b.shape[0]), **kw)


def _fp8_launch(a, b, masked, on_device, masked_m, offsets, out, bias, activation, scale_a, scale_b, backend,
                stream) -> bool:
    """Checked float8 groups on CuPy arrays (the expert form or the masked layout) as one launch
    of the grouped kernel's float8 kind (the s8 kind's operand path, the dequantizing store;
    sizes on the GPU read there), where the plan makes it one; False where it does not (the
    caller then runs the groups' products)."""
    from ._types import TYPE_ROWS
    from .kinds import FP8_KINDS

    # the kernel computes outᵀ = bᵀ aᵀ: its A is the weights' type, its B the tokens'
    row = TYPE_ROWS[FP8_KINDS[(b.dtype.name, a.dtype.name)]]
    sa, sb = _grouped_fp8.vector_scales(a, b, masked, scale_a, scale_b)
    if masked:
        x, y, sx = _rows_of_blocks(a), _rows_of_blocks(out), _rows_of_blocks(sa)
        if x is None or y is None or sx is None:
            return False
        counts = None if on_device is not None else _check_masked_m(masked_m, b.shape[0], a.shape[1])
        return _masked_launch(a, b, x, y, sx, counts, on_device, a.shape[1], None, bias, activation, sb, True,
                              None, backend, stream, row=row)
    if on_device is not None:
        return _on_device(a, b, on_device, out, bias, sa, sb, activation, True, None, backend, stream,
                          row=row) is not None
    ends = _check_offsets(offsets, a.shape[0], b.shape[0])
    starts = [0] + ends[:-1]
    sizes = tuple((b.shape[2], e - s0, a.shape[1]) for s0, e in zip(starts, ends))
    blocker = _blocker(a, out.dtype, True, None, b) or (
        "" if _arrays.device_id(b) == _arrays.device_id(out) == _arrays.device_id(a) else
        "a, b and out are not on one device")
    cols = None if blocker else _expert_columns(a, b, ends, out, bias, sa, sb)
    desc = _describe("experts", a, out.dtype, sizes, cols, blocker or ("" if cols is not None else _LAYOUT),
                     activation, bias is not None, True, None, row=row)
    return execute_group(desc, cols, backend, streams.handle(stream)) is not None


def _masked_launch(a, b, x, y, sa, counts, on_device, expected, key, bias, activation, scale_b, dequant,
                   compute, backend, stream, row=None) -> bool:
    """The masked layout on CuPy arrays as one grouped launch, the expert form's on the blocks
    as rows (``x``, ``y``, ``sa``: ``a``, ``out``, ``scale_a`` so viewed), kept under ``key``
    (:func:`_masked`'s, on the 3-D arrays) for a repeat; False where the plan is not one
    launch (the caller then runs the loop)."""
    groups, max_m = a.shape[:2]
    if on_device is not None:
        ran = _on_device(x, b, on_device, y, bias, sa, scale_b, activation, dequant, compute, backend, stream,
                         group_rows=max_m, expected=expected, row=row)
        if ran is None:
            return False
        if key is not None:
            calls.put(key, _DeviceRan(ran[0], ran[1], ran[2], on_device[2]), refers_to=ran[0])
        return True
    starts = [g * max_m for g in range(groups)]
    ends = [s0 + c for s0, c in zip(starts, counts)]
    sizes = tuple((b.shape[2], c, a.shape[2]) for c in counts)
    blocker = _blocker(x, y.dtype, dequant, compute, b) or (
        "" if _arrays.device_id(b) == _arrays.device_id(y) == _arrays.device_id(x)
        else "a, b and out are not on one device")
    cols = None if blocker else _expert_columns(x, b, ends, y, bias, sa, scale_b, starts)
    if cols is None and not blocker:
        blocker = _LAYOUT
    desc = _describe("experts", x, y.dtype, sizes, cols, blocker, activation, bias is not None, dequant,
                     compute, row=row)
    ran = execute_group(desc, cols, backend, streams.handle(stream))
    if ran is None:
        return False
    if key is not None:
        _remember(key, _Ran(*ran), a, b, y, bias, sa, scale_b)
    return True


def _foreign(a, b, offsets, out, dtype, bias, activation, scale_a, scale_b, compute, backend,
             stream, invariant=None, masked_m=None, expected_m=None):
    """PyTorch tensors, JAX arrays, CUDA-array-interface or DLPack objects among the arrays:
    ``(result,)`` of the call on their NumPy / CuPy views (:mod:`pyblasgemm.arrays`), in the
    caller's framework (``out`` given: the caller's own, written in place); None when every
    array is NumPy's or CuPy's. The list form's lists are converted member by member (what is
    not a list there is passed on for the call's own error)."""
    listed = offsets is None and masked_m is None
    fields = (("a", a), ("b", b), ("out", out), ("bias", bias), ("scale_a", scale_a),
              ("scale_b", scale_b))
    # JAX offsets / counts cross the door with the operands: on the GPU a CuPy view that the
    # launch's scan reads where it lies (no copy to the host, so no sync); a CUDA tensor's are
    # read as they are (_device_offsets), a sequence on the host
    layout = tuple((name, v) for name, v in (("offsets", offsets), ("masked_m", masked_m))
                   if v is not None and arrays.framework(v) == "jax")
    fields += layout
    named, shape = [], []
    for name, v in fields:
        if listed and isinstance(v, (list, tuple)):
            named += [(f"{name}[{g}]", x) for g, x in enumerate(v)]
            shape.append(len(v))
        elif listed and name not in ("a", "b") and v is not None:
            shape.append(-1)            # not a list: the call refuses it, named
        else:
            named.append((name, v))
            shape.append(None)
    if not arrays.is_foreign(*(x for _, x in named)):
        return None
    torch_key = None
    if not listed and masked_m is None and type(a) is arrays.torch_type() and type(offsets) is type(a) \
            and resolve_invariant("grouped_matmul", invariant) is False:
        # a repeated expert-form call on CUDA tensors with the sizes on the GPU: the recorded
        # launch pair on the tensors' own pointers, no conversion (H200, 64 experts of <= 64
        # tokens: ~280 us of a converting call's host time against a 44 us kernel)
        words = ("grouped_matmul experts", activation, None if dtype is None else str(dtype), compute,
                 backend, stream is None)
        sig = calls.key(words, a, b, out, (offsets, bias, scale_a, scale_b))
        if sig is not None:
            torch_key = sig[0]
            result = _torch_replay(torch_key, sig, a, b, out, offsets, stream)
            if result is not None:
                return result,
    if arrays.needs_grad(*(x for _, x in named)):
        raise TypeError("grouped_matmul: a tensor requires grad, and grouped_matmul is not "
                        "differentiable (pyblasgemm.torch differentiates matmul and linear): "
                        "detach the tensors, or call it under torch.no_grad()")
    writes = tuple(n for n, _ in named if n == "out" or n.startswith("out["))
    conv = arrays.convert("grouped_matmul", named, writes=writes)
    natives, at = [], 0
    for (name, v), count in zip(fields, shape):
        if count is None:
            natives.append(conv.arrays[at])
            at += 1
        elif count == -1:
            natives.append(v)
        else:
            natives.append(list(conv.arrays[at:at + count]))
            at += count
    na, nb, nout, nbias, nsa, nsb, *nlayout = natives
    viewed = dict(zip((name for name, _ in layout), nlayout))
    offsets, masked_m = viewed.get("offsets", offsets), viewed.get("masked_m", masked_m)
    _last_device_run.ran = None
    with conv.allocating():
        result = grouped_matmul(na, nb, offsets=offsets, out=nout, dtype=arrays.numpy_dtype(dtype), bias=nbias,
                                activation=activation, scale_a=nsa, scale_b=nsb, compute=compute,
                                backend=backend, stream=conv.stream if stream is None else stream,
                                invariant=invariant, masked_m=masked_m, expected_m=expected_m)
    ran, _last_device_run.ran = _last_device_run.ran, None
    if torch_key is not None and ran is not None:
        if out is not None:
            calls.put(torch_key, _TorchDeviceRan(ran, None, None), refers_to=ran.launch)
            return out,
        back = conv.back(result, framework_type=False)
        calls.put(torch_key, _TorchDeviceRan(ran, back.dtype, tuple(back.shape)), refers_to=ran.launch)
        return back,
    if out is not None:
        return (list(out) if listed else out),
    # (the results have the types the call asked for: bfloat16 stays bfloat16, dtype= holds)
    if listed:
        return [conv.back(r, framework_type=False) for r in result],
    return conv.back(result, framework_type=False),


def _check_modes(row, compute, backend, xp_name):
    """compute= and backend= as gemm checks them (a forced backend, the argument's or
    PYBLASGEMM_BACKEND's, must suit the arrays), named for grouped_matmul."""
    resolve_compute(row, compute, "grouped_matmul")
    check_forced_backend("grouped_matmul", check_backend("grouped_matmul", backend), xp_name)


_LAYOUT = ("a problem's layout is not the kernel's (row-major with unit stride along rows, the "
           "bias and scales contiguous in the result's type, no output sharing an input's memory)")


def _blocker(x0, out_dtype, dequant: bool, compute, w0=None) -> str:
    """Why the group cannot run as our one persistent launch, whatever its sizes ('': it can).
    ``x0``, ``w0``: a group's tokens and weight (the kernel's B and A; ``w0`` None: of ``x0``'s
    type)."""
    if compute is not None:
        return f"compute={compute!r} asks for the GEMMs' arithmetic"
    kind = GROUPED_KINDS.get(((x0 if w0 is None else w0).dtype.name, x0.dtype.name))
    if kind is None:
        pair = x0.dtype.name if w0 is None or w0.dtype == x0.dtype else f"{x0.dtype.name} x {w0.dtype.name}"
        return f"no grouped kernel for {pair} operands"
    if dequant and out_dtype.name not in DEQUANT_OUT or not dequant and out_dtype.name != kind[1]:
        return (f"the grouped kernel writes {kind[1]} results (or a dequantized float16, bfloat16 "
                f"or float32), not {out_dtype.name}")
    if _arrays.device_id(x0) != _arrays.current_device():
        return "the arrays are not on the current device"
    return ""


def _describe(form, x0, out_dtype, sizes, cols, blocker, activation, has_bias, dequant, compute,
              device_sizes=False, row=None):
    """The GemmDesc of a grouped call: its GroupSpec (sizes, alignment classes from the table's
    columns, what keeps it off the kernel) and its epilogue, in the kernel's column-major terms
    (``outᵀ = bᵀ aᵀ``: a problem's m is the user's n, the bias one value per m index). ``row``:
    the type row (default: ``x0``'s type's; a float8 pair's is its kind's)."""
    row = ROW_BY_DTYPE[x0.dtype] if row is None else row
    if not dequant and out_dtype != row.c_dtype:
        row = ROW_BY_DTYPES.get((x0.dtype, out_dtype), row)
    eb, ob = x0.dtype.itemsize, out_dtype.itemsize
    ab_align = c_align = 16
    if cols is not None and len(cols["m"]):
        live = (cols["m"] > 0) & (cols["n"] > 0)
        ab = np.bitwise_or.reduce(np.concatenate([cols[c][live].astype(np.uint64) for c in ("A", "B")]
                                                 + [(cols[c][live] * eb).astype(np.uint64) for c in ("lda", "ldb")]
                                                 + [np.zeros(1, np.uint64)]))
        cc = np.bitwise_or.reduce(np.concatenate([cols["C"][live].astype(np.uint64),
                                                  (cols["ldc"][live] * ob).astype(np.uint64),
                                                  np.zeros(1, np.uint64)]))
        ab_align, c_align = alignment(int(ab)), alignment(int(cc))
    group = GroupSpec(form, sizes, ab_align, c_align, blocker, device_sizes)
    epi = None
    if dequant or has_bias or activation is not None:
        epi = EpilogueSpec(activation, "m" if has_bias else None, 16 if has_bias else 0, False, 0,
                           out_dtype.name if dequant else None)
    m, n, k = (max((sz[i] for sz in sizes), default=0) for i in range(3))
    is_int = row.prefix == "i" and not dequant
    return describe("grouped_matmul", row, resolve_compute(row, compute, "grouped_matmul"), "N", "N",
                    m, n, k, max(m, 1), max(k, 1), max(m, 1), len(sizes), 0, 0, 0, "cupy",
                    _arrays.device_id(x0), (min(ab_align, c_align),), 1 if is_int else 1.0,
                    0 if is_int else 0.0, epilogue=epi, group=group)


def _row_major_ld(x) -> int | None:
    """Elements between rows of a 2-D array with unit stride along its rows, or None."""
    isz = x.dtype.itemsize
    if x.size == 0:                 # (CuPy and NumPy give empty arrays zero strides)
        return max(x.shape[1], 1)
    if x.shape[1] > 1 and x.strides[1] != isz:
        return None
    ld = x.strides[0] // isz if x.shape[0] > 1 else x.shape[1]
    return max(ld, x.shape[1], 1) if x.strides[0] % isz == 0 and x.strides[0] >= 0 else None


def _device_offsets(offsets, groups: int, xp_name: str, name: str = "offsets"):
    """``(pointer, bytes per offset, device)`` of end offsets that live on a GPU (a CuPy array,
    or a CUDA tensor: ``torch._grouped_mm``'s ``offs``), 1-D, contiguous, int32 or int64, for
    CuPy operands; None for host offsets (a sequence, a NumPy array), which are read and checked
    on the host. A wrong length or type is refused here, before any work; the values are not
    read (that is the point: no copy to the host), so the device's scan clamps them instead (see
    :func:`grouped_matmul`). ``name``: the argument's (``masked_m`` holds the masked layout's
    row counts, in the same types)."""
    if xp_name != "cupy" or offsets is None:
        return None
    cupy_type, torch_type = calls.cupy_type(), arrays.torch_type()
    if cupy_type is not None and type(offsets) is cupy_type:
        shape, itemsize, kind = offsets.shape, offsets.dtype.itemsize, offsets.dtype.kind
        contiguous = offsets.ndim != 1 or offsets.strides[0] == itemsize or offsets.size < 2
        where = (offsets.data.ptr, offsets.device.id)
    elif torch_type is not None and isinstance(offsets, torch_type) and offsets.is_cuda:
        shape, itemsize = tuple(offsets.shape), offsets.element_size()
        kind = "i" if not offsets.dtype.is_floating_point and not offsets.dtype.is_complex \
            and offsets.dtype != sys.modules["torch"].bool else "f"
        contiguous = offsets.dim() != 1 or offsets.stride(0) == 1 or offsets.numel() < 2
        where = (offsets.data_ptr(), offsets.get_device())
    else:
        return None
    if kind not in "iu" or itemsize not in (4, 8) or kind == "u" and itemsize == 4:
        raise TypeError(f"grouped_matmul: {name} on the GPU must be int32 or int64, got {offsets.dtype}")
    if len(shape) != 1 or shape[0] != groups:
        raise ValueError(f"grouped_matmul: {name} has shape {shape}; b holds {groups} groups")
    if not contiguous:
        return None                 # (read on the host, as a sequence)
    return where[0], itemsize, where[1]


class _DeviceRan(NamedTuple):
    """An expert-form launch pair with the offsets on the GPU, as it ran: what a repeated call
    replays with its own arrays' bases (:func:`_expert_bases`)."""

    launch: object      # the GroupedLaunch (execute's: the signature refers to it)
    values: dict        # the table kernel's values (grouped.OFFSETS_FIELDS)
    route: object       # the plan's Route (pyblasgemm.epilogue.last_route reads it)
    device: int         # the offsets' device (the launch's)


class _LastDeviceRun(threading.local):
    ran = None


#: the expert-form launch pair the CuPy-view call just ran (read by the torch door to record it)
_last_device_run = _LastDeviceRun()


class _TorchDeviceRan(NamedTuple):
    """An expert-form launch pair recorded under CUDA tensors' key, and its fresh result's
    type and shape (row-major)."""

    ran: _DeviceRan
    dtype: object       # the result tensor's torch dtype
    shape: tuple


def _torch_extent(t) -> tuple:
    """``[first, last]`` byte addresses a tensor's elements span (its strides may leave gaps)."""
    lo = t.data_ptr()
    return lo, lo + sum((n - 1) * st for n, st in zip(t.shape, t.stride()) if n > 0) * t.element_size() \
        + t.element_size() - 1


def _torch_replay(torch_key, sig, a, b, out, offsets, stream):
    """The recorded launch pair of a repeated expert-form call on CUDA tensors (``sig``:
    :func:`pyblasgemm.calls.key`'s, the pointers of a, b, out, then the offsets, bias and
    scales), into ``out`` or a fresh tensor; None without a record, on another device, or where
    ``out`` meets ``a`` or ``b`` (the converting path then runs, and refuses or copies as the
    first call did). The key holds every other fact the call's checks read."""
    hit = calls.get(torch_key)
    dev = torch_key[calls.TORCH_DEVICE]
    if hit is None or hit.ran.device != dev:
        return None
    if out is None:
        out = sys.modules["torch"].empty(hit.shape, dtype=hit.dtype, device=a.device)
    else:
        lo, hi = _torch_extent(out)
        if any(x_lo <= hi and lo <= x_hi for x_lo, x_hi in (_torch_extent(a), _torch_extent(b))):
            return None
    _, pa, pb, _, p_offsets, p_bias, p_sa, p_sb = sig
    values = dict(hit.ran.values, weights=pb, tokens=pa, out=out.data_ptr(), bias=p_bias, scale_w=p_sb,
                  scale_x=p_sa)
    with streams.on(arrays.torch_raw_stream(dev) if stream is None else streams.handle(stream)):
        hit.ran.launch.launch_offsets(b.shape[0], p_offsets, offsets.element_size(), values)
    note_route(hit.ran.route)
    return out


def _expert_bases(a, b, out, bias, scale_a, scale_b) -> dict:
    """The table kernel's base pointers of the arrays (0 for an absent one)."""
    def base(x):
        return 0 if x is None else _arrays.data_ptr(x)

    return dict(weights=base(b), tokens=base(a), out=base(out), bias=base(bias), scale_w=base(scale_b),
                scale_x=base(scale_a))


def _on_device(a, b, on_device, out, bias, scale_a, scale_b, activation, dequant, compute, backend,
               stream, group_rows=0, expected=0, row=None):
    """The expert form with device-side offsets as one launch pair (the table built on the GPU,
    then the grouped GEMM; :func:`pyblasgemm.execute.execute_group_offsets`): its
    ``(launch, values, route)``, or None when it cannot run so (its blocker, a layout off the
    kernel, the planner's loop): the caller then reads the offsets back and takes the host
    path. ``group_rows`` > 0: the masked layout (``a``, ``out`` and ``scale_a`` the blocks'
    rows, :func:`_masked`), planned for groups of ``expected`` rows."""
    rows, (groups, k, n) = a.shape[0], b.shape
    ptr, offset_bytes, device = on_device
    blocker = _blocker(a, out.dtype, dequant, compute, b) or (
        "" if _arrays.device_id(b) == _arrays.device_id(out) == _arrays.device_id(a) == device
        else "a, b, out and offsets are not on one device")
    layout = None if blocker else _expert_layout(a, b, out, bias, scale_a, scale_b)
    if layout is None:
        return None
    osz = out.dtype.itemsize
    if dequant and (_arrays.data_ptr(out) % 16 or out.strides[0] % 16):
        return None     # a dequantizing store needs every group's C in whole 16-byte columns
    # the group sizes are on the device: the plan is made for one-row groups (every start, so
    # the alignment classes hold for any sizes), which prices the one launch; the launch reads
    # the real sizes. Masked: the starts are the blocks' (fixed), the groups `expected` rows.
    if group_rows:
        starts = [g * group_rows for g in range(groups)]
        nominal = [s0 + max(expected, 1) for s0 in starts]     # (0 rows: "nothing to compute")
    else:
        nominal = [min(rows, g + 1) for g in range(groups - 1)] + [rows]
        starts = [0] + nominal[:-1]
    cols = _expert_columns(a, b, nominal, out, bias, scale_a, scale_b, starts)
    sizes = tuple((n, e - s0, k) for s0, e in zip(starts, nominal))
    desc = _describe("experts", a, out.dtype, sizes, cols, "", activation, bias is not None, dequant,
                     compute, device_sizes=True, row=row)
    lda, ldb, ldc = layout
    values = dict(_expert_bases(a, b, out, bias, scale_a, scale_b), w_group_bytes=b.strides[0], x_row_bytes=a.strides[0],
                  out_row_bytes=out.strides[0], bias_group_bytes=0 if bias is None else bias.strides[0],
                  scale_w_group_bytes=0 if scale_b is None else scale_b.strides[0], lda=lda, ldb=ldb,
                  ldc=ldc, rows=rows, m=n, k=k, out_bytes=osz, group_rows=group_rows)
    return execute_group_offsets(desc, groups, ptr, offset_bytes, values, backend,
                                 streams.handle(stream))


def _expert_layout(a, b, out, bias, scale_a, scale_b):
    """The expert form's leading dimensions ``(lda, ldb, ldc)`` in the kernel's terms (see
    :func:`_expert_columns`), or None when a layout keeps it off the kernel."""
    isz, osz = a.dtype.itemsize, out.dtype.itemsize
    groups, k, n = b.shape
    if (k > 1 and a.strides[1] != isz) or (n > 1 and (b.strides[2] != isz or out.strides[1] != osz)):
        return None
    if min(a.strides[0], b.strides[0], b.strides[1], out.strides[0]) < 0 or may_overlap(out, a) \
            or may_overlap(out, b):
        return None
    if bias is not None and bias.dtype != out.dtype:
        return None                 # the kernel reads the bias in the result's type
    for v in (bias, scale_b):
        if v is not None and (n > 1 and v.strides[1] != v.dtype.itemsize):
            return None
    if scale_a is not None and a.shape[0] > 1 and scale_a.strides[0] != 4:
        return None
    return max(b.strides[1] // isz, n, 1), max(a.strides[0] // isz, k, 1), max(out.strides[0] // osz, n, 1)


def _expert_columns(a, b, ends, out, bias, scale_a, scale_b, starts=None):
    """The table columns of the expert form, vectorized from the arrays' addresses and strides
    (no per-expert views: CuPy makes one in ~5 µs), or None when a layout keeps it off the
    kernel. Row-major ``out[s:e] = a[s:e] @ b[g]`` is the kernel's ``outᵀ = b[g]ᵀ a[s:e]ᵀ``:
    its m is n, its n the expert's rows. ``starts``: each group's first row (default: the
    previous group's end; the masked layout's are its blocks' first rows)."""
    layout = _expert_layout(a, b, out, bias, scale_a, scale_b)
    if layout is None:
        return None
    lda, ldb, ldc = layout
    groups, k, n = b.shape
    ends = np.asarray(ends, np.int64)
    starts = np.concatenate(([0], ends[:-1])) if starts is None else np.asarray(starts, np.int64)
    g = np.arange(groups, dtype=np.int64)

    def addr(x, step, index):
        return (np.uint64(_arrays.data_ptr(x)) + (index * step).astype(np.uint64)) if x is not None else \
            np.zeros(groups, np.uint64)

    cols = dict(A=addr(b, b.strides[0], g), B=addr(a, a.strides[0], starts), C=addr(out, out.strides[0], starts),
                bias=addr(bias, None if bias is None else bias.strides[0], g),
                scale_m=addr(scale_b, None if scale_b is None else scale_b.strides[0], g),
                scale_n=addr(scale_a, 4, starts),
                lda=np.full(groups, lda), ldb=np.full(groups, ldb), ldc=np.full(groups, ldc),
                m=np.full(groups, n), n=ends - starts, k=np.full(groups, k))
    return cols


def _list_columns(pairs, outs, biases, scales_a, scales_b, out_dtype):
    """The table columns of the list form (one entry per problem), or None when a problem's
    types, devices or layout keep the list off the kernel."""
    x0 = pairs[0][0]
    dev = _arrays.device_id(x0)
    cols = {c: [] for c in ("A", "B", "C", "bias", "scale_m", "scale_n", "lda", "ldb", "ldc", "m", "n", "k")}
    for g, ((x, w), c) in enumerate(zip(pairs, outs)):
        bias = None if biases is None else biases[g]
        sa = None if scales_a is None else scales_a[g]
        sb = None if scales_b is None else scales_b[g]
        rows, k, n = x.shape[0], x.shape[1], w.shape[1]
        if _arrays.array_module_name(x) != "cupy" or _arrays.array_module_name(w) != "cupy" \
                or _arrays.array_module_name(c) != "cupy" or x.dtype != x0.dtype or w.dtype != x0.dtype \
                or c.dtype != out_dtype or c.shape != (rows, n) \
                or any(_arrays.device_id(v) != dev for v in (x, w, c)):
            return None
        lx, lw, lc = _row_major_ld(x), _row_major_ld(w), _row_major_ld(c)
        if None in (lx, lw, lc) or may_overlap(c, x) or may_overlap(c, w):
            return None
        if bias is not None and bias.dtype != out_dtype:
            return None             # the kernel reads the bias in the result's type
        for v, length in ((bias, n), (sa, rows), (sb, n)):
            if v is not None and (v.shape not in ((length,), (1, length)) or not v.flags.c_contiguous):
                return None
        for name, value in (("A", _arrays.data_ptr(w)), ("B", _arrays.data_ptr(x)), ("C", _arrays.data_ptr(c)),
                            ("bias", 0 if bias is None else _arrays.data_ptr(bias)),
                            ("scale_m", 0 if sb is None else _arrays.data_ptr(sb)),
                            ("scale_n", 0 if sa is None else _arrays.data_ptr(sa)),
                            ("lda", lw), ("ldb", lx), ("ldc", lc), ("m", n), ("n", rows), ("k", k)):
            cols[name].append(value)
    return {name: np.asarray(v, np.uint64 if name in ("A", "B", "C", "bias", "scale_m", "scale_n") else np.int64)
            for name, v in cols.items()}


class _Ran(NamedTuple):
    """A grouped launch as it ran: what a repeated expert-form call replays."""

    launch: object      # the GroupedLaunch (execute's: the signature refers to it)
    rows: object        # its packed table (absolute addresses)
    tiles: int
    route: object       # the plan's Route (pyblasgemm.epilogue.last_route reads it)


# ---------------------------------------------------------------------------------------------
# The expert form's call-signature replay: a repeated call (same shapes, strides, dtypes,
# offsets, epilogue and alignment classes) re-launches its packed table with the new arrays'
# addresses: H100, 64 experts of <= 64 tokens: the full host path was ~180 µs a call.

#: the table's pointer columns (uint64 words of a row) and the array each address is in
_POINTER_WORDS = (("A", "b"), ("B", "a"), ("C", "out"), ("bias", "bias"), ("scale_m", "scale_b"),
                  ("scale_n", "scale_a"))


def _overlaps(x, y) -> bool:
    return may_overlap(x, y)


def _expert_signature(a, b, ends, out, out_given, bias, scale_a, scale_b, activation, dtype, compute,
                      backend):
    """The key of a repeatable expert-form call on CuPy arrays, or None: the
    :func:`pyblasgemm.calls.key` of ``a`` and ``b``, with ``out`` (when given), the bias and
    scales as extra arrays, each with its own alignment class (the table's vector loads need
    A and B aligned, a dequantizing store C: one class for all would mix them)."""
    nd = calls.cupy_type()
    if nd is None or type(a) is not nd or type(out) is not nd or \
            not (activation is None or type(activation) is str) or \
            not (compute is None or type(compute) is str) or not (backend is None or type(backend) is str):
        return None
    if not current_settings().cache:
        return None
    words = ("grouped_matmul", tuple(ends), activation, None if dtype is None else str(dtype), compute,
             backend, None if out_given else (out.dtype, out.shape))
    sig = calls.key(words, a, b, None, (out if out_given else None, bias, scale_a, scale_b))
    return None if sig is None else sig[0]


def _bases(a, b, out, bias, scale_a, scale_b):
    arrays = dict(a=a, b=b, out=out, bias=bias, scale_a=scale_a, scale_b=scale_b)
    return [(word, None if arrays[name] is None else _arrays.data_ptr(arrays[name]))
            for word, name in _POINTER_WORDS]


def _remember(key, ran, a, b, out, bias, scale_a, scale_b):
    """Keep the launch with its table relative to the arrays' addresses."""
    rows = ran.rows.copy()
    words = rows.view(np.uint64).reshape(len(rows), PROBLEM_ROW.itemsize // 8)
    for word, base in _bases(a, b, out, bias, scale_a, scale_b):
        if base is not None:
            words[:, PROBLEM_ROW.fields[word][1] // 8] -= np.uint64(base)
    calls.put(key, ran._replace(rows=rows), refers_to=ran.launch)


def _replay(ran, a, b, out, bias, scale_a, scale_b, stream):
    rows = ran.rows.copy()
    words = rows.view(np.uint64).reshape(len(rows), PROBLEM_ROW.itemsize // 8)
    for word, base in _bases(a, b, out, bias, scale_a, scale_b):
        if base is not None:
            words[:, PROBLEM_ROW.fields[word][1] // 8] += np.uint64(base)
    with streams.on(None if stream is None else streams.handle(stream)):
        ran.launch.launch_rows(rows, ran.tiles)
    note_route(ran.route)
