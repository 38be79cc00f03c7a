"""pyblasgemm.dask on the host: NumPy chunks on the threaded scheduler and on a
distributed.LocalCluster (small shapes, uneven chunks, K in 1-7 chunks, every dtype, against
float64), bitwise determinism across the two, the K alignment, gemm's op / alpha / beta / c,
and the errors."""
import logging

import ml_dtypes
import numpy as np
import pytest

da = pytest.importorskip("dask.array")
import dask  # noqa: E402

import pyblasgemm  # noqa: E402
from pyblasgemm import dask as pbd  # noqa: E402

DTYPES = [np.float16, ml_dtypes.bfloat16, np.float32, np.float64, np.complex64, np.complex128, np.int8]
#: relative error against the float64 reference's scale |x| @ |y|: the result type's rounding
#: (float16 2^-11, bfloat16 2^-8; sums in float32 / the type itself)
RTOL = {np.float16: 1e-3, ml_dtypes.bfloat16: 8e-3, np.float32: 1e-5, np.float64: 1e-13,
        np.complex64: 1e-5, np.complex128: 1e-13, np.int8: 0}


def _data(rng, shape, dtype):
    if dtype is np.int8:
        return rng.integers(-128, 128, shape).astype(np.int8)
    x = rng.uniform(-1, 1, shape)
    if np.dtype(dtype).kind == "c":
        x = x + 1j * rng.uniform(-1, 1, shape)
    return x.astype(dtype)


def _chunks(rng, n, parts):
    """``parts`` uneven chunk sizes summing to n."""
    cuts = np.sort(rng.choice(np.arange(1, n), parts - 1, replace=False)) if parts > 1 else []
    edges = [0, *cuts, n]
    return tuple(int(b - a) for a, b in zip(edges[:-1], edges[1:]))


def _check(got, x, y, dtype, what):
    ref = x.astype(np.complex128 if np.dtype(dtype).kind == "c" else np.float64) @ \
        y.astype(np.complex128 if np.dtype(dtype).kind == "c" else np.float64)
    if dtype is np.int8:                     # numpy's int8 matmul wraps to int8; so do we
        np.testing.assert_array_equal(got, (x.astype(np.int64) @ y.astype(np.int64)).astype(np.int8), what)
        return
    scale = np.abs(x).astype(np.float64) @ np.abs(y).astype(np.float64)
    err = np.abs(got.astype(ref.dtype) - ref)
    assert np.all(err <= RTOL[dtype] * scale + 1e-30), (what, float(np.max(err / (scale + 1e-300))))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("k_parts", [1, 2, 3, 5, 7])
def test_every_dtype_uneven_chunks_threaded(dtype, k_parts):
    rng = np.random.default_rng(k_parts * 10 + DTYPES.index(dtype))
    m, k, n = 23, 41, 17
    x, y = _data(rng, (m, k), dtype), _data(rng, (k, n), dtype)
    kc = _chunks(rng, k, k_parts)
    X = da.from_array(x, chunks=(_chunks(rng, m, 3), kc))
    Y = da.from_array(y, chunks=(kc, _chunks(rng, n, 2)))
    z = pbd.matmul(X, Y)
    assert z.dtype == pyblasgemm.matmul(x, y).dtype and z.chunks == (X.chunks[0], Y.chunks[1])
    with dask.config.set(scheduler="threads"):
        got = z.compute()
    _check(got, x, y, dtype, (np.dtype(dtype).name, kc))


def test_misaligned_k_chunks_are_rechunked_and_logged(caplog):
    rng = np.random.default_rng(1)
    x, y = _data(rng, (8, 30), np.float32), _data(rng, (30, 6), np.float32)
    X, Y = da.from_array(x, chunks=(8, (10, 20))), da.from_array(y, chunks=((15, 15), 6))
    with caplog.at_level(logging.DEBUG, logger="pyblasgemm.dask"):
        z = pbd.matmul(X, Y)
    assert "rechunking K" in caplog.text and "(10, 5, 15)" in caplog.text
    _check(z.compute(scheduler="threads"), x, y, np.float32, "rechunked")
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="pyblasgemm.dask"):
        pbd.matmul(X, da.from_array(y, chunks=((10, 20), 6)))
    assert "rechunking" not in caplog.text            # aligned: nothing moves


def test_batch_dimensions_broadcast_and_vectors():
    rng = np.random.default_rng(2)
    x, y = _data(rng, (3, 1, 9, 14), np.float32), _data(rng, (4, 14, 5), np.float32)
    X, Y = da.from_array(x, chunks=(2, 1, 4, 7)), da.from_array(y, chunks=(3, 5, 2))
    got = pbd.matmul(X, Y).compute(scheduler="threads")
    ref = np.matmul(x.astype(np.float64), y.astype(np.float64))
    assert got.shape == ref.shape == (3, 4, 9, 5)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    v = _data(rng, (14,), np.float32)
    assert pbd.matmul(X, da.from_array(v, chunks=5)).shape == (3, 1, 9)
    assert pbd.matmul(da.from_array(v, chunks=7), Y).shape == (4, 5)
    np.testing.assert_allclose(pbd.matmul(da.from_array(v, chunks=4), da.from_array(v, chunks=6)).compute(),
                               v.astype(np.float64) @ v, rtol=1e-5)


