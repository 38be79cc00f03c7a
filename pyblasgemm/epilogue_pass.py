"""The unfused epilogue route's one elementwise pass: ``out = act(v)`` (and the
pre-activation) from a product computed in the accumulation type, where the product lives
(NumPy here; on a GPU one CuPy kernel, :mod:`pyblasgemm.kernels.epilogue_ops`, that includes the
device definitions the fused kernels share). The definitions are :mod:`pyblasgemm.epilogue`'s.

Example
-------
>>> import numpy as np
>>> from pyblasgemm.epilogue import ACTIVATIONS, Epilogue
>>> t = np.array([[-1.0, 2.0]], np.float32)
>>> out = np.empty_like(t)
>>> apply(Epilogue("cols", ACTIVATIONS["relu"], False, False), t, None, None, None,
...       np.array([0.5, 0.5], np.float32), None, None, None, out)
array([[0. , 2.5]], dtype=float32)
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from . import _arrays
from .epilogue import Epilogue, note_route
from .kernels.epilogue_ops import apply_device

__all__ = ["apply", "UnfusedRoute", "UNFUSED", "run_unfused"]


class UnfusedRoute(NamedTuple):
    """The unfused route where no plan chose it (a product the arrays do not let one
    description hold: batches that broadcast, vectors, integer or mixed types)."""

    kind: str
    line: str


#: how the unfused calls run, by where the arrays live
UNFUSED = {"numpy": UnfusedRoute("unfused", "host: the product in the accumulation type, then the "
                                             "epilogue in NumPy"),
           "cupy": UnfusedRoute("unfused", "GPU: the planned GEMM into the accumulation type, then "
                                           "one elementwise epilogue pass (not fused)")}


def run_unfused(epi: Epilogue, xp_name: str, t, alpha, beta, c_old, bias, scale_a, scale_b,
                preactivation_out, out, route=None):
    """:func:`apply`, recording the route it completes (the plan's, or :data:`UNFUSED`)."""
    note_route(UNFUSED[xp_name] if route is None else route)
    return apply(epi, t, alpha, beta, c_old, bias, scale_a, scale_b, preactivation_out, out)


def apply(epi: Epilogue, t, alpha, beta, c_old, bias, scale_a, scale_b, preactivation_out, out):
    """``out[...] = act(v)`` (and ``preactivation_out[...] = v``) with ``v = t + bias``, where
    ``t`` holds ``alpha·op(a)·op(b) + beta·out`` in :func:`pyblasgemm._types.acc_dtype`, a (..., m, n) array;
    when dequantizing, ``t`` is the int32 product and ``v = alpha·scale_a·scale_b·t +
    beta·c_old + bias`` (``beta`` None: C not read). Runs where ``t`` lives. An integer or
    bool ``t`` (an integer result: NumPy's product, wrapped as its loop wraps) is summed and
    activated exactly (:func:`_apply_integer`) and cast to ``out``'s type last."""
    if t.dtype.kind in "iub" and not epi.dequantize:
        return _apply_integer(epi, t, bias, preactivation_out, out)
    if _arrays.array_module_name(t) == "numpy":
        return _apply_host(epi, t, alpha, beta, c_old, bias, scale_a, scale_b, preactivation_out, out)
    return apply_device(epi, t, alpha, beta, c_old, bias, scale_a, scale_b, preactivation_out, out)


def _apply_host(epi, t, alpha, beta, c_old, bias, scale_a, scale_b, preactivation_out, out):
    wide = np.float64 if t.dtype == np.float64 else (t.dtype.type if t.dtype.kind == "c" else np.float32)
    v = t
    if epi.dequantize:
        v = np.float32(alpha) * (scale_a.reshape(-1, 1) * scale_b.reshape(-1) * t.astype(np.float32))
    if beta is not None:
        v = v + wide(beta) * c_old.astype(wide)
    if bias is not None:
        b = bias.astype(wide)
        v = v + (b.reshape(-1, 1) if epi.bias_axis == "rows" else b.reshape(-1))
    v = np.asarray(v, dtype=wide)
    if preactivation_out is not None:
        preactivation_out[...] = v.astype(preactivation_out.dtype)
    if epi.activation is not None:
        v = epi.activation.host(v)
    out[...] = v.astype(out.dtype)
    return out


def _apply_integer(epi, t, bias, preactivation_out, out):
    """The epilogue of an integer or bool result, before its cast (a cast first turned a
    product of -23 into 233 for a uint8 result, and relu kept it): ``v = t + bias`` in 64-bit
    integers (uint64 for a uint64 product), relu on them exactly, the other activations in
    float64 (truncated back to integers as ``astype`` truncates), then one cast to ``out``'s
    type, wrapping as NumPy's ``astype`` does."""
    xp = _arrays.xp_of(_arrays.array_module_name(t))
    wide = np.uint64 if t.dtype == np.uint64 else np.int64
    v = t.astype(wide)
    if bias is not None:
        b = bias.astype(wide)
        v += b.reshape(-1, 1) if epi.bias_axis == "rows" else b.reshape(-1)
    if preactivation_out is not None:
        preactivation_out[...] = v.astype(preactivation_out.dtype)
    if epi.activation is not None and epi.activation.name == "relu":
        v = xp.where(v < 0, v.dtype.type(0), v)
    elif epi.activation is not None:
        f = v.astype(np.float64)
        only = Epilogue(None, epi.activation, False, False)
        v = apply(only, f, None, None, None, None, None, None, None, xp.empty_like(f)).astype(wide)
    out[...] = v.astype(out.dtype)
    return out
