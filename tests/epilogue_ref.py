"""The epilogue tests' float64 references, written independently of the library's host ones,
and the NaN/Inf check every fused route must pass (shared by test_epilogue.py and
test_fused_mma_sync_gpu.py)."""
import math

import ml_dtypes
import numpy as np
from scipy.special import erf

from conftest import to_host

#: float64 definitions of the activations
REF = {None: lambda v: v,
       "relu": lambda v: np.where(v < 0, 0.0, v),
       "gelu": lambda v: 0.5 * v * (1 + erf(v / math.sqrt(2))),
       "gelu_tanh": lambda v: 0.5 * v * (1 + np.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v**3))),
       "silu": lambda v: v / (1 + np.exp(-v)),
       "sigmoid": lambda v: 1 / (1 + np.exp(-v))}
#: unit roundoff of the output type (the epilogue rounds once, from the accumulation type)
UNIT = {np.float16: 2.0**-11, ml_dtypes.bfloat16: 2.0**-8, np.float32: 2.0**-24, np.float64: 2.0**-53}


def assert_nan_and_inf_like_unfused(act, route_prefix):
    """A NaN in one element and a +Inf row of x (64 x 64 float16, all-ones w) reach the result
    of a fused ``matmul(..., activation=act)`` exactly as the float64 sequence has them, on a
    route whose ``last_route()`` starts with ``route_prefix``."""
    import cupy

    import pyblasgemm
    from pyblasgemm.epilogue import last_route

    x = np.ones((64, 64), np.float16)
    x[1, 0] = np.nan
    x[2, :] = np.inf
    w = np.ones((64, 64), np.float16)
    y = to_host(pyblasgemm.matmul(cupy.asarray(x), cupy.asarray(w), activation=act, backend="tensorcore"))
    assert last_route().startswith(route_prefix), last_route()
    want = REF[act](x.astype(np.float64) @ w.astype(np.float64))
    np.testing.assert_array_equal(np.isnan(y), np.isnan(want))
    np.testing.assert_array_equal(np.isposinf(y), np.isposinf(want))


def residual_case(rng, dtype, out_dtype, m, n, k):
    """gemm('T', 'T') with alpha = 0.5, beta = -1.5 over a random C, a bias and the erf GELU, on
    operands with padded leading dimensions (ld m + 8 and k + 8): (result, float64
    pre-activation, the sum of |terms| for the error bound)."""
    import cupy

    import pyblasgemm

    def data(shape, t):
        return rng.standard_normal(shape).astype(np.float32).astype(t)

    ap = cupy.asarray(data((k, m + 8), dtype))[:, :m]          # op(a) = ap.T, ld m + 8
    bp = cupy.asarray(data((n, k + 8), dtype))[:, :k]          # op(b) = bp.T, ld k + 8
    c0 = data((m, n), out_dtype)
    bias = data((n,), out_dtype)
    out = cupy.array(c0, copy=True)
    pyblasgemm.gemm("T", "T", ap, bp, out, alpha=0.5, beta=-1.5, bias=cupy.asarray(bias), activation="gelu")
    a64, b64 = to_host(ap).astype(np.float64).T, to_host(bp).astype(np.float64).T
    c64 = c0.astype(np.float64)
    v64 = 0.5 * a64 @ b64 - 1.5 * c64 + bias.astype(np.float64)
    return out, v64, 0.5 * np.abs(a64) @ np.abs(b64) + 1.5 * np.abs(c64) + 1