@pytest.mark.parametrize("transa,transb", [("N", "N"), ("T", "N"), ("N", "C"), ("C", "T")])
def test_gemm_ops_alpha_beta_and_c(transa, transb):
    rng = np.random.default_rng(3)
    m, k, n = 13, 22, 9
    dt = np.complex64
    a = _data(rng, (m, k) if transa == "N" else (k, m), dt)
    b = _data(rng, (k, n) if transb == "N" else (n, k), dt)
    c = _data(rng, (m, n), dt)
    op = {"N": lambda v: v, "T": lambda v: v.T, "C": lambda v: v.conj().T}
    A, B = da.from_array(a, chunks=5), da.from_array(b, chunks=7)
    C = da.from_array(c, chunks=4)                               # rechunked to the result's blocks
    got = pbd.gemm(transa, transb, A, B, c=C, alpha=0.5 - 1j, beta=2).compute(scheduler="threads")
    ref = (0.5 - 1j) * (op[transa](a).astype(np.complex128) @ op[transb](b)) + 2 * c
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    nan_c = da.full((m, n), np.nan, dtype=dt, chunks=4)          # beta = 0: c is never read
    got = pbd.gemm(transa, transb, A, B, c=nan_c).compute(scheduler="threads")
    assert np.isfinite(got).all()


def test_k_group_changes_the_tree_not_the_accuracy_and_each_is_deterministic():
    rng = np.random.default_rng(4)
    x, y = _data(rng, (16, 70), np.float16), _data(rng, (70, 12), np.float16)
    X, Y = da.from_array(x, chunks=(8, 10)), da.from_array(y, chunks=(10, 6))
    results = {}
    for g in (1, 2, 3, 7):
        z = pbd.matmul(X, Y, k_group=g)
        first, second = z.compute(scheduler="threads"), z.compute(scheduler="sync")
        np.testing.assert_array_equal(first.view(np.uint16), second.view(np.uint16))
        _check(first, x, y, np.float16, g)
        results[g] = first
    assert pbd.k_group_for(7, 4) == 1 and pbd.k_group_for(7, 64) == 7


def test_accuracy_against_one_call_and_dask_matmul_float16():
    """K in 8 chunks: our error is one pyblasgemm call's (same float32 sums, one rounding);
    dask.array.matmul rounds each partial product to float16 and adds them in float16."""
    rng = np.random.default_rng(5)
    x, y = _data(rng, (64, 512), np.float16), _data(rng, (512, 48), np.float16)
    X, Y = da.from_array(x, chunks=(32, 64)), da.from_array(y, chunks=(64, 24))
    ref = x.astype(np.float64) @ y.astype(np.float64)

    def err(z):
        return float(np.linalg.norm(z.astype(np.float64) - ref) / np.linalg.norm(ref))

    ours, one = err(pbd.matmul(X, Y).compute(scheduler="threads")), err(pyblasgemm.matmul(x, y))
    theirs = err(da.matmul(X, Y).compute(scheduler="threads"))
    assert ours <= 1.5 * one and theirs > 1.5 * ours, (ours, one, theirs)


def test_bad_input_is_named_before_any_work():
    X = da.ones((4, 6), chunks=2)
    with pytest.raises(TypeError, match="out= is not a Dask concept"):
        pbd.matmul(X, X.T, out=np.empty((4, 4)))
    with pytest.raises(ValueError, match="inner sizes"):
        pbd.matmul(X, X)
    with pytest.raises(ValueError, match="transa='X'"):
        pbd.gemm("X", "N", X, X)
    with pytest.raises(ValueError, match="beta != 0 needs c="):
        pbd.gemm("N", "T", X, X, beta=1)
    with pytest.raises(ValueError, match="k_group=0"):
        pbd.matmul(X, X.T, k_group=0)
    with pytest.raises(ValueError, match="compute="):
        pbd.matmul(X, X.T, compute="int8-ozaki-99")
    assert pbd.matmul(da.ones((3, 0), chunks=1), da.ones((0, 2), chunks=1)).compute().tolist() == [[0.0] * 2] * 3


@pytest.fixture(scope="module")
def local_cluster():
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                                  silence_logs=logging.ERROR) as cluster, distributed.Client(cluster) as client:
        yield client


def _threaded_here(x, y, x_chunks, y_chunks):
    """The same graph on the threaded scheduler, in the process this runs in."""
    return pbd.matmul(da.from_array(x, chunks=x_chunks), da.from_array(y, chunks=y_chunks),
                      k_group=1).compute(scheduler="threads")


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float32, np.complex128, np.int8],
                         ids=lambda d: np.dtype(d).name)
