"""pyblasgemm.dask with CuPy chunks on one GPU: the threaded scheduler and a
dask_cuda.LocalCUDACluster(n_workers=1) give the same bits; results against float64."""
import logging

import ml_dtypes
import numpy as np
import pytest

da = pytest.importorskip("dask.array")
cupy = pytest.importorskip("cupy")
try:
    _HAS_GPU = cupy.cuda.runtime.getDeviceCount() > 0
except Exception:  # pragma: no cover - no driver
    _HAS_GPU = False
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _HAS_GPU, reason="needs CuPy and a CUDA device")]

from pyblasgemm import dask as pbd  # noqa: E402
from test_dask import _data  # noqa: E402  (the host tests' operands)

DTYPES = [np.float16, ml_dtypes.bfloat16, np.float32, np.float64, np.complex64, np.int8]
RTOL = {np.float16: 1e-3, ml_dtypes.bfloat16: 8e-3, np.float32: 1e-5, np.float64: 1e-13, np.complex64: 1e-5}


def _operands(rng, dtype, m=300, k=1000, n=200):
    x, y = _data(rng, (m, k), dtype), _data(rng, (k, n), dtype)
    X = da.from_array(cupy.asarray(x), chunks=((100, 200), (125,) * 8), asarray=False)
    Y = da.from_array(cupy.asarray(y), chunks=((125,) * 8, (64, 136)), asarray=False)
    return x, y, X, Y


def _check(got, x, y, dtype):
    if dtype is np.int8:
        np.testing.assert_array_equal(got, (x.astype(np.int64) @ y.astype(np.int64)).astype(np.int8))
        return
    wide = np.complex128 if np.dtype(dtype).kind == "c" else np.float64
    ref = x.astype(wide) @ y.astype(wide)
    scale = np.abs(x).astype(np.float64) @ np.abs(y).astype(np.float64)
    rel = np.abs(got.astype(wide) - ref) / scale
    bad = rel > RTOL[dtype]
    # which blocks are wrong and by how much (the operands' chunks are rows 100 | 200, columns 64 | 136)
    assert not bad.any(), (f"{int(bad.sum())} of {bad.size} beyond {RTOL[dtype]:g}: worst {rel.max():.3g} at "
                           f"{np.unravel_index(rel.argmax(), rel.shape)}; rows {sorted(set(np.nonzero(bad)[0] // 100))[:6]} "
                           f"x 100, columns {sorted(set(np.nonzero(bad)[1] // 64))[:6]} x 64")


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("k_group", [1, None])
def test_cupy_chunks_threaded(dtype, k_group):
    """Block products from many threads at once (k_group=1: 8 partial tasks per block): each
    result against float64 (the launches' argument cells were once shared between threads)."""
    rng = np.random.default_rng(DTYPES.index(dtype))
    x, y, X, Y = _operands(rng, dtype)
    z = pbd.matmul(X, Y, k_group=k_group)
    assert isinstance(z._meta, cupy.ndarray)
    got = z.compute(scheduler="threads")
    # numpy.matmul's result type (bfloat16 @ bfloat16 is float32 with ml_dtypes), as
    # pyblasgemm.matmul's, and the array module of the chunks
    assert isinstance(got, cupy.ndarray) and got.dtype == np.matmul(x[:1, :1], y[:1, :1]).dtype, got.dtype
    assert z.dtype == got.dtype
    _check(cupy.asnumpy(got), x, y, dtype)


@pytest.fixture(scope="module")
def cuda_cluster():
    dask_cuda = pytest.importorskip("dask_cuda")
    distributed = pytest.importorskip("distributed")
    with dask_cuda.LocalCUDACluster(n_workers=1, dashboard_address=None, silence_logs=logging.ERROR) as cluster, \
            distributed.Client(cluster) as client:
        yield client


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float64, np.int8], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("k_group", [1, None])
def test_local_cuda_cluster_gives_the_threaded_schedulers_bits(cuda_cluster, dtype, k_group):
    rng = np.random.default_rng(7)
    x, y, X, Y = _operands(rng, dtype)
    z = pbd.matmul(X, Y, k_group=k_group)
    threaded = cupy.asnumpy(z.compute(scheduler="threads"))
    clustered = cuda_cluster.compute(z).result()
    clustered = cupy.asnumpy(clustered) if isinstance(clustered, cupy.ndarray) else clustered
    np.testing.assert_array_equal(threaded.view(np.uint8), clustered.view(np.uint8))
    _check(clustered, x, y, dtype)


def test_gemm_on_the_gpu_with_c(cuda_cluster):
    rng = np.random.default_rng(8)
    x, y, X, Y = _operands(rng, np.float32)
    c = _data(rng, (300, 200), np.float32)
    C = da.from_array(cupy.asarray(c), chunks=100, asarray=False)
    z = pbd.gemm("N", "N", X, Y, c=C, alpha=2, beta=-1)
    got = cupy.asnumpy(cuda_cluster.compute(z).result())
    ref = 2 * (x.astype(np.float64) @ y) - c
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
