"""Epilogues: what happens to the product before it is stored.

``gemm`` and ``matmul`` take five keywords that extend ``alpha·op(a)·op(b) + beta·out``:

``bias``
    a vector added to every row (shape ``(n,)`` or ``(1, n)``: one value per column, as in
    ``x @ w + b``) or to every column (shape ``(m, 1)``: one value per row), of the output's
    dtype or the operands' (float32 or the output's for a dequantized int8 product);
``activation``
    a name of :data:`ACTIVATIONS` (the erf GELU, its tanh approximation, relu, silu, ...),
    applied last;
``preactivation_out``
    an array of the output's shape and dtype that receives the value before the activation
    (what a backward pass needs);
``scale_a``, ``scale_b``
    for int8 operands: float32 scales per row of ``op(a)`` (shape ``(m,)``) and per column of
    ``op(b)`` (shape ``(n,)``), or one scalar each; the int32 product is dequantized to
    ``scale_a[i] · scale_b[j] · (op(a) @ op(b))[i, j]`` and the output is float16, bfloat16
    or float32 (``out``'s dtype, or ``matmul``'s ``dtype=``; float32 when neither says).

The order is cuBLASLt's: ``y = act(alpha·dequant(op(a)·op(b)) + beta·out + bias)``, with the
pre-activation value ``alpha·… + bias`` written to ``preactivation_out``. Everything between
the accumulator and the store is computed in the accumulation type (float32 for 16-bit and
int8 operands, the output's type otherwise) and rounded once, so 16-bit results do not round
twice. NaN and Inf propagate as in the unfused sequence (``relu(NaN)`` is NaN).

This module is a leaf table (it imports only NumPy and the host erf, :mod:`pyblasgemm._erf`):
one row per activation with its host definition, device code, derivative and PyTorch form; the
checked epilogue of a call (:class:`Epilogue`; the keywords are checked with every other
argument, in :func:`pyblasgemm.desc.check_epilogue`); and the epilogue a description carries
(:class:`EpilogueSpec`, ``GemmDesc.epilogue``). How a call runs is the planner's choice among
three routes, priced by its model and recorded in the plan (``Plan.epilogue``, shown by
``Plan.explain()``; :func:`last_route` reads the last one): fused in our kernel's store, fused
in cuBLASLt's epilogue (relu and the tanh GELU), or unfused: the planned GEMM into the
accumulation type, then one elementwise pass (NumPy on the host; on a GPU a kernel that includes
``epilogue/activation.cuh``, the device definitions the fused kernels share). Every route rounds
once from the same float32 values.

Example
-------
>>> import numpy as np, pyblasgemm
>>> x = np.array([[1., -2.], [3., 4.]], dtype=np.float32)
>>> w = np.eye(2, dtype=np.float32)
>>> pre = np.empty((2, 2), np.float32)
>>> pyblasgemm.matmul(x, w, bias=np.array([0.5, 0.5], np.float32), activation="relu",
...                   preactivation_out=pre)
array([[1.5, 0. ],
       [3.5, 4.5]], dtype=float32)
>>> pre
array([[ 1.5, -1.5],
       [ 3.5,  4.5]], dtype=float32)
"""
from __future__ import annotations

import math
import threading
from typing import Callable, NamedTuple

import numpy as np

from ._erf import erf_function

__all__ = ["ACTIVATIONS", "Activation", "Epilogue", "EpilogueSpec", "EPILOGUE_KEYWORDS",
           "check_activation", "last_route"]

#: the keywords that turn a gemm / matmul call into one with an epilogue
EPILOGUE_KEYWORDS = ("bias", "activation", "preactivation_out", "scale_a", "scale_b")

_SQRT_HALF = 1 / math.sqrt(2.0)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_GELU_C = 0.044715


def _gelu(x):
    erf = erf_function()

    return x * x.dtype.type(0.5) * (x.dtype.type(1) + erf(x * x.dtype.type(_SQRT_HALF)))


def _gelu_tanh(x):
    t = x.dtype.type
    return t(0.5) * x * (t(1) + np.tanh(t(_SQRT_2_OVER_PI) * (x + t(_GELU_C) * x * x * x)))


def _silu(x):
    with np.errstate(over="ignore"):     # exp(-x) = inf for x < -88 (float32): x / inf = -0
        return x / (x.dtype.type(1) + np.exp(-x))


def _sigmoid(x):
    with np.errstate(over="ignore"):     # exp(-x) = inf for x < -88 (float32): 1 / inf = 0
        return x.dtype.type(1) / (x.dtype.type(1) + np.exp(-x))


def _relu(x):
    # x < 0 is False for NaN: NaN stays NaN, as torch.relu keeps it
    return np.where(x < 0, x.dtype.type(0), x)


