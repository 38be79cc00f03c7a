"""C = beta * C on the GPU in IEEE arithmetic (the alpha = 0 / k = 0 path of every GPU call).

CuPy compiles its elementwise kernels with ``-ftz=true``: ``c *= beta`` flushed products below
FLT_MIN (1.18e-38) to zero, where cuBLAS and the host keep them (the GPU fuzz found it: cgemm
with alpha = 0 and beta = FLT_MIN·i returned zeros). Inline PTX is not rewritten by ``-ftz``,
so these kernels multiply with ``mul.rn.f32`` / ``fma.rn.f32`` as written. float64 arithmetic
is never flushed, and 16-bit results are formed from float32 products (see execute.scale_c).
"""
from __future__ import annotations

_PREAMBLE = r"""
__device__ float pbg_mul_ieee(float a, float b) {
  float r; asm("mul.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b)); return r;
}
__device__ float pbg_fma_ieee(float a, float b, float c) {
  float r; asm("fma.rn.f32 %0, %1, %2, %3;" : "=f"(r) : "f"(a), "f"(b), "f"(c)); return r;
}
"""

_kernels: dict = {}


def _kernel(kind: str):
    k = _kernels.get(kind)
    if k is None:
        import cupy
        if kind == "real":
            k = cupy.ElementwiseKernel("float32 b", "float32 c", "c = pbg_mul_ieee(c, b)",
                                       "pyblasgemm_scale_f32", preamble=_PREAMBLE)
        else:   # (cr + i ci)(br + i bi); -bi is passed negated (negation under -ftz flushes too)
            k = cupy.ElementwiseKernel(
                "float32 br, float32 bi, float32 nbi", "complex64 c",
                "float cr = c.real(), ci = c.imag();"
                "c = complex<float>(pbg_fma_ieee(cr, br, pbg_mul_ieee(ci, nbi)),"
                "                   pbg_fma_ieee(cr, bi, pbg_mul_ieee(ci, br)))",
                "pyblasgemm_scale_c64", preamble=_PREAMBLE)
        _kernels[kind] = k
    return k


def scale_ieee(view, beta) -> None:
    """``view *= beta`` for a float32 or complex64 CuPy array (any strides), subnormals kept.

    Example::

        scale_ieee(c_view, 1.2e-38)      # products below FLT_MIN stay subnormal, not zero
    """
    if view.dtype.kind == "c":
        b = complex(beta)
        _kernel("complex")(b.real, b.imag, -b.imag, view)
    else:
        _kernel("real")(float(beta), view)