def test_local_cluster_gives_the_threaded_schedulers_bits(local_cluster, dtype):
    """The graph fixes every sum's order and every block's layout (C order: OpenBLAS's float32
    bits differed between views and copies on the GPU machine's host): the cluster's bits
    are the threaded scheduler's, here and inside a worker (whose BLAS has one thread)."""
    rng = np.random.default_rng(6)
    x, y = _data(rng, (40, 90), dtype), _data(rng, (90, 30), dtype)
    x_chunks, y_chunks = ((13, 27), (20, 5, 30, 35)), ((20, 5, 30, 35), (11, 19))
    clustered = local_cluster.compute(pbd.matmul(da.from_array(x, chunks=x_chunks),
                                                 da.from_array(y, chunks=y_chunks), k_group=1)).result()
    in_worker = local_cluster.submit(_threaded_here, x, y, x_chunks, y_chunks, pure=False).result()
    here = _threaded_here(x, y, x_chunks, y_chunks)          # 4 partials and 3 adds a block
    np.testing.assert_array_equal(in_worker.view(np.uint8), clustered.view(np.uint8))
    np.testing.assert_array_equal(here.view(np.uint8), clustered.view(np.uint8))
    _check(clustered, x, y, dtype, "cluster")


def test_bfloat16_cast_is_ml_dtypes_rounding_on_any_array_module():
    """The final cast to bfloat16 is done on the bits (CuPy has no bfloat16 astype): it must be
    ml_dtypes' round-to-nearest-even for every kind of float32, halfway cases included."""
    rng = np.random.default_rng(9)
    bits = np.concatenate([rng.integers(0, 2**32, 200000, dtype=np.uint64).astype(np.uint32),
                           np.array([0x3F808000, 0x3F818000, 0x7F7FFFFF, 0x00008000, 0x80018000,
                                     0x7F800000, 0xFF800000, 0x7FC00001, 0x7F800001, 0], np.uint32)])
    v = bits.view(np.float32)
    ours = pbd._to_bfloat16(v)
    assert ours.dtype == ml_dtypes.bfloat16
    ref = v.astype(ml_dtypes.bfloat16)
    same = ours.view(np.uint16) == ref.view(np.uint16)
    both_nan = np.isnan(ours.astype(np.float32)) & np.isnan(ref.astype(np.float32))
    assert np.all(same | both_nan)


def test_dask_guide_quotes_the_measured_run():
    """docs/guide/dask.rst's tables are bench/results/dask_{h100,h200}_2026-11-25_8bf323d.json's."""
    import json
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[1]
    text = " ".join((root / "docs/guide/dask.rst").read_text().split())
    for gpu in ("h100", "h200"):
        doc = json.loads((root / f"bench/results/dask_{gpu}_2026-11-25_8bf323d.json").read_text())
        assert doc["device"]["name"].split()[1].lower() == gpu
        for acc in (c for c in doc["cases"] if c["case"] == "accuracy"):
            e = acc["errors"]
            row = (f"{acc['dtype']}, {acc['k_chunks']} - {e['pyblasgemm.dask.matmul']:.3e} - "
                   f"{e['pyblasgemm.matmul (one call)']:.3e} - "
                   f"{e['rounding floor (float64 product rounded once)']:.3e} - "
                   f"{e['dask.array.matmul']:.3e} ({acc['ratio_dask']:.2f}x ours)")
            assert row in text, row
            assert acc["ratio_floor"] < 1.0001 and acc["ratio_one_call"] <= 1.5
        t = next(c for c in doc["cases"] if c["case"].startswith("time"))
        ours, grouped = t["pyblasgemm.dask.matmul"], t["pyblasgemm.dask.matmul k_group=all"]
        theirs = t["dask.array.matmul"]
        row = (f"{gpu.upper()} - {ours['median_s'] * 1e3:.1f} ms, {ours['tasks']} tasks ({t['ratio']:.2f}x) - "
               f"{grouped['median_s'] * 1e3:.1f} ms, {grouped['tasks']} tasks ({t['ratio_k_group_all']:.2f}x) - "
               f"{theirs['median_s'] * 1e3:.1f} ms, {theirs['tasks']} tasks")
        assert row in text, row
        assert t["bitwise_equal_cluster_vs_threaded"]


def test_bfloat16_results_on_request_are_the_float32_sum_rounded_once():
    """bfloat16 @ bfloat16 is float32 (NumPy's type); dtype=bfloat16 gives bgemm's type: the same
    float32 sum, rounded once (ml_dtypes' rounding)."""
    rng = np.random.default_rng(12)
    x, y = _data(rng, (30, 70), ml_dtypes.bfloat16), _data(rng, (70, 20), ml_dtypes.bfloat16)
    X, Y = da.from_array(x, chunks=(15, 10)), da.from_array(y, chunks=(10, 7))
    wide = pbd.matmul(X, Y).compute(scheduler="threads")
    narrow = pbd.matmul(X, Y, dtype=ml_dtypes.bfloat16)
    assert wide.dtype == np.float32 and narrow.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(narrow.compute(scheduler="threads").view(np.uint16),
                                  wide.astype(ml_dtypes.bfloat16).view(np.uint16))
    with pytest.raises(TypeError):          # what NumPy refuses stays refused
        pbd.matmul(X.astype(np.float32), Y.astype(np.float32), dtype=ml_dtypes.bfloat16)
