"""Types of the public interface, for type checkers (mypy, pyright): nothing here runs at
call time, and CuPy, PyTorch and JAX are imported only under ``TYPE_CHECKING`` (``import
pyblasgemm`` imports none of them).

The forms are typed by overloads: NumPy in gives ``numpy.ndarray`` out, CuPy gives CuPy,
PyTorch gives ``torch.Tensor``, JAX gives ``jax.Array``. The words are ``Literal`` types, in
the lower case the documentation uses (the run-time check takes any case).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar, Union, overload

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    import cupy  # type: ignore[import-not-found, import-untyped, unused-ignore]
    import jax
    import torch

__all__ = ["Trans", "GemmTrans", "Compute", "Fp32Compute", "Backend", "Activation", "MlpMethod", "NDArray", "HostScalar",
           "BlasRoutine", "ScipyRoutine"]

#: op(X) of the BLAS form: X, Xᵀ, Xᴴ
Trans = Literal["N", "T", "C", "n", "t", "c"]
#: gemm's op(X): also CuPy's 'H' and cuBLAS's operation values 0, 1, 2
GemmTrans = Literal["N", "T", "C", "H", "n", "t", "c", "h", 0, 1, 2]
#: compute= names: the modes (pyblasgemm._types.TYPE_ROWS), the emulated float64's dial
#: 'int8-ozaki-<bits>', its 'fast' scaling ('int8-ozaki-fast', 'int8-ozaki-<bits>-fast') and
#: the ecosystem's aliases (pyblasgemm._types.COMPUTE_ALIASES)
Compute = Literal[
    "fp32", "tf32", "3xtf32", "fp64", "fp16", "int32", "int8-ozaki",
    "tf32x3", "ieee", "highest", "high",
    "int8-ozaki-1", "int8-ozaki-2", "int8-ozaki-3", "int8-ozaki-4", "int8-ozaki-5",
    "int8-ozaki-6", "int8-ozaki-7", "int8-ozaki-8", "int8-ozaki-9", "int8-ozaki-10",
    "int8-ozaki-11", "int8-ozaki-12", "int8-ozaki-13", "int8-ozaki-14", "int8-ozaki-15",
    "int8-ozaki-16", "int8-ozaki-17", "int8-ozaki-18", "int8-ozaki-19", "int8-ozaki-20",
    "int8-ozaki-21", "int8-ozaki-22", "int8-ozaki-23", "int8-ozaki-24", "int8-ozaki-25",
    "int8-ozaki-26", "int8-ozaki-27", "int8-ozaki-28", "int8-ozaki-29", "int8-ozaki-30",
    "int8-ozaki-31", "int8-ozaki-32", "int8-ozaki-33", "int8-ozaki-34", "int8-ozaki-35",
    "int8-ozaki-36", "int8-ozaki-37", "int8-ozaki-38", "int8-ozaki-39", "int8-ozaki-40",
    "int8-ozaki-41", "int8-ozaki-42", "int8-ozaki-43", "int8-ozaki-44", "int8-ozaki-45",
    "int8-ozaki-46", "int8-ozaki-47", "int8-ozaki-48", "int8-ozaki-49", "int8-ozaki-50",
    "int8-ozaki-51", "int8-ozaki-52", "int8-ozaki-53", "int8-ozaki-54", "int8-ozaki-55",
    "int8-ozaki-56", "int8-ozaki-57", "int8-ozaki-58", "int8-ozaki-59", "int8-ozaki-60",
    "int8-ozaki-61", "int8-ozaki-62",
    "int8-ozaki-fast", "int8-ozaki-1-fast", "int8-ozaki-2-fast", "int8-ozaki-3-fast", "int8-ozaki-4-fast",
    "int8-ozaki-5-fast", "int8-ozaki-6-fast", "int8-ozaki-7-fast", "int8-ozaki-8-fast", "int8-ozaki-9-fast",
    "int8-ozaki-10-fast", "int8-ozaki-11-fast", "int8-ozaki-12-fast", "int8-ozaki-13-fast", "int8-ozaki-14-fast",
    "int8-ozaki-15-fast", "int8-ozaki-16-fast", "int8-ozaki-17-fast", "int8-ozaki-18-fast", "int8-ozaki-19-fast",
    "int8-ozaki-20-fast", "int8-ozaki-21-fast", "int8-ozaki-22-fast", "int8-ozaki-23-fast", "int8-ozaki-24-fast",
    "int8-ozaki-25-fast", "int8-ozaki-26-fast", "int8-ozaki-27-fast", "int8-ozaki-28-fast", "int8-ozaki-29-fast",
    "int8-ozaki-30-fast", "int8-ozaki-31-fast", "int8-ozaki-32-fast", "int8-ozaki-33-fast", "int8-ozaki-34-fast",
    "int8-ozaki-35-fast", "int8-ozaki-36-fast", "int8-ozaki-37-fast", "int8-ozaki-38-fast", "int8-ozaki-39-fast",
    "int8-ozaki-40-fast", "int8-ozaki-41-fast", "int8-ozaki-42-fast", "int8-ozaki-43-fast", "int8-ozaki-44-fast",
    "int8-ozaki-45-fast", "int8-ozaki-46-fast", "int8-ozaki-47-fast", "int8-ozaki-48-fast", "int8-ozaki-49-fast",
    "int8-ozaki-50-fast", "int8-ozaki-51-fast", "int8-ozaki-52-fast", "int8-ozaki-53-fast", "int8-ozaki-54-fast",
    "int8-ozaki-55-fast", "int8-ozaki-56-fast", "int8-ozaki-57-fast", "int8-ozaki-58-fast", "int8-ozaki-59-fast",
    "int8-ozaki-60-fast", "int8-ozaki-61-fast", "int8-ozaki-62-fast"]
#: set_default_compute's words: float32's modes (pyblasgemm._types.FP32_DEFAULTS) and their aliases
Fp32Compute = Literal["fp32", "tf32", "3xtf32", "tf32x3", "ieee", "highest", "high"]
#: backend= names (pyblasgemm.desc.BACKEND_NAMES and BACKEND_ALIASES)
Backend = Literal["auto", "tensorcore", "cublas", "host", "pyblasgemm"]
#: activation= names (pyblasgemm.epilogue.ACTIVATIONS; the run-time check takes these exactly)
Activation = Literal["relu", "gelu", "gelu_tanh", "silu", "sigmoid"]
#: fused_mlp's method= (pyblasgemm.mlp.METHODS, None aside)
MlpMethod = Literal["on_chip", "two_gemms"]
#: pyblasgemm.dask's transport= (pyblasgemm.dask.TRANSPORTS)
DaskTransport = Literal["auto", "ipc", "dask"]
NDArray = npt.NDArray[Any]
#: alpha / beta: Python numbers or NumPy scalars (0-d arrays too, for gemm)
HostScalar = Union[int, float, complex, np.number[Any], np.bool_]
#: any array a form takes and answers in kind
ArrayT = TypeVar("ArrayT", bound=Any)


class BlasRoutine(Protocol):
    """The BLAS form's signature (``sgemm``, ``dgemm``, ...): ``c`` returned, updated."""

    def __call__(self, transa: Trans, transb: Trans, m: int, n: int, k: int,
                 alpha: HostScalar, a: ArrayT, lda: int, b: Any, ldb: int, beta: HostScalar,
                 c: ArrayT, ldc: int, *, compute: Compute | None = None,
                 backend: Backend | None = None, autotune: bool | None = None,
                 stream: Any = None, invariant: bool | None = None) -> ArrayT: ...


