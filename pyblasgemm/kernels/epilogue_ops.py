"""The epilogue pass on a GPU: one elementwise kernel over the product (pyblasgemm.epilogue).

The kernel is generated per epilogue structure (dequantize, bias, beta, activation,
pre-activation output), compiled once (:func:`~pyblasgemm.kernels.jit.raw_function`), and includes
``epilogue/activation.cuh``: the same device definitions the fused GEMM stores will use.
"""
from __future__ import annotations

import functools
import sys
import threading

from .driver import launch_kernel, stream as cu_stream
from .jit import INCLUDE_DIR, raw_function


@functools.lru_cache(maxsize=64)
def _kernel(acc: str, dequant: bool, bias: bool, beta: bool, act: int, preact: bool):
    """An ElementwiseKernel computing ``v = [alpha·sa·sb·]t [+ beta·c] [+ bias]``, then
    ``pre = v`` and ``y = act(v)`` in ``acc`` ('float' or 'double')."""
    import cupy

    ins = ["T t"]
    body = [f"{acc} v = ({acc})t;"]
    if dequant:
        ins += ["float32 sa", "float32 sb", "float32 alpha"]
        body.append("v = alpha * (sa * sb * v);")
    if beta:
        ins += ["C c", f"{'float32' if acc == 'float' else 'float64'} beta"]
        body.append(f"v += beta * ({acc})c;")
    if bias:
        ins.append("B b")
        body.append(f"v += ({acc})b;")
    outs = ["Y y"]
    if preact:
        outs.append("P pre")
        body.append("pre = (P)v;")
    body.append(f"y = (Y)pyblasgemm::activate<{acc}>(v, {act});")
    return cupy.ElementwiseKernel(", ".join(ins), ", ".join(outs), "\n".join(body),
                                  f"pyblasgemm_epilogue_{acc}_{int(dequant)}{int(bias)}{int(beta)}"
                                  f"{act}{int(preact)}",
                                  preamble='#include "pyblasgemm/epilogue/activation.cuh"',
                                  options=(f"-I{INCLUDE_DIR}",))


def apply_device(epi, t, alpha, beta, c_old, bias, scale_a, scale_b, preactivation_out, out):
    """``out[...] = act(v)`` and ``preactivation_out[...] = v`` on the GPU, v as
    :func:`pyblasgemm.epilogue_pass.apply` defines it; float32 results are rounded once into 16-bit
    outputs."""
    cupy = sys.modules["cupy"]          # (t is a CuPy array)
    acc = "double" if t.dtype == cupy.float64 else "float"
    if t.dtype.kind == "c":      # complex: a bias only (activations are for real outputs)
        v = t + bias.reshape(-1, 1) if epi.bias_axis == "rows" else t + bias.reshape(-1)
        out[...] = v
        if preactivation_out is not None:
            preactivation_out[...] = v
        return out
    wide = cupy.float64 if acc == "double" else cupy.float32
    # float16 / float32 / float64 outputs are written by the kernel itself (one rounding, in
    # the conversion): no float32 result array and no cast pass (at 8192^3 that is 536 MB of
    # traffic, ~0.18 ms on an H100). bfloat16 goes through a float32 array and astype.
    direct = ("e", "f", "d")
    args = [t]
    if epi.dequantize:
        args += [scale_a.reshape(-1, 1), scale_b.reshape(-1), cupy.float32(alpha)]
    if beta is not None:
        args += [c_old.astype(wide, copy=False), wide(beta)]
    if bias is not None:
        b = bias.astype(wide, copy=False)      # (astype copies by default: one more kernel)
        args.append(b.reshape(-1, 1) if epi.bias_axis == "rows" else b.reshape(-1))
    y = out if out.dtype.char in direct else cupy.empty(t.shape, wide)
    outs = [y]
    pre = None
    if epi.preactivation:
        pre = preactivation_out if preactivation_out.dtype.char in direct else cupy.empty(t.shape, wide)
        outs.append(pre)
    act = epi.activation.code if epi.activation is not None else 0
    _kernel(acc, epi.dequantize, bias is not None, beta is not None, act, pre is not None)(*args, *outs)
    if y is not out:
        out[...] = y.astype(out.dtype)          # one rounding into bfloat16
    if pre is not None and pre is not preactivation_out:
        preactivation_out[...] = pre.astype(preactivation_out.dtype)
    return out


