"""The back-to-back product of a feed-forward layer: ``activation(x @ w1 + b1) @ w2 + b2``.

The seed design fuses it into one kernel: each CTA computes its rows of the intermediate
``h = activation(x @ w1 + b1)``, keeps them in shared memory as the second product's ``A``
(only ``w2`` is read from global memory), and writes only ``y``. That is possible while a CTA's
slice of ``h`` (its rows x the hidden width) fits on chip; wider layers are two GEMMs with
fused epilogues.

Semantics (whichever way it runs): ``h`` is rounded to the layer's dtype (``x``'s: float16 or
bfloat16 keep the intermediate in 16 bits, as the on-chip tile would), each product
accumulates in float32, and ``y`` has ``x``'s dtype.

How it runs today: as two products with epilogues (:func:`pyblasgemm.matmul` with ``bias=``,
``activation=`` and ``dtype=``; on a GPU each fused in its GEMM where
:func:`pyblasgemm.epilogue.last_route` says so); :func:`mlp_plan` says so. The on-chip kernel
is the next step.

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

from typing import NamedTuple

from . import _arrays

__all__ = ["fused_mlp", "mlp_plan", "MlpPlan"]

#: shared memory a CTA can give the intermediate tile on sm_80 / sm_90 (of 227 KB): what is
#: left after a 3-stage 128 x 64 operand ring for the second product (~48 KB)
ON_CHIP_BYTES = 160 * 1024
#: the rows of x one CTA would own in the on-chip kernel
ROWS_PER_CTA = 64


class MlpPlan(NamedTuple):
    """How :func:`fused_mlp` runs one layer."""

    on_chip_fits: bool      # a CTA's rows of h (ROWS_PER_CTA x hidden) fit in ON_CHIP_BYTES
    kernel: str             # what runs now
    reason: str

    def explain(self) -> str:
        return f"{self.kernel}: {self.reason}"


def mlp_plan(tokens: int, features: int, hidden: int, out_features: int, dtype="float16") -> MlpPlan:
    """The plan of a layer (no arrays needed).

    >>> print(mlp_plan(16, 4096, 11008, 4096).explain())   # doctest: +NORMALIZE_WHITESPACE
    two GEMMs with fused epilogues: a CTA's 64 rows of h are 64 x 11008 x 2 B = 1376 KB, more
    than the 160 KB of shared memory the on-chip kernel would give them
    """
    import numpy as np

    size = np.dtype(dtype).itemsize if not isinstance(dtype, str) or dtype != "bfloat16" else 2
    tile = ROWS_PER_CTA * hidden * size
    fits = tile <= ON_CHIP_BYTES
    if fits:
        return MlpPlan(True, "two GEMMs with fused epilogues",
                       f"a CTA's {ROWS_PER_CTA} rows of h ({tile // 1024} KB) would fit on chip; "
                       f"the on-chip back-to-back kernel is not built yet")
    return MlpPlan(False, "two GEMMs with fused epilogues",
                   f"a CTA's {ROWS_PER_CTA} rows of h are {ROWS_PER_CTA} x {hidden} x {size} B = "
                   f"{tile // 1024} KB, more than the {ON_CHIP_BYTES // 1024} KB of shared memory "
                   f"the on-chip kernel would give them")


def fused_mlp(x, w1, w2, b1=None, b2=None, activation="gelu", *, compute=None, backend=None,
              stream=None):
    """``activation(x @ w1 + b1) @ w2 + b2`` for 2-D ``x`` (tokens x features), ``w1``
    (features x hidden), ``w2`` (hidden x out); biases of shapes ``(hidden,)`` and ``(out,)``
    in the layer's dtype. Returns ``x``'s dtype; see the module docstring.

    >>> import numpy as np, pyblasgemm
    >>> x = np.ones((2, 3), np.float16)
    >>> y = pyblasgemm.fused_mlp(x, np.ones((3, 4), np.float16), np.ones((4, 1), np.float16),
    ...                          b2=np.array([1], np.float16), activation="relu")
    >>> y, y.dtype
    (array([[13.],
           [13.]], dtype=float16), dtype('float16'))
    """
    from .matmul import matmul

    r = "fused_mlp"
    for name, v in (("x", x), ("w1", w1), ("w2", w2)):
        if _arrays.array_module_name(v) is None or v.ndim != 2:
            raise ValueError(f"{r}: {name} must be a 2-D NumPy or CuPy array")
        if v.dtype != x.dtype:
            raise TypeError(f"{r}: {name} has dtype {v.dtype.name}; the layer is {x.dtype.name}")
    if x.shape[1] != w1.shape[0] or w1.shape[1] != w2.shape[0]:
        raise ValueError(f"{r}: x {x.shape} @ w1 {w1.shape} @ w2 {w2.shape}: inner sizes differ")
    # matmul, not gemm: a repeated layer replays each product's launch from its call signature
    # (H100, 4096 x 1024 -> 1024 -> 1024: two gemm calls through their full path took 249 µs,
    # host-bound, against 63 µs for PyTorch's four launches)
    kw = dict(compute=compute, backend=backend, stream=stream, dtype=x.dtype)
    h = matmul(x, w1, bias=b1, activation=activation, **kw)
    return matmul(h, w2, bias=b2, **kw)