# The derivatives, on the pre-activation ``p``, written once against a math namespace ``m``
# (exp, tanh, erf, sigmoid, where, ones_like, zeros_like): ``torch`` for pyblasgemm.torch's
# backward, :data:`HOST_MATH` (NumPy) for the host.

def _d_relu(p, m):
    return m.where(p > 0, m.ones_like(p), m.zeros_like(p))     # 0 at 0: PyTorch's convention


def _d_gelu(p, m):
    return 0.5 * (1.0 + m.erf(p * _SQRT_HALF)) + p * m.exp(-0.5 * p * p) * _INV_SQRT_2PI


def _d_gelu_tanh(p, m):
    # y = p/2 · (1 + tanh u), u = √(2/π)(p + c p³): the tanh form's exact derivative
    t = m.tanh(_SQRT_2_OVER_PI * (p + _GELU_C * p * p * p))
    return 0.5 * (1.0 + t) + 0.5 * p * (1.0 - t * t) * _SQRT_2_OVER_PI * (1.0 + 3.0 * _GELU_C * p * p)


def _d_silu(p, m):
    s = m.sigmoid(p)
    return s * (1.0 + p * (1.0 - s))


def _d_sigmoid(p, m):
    s = m.sigmoid(p)
    return s * (1.0 - s)


class _HostMath:
    """The namespace the derivatives take, on NumPy arrays (erf from SciPy when installed)."""

    exp, tanh, where = staticmethod(np.exp), staticmethod(np.tanh), staticmethod(np.where)
    ones_like, zeros_like = staticmethod(np.ones_like), staticmethod(np.zeros_like)

    @staticmethod
    def erf(x):
        return erf_function()(x)

    @staticmethod
    def sigmoid(x):
        return _sigmoid(np.asarray(x))


HOST_MATH = _HostMath()


class Activation(NamedTuple):
    """One activation, the single source of every fact about it: its name, its code in the
    device headers (``case`` of ``pyblasgemm::activate`` in ``epilogue/activation.cuh``), its
    host definition on float32 / float64 arrays, its formula and its derivative's (for the
    docs), the derivative on the pre-activation (``derivative(p, math)``, see
    :data:`HOST_MATH`) and PyTorch's own function of that name (``torch_forward(p, torch)``:
    what :mod:`pyblasgemm.torch` applies and differentiates)."""

    name: str
    code: int
    host: Callable
    formula: str
    derivative: Callable
    derivative_formula: str
    torch_forward: Callable
    nan_inf: str = "as the formula"


#: name -> Activation; the device codes are ``pyblasgemm::Activation`` in activation.cuh
ACTIVATIONS: dict[str, Activation] = {a.name: a for a in (
    Activation("relu", 1, _relu, "0 if x < 0 else x", _d_relu,
               "1 where p > 0, else 0 (PyTorch's convention at 0)", lambda p, t: t.relu(p),
               "NaN stays NaN"),
    Activation("gelu", 2, _gelu, "x/2 · (1 + erf(x/√2)) (exact)", _d_gelu,
               "Φ(p) + p·φ(p) = ½(1 + erf(p/√2)) + p·exp(−p²/2)/√(2π)",
               lambda p, t: t.nn.functional.gelu(p)),
    Activation("gelu_tanh", 3, _gelu_tanh, "x/2 · (1 + tanh(√(2/π) · (x + 0.044715 x³)))",
               _d_gelu_tanh, "½(1 + t) + ½·p·(1 − t²)·√(2/π)·(1 + 3·0.044715·p²), "
               "t = tanh(√(2/π)(p + 0.044715 p³))",
               lambda p, t: t.nn.functional.gelu(p, approximate="tanh")),
    Activation("silu", 4, _silu, "x / (1 + exp(-x))", _d_silu, "σ(p)·(1 + p·(1 − σ(p)))",
               lambda p, t: t.nn.functional.silu(p)),
    Activation("sigmoid", 5, _sigmoid, "1 / (1 + exp(-x))", _d_sigmoid, "σ(p)·(1 − σ(p))",
               lambda p, t: t.sigmoid(p)),
)}


def activation_table(kind: str = "definition") -> str:
    """The activations as a reStructuredText table (``kind``: ``'definition'``, the forward
    formulas with their NaN / Inf behaviour; ``'derivative'``, the derivatives): the docs'
    tables are made from :data:`ACTIVATIONS` by this (docs/conf.py), never written by hand.

    >>> print(activation_table("derivative").splitlines()[3])
    ``'none'``      1
    """
    if kind == "definition":
        rows = [(f"``{a.name!r}``", a.formula, a.nan_inf) for a in ACTIVATIONS.values()]
        head = ("``activation=``", "definition", "NaN / ±Inf")
    elif kind == "derivative":
        rows = [("``'none'``", "1")] + [(f"``{a.name!r}``", a.derivative_formula)
                                        for a in ACTIVATIONS.values()]
        head = ("activation", "``act'(p)``")
    else:
        raise ValueError(f"activation_table: kind={kind!r} is not 'definition' or 'derivative'")
    widths = [max(len(r[i]) for r in rows + [head]) for i in range(len(head))]
    rule = " ".join("=" * w for w in widths)

    def line(cells):
        return " ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()

    return "\n".join([rule, line(head), rule] + [line(r) for r in rows] + [rule])