# ---------------------------------------------------------------------------------------------
# The pass as a bound launch on raw pointers (the unfused route's second half, replayable)
# ---------------------------------------------------------------------------------------------

_PASS_SOURCE = r"""
#include "pyblasgemm/epilogue/activation.cuh"

// In place on the column-major C (m x n, leading dimension ldc): v = C + bias (one value per
// row, bias_axis 1, or per column, 2), pre = v where pre is given (C's offsets), C = act(v).
// The same arithmetic, in the same order, as the CuPy elementwise pass above.
template <class T>
__global__ void pyblasgemm_epilogue_pass(T* __restrict__ c, const T* __restrict__ bias,
                                         T* __restrict__ pre, long long m, long long n,
                                         long long ldc, int bias_axis, int act) {
  const long long total = m * n;
  for (long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x; idx < total;
       idx += (long long)gridDim.x * blockDim.x) {
    const long long j = idx / m, i = idx - j * m;
    const long long at = i + j * ldc;
    T v = c[at];
    if (bias_axis == 1) v += bias[i];
    else if (bias_axis == 2) v += bias[j];
    if (pre != nullptr) pre[at] = v;
    c[at] = pyblasgemm::activate<T>(v, act);
  }
}
"""
_PASS_NAMES = {"float32": "pyblasgemm_epilogue_pass<float>", "float64": "pyblasgemm_epilogue_pass<double>"}
#: types the bound pass runs in (C is the accumulation type: float32 or float64)
PASS_DTYPES = tuple(_PASS_NAMES)
_PASS_THREADS = 256
#: at most this many CTAs per SM (a grid-stride loop covers the rest): 8 x 256 threads fill an
#: SM's 2048 thread slots on sm_80 / sm_90
_PASS_CTAS_PER_SM = 8
class PassLaunch:
    """The epilogue pass of one problem class bound to its kernel: ``p(c_ptr, bias_ptr, pre_ptr,
    stream)`` enqueues ``pre = v; C = act(v)`` with ``v = C + bias`` on the raw stream handle
    (``bias_axis``: 'm' one value per row of the column-major C, 'n' per column, None; a zero
    ``pre_ptr``: no pre-activation). Calls from several threads take turns (the argument cells
    are filled under a lock; cuLaunchKernel copies them).

    Example (on a GPU)::

        p = PassLaunch(0, "float32", m, n, ldc, "n", ACTIVATIONS["gelu"].code)
        p(c.data.ptr, bias.data.ptr, 0, cupy.cuda.get_current_stream().ptr)
    """

    __slots__ = ("_dev", "_fptr", "_grid", "_pack", "_lock", "__weakref__")

    def __init__(self, device: int, dtype: str, m: int, n: int, ldc: int, bias_axis, act: int):
        import ctypes as ct

        import cupy

        from .mma_sync import _ArgPack

        if dtype not in _PASS_NAMES:
            raise ValueError(f"PassLaunch: dtype={dtype!r} is not one of {PASS_DTYPES}")
        self._dev, self._fptr = device, raw_function(_PASS_SOURCE, _PASS_NAMES[dtype], device)
        sms = cupy.cuda.Device(device).attributes["MultiProcessorCount"]
        self._grid = max(1, min(-(-(m * n) // _PASS_THREADS), sms * _PASS_CTAS_PER_SM))
        fields = [("c", ct.c_void_p), ("bias", ct.c_void_p), ("pre", ct.c_void_p), ("m", ct.c_longlong),
                  ("n", ct.c_longlong), ("ldc", ct.c_longlong), ("axis", ct.c_int), ("act", ct.c_int)]
        axis = {None: 0, "m": 1, "n": 2}[bias_axis]
        self._pack = _ArgPack(fields, dict(c=0, bias=0, pre=0, m=m, n=n, ldc=ldc, axis=axis, act=act))
        self._lock = threading.Lock()

    def __call__(self, c_ptr: int, bias_ptr: int, pre_ptr: int, stream: int) -> None:
        cells = self._pack.cells
        with self._lock:
            cells["c"].value, cells["bias"].value, cells["pre"].value = c_ptr, bias_ptr or None, pre_ptr or None
            launch_kernel(self._dev, self._fptr, self._grid, 1, 1, _PASS_THREADS, 1, 1, 0,
                          cu_stream(stream), self._pack.addr)
