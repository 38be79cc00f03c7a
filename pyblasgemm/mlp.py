"""The back-to-back product of a feed-forward layer: ``activation(x @ w1 + b1) @ w2 + b2``.

On a GPU it runs as one kernel (``kernels/include/pyblasgemm/impls/sm80_fused_mlp.cuh``,
mma.sync, sm_80 and newer): each CTA computes its 64 rows of the intermediate
``h = activation(x @ w1 + b1)`` into shared memory, keeps them there as the second product's
``A`` (only ``w2`` is read from global memory) and writes only ``y``. That is possible while a
CTA's slice of ``h`` (64 rows x the hidden width, plus padding and a 40.5 KB operand ring)
fits in the device's shared memory (hidden <= 1472 on H100 / H200, <= 960 on A100), the
operands are float16 or bfloat16 CuPy arrays, C-contiguous and 16-byte aligned, and the
features, hidden and output widths are multiples of 8; ``method='on_chip'`` runs it. It is
not the default: measured slower than two fused GEMMs (:data:`ON_CHIP_MEASURED`). By default,
and where it cannot run, the layer is two GEMMs with fused epilogues (:func:`pyblasgemm.matmul` with ``bias=``, ``activation=`` and ``dtype=``), and always
on the host (NumPy). :func:`mlp_plan` says which and why.

Semantics (whichever way it runs): ``h`` is computed in float32 and rounded once to the
layer's dtype (``x``'s: float16 or bfloat16 keep the intermediate in 16 bits, as the on-chip
tile does), each product accumulates in float32, ``y`` is rounded once to ``x``'s dtype. NaN
and Inf propagate as in the unfused sequence (a NaN in a row of ``x`` reaches only that row of
``y``).

Example
-------
>>> import numpy as np, pyblasgemm
>>> x = np.array([[1., -1.]], dtype=np.float32)
>>> w1 = np.array([[1., 2., -3.], [0., 1., 1.]], dtype=np.float32)     # 2 -> 3 hidden
>>> w2 = np.ones((3, 1), dtype=np.float32)
>>> pyblasgemm.fused_mlp(x, w1, w2, activation="relu")                  # relu([1, 1, -4]) @ 1
array([[2.]], dtype=float32)
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple, overload

if TYPE_CHECKING:     # types only: importing pyblasgemm imports none of these
    import cupy  # type: ignore[import-not-found, import-untyped, unused-ignore]
    import jax
    import torch

    from ._typing import Activation, Backend, Compute, MlpMethod, NDArray

import sys

import numpy as np

from . import _arrays, arrays
from ._types import ROW_BY_DTYPE, resolve_compute
from .desc import check_backend, check_epilogue, check_same_place
from .epilogue import check_activation
from .execute import execute_mlp
from .kernels import mlp_kernel as _kernel
from .matmul import matmul
from .planner.overrides import check_forced_backend

__all__ = ["fused_mlp", "mlp_plan", "MlpPlan"]

#: the rows of x one CTA owns in the on-chip kernel (the kernel's kMlpBM)
ROWS_PER_CTA = _kernel.BM
#: shared memory the on-chip kernel can give a CTA's rows of h (padding included) on sm_90
#: (H100 / H200): the 227 KB a block may opt in to, less the kernel's 40.5 KB operand ring
ON_CHIP_BYTES = _kernel.SMEM_OPTIN["sm_90"] - _kernel.RING_BYTES
#: what :func:`mlp_plan` assumes without a device: an H100 SXM (132 SMs, 227 KB per block)
DEFAULT_SM_COUNT = 132

ON_CHIP = "on-chip back-to-back kernel"
#: why the on-chip kernel is not the default (bench/results/fusion_h100_2026-11-24_9ae9d89.json)
ON_CHIP_MEASURED = ("on an H100 at 4096 x 1024 -> 1024 -> 1024 it ran at 0.19x of PyTorch's "
                    "sequence, two fused GEMMs at 0.66x (its mma.sync mainloop reaches half the "
                    "wgmma peak, and each N2 split recomputes its rows of h)")
TWO_GEMMS = "two GEMMs with fused epilogues"
METHODS = (None, "on_chip", "two_gemms")


class MlpPlan(NamedTuple):
    """How :func:`fused_mlp` runs one layer."""

    on_chip_fits: bool      # the on-chip kernel runs it (every bound of kernels.mlp_kernel.fits)
    kernel: str             # what runs
    reason: str
    smem_bytes: int = 0     # the on-chip kernel's dynamic shared memory per CTA (0: not used)
    n2_splits: int = 0      # CTAs per block of 64 rows (grid dimension y; 0: not used)

    def explain(self) -> str:
        return f"{self.kernel}: {self.reason}"


def _dtype_name(dtype) -> str:
    return _kernel.dtype_name(dtype)


def mlp_plan(tokens: int, features: int, hidden: int, out_features: int, dtype: Any = "float16", *,
             max_smem: int | None = None, sm_count: int | None = None) -> MlpPlan:
    """The plan of a layer on a GPU (no arrays needed): two GEMMs with fused epilogues, and
    whether the on-chip kernel's bounds hold (:func:`pyblasgemm.kernels.mlp_kernel.fits`: then
    its shared memory and grid, what ``method='on_chip'`` runs) or which bound failed. ``max_smem`` (the opt-in shared memory per block) and
    ``sm_count`` default to an H100's (232448 B, 132 SMs); :func:`fused_mlp` passes the
    device's own. The arrays' own conditions (CuPy, C-contiguous, 16-byte aligned) are checked
    by :func:`fused_mlp`.

    >>> print(mlp_plan(16, 4096, 11008, 4096).explain())   # doctest: +NORMALIZE_WHITESPACE
    two GEMMs with fused epilogues: a CTA's 64 rows of h are 64 x 11008 x 2 B = 1376 KB, more
    than the 186 KB of shared memory the on-chip kernel can give them (hidden <= 1472 fits)
    >>> print(mlp_plan(16, 1024, 1024, 1024).explain())    # doctest: +ELLIPSIS
    two GEMMs with fused epilogues: the on-chip back-to-back kernel fits (grid 1 x 8: ...) but is not the default: ...
    """
    max_smem = _kernel.SMEM_OPTIN["sm_90"] if max_smem is None else int(max_smem)
    sm_count = DEFAULT_SM_COUNT if sm_count is None else int(sm_count)
    name = _dtype_name(dtype)
    ok, why = _kernel.fits(tokens, features, hidden, out_features, name, max_smem)
    if ok:
        splits = _kernel.choose_n2_splits(tokens, out_features, sm_count)
        grid_m = -(-tokens // ROWS_PER_CTA)
        chunks = -(-out_features // _kernel.CHUNK)
        per = -(-chunks // splits) * _kernel.CHUNK
        share = (f"N2 = {out_features} in {splits} splits of {per} columns, each recomputing its rows of h"
                 if splits > 1 else f"all {out_features} columns of y")
        return MlpPlan(True, TWO_GEMMS,
                       f"the {ON_CHIP} fits (grid {grid_m} x {splits}: {ROWS_PER_CTA} rows of x per CTA; "
                       f"{share}; {why}) but is not the default: {ON_CHIP_MEASURED}; method='on_chip' "
                       f"runs it", _kernel.smem_bytes(hidden), splits)
    if name in _kernel.DTYPES and _kernel.smem_bytes(hidden) > max_smem and hidden % 8 == 0:
        tile = ROWS_PER_CTA * hidden * 2
        why = (f"a CTA's {ROWS_PER_CTA} rows of h are {ROWS_PER_CTA} x {hidden} x 2 B = {tile // 1024} KB, more "
               f"than the {(max_smem - _kernel.RING_BYTES) // 1024} KB of shared memory the on-chip kernel can "
               f"give them (hidden <= {_kernel.max_hidden(max_smem)} fits)")
    return MlpPlan(False, TWO_GEMMS, why)


def _array_blocker(x, w1, w2, b1, b2, compute, backend) -> str | None:
    """Why the arrays (not the sizes) keep a call off the on-chip kernel, or None."""
    arrays = [("x", x), ("w1", w1), ("w2", w2)] + [(n, b) for n, b in (("b1", b1), ("b2", b2)) if b is not None]
    if not all(_arrays.is_cupy_array(v) for _, v in arrays):
        host = [n for n, v in arrays if not _arrays.is_cupy_array(v)]
        return f"{', '.join(host)} not CuPy arrays (the on-chip kernel runs on a GPU)"
    if compute is not None:
        return f"compute={compute!r} asks for the GEMMs' arithmetic"
    if backend not in (None, "auto", "tensorcore"):
        return f"backend={backend!r}"
    dev = x.device.id
    for n, v in arrays:
        if v.device.id != dev:
            return f"{n} is on device {v.device.id}, x on device {dev}"
        if not v.flags.c_contiguous:
            return f"{n} is not C-contiguous"
    for n, v in arrays[:3]:
        if v.data.ptr % 16:
            return f"{n} is not 16-byte aligned"
    for n, b, width in (("b1", b1, w1.shape[1]), ("b2", b2, w2.shape[1])):
        if b is None:
            continue
        if b.dtype != x.dtype:
            return f"{n} has dtype {b.dtype.name}, the layer {x.dtype.name}"
        if b.shape not in ((width,), (1, width)):
            return f"{n} has shape {b.shape}, not ({width},)"
    return None


def _device_plan(x, w2, w1) -> MlpPlan:
    dev = x.device.id
    return mlp_plan(x.shape[0], x.shape[1], w1.shape[1], w2.shape[1], x.dtype,
                    max_smem=_kernel.max_smem(dev), sm_count=_kernel.sm_count(dev))


# x's framework in gives it out (pyblasgemm._typing)
@overload
def fused_mlp(x: NDArray, w1: NDArray, w2: NDArray, b1: NDArray | None = None, b2: NDArray | None = None,
              activation: Activation = "gelu", *, compute: Compute | None = None,
              backend: Backend | None = None, stream: Any = None,
              method: MlpMethod | None = None) -> NDArray: ...


@overload
def fused_mlp(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, b1: torch.Tensor | None = None, b2: torch.Tensor | None = None,
              activation: Activation = "gelu", *, compute: Compute | None = None,
              backend: Backend | None = None, stream: Any = None,
              method: MlpMethod | None = None) -> torch.Tensor: ...


@overload
def fused_mlp(x: jax.Array, w1: jax.Array, w2: jax.Array, b1: jax.Array | None = None, b2: jax.Array | None = None,
              activation: Activation = "gelu", *, compute: Compute | None = None,
              backend: Backend | None = None, stream: Any = None,
              method: MlpMethod | None = None) -> jax.Array: ...


@overload
def fused_mlp(x: cupy.ndarray, w1: cupy.ndarray, w2: cupy.ndarray, b1: cupy.ndarray | None = None, b2: cupy.ndarray | None = None,
              activation: Activation = "gelu", *, compute: Compute | None = None,
              backend: Backend | None = None, stream: Any = None,
              method: MlpMethod | None = None) -> cupy.ndarray: ...


@overload
def fused_mlp(x: Any, w1: Any, w2: Any, b1: Any | None = None, b2: Any | None = None,
              activation: Activation = "gelu", *, compute: Compute | None = None,
              backend: Backend | None = None, stream: Any = None,
              method: MlpMethod | None = None) -> Any: ...


def fused_mlp(x, w1, w2, b1=None, b2=None, activation="gelu", *, compute=None, backend=None,
              stream=None, method=None):
    """``activation(x @ w1 + b1) @ w2 + b2`` for 2-D ``x`` (tokens x features), ``w1``
    (features x hidden), ``w2`` (hidden x out); biases of shapes ``(hidden,)`` and ``(out,)``
    in the layer's dtype. Returns ``x``'s dtype; see the module docstring.

    ``method``: None (the plan decides: today always two GEMMs, see :func:`mlp_plan`),
    ``'on_chip'`` (the on-chip kernel, or a ValueError saying why it cannot run) or
    ``'two_gemms'`` (two :func:`pyblasgemm.matmul` calls with fused epilogues).

    ``compute``, ``backend``: as for :func:`pyblasgemm.matmul` (aliases included). ``stream``:
    where the GPU work is enqueued (a CuPy or PyTorch stream, ``__cuda_stream__``, or a raw
    ``cudaStream_t`` int; default: the current stream of the arrays' framework). NumPy, CuPy,
    PyTorch tensors, JAX arrays and DLPack objects are taken; the result is in ``x``'s
    framework (a tensor that requires grad runs two differentiable
    ``pyblasgemm.torch.linear`` calls).

    >>> import numpy as np, pyblasgemm
    >>> x = np.ones((2, 3), np.float16)
    >>> y = pyblasgemm.fused_mlp(x, np.ones((3, 4), np.float16), np.ones((4, 1), np.float16),
    ...                          b2=np.array([1], np.float16), activation="relu")
    >>> y, y.dtype
    (array([[13.],
           [13.]], dtype=float16), dtype('float16'))
    >>> pyblasgemm.fused_mlp(x, np.ones((3, 4), np.float16), np.ones((4, 1), np.float16),
    ...                      method="on_chip")
    Traceback (most recent call last):
        ...
    ValueError: fused_mlp: method='on_chip' cannot run: x, w1, w2 not CuPy arrays (the on-chip kernel runs on a GPU)
    """
    r = "fused_mlp"
    if arrays.is_foreign(x, w1, w2, b1, b2):
        return _foreign(x, w1, w2, b1, b2, activation, compute, backend, stream, method)
    act = _check_call(r, x, w1, w2, b1, b2, activation, compute, backend, method)
    if method == "on_chip":
        # (planned only here while two GEMMs are the default: at be72d7f the plan's checks and
        # device queries ran on every call, and the host-bound 4096 x 1024 -> 1024 -> 1024 layer
        # measured 0.42x on an H100, 0.66x without them at d29ef8e)
        why = _array_blocker(x, w1, w2, b1, b2, compute, backend)
        plan = None
        if why is None:
            plan = _device_plan(x, w2, w1)
            if not plan.on_chip_fits:
                why = plan.reason
        if why is not None:
            raise ValueError(f"{r}: method='on_chip' cannot run: {why}")
        return _run_on_chip(x, w1, w2, b1, b2, 0 if act is None else act.code, plan.n2_splits, stream)
    # matmul, not gemm: a repeated layer replays each product's launch from its call signature
    # (H100, 4096 x 1024 -> 1024 -> 1024: two gemm calls through their full path took 249 µs,
    # host-bound, against 63 µs for PyTorch's four launches)
    kw = dict(compute=compute, backend=backend, stream=stream, dtype=x.dtype)
    h = matmul(x, w1, bias=b1, activation=activation, **kw)
    if b2 is None and x.dtype.name == "bfloat16" and _arrays.array_module_name(x) == "numpy":
        # NumPy has no bfloat16 loop for matmul's dtype= (its TypeError): the float32 product,
        # rounded to bfloat16 once, as the epilogue's route rounds it
        return matmul(h, w2, **{**kw, "dtype": np.float32}).astype(x.dtype)
    return matmul(h, w2, bias=b2, **kw)


def _check_call(r, x, w1, w2, b1, b2, activation, compute, backend, method):
    """fused_mlp's checks of its arguments, before any work; returns the Activation."""
    for name, v in (("x", x), ("w1", w1), ("w2", w2)):
        if _arrays.array_module_name(v) is None or v.ndim != 2:
            raise ValueError(f"{r}: {name} must be a 2-D NumPy or CuPy array (or a PyTorch "
                             f"tensor, JAX array, DLPack object)")
        if v.dtype != x.dtype:
            raise TypeError(f"{r}: {name} has dtype {v.dtype.name}; the layer is {x.dtype.name}")
    if x.shape[1] != w1.shape[0] or w1.shape[1] != w2.shape[0]:
        raise ValueError(f"{r}: x {x.shape} @ w1 {w1.shape} @ w2 {w2.shape}: inner sizes differ")
    if method not in METHODS:
        raise ValueError(f"{r}: method={method!r} is not one of {', '.join(map(repr, METHODS))}")
    act = check_activation(r, activation)
    _check_layer(r, x, w1, w2, b1, b2, activation, compute, backend)
    return act


def _foreign(x, w1, w2, b1, b2, activation, compute, backend, stream, method):
    """fused_mlp on PyTorch tensors, JAX arrays, CUDA-array-interface or DLPack objects: the
    layer on their NumPy / CuPy views (:mod:`pyblasgemm.arrays`), the result in the caller's
    framework and ``x``'s dtype. A tensor that requires grad: the same layer as two
    differentiable :func:`pyblasgemm.torch.linear` calls (each rounds to the layer's dtype
    once, as here), or a TypeError where the call asks for more than they do."""
    r = "fused_mlp"
    conv = arrays.convert(r, [("x", x), ("w1", w1), ("w2", w2), ("b1", b1), ("b2", b2)])
    nx, nw1, nw2, nb1, nb2 = conv.arrays
    # every check first, named as given, on the views (no work: they read shapes and dtypes)
    _check_call(r, nx, nw1, nw2, nb1, nb2, activation, compute, backend, method)
    if arrays.needs_grad(x, w1, w2, b1, b2):
        torch = sys.modules["torch"]        # (a tensor requires grad: PyTorch is imported)

        extra = [f"{k}={v!r}" for k, v in (("method", method), ("compute", compute),
                                           ("backend", backend), ("stream", stream))
                 if v is not None and not (k == "method" and v == "two_gemms")]
        if extra or not all(isinstance(v, torch.Tensor) for v in (x, w1, w2, b1, b2) if v is not None):
            raise TypeError(f"{r}: {', '.join(extra) or 'arrays that are not all tensors'} with "
                            f"tensors that require grad: the differentiable layer is two "
                            f"pyblasgemm.torch.linear calls on tensors, without method='on_chip', "
                            f"compute=, backend= or stream=; detach the tensors, or call under "
                            f"torch.no_grad()")
        linear = arrays.differentiable("linear")
        # (a (1, n) bias is the (n,) vector linear takes; w.T: nn.Linear's (out, in) layout)
        h = linear(x, w1.T, None if b1 is None else b1.reshape(-1), activation)
        return linear(h, w2.T, None if b2 is None else b2.reshape(-1))
    with conv.allocating():
        y = fused_mlp(nx, nw1, nw2, nb1, nb2, activation, compute=compute, backend=backend,
                      stream=conv.stream if stream is None else stream, method=method)
    return conv.back(y, framework_type=False)       # x's dtype (bfloat16 stays bfloat16)


def _check_layer(r, x, w1, w2, b1, b2, activation, compute, backend) -> None:
    """The two products' checks, before either runs, naming fused_mlp's own arguments (``b1``,
    ``b2``, ``compute=``): the matmul calls would name theirs (``bias``) and themselves."""
    xp_name, _ = check_same_place(r, [("x", x), ("w1", w1), ("w2", w2)])
    tokens, hidden, width = x.shape[0], w1.shape[1], w2.shape[1]
    check_epilogue(r, (tokens, hidden), (tokens, hidden), x.dtype, xp_name, b1, activation, None,
                   None, None, x.dtype, names={"bias": "b1"})
    check_epilogue(r, (tokens, width), (tokens, width), x.dtype, xp_name, b2, None, None, None, None,
                   x.dtype, names={"bias": "b2"})
    row = ROW_BY_DTYPE.get(x.dtype)
    if row is not None:
        resolve_compute(row, compute, r)
    # a forced backend (the argument's, or PYBLASGEMM_BACKEND's) must suit the arrays: named
    # for fused_mlp here, before the products would name it for matmul
    check_forced_backend(r, check_backend(r, backend), _arrays.array_module_name(x))


def _run_on_chip(x, w1, w2, b1, b2, code: int, n2_splits: int, stream):
    """The on-chip kernel's one launch, run by :func:`pyblasgemm.execute.execute_mlp`."""
    return execute_mlp(x, w1, w2, b1, b2, code, n2_splits, stream)
