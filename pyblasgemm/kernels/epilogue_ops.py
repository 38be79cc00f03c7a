"""The epilogue pass on a GPU: one elementwise kernel over the product (pyblasgemm.epilogue).

The kernel is generated per epilogue structure (dequantize, bias, beta, activation,
pre-activation output), compiled once per process through CuPy, and includes
``epilogue/activation.cuh``: the same device definitions the fused GEMM stores will use.
"""
from __future__ import annotations

import functools
import sys

from .jit import INCLUDE_DIR


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
