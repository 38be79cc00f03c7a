"""Shared test data for the kernel GPU tests: stored column-major operands on host and device,
the float64 (int64) reference, cuBLAS on the same inputs, and the error check."""
from __future__ import annotations

import numpy as np
import cupy as cp
import ml_dtypes

from pyblasgemm.kernels import KernelProblem

NP_IN = {"f16": np.float16, "bf16": ml_dtypes.bfloat16, "s8": np.int8, "tf32": np.float32, "3xtf32": np.float32,
         "f16_out32": np.float16, "bf16_out32": ml_dtypes.bfloat16, "f32": np.float32}
NP_OUT = {"f16": np.float16, "bf16": ml_dtypes.bfloat16, "s8": np.int32, "tf32": np.float32, "3xtf32": np.float32,
          "f16_out32": np.float32, "bf16_out32": np.float32, "f32": np.float32}
# Absolute slack on top of "2x cuBLAS's error" (relative Frobenius norm), per output kind.
# 3xTF32 carries 2 x 11 = 22 significant bits per operand (fp32: 24) and mma.sync accumulates
# without round-to-nearest, so at short K (where SGEMM's error is just its output rounding,
# ~6e-8) it sits at a few 1e-7: measured 9.1e-7 at 7x31x129 on an H100. Hence 2^-21 there;
# test_3xtf32_accuracy holds it to 2x SGEMM + 1e-7 at K >= 1000.
EPS_OUT = {"f16": 2.0**-11, "bf16": 2.0**-8, "s8": 0, "tf32": 2.0**-24, "3xtf32": 2.0**-21,
           "f16_out32": 2.0**-24, "bf16_out32": 2.0**-24, "f32": 2.0**-24}