class ScipyRoutine(Protocol):
    """``scipy.linalg.blas``'s GEMM signature (``pyblasgemm.scipy.sgemm``, ...): NumPy arrays
    (and what NumPy reads) give ``numpy.ndarray``, CuPy arrays CuPy. ``trans_a`` / ``trans_b``
    are SciPy's 0, 1, 2; ``compute`` and ``backend`` pyblasgemm's words."""

    @overload
    def __call__(self, alpha: HostScalar, a: NDArray, b: NDArray, beta: HostScalar | None = ...,
                 c: NDArray | None = None, trans_a: int = 0, trans_b: int = 0,
                 overwrite_c: int = 0, *, backend: Backend | None = None,
                 compute: Compute | None = None) -> NDArray: ...

    @overload
    def __call__(self, alpha: HostScalar, a: cupy.ndarray, b: cupy.ndarray,
                 beta: HostScalar | None = ..., c: cupy.ndarray | None = None, trans_a: int = 0,
                 trans_b: int = 0, overwrite_c: int = 0, *, backend: Backend | None = None,
                 compute: Compute | None = None) -> cupy.ndarray: ...

    @overload
    def __call__(self, alpha: HostScalar, a: npt.ArrayLike, b: npt.ArrayLike,
                 beta: HostScalar | None = ..., c: npt.ArrayLike | None = None, trans_a: int = 0,
                 trans_b: int = 0, overwrite_c: int = 0, *, backend: Backend | None = None,
                 compute: Compute | None = None) -> NDArray: ...