class Epilogue(NamedTuple):
    """The checked epilogue of one call, in the caller's terms (its arrays are held by the
    call, not here)."""

    bias_axis: str | None          # 'cols' (one value per column: shape (n,)), 'rows' ((m, 1))
    activation: Activation | None
    preactivation: bool
    dequantize: bool               # int8 operands, float output scaled by scale_a / scale_b

    def describe(self) -> str:
        """One line for ``explain()`` and messages, e.g. ``'bias per column, gelu'``."""
        parts = []
        if self.dequantize:
            parts.append("dequantize (scale_a per row, scale_b per column)")
        if self.bias_axis:
            parts.append(f"bias per {self.bias_axis[:-1]}")
        if self.activation:
            parts.append(self.activation.name)
        if self.preactivation:
            parts.append("pre-activation out")
        return ", ".join(parts) or "none"


class EpilogueSpec(NamedTuple):
    """The epilogue of a described problem (``GemmDesc.epilogue``), in the description's
    column-major terms: what the planner prices its routes by. Hashable; part of the plan's key.

    >>> EpilogueSpec("gelu", "n", 16, False, 0).describe()
    'bias per column of the described C, gelu'
    """

    activation: str | None         # a name of ACTIVATIONS
    bias: str | None               # 'm': one value per row of the described C, 'n': per column
    bias_align: int                # the bias pointer's alignment in bytes (<= 16; 0: no bias)
    preactivation: bool            # the value before the activation is written too (at C's offsets)
    pre_align: int                 # its pointer's alignment (0: none)
    dequantize: str | None = None  # int8 / float8 products scaled per row / column to this float type
    blocker: str = ""              # why no fused route can take these arrays ('': none)
    #: a float8 product's scales the store reads, ``(of the described m side, of the n side)``,
    #: each 'tensor' (one value) or 'vector' (one per row / column of the described C); () for
    #: block scales (the mainloop's: GemmDesc.block_scales) and for other products
    scales: tuple = ()

    @property
    def code(self) -> int:
        """The activation's device code (0: none)."""
        return 0 if self.activation is None else ACTIVATIONS[self.activation].code

    def describe(self) -> str:
        parts = []
        if self.scales:
            parts.append(f"float8 scales {self.scales[0]} x {self.scales[1]} in the store, to {self.dequantize}")
        elif self.dequantize:       # int8 per row / column, or float8 block-scaled in the mainloop
            parts.append(f"dequantized to {self.dequantize}")
        if self.bias:
            parts.append(f"bias per {'row' if self.bias == 'm' else 'column'} of the described C")
        if self.activation:
            parts.append(self.activation)
        if self.preactivation:
            parts.append("pre-activation out")
        return ", ".join(parts) or "none"


def check_activation(routine: str, value) -> Activation | None:
    if value is None:
        return None
    row = ACTIVATIONS.get(value) if isinstance(value, str) else None
    if row is None:
        raise ValueError(f"{routine}: activation={value!r} is not one of "
                         f"{', '.join(map(repr, ACTIVATIONS))} (or None)")
    return row


# ---------------------------------------------------------------------------------------------
# The route of the last call: a thin reader of its plan (Plan.epilogue, Plan.group)

_last = threading.local()


def note_route(route) -> None:
    """Record how this thread's call with an epilogue ran: the plan's route (an object with a
    ``line``), set where the route runs (``execute``, the unfused pass)."""
    _last.route = route


def last_route() -> str:
    """How this thread's last call with an epilogue (or grouped call) ran, in one line: the
    ``line`` of its plan's route (``Plan.epilogue`` / ``Plan.group``; ``Plan.explain()`` shows
    the priced alternatives), e.g. ``'cuBLASLt epilogue GELU_BIAS (fused in the GEMM)'``.

    >>> import numpy as np, pyblasgemm
    >>> _ = pyblasgemm.matmul(np.ones((2, 2), np.float32), np.ones((2, 2), np.float32), activation="relu")
    >>> pyblasgemm.epilogue.last_route()
    'host: the product in the accumulation type, then the epilogue in NumPy'
    """
    route = getattr(_last, "route", None)
    return "no call with an epilogue yet" if route is None else route.line