def tf32_round(x):
    """Round fp32 to tf32, ties away (cvt.rna), as the kernel does."""
    b = x.astype(np.float32).view(np.uint32)
    b = ((b + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).astype(np.uint32)
    return b.view(np.float32)


class Case:
    """Stored column-major operands with leading dims, on host and device, plus references."""

    def __init__(self, kind, acc, ta, tb, m, n, k, pad=0, alpha=1.0, beta=0.0, rng=None, batch=1,
                 ld_multiple=1):
        rng = rng or np.random.default_rng()
        self.kind, self.acc, self.ta, self.tb, self.m, self.n, self.k = kind, acc, ta, tb, m, n, k
        self.alpha, self.beta, self.batch = alpha, beta, batch
        ra, ca = (k, m) if ta == "T" else (m, k)  # stored rows x cols
        rb, cb = (n, k) if tb == "T" else (k, n)
        # ld_multiple rounds the padded leading dimensions up (TMA needs 16-byte multiples)
        up = lambda x: -(-x // ld_multiple) * ld_multiple  # noqa: E731
        self.lda, self.ldb, self.ldc = up(ra + pad), up(rb + pad), up(m + pad)
        tin, tout = NP_IN[kind], NP_OUT[kind]

        def rnd(shape, dt):
            if kind == "s8":
                return rng.integers(-128, 128, size=shape).astype(dt)
            return rng.standard_normal(shape).astype(np.float32).astype(dt)

        # numpy (batch, cols, ld) row-major == column-major (ld x cols) per batch
        self.a_h = rnd((batch, ca, self.lda), tin)
        self.b_h = rnd((batch, cb, self.ldb), tin)
        if beta == 0:
            c0 = np.full((batch, n, self.ldc), -12345 if kind == "s8" else np.nan, dtype=np.float64)
        else:
            c0 = rnd((batch, n, self.ldc), np.float32).astype(np.float64)
        if kind == "s8":
            c0 = np.where(np.isnan(c0), -12345, c0) if beta == 0 else rng.integers(-1000, 1000, size=c0.shape)
        self.c_h = c0.astype(tout)
        self.a_d, self.b_d, self.c_d = cp.asarray(self.a_h), cp.asarray(self.b_h), cp.asarray(self.c_h)

    def ops(self, a, b):
        opa = a[:, :, : self.k] if self.ta == "T" else a[:, :, : self.m].transpose(0, 2, 1)
        opb = b[:, :, : self.n] if self.tb == "T" else b[:, :, : self.k].transpose(0, 2, 1)
        if self.ta == "N":
            opa = a[:, :, : self.m].transpose(0, 2, 1)
        return opa, opb

    def c_view(self, c):
        return c[:, :, : self.m].transpose(0, 2, 1)

    def problem(self):
        sa, sb, sc = self.a_h[0].size, self.b_h[0].size, self.c_h[0].size
        return KernelProblem(kind=self.kind, accumulate=self.acc, transa=self.ta, transb=self.tb, m=self.m,
                             n=self.n, k=self.k, lda=self.lda, ldb=self.ldb, ldc=self.ldc,
                             a_ptr=self.a_d.data.ptr, b_ptr=self.b_d.data.ptr, c_ptr=self.c_d.data.ptr,
                             alpha=self.alpha, beta=self.beta, batch=self.batch, stride_a=sa, stride_b=sb,
                             stride_c=sc)

    def reference(self, a=None, b=None):
        """float64 (int64 for s8) alpha*op(A)op(B) + beta*C from the given (host) operands."""
        a = self.a_h if a is None else a
        b = self.b_h if b is None else b
        big = np.int64 if self.kind == "s8" else np.float64
        opa, opb = self.ops(a.astype(big), b.astype(big))
        out = self.alpha * (opa @ opb)
        if self.beta != 0:
            out = out + self.beta * self.c_view(self.c_h.astype(big))
        return out

    def cublas_out(self):
        """cuBLAS (cupy.matmul) on the same inputs, alpha/beta applied in float64."""
        if self.kind == "s8":
            return None  # s8 is checked exactly against int64
        if self.kind == "tf32":
            # cuBLAS's TF32 mode rounds operands to tf32; model that exactly in float64.
            return self.reference(tf32_round(self.a_h), tf32_round(self.b_h))
        opa, opb = self.ops(self.a_d, self.b_d)
        if self.kind in ("f16_out32", "bf16_out32"):
            # 16-bit operands, fp32 C: cublasGemmEx with a 32F C (shgemm / sbgemm) on the same bytes
            import pyblasgemm

            routine = pyblasgemm.shgemm if self.kind == "f16_out32" else pyblasgemm.sbgemm
            prod = np.empty((self.batch, self.m, self.n))
            for z in range(self.batch):
                c = cp.empty(self.m * self.n, dtype=cp.float32)
                routine(self.ta, self.tb, self.m, self.n, self.k, 1.0, self.a_d[z].ravel(), self.lda,
                        self.b_d[z].ravel(), self.ldb, 0.0, c, self.m, backend="cublas")
                prod[z] = c.get().reshape(self.n, self.m).T
            out = self.alpha * prod
            if self.beta != 0:
                out = out + self.beta * self.c_view(self.c_h.astype(np.float64))
            return out
        try:
            prod = cp.matmul(cp.ascontiguousarray(opa), cp.ascontiguousarray(opb)).get().astype(np.float64)
        except Exception:  # a CuPy without bf16 GEMM: fp32 GEMM of the same values, rounded
            prod = cp.matmul(opa.astype(cp.float32), opb.astype(cp.float32)).get()
            prod = prod.astype(NP_OUT[self.kind]).astype(np.float64)
        out = self.alpha * prod
        if self.beta != 0:
            out = out + self.beta * self.c_view(self.c_h.astype(np.float64))
        return out

    def check(self, out_h, ref, cub=None):
        """Return our relative error; asserts untouched padding and no NaN."""
        pad = out_h[:, :, self.m:]
        assert np.array_equal(pad.view(np.uint8), self.c_h[:, :, self.m:].view(np.uint8)), "wrote into ld padding"
        got = self.c_view(out_h)
        if self.kind == "s8":
            want = ref.astype(np.int64).astype(np.int32)  # int32 wraparound, as the kernel
            assert np.array_equal(got, want), f"s8 mismatch, max diff {np.abs(got.astype(np.int64) - ref).max()}"
            return 0.0
        g = got.astype(np.float64)
        assert not np.isnan(g).any(), "NaN in output (unwritten element or NaN propagated from C)"
        rq = ref.astype(NP_OUT[self.kind]).astype(np.float64)  # best possible: correctly rounded
        den = max(np.linalg.norm(ref), 1e-30)
        err = np.linalg.norm(g - ref) / den
        if cub is not None:
            cub_err = np.linalg.norm(cub.astype(NP_OUT[self.kind]).astype(np.float64) - ref) / den
            floor = 2 * np.linalg.norm(rq - ref) / den + 4 * EPS_OUT[self.kind]
            if self.beta != 0 and EPS_OUT[self.kind]:
                # the epilogue rounds alpha*acc and beta*C before adding them: where they cancel,
                # that is u * (|alpha*acc| + |beta*C|), not u * |result| (one fp32 C element)
                bc = np.abs(self.beta * self.c_view(self.c_h.astype(np.float64)))
                floor += 2 * EPS_OUT[self.kind] * np.linalg.norm(np.abs(ref) + 2 * bc) / den
            if self.acc == "f16":
                # cuBLAS via CuPy accumulates f16 GEMMs in fp32; f16 accumulation adds about
                # sqrt(k) half-ulps of f16 (random-walk rounding), which we allow on top.
                floor += 2 * EPS_OUT["f16"] * np.sqrt(self.k)
            assert err <= 2 * cub_err + floor, f"error {err:.3g} > 2 x cuBLAS {cub_err:.3g} (+{floor:.2g})"
        return err
