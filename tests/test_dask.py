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
    assert pbd.k_group_for(7, 4) == 4 and pbd.k_group_for(7, 64) == 7     # 2 tasks x 4 blocks; one a block


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
    """4 single-thread worker processes, work stealing off: the placement tests' blocks are a few
    KB, which Dask's stealing heuristic may move at will (it leaves alone tasks whose inputs take
    longer to move than to compute: 128 MB GPU blocks), and the placement is what they check."""
    distributed = pytest.importorskip("distributed")
    with dask.config.set({"distributed.scheduler.work-stealing": False}), \
            distributed.LocalCluster(n_workers=4, threads_per_worker=1, processes=True, dashboard_address=None,
                                     silence_logs=logging.ERROR) as cluster, distributed.Client(cluster) as client:
        yield client


def _threaded_here(x, y, x_chunks, y_chunks, k_group=1):
    """The same graph on the threaded scheduler, in the process this runs in."""
    return pbd.matmul(da.from_array(x, chunks=x_chunks), da.from_array(y, chunks=y_chunks),
                      k_group=k_group).compute(scheduler="threads")


@pytest.mark.parametrize("k_group", [1, None], ids=["k_group=1", "default"])
@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float32, np.complex128, np.int8],
                         ids=lambda d: np.dtype(d).name)
def test_local_cluster_gives_the_threaded_schedulers_bits(local_cluster, dtype, k_group):
    """The graph fixes every sum's order and every block's layout (C order: OpenBLAS's float32
    bits differed between views and copies on the GPU machine's host): the cluster's bits
    are the threaded scheduler's, here and inside a worker (whose BLAS has one thread)."""
    rng = np.random.default_rng(6)
    x, y = _data(rng, (40, 90), dtype), _data(rng, (90, 30), dtype)
    x_chunks, y_chunks = ((13, 27), (20, 5, 30, 35)), ((20, 5, 30, 35), (11, 19))
    clustered = local_cluster.compute(pbd.matmul(da.from_array(x, chunks=x_chunks),
                                                 da.from_array(y, chunks=y_chunks), k_group=k_group)).result()
    in_worker = local_cluster.submit(_threaded_here, x, y, x_chunks, y_chunks, k_group, pure=False).result()
    # k_group=1: 4 partials and 3 adds a block; the default (4 blocks): 2 chains of 2, one add
    here = _threaded_here(x, y, x_chunks, y_chunks, k_group)
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


# ---------------------------------------------------------------------------------------------
# Every dtype pair NumPy's matmul accepts (issue #30, item 2): numpy.matmul's type and values
# ---------------------------------------------------------------------------------------------

#: the operand types of the pairs: NumPy's matmul (with ml_dtypes' bfloat16) accepts all 144
PAIR_DTYPES = [np.bool_, np.int8, np.uint8, np.int16, np.int32, np.int64, np.float16, ml_dtypes.bfloat16,
               np.float32, np.float64, np.complex64, np.complex128]


def _sample(rng, shape, dtype, limit=None):
    """Integers over their whole range (sums wrap, as NumPy's do) or within +-limit, floats in
    [-1, 1]."""
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return rng.integers(0, 2, shape).astype(bool)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        lo, hi = (info.min, info.max) if limit is None else (max(info.min, -limit), min(info.max, limit))
        return rng.integers(lo, hi, shape, dtype=dt, endpoint=True)
    return _data(rng, shape, dtype)


def _assert_numpy_result(got, x, y, dtype=None, what=""):
    """``got`` is numpy.matmul(x, y, dtype=dtype): its type and shape, its values exactly for
    integers and bool; for floats, within one rounding to the result type (plus the wide sums'
    error) of the exact product of the operands as NumPy's loop casts them, and so within that
    plus NumPy's own sums' error of NumPy's result."""
    want = np.matmul(x, y, dtype=dtype)
    assert (got.dtype, got.shape) == (want.dtype, want.shape), (what, got.dtype, want.dtype)
    if want.dtype.kind in "biu":
        np.testing.assert_array_equal(got, want, str(what))
        return
    loop = np.matmul.resolve_dtypes((x.dtype, y.dtype, None), signature=(None, None, dtype))[0]
    wide = np.complex128 if "c" in (loop.kind, want.dtype.kind) else np.float64
    xs, ys = x.astype(loop).astype(wide), y.astype(loop).astype(wide)
    exact, scale = xs @ ys, np.abs(xs) @ np.abs(ys)
    k = x.shape[-1]
    u_out = float(ml_dtypes.finfo(want.dtype).eps) / 2
    u_acc = float(ml_dtypes.finfo(pbd.accumulation_dtype(want.dtype)).eps) / 2
    ours = 2 * u_out + 4 * k * u_acc              # one rounding, sums in the accumulation type
    err = np.abs(got.astype(wide) - exact)
    assert np.all(err <= ours * scale + 1e-300), (what, float(np.max(err / (scale + 1e-300))), ours)
    theirs = ours + 4 * k * u_out                 # NumPy may sum in the result type
    err = np.abs(got.astype(wide) - want.astype(wide))
    assert np.all(err <= theirs * scale + 1e-300), (what, "against numpy", float(np.max(err / (scale + 1e-300))))


@pytest.mark.parametrize("x_dtype", PAIR_DTYPES, ids=lambda d: np.dtype(d).name)
def test_every_dtype_pair_gives_numpys_result_with_one_and_several_k_chunks_per_task(x_dtype):
    """x of one type @ y of each type, K in 4 uneven chunks, with 1 K chunk per task (a tree of
    sums), 2 (chains of two, then a sum) and all 4 (one chain): each is numpy.matmul's result.
    Today's mixed pairs and the types pyblasgemm does not accelerate (int16, bool, ...) failed
    at .compute() as soon as a task chained two K chunks."""
    rng = np.random.default_rng(PAIR_DTYPES.index(x_dtype))
    m, k, n = 11, 23, 9
    kc = (7, 3, 8, 5)
    failures = []
    for y_dtype in PAIR_DTYPES:
        x, y = _sample(rng, (m, k), x_dtype), _sample(rng, (k, n), y_dtype)
        X, Y = da.from_array(x, chunks=((6, 5), kc)), da.from_array(y, chunks=(kc, (4, 5)))
        for group in (1, 2, 4):
            what = (np.dtype(x_dtype).name, np.dtype(y_dtype).name, group)
            try:
                z = pbd.matmul(X, Y, k_group=group)
                assert z.dtype == np.matmul(x, y).dtype, (what, z.dtype)
                _assert_numpy_result(z.compute(scheduler="threads"), x, y, None, what)
            except Exception as e:          # every pair is reported, not only the first
                failures.append(f"{what}: {type(e).__name__}: {str(e)[:160]}")
    assert not failures, "\n".join(failures)


def test_the_issues_example_float32_at_float64():
    """#30's reproducer (dtype= by keyword: Dask's ``ones`` takes no positional dtype, so the
    issue's own line multiplies two float64 arrays): 64 output blocks, so the default chains
    the 3 K chunks in one task."""
    x = da.ones((40, 12), dtype=np.float32, chunks=(5, 4))
    y = da.ones((12, 40), dtype=np.float64, chunks=(4, 5))
    got = pbd.matmul(x, y)
    assert got.dtype == np.float64 == da.matmul(x, y).dtype
    np.testing.assert_array_equal(got.compute(), np.full((40, 40), 12.0))


#: (x, y, dtype=) requests NumPy serves and today's module failed at .compute() or rounded
DTYPE_REQUESTS = [
    (np.float16, np.float16, np.float64),        # #30: float16 operands, float64 sums
    (ml_dtypes.bfloat16, ml_dtypes.bfloat16, np.float64),
    (np.float32, np.float32, np.float64),
    (np.float32, np.float64, np.complex128),
    (np.float64, np.float64, np.float16),        # NumPy rounds the operands to float16 first
    (np.int16, np.bool_, np.float16),            # ... and int16 values above 2048 too
    (np.int8, np.int8, np.float32),
    (np.int16, np.int16, np.int8),               # the operands wrap to int8 first
    (np.uint8, np.int8, np.int64),
    (np.bool_, np.bool_, np.int32),              # counts, not "any"
    (np.bool_, np.float32, np.float16),
]


@pytest.mark.parametrize("x_dtype,y_dtype,dtype", DTYPE_REQUESTS, ids=lambda d: np.dtype(d).name)
def test_dtype_keyword_is_numpys(x_dtype, y_dtype, dtype):
    rng = np.random.default_rng(20)
    limit = 2500 if dtype is np.float16 else None          # 26 x 2500 < 65504: no overflow
    x, y = _sample(rng, (10, 26), x_dtype, limit), _sample(rng, (26, 7), y_dtype, limit)
    X, Y = da.from_array(x, chunks=(5, (9, 4, 6, 7))), da.from_array(y, chunks=((9, 4, 6, 7), 7))
    for group in (1, 2, 4):
        z = pbd.matmul(X, Y, dtype=dtype, k_group=group)
        assert z.dtype == np.dtype(dtype)
        _assert_numpy_result(z.compute(scheduler="threads"), x, y, dtype, group)


def test_a_narrower_dtype_rounds_the_operands_first_as_numpy_does():
    """dtype=float16 on float32 operands: NumPy casts the operands to float16 (1 + 2^-11 and
    1 - 2^-12 are ties, both rounded to 1) and multiplies those: 0 in every row. The float32
    operands' own sum, 2 (2^-11 - 2^-12) = 2^-11, rounded once to float16 is not NumPy's answer."""
    x = np.tile(np.array([1 + 2**-11, -1, 1 - 2**-12, -1, 0.5, -0.5], np.float32), (4, 2))
    y = np.ones((12, 3), np.float32)
    want = np.matmul(x, y, dtype=np.float16)
    assert not want.any()
    for group in (1, 3):
        got = pbd.matmul(da.from_array(x, chunks=(2, 3)), da.from_array(y, chunks=(3, 3)), dtype=np.float16,
                         k_group=group).compute(scheduler="threads")
        np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))


# ---------------------------------------------------------------------------------------------
# gemm's alpha / beta: checked as pyblasgemm.gemm checks them, before any graph
# ---------------------------------------------------------------------------------------------

def _gemm_error(dtype, alpha, beta, out_dtype=None):
    """What pyblasgemm.gemm raises for these scalars on 1 x 1 operands of ``dtype``."""
    a = np.ones((1, 1), dtype)
    out = np.zeros((1, 1), out_dtype or pyblasgemm.matmul(a, a, dtype=out_dtype).dtype)
    if out.dtype == np.int8:
        out = np.zeros((1, 1), np.int32)            # gemm's int8 row writes int32
    with pytest.raises(Exception) as info:
        pyblasgemm.gemm("N", "N", a, a, out, alpha, beta)
    return info.value


@pytest.mark.parametrize("dtype,alpha,beta,out_dtype", [
    (np.int8, 1.5, 0, None),                     # #30: truncated to 1 silently
    (np.int8, 1, 2.0, None),
    (np.int8, 2**31, 0, None),
    (np.int8, True, 0, None),
    (np.float32, 0.5 - 1j, 0, None),             # #30: a bare float() error at .compute()
    (np.float32, 1, 1e39, None),
    (np.float16, 1e39, 0, None),
    (np.float16, 1j, 0, np.float32),             # shgemm's row
    (ml_dtypes.bfloat16, 1, 1j, None),
    (np.float64, "2", 0, None),
    (np.complex64, 1e39j, 0, None),
], ids=str)
def test_gemm_refuses_the_scalars_pyblasgemm_gemm_refuses(dtype, alpha, beta, out_dtype):
    expected = _gemm_error(dtype, alpha, beta, out_dtype)
    A = da.ones((6, 8), dtype=dtype, chunks=(3, 2))
    C = da.zeros((6, 6), dtype=out_dtype or np.matmul(np.ones((1, 1), dtype), np.ones((1, 1), dtype)).dtype,
                 chunks=3)
    with pytest.raises(type(expected)) as info:
        pbd.gemm("N", "T", A, A, c=C, alpha=alpha, beta=beta, dtype=out_dtype)
    assert str(info.value).startswith("pyblasgemm.dask.gemm: ")
    assert str(info.value).split(": ", 1)[1] == str(expected).split(": ", 1)[1]


@pytest.mark.parametrize("x_dtype,y_dtype,alpha,beta,error,match", [
    (np.int16, np.int16, 1.5, 0, TypeError, r"parameter 6 \(alpha=1.5\) must be an integer"),
    (np.int32, np.int64, 1, 2**63, ValueError, r"parameter 7 \(beta=9223372036854775808\).*int64 range"),
    (np.uint8, np.uint8, 2**31, 0, ValueError, r"alpha=2147483648.*int32 range"),
    (np.bool_, np.bool_, 2, 0, ValueError, r"alpha=2.*0 or 1"),
    (np.float32, np.float64, 1j, 0, TypeError, r"alpha=1j.*real number"),
    (np.int8, np.float32, 1, 1e39, ValueError, r"beta=1e\+39.*float32 range"),
], ids=str)
def test_gemm_scalars_for_types_pyblasgemm_does_not_accelerate(x_dtype, y_dtype, alpha, beta, error, match):
    A = da.ones((6, 8), dtype=x_dtype, chunks=(3, 2))
    B = da.ones((6, 8), dtype=y_dtype, chunks=(3, 2))
    C = da.zeros((6, 6), dtype=np.matmul(np.ones((1, 1), x_dtype), np.ones((1, 1), y_dtype)).dtype, chunks=3)
    with pytest.raises(error, match=match):
        pbd.gemm("N", "T", A, B, c=C, alpha=alpha, beta=beta)


@pytest.mark.parametrize("x_dtype,y_dtype,alpha,beta", [
    (np.int16, np.int16, 3, -2),
    (np.uint8, np.uint8, -1, 5),
    (np.int8, np.uint8, 2, 1),
    (np.bool_, np.bool_, 1, 1),
    (np.float32, np.float64, 0.5, 2.0),
    (np.int8, np.float32, np.float32(-1.5), np.array(0.25)),     # NumPy scalars and 0-d arrays
    (np.float32, np.complex64, 0.5 - 1j, 2),
    (np.float16, np.float32, 3, -1),
], ids=str)
def test_gemm_on_every_kind_of_pair_is_alpha_numpys_product_plus_beta_c(x_dtype, y_dtype, alpha, beta):
    """alpha * op(a) @ op(b) + beta * c, K in 5 chunks, two per task: integer types exactly
    (wrapping as their sums do), floats within the result's rounding."""
    rng = np.random.default_rng(21)
    a, b = _sample(rng, (24, 10), x_dtype), _sample(rng, (9, 24), y_dtype)
    out_dtype = np.matmul(a.T, b.T).dtype
    c = _sample(rng, (10, 9), out_dtype)
    A, B = da.from_array(a, chunks=((5, 4, 6, 3, 6), 5)), da.from_array(b, chunks=(3, (5, 4, 6, 3, 6)))
    got = pbd.gemm("T", "T", A, B, c=da.from_array(c, chunks=4), alpha=alpha, beta=beta, k_group=2)
    assert got.dtype == out_dtype
    got = got.compute(scheduler="threads")
    alpha, beta = np.asarray(alpha).item(), np.asarray(beta).item()
    if out_dtype.kind == "b":
        want = (bool(alpha) & np.matmul(a.T, b.T)) | (bool(beta) & c)
        np.testing.assert_array_equal(got, want)
    elif out_dtype.kind in "iu":
        wide = alpha * (a.T.astype(np.int64) @ b.T.astype(np.int64)) + beta * c.astype(np.int64)
        np.testing.assert_array_equal(got, wide.astype(out_dtype))
    else:
        wide = np.complex128 if out_dtype.kind == "c" else np.float64
        exact = alpha * (a.T.astype(wide) @ b.T.astype(wide)) + beta * c.astype(wide)
        scale = abs(alpha) * (np.abs(a.T).astype(np.float64) @ np.abs(b.T)) + abs(beta) * np.abs(c)
        u = float(np.finfo(out_dtype).eps)
        assert np.all(np.abs(got.astype(wide) - exact) <= 4 * u * scale)


def test_gemm_refuses_a_c_that_the_result_type_cannot_hold():
    """c is added in the result's type: a complex c on a real product would lose its imaginary
    part (NumPy warns; a Dask worker's warning is easily lost)."""
    A = da.ones((6, 8), dtype=np.float32, chunks=(3, 2))
    with pytest.raises(TypeError, match=r"c has dtype complex64.*float32"):
        pbd.gemm("N", "T", A, A, c=da.ones((6, 6), dtype=np.complex64, chunks=3), beta=1)
    with pytest.raises(TypeError, match=r"c has dtype float64.*int8"):
        pbd.gemm("N", "T", A.astype(np.int8), A.astype(np.int8), c=da.ones((6, 6), chunks=3), beta=1)


# ---------------------------------------------------------------------------------------------
# The graph: a plain task dict, not HighLevelGraph.from_collections (issue #32, item 1)
# ---------------------------------------------------------------------------------------------

def test_the_graph_is_built_without_highlevelgraph_from_collections(monkeypatch):
    """Dask discourages HighLevelGraph.from_collections for new code: the module merges the
    operands' graphs as plain dicts and hands its own dict to dask.array.Array (which wraps any
    dict itself: only calls made from pyblasgemm.dask are refused here). A K tree with batch
    dimensions, a gemm with c, and one task per block all build and compute as before."""
    import inspect
    import sys

    from dask.highlevelgraph import HighLevelGraph

    original = HighLevelGraph.from_collections.__func__

    def refusing(cls, *args, **kwargs):
        if sys._getframe(1).f_globals.get("__name__") == "pyblasgemm.dask":
            raise AssertionError("pyblasgemm.dask called HighLevelGraph.from_collections")
        return original(cls, *args, **kwargs)

    monkeypatch.setattr(HighLevelGraph, "from_collections", classmethod(refusing))
    rng = np.random.default_rng(30)
    x, y = _data(rng, (2, 9, 20), np.float32), _data(rng, (20, 7), np.float32)
    X, Y = da.from_array(x, chunks=(1, 5, (6, 3, 7, 4))), da.from_array(y, chunks=((6, 3, 7, 4), 4))
    for group in (1, 2, 4):                          # a tree of 4, a tree of 2, one chain
        got = pbd.matmul(X, Y, k_group=group).compute(scheduler="threads")
        np.testing.assert_allclose(got, x.astype(np.float64) @ y, rtol=1e-5, atol=1e-5)
    c = _data(rng, (9, 7), np.float32)
    got = pbd.gemm("N", "N", X[1], Y, c=da.from_array(c, chunks=3), alpha=2, beta=-1, k_group=3)
    np.testing.assert_allclose(got.compute(scheduler="threads"), 2 * (x[1].astype(np.float64) @ y) - c,
                               rtol=1e-5, atol=1e-5)
    assert "dask.highlevelgraph" not in inspect.getsource(pbd)        # nor imports it


# ---------------------------------------------------------------------------------------------
# The default grouping of K chunks (issue #32, item 2): one task per output block from
# MIN_TASKS blocks up, about MIN_TASKS partial tasks in all below
# ---------------------------------------------------------------------------------------------

def _task_counts(z):
    """(partial-product tasks, tree adds, roots) in z's graph as Dask's array optimization
    leaves it (culled, linear chains fused): what the scheduler gets."""
    graph = z.__dask_optimize__(z.__dask_graph__(), z.__dask_keys__())
    names = [k[0] if isinstance(k, tuple) else k for k in dict(graph)]
    return tuple(sum(n.startswith(p) for n in names)
                 for p in ("pyblasgemm-partial-", "pyblasgemm-sum-", "pyblasgemm-matmul-"))


def test_default_is_one_task_per_output_block_from_min_tasks_blocks_up():
    assert pbd.MIN_TASKS == 8
    assert pbd.k_group_for(4, 16) == 4 and pbd.k_group_for(50, 8) == 50 and pbd.k_group_for(1, 1) == 1
    rng = np.random.default_rng(31)
    x, y = _data(rng, (24, 40), np.float16), _data(rng, (40, 16), np.float16)
    # 4 x 2 = 8 output blocks, K in 5 chunks: 8 tasks, each chaining all 5 (no partials, no adds)
    X, Y = da.from_array(x, chunks=(6, (8, 8, 8, 8, 8))), da.from_array(y, chunks=(8, 8))
    z = pbd.matmul(X, Y)
    assert _task_counts(z) == (0, 0, 8)
    np.testing.assert_array_equal(z.compute(scheduler="threads").view(np.uint16),
                                  pbd.matmul(X, Y, k_group=5).compute(scheduler="sync").view(np.uint16))
    _check(z.compute(scheduler="threads"), x, y, np.float16, "one task a block")


@pytest.mark.parametrize("k_chunks,blocks,partials_per_block", [
    (32, 1, 8),             # a long K, one output block: 8 tasks of 4 K chunks, for 4-8 GPUs
    (16, 2, 4),             # 2 blocks: 4 tasks of 4 each
    (7, 4, 2),              # 4 blocks: 2 tasks (4 + 3 K chunks) each
    (9, 1, 5),              # 8 tasks would be 2 K chunks long at most: 5 tasks of at most 2
    (3, 1, 3),              # never less than one K chunk a task
])
def test_few_output_blocks_split_k_into_about_min_tasks(k_chunks, blocks, partials_per_block):
    """The split survives Dask's optimization (every partial task stays a task of its own, for
    any worker), and the sum is as accurate and as deterministic as one chain."""
    rng = np.random.default_rng(k_chunks)
    k = 3 * k_chunks
    x, y = _data(rng, (8, k), np.float16), _data(rng, (k, 4 * blocks), np.float16)
    X, Y = da.from_array(x, chunks=(8, 3)), da.from_array(y, chunks=(3, 4))
    z = pbd.matmul(X, Y)
    assert len(X.chunks[1]) == k_chunks and z.numblocks == (1, blocks)
    partials, adds, roots = _task_counts(z)
    assert (partials, roots) == (blocks * partials_per_block, blocks), (partials, roots)
    assert adds == blocks * max(partials_per_block - 2, 0)      # a pairwise tree, the root adds the last 2
    first, second = z.compute(scheduler="threads"), z.compute(scheduler="sync")
    np.testing.assert_array_equal(first.view(np.uint16), second.view(np.uint16))
    _check(first, x, y, np.float16, (k_chunks, blocks))


@pytest.mark.parametrize("k_group,error", [(0, ValueError), (-2, ValueError), (2.0, TypeError),
                                           (True, TypeError), ("4", TypeError)],
                         ids=lambda v: v.__name__ if isinstance(v, type) else repr(v))
def test_k_group_is_checked_before_any_graph(k_group, error):
    """A k_group that is no positive integer is named with its routine, in matmul, gemm and
    k_group_for alike (True was one K chunk a task, 2.0 a ValueError without the routine)."""
    X = da.ones((4, 6), chunks=2)
    for call, routine in ((lambda: pbd.matmul(X, X.T, k_group=k_group), "matmul"),
                          (lambda: pbd.gemm("N", "T", X, X, k_group=k_group), "gemm"),
                          (lambda: pbd.k_group_for(3, 4, k_group), "k_group_for")):
        with pytest.raises(error, match=rf"pyblasgemm\.dask\.{routine}: k_group={k_group!r}"):
            call()
    with pytest.raises(ValueError, match=r"k_group_for: output_blocks=0 must be at least 1"):
        pbd.k_group_for(3, 0)


def test_dask_guide_quotes_the_scaling_run():
    """docs/guide/dask.rst's scaling tables are bench/dask_scaling.py's guide_table of the committed
    4-GPU results (UCX, and the TCP run), and the claims the text makes hold in them."""
    import json
    import pathlib
    import sys

    root = pathlib.Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root))
    from bench.dask_scaling import guide_rows, guide_table

    text = (root / "docs/guide/dask.rst").read_text()
    ucx = root / "bench/results/dask_scaling_h200x4_2026-11-27_f15dd68.json"
    tcp = root / "bench/results/dask_scaling_h200x4_2026-11-27_bbf852d.json"
    assert guide_table(ucx, "ucx-nvlink") in text and guide_table(tcp, "tcp") in text
    doc = json.loads(ucx.read_text())
    assert doc["gpu_count"] == 4 and doc["git_sha"] == "f15dd68"
    assert all(b["all_runs_equal"] for b in doc["bitwise"].values())
    assert doc["bitwise"]["32768^3 float16"]["threaded_equal"] is True
    rows = {(r[0], r[1]): r for r in guide_rows(ucx) if r[2] == "ucx-nvlink"}
    flat = " ".join(text.split())
    two, four = (rows[("32768^3 float16", g)][4] for g in (2, 4))
    assert f"runs {two:.2f}x one call on 2 GPUs and {four:.2f}x on 4" in flat
    against = [f"{rows[('32768^3 float16', g)][8]:.2f}x" for g in (1, 2, 4)]
    assert f"{against[0]}, {against[1]} and {against[2]} faster" in flat


# ---------------------------------------------------------------------------------------------
# Placement on a distributed cluster (issue #32, item 4): each chain of products where most of
# its data is (C[i, j] with A's row panel i, a long K's partials with their K chunks), adds
# with their left input, each operand block fetched at most once by each worker
# ---------------------------------------------------------------------------------------------

def _identity(block):
    return block


def _fetched(dask_worker):
    """The keys this worker has received from other workers, one entry per transfer."""
    return [tuple(k) if isinstance(k, list) else k for e in dask_worker.transfer_incoming_log for k in e["keys"]]


def _on_workers(client, data, chunks, owner, prefix):
    """A Dask array of ``data`` in ``chunks`` whose block (i, j) is in the memory of worker
    ``owner(i, j)`` (an index into the sorted addresses), as a loader would have spread it."""
    import uuid

    import distributed

    workers = sorted(client.nthreads())
    name = f"{prefix}-{uuid.uuid4().hex}"
    edges = [np.cumsum((0,) + c) for c in chunks]
    futures = {}
    for i in range(len(chunks[0])):
        for j in range(len(chunks[1])):
            block = data[edges[0][i]:edges[0][i + 1], edges[1][j]:edges[1][j + 1]]
            futures[(name, i, j)] = client.submit(_identity, block, key=(name, i, j), workers=[workers[owner(i, j)]],
                                                  allow_other_workers=False, pure=False)
    arr = da.Array(futures, name, chunks, meta=data[:0, :0])
    distributed.wait(arr)
    return arr


def _panels_on_workers(client, seed):
    """(x, y, X, Y): a 64 x 48 and a 48 x 40 float32 operand in 4 x 4 chunks, A's row panel i
    and B's column panel j held by worker i and j of the cluster's 4."""
    rng = np.random.default_rng(seed)
    x, y = _data(rng, (64, 48), np.float32), _data(rng, (48, 40), np.float32)
    xc, yc = ((16,) * 4, (12,) * 4), ((12,) * 4, (10,) * 4)
    return (x, y, _on_workers(client, x, xc, lambda i, k: i, "a"),
            _on_workers(client, y, yc, lambda k, j: j, "b"))


def test_each_output_block_is_computed_where_its_row_panel_is_and_each_block_moves_once(local_cluster):
    """A's row panel i and B's column panel j on worker i and j of 4: C[i, j] runs on worker i,
    which fetches each of B's blocks it lacks exactly once (4 of its tasks read each) and none
    of A's; the bits are the threaded scheduler's."""
    from distributed import wait

    client = local_cluster
    workers = sorted(client.nthreads())
    x, y, X, Y = _panels_on_workers(client, 40)
    z = pbd.matmul(X, Y)
    assert type(z).__name__ == "PlacedArray" and isinstance(z, da.Array)
    before = client.run(_fetched)
    done = client.persist(z)
    wait(done)
    who = client.who_has(done)
    assert {key: tuple(w) for key, w in who.items()} == {(z.name, i, j): (workers[i],) for i in range(4) for j in range(4)}
    after = client.run(_fetched)
    for n, w in enumerate(workers):
        got = after[w][len(before[w]):]
        assert len(got) == len(set(got)), (w, got)                                  # once each
        assert set(got) == {(Y.name, k, j) for k in range(4) for j in range(4) if j != n}, (w, sorted(got))
    threaded = pbd.matmul(da.from_array(x, chunks=X.chunks), da.from_array(y, chunks=Y.chunks)).compute(scheduler="threads")
    np.testing.assert_array_equal(done.compute().view(np.uint8), threaded.view(np.uint8))


def test_a_long_k_is_computed_where_its_k_chunks_are_and_only_partial_sums_move(local_cluster):
    """One output block, K in 8 chunks, chunk k of A and of B on worker k // 2 of 4: the
    default's 8 partial products run where their data is (2 a worker), the fixed pairwise tree
    adds each pair where its left input is, so the only transfers are 3 partial sums; the bits
    are the threaded scheduler's."""
    from distributed import get_task_stream, wait

    client = local_cluster
    workers = sorted(client.nthreads())
    rng = np.random.default_rng(41)
    x, y = _data(rng, (16, 64), np.float16), _data(rng, (64, 12), np.float16)
    xc, yc = ((16,), (8,) * 8), ((8,) * 8, (12,))
    X = _on_workers(client, x, xc, lambda i, k: k // 2, "a")
    Y = _on_workers(client, y, yc, lambda k, j: k // 2, "b")
    z = pbd.matmul(X, Y)
    assert _task_counts(z) == (8, 6, 1)
    before = client.run(_fetched)
    with get_task_stream(client) as stream:
        done = client.persist(z)
        wait(done)
    ran = {t["key"]: t["worker"] for t in stream.data}
    partials = sorted(k for k in ran if k[0].startswith("pyblasgemm-partial-"))
    assert [ran[k] for k in partials] == [workers[g // 2] for g in range(8)]
    sums = {k: w for k, w in ran.items() if k[0].startswith("pyblasgemm-sum-")}
    assert sorted((k[1], k[-1], w) for k, w in sums.items()) == [
        (0, 0, workers[0]), (0, 1, workers[1]), (0, 2, workers[2]), (0, 3, workers[3]),
        (1, 0, workers[0]), (1, 1, workers[2])]
    assert ran[(z.name, 0, 0)] == workers[0]
    after = client.run(_fetched)
    moved = sorted(k for w in workers for k in after[w][len(before[w]):])
    assert len(moved) == 3 and all(k[0].startswith("pyblasgemm-sum-") for k in moved), moved
    threaded = pbd.matmul(da.from_array(x, chunks=X.chunks), da.from_array(y, chunks=Y.chunks)).compute(scheduler="threads")
    np.testing.assert_array_equal(done.compute().view(np.uint16), threaded.view(np.uint16))


def test_placement_shares_the_work_when_one_worker_holds_everything():
    """All blocks on one worker of 4: it keeps its fair share (the first 4 chains, priority 0:
    their data is local), the others take 4 each and wait for their data (priority -1); the
    adds of a tree follow their left input."""
    products = [(("c", i, j), 10, [(("x", i), 80, "x"), (("y", j), 80, "y")]) for i in range(4) for j in range(4)]
    where, priority = pbd._placement(products, [(("sum", 0), ("c", 0, 1)), (("sum", 1), ("c", 3, 3))],
                                     ["w0", "w1", "w2", "w3"], lambda key: {"w0"})
    counts = {w: sum(v == w for k, v in where.items() if k[0] == "c") for w in ("w0", "w1", "w2", "w3")}
    assert counts == {"w0": 4, "w1": 4, "w2": 4, "w3": 4}
    assert [where["c", 0, j] for j in range(4)] == ["w0"] * 4
    assert {k: p for k, p in priority.items() if p == 0} == {("c", 0, j): 0 for j in range(4)}
    assert where["sum", 0] == where["c", 0, 1] and where["sum", 1] == where["c", 3, 3]
    # a chain none of whose blocks is in memory is left to Dask; an uneven share differs by one task
    # x's blocks on w1, y's nowhere, 6 chains (a share of 1.5 each): w1 takes 2, the least
    # loaded of the others the rest in turn
    where, priority = pbd._placement(products[:6], [], ["w0", "w1", "w2", "w3"],
                                     lambda key: {"w1"} if key[0] == "x" else set())
    assert [where["c", i, j] for i, j in ((0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1))] == \
        ["w1", "w1", "w0", "w2", "w3", "w0"]
    assert set(priority.values()) == {-1}                      # y's blocks are nowhere yet
    # a chain none of whose blocks is in memory is left to Dask
    assert pbd._placement(products[:2], [], ["w0", "w1"], lambda key: set()) == ({}, {})


def test_placement_is_dasks_without_a_cluster_or_data_in_its_memory(local_cluster):
    """Operands not in cluster memory (a NumPy array's blocks, computed when the product is),
    or a placement of the caller's own (``dask.annotate(workers=...)``): a plain dask Array,
    whose tasks Dask places."""
    X = da.ones((8, 8), chunks=4)
    assert type(pbd.matmul(X, X)) is da.Array                                  # a client, no data
    persisted = local_cluster.persist(X)
    from distributed import wait

    wait(persisted)
    assert type(pbd.matmul(persisted, persisted)).__name__ == "PlacedArray"
    workers = sorted(local_cluster.nthreads())
    with dask.annotate(workers=workers[:1]):
        assert type(pbd.matmul(persisted, persisted)) is da.Array
    np.testing.assert_array_equal(local_cluster.compute(pbd.matmul(persisted, persisted)).result(), np.full((8, 8), 8.0))


def _as_void(block):
    """What a bfloat16 CuPy block is after Dask moved it between workers: the same bytes, '|V2'."""
    return block.view("V2")


def test_bfloat16_blocks_that_arrive_as_void_are_read_as_bfloat16():
    """Dask's CuPy serializer sends a block's ``typestr``, '<V2' for ml_dtypes' bfloat16: a
    4-GPU run's bfloat16 products failed on blocks that had crossed between workers. The tasks
    read a void block of the operand's width as the graph's type: the same bits as from
    bfloat16 blocks, for matmul and for gemm's c."""
    bf16 = np.dtype(ml_dtypes.bfloat16)
    rng = np.random.default_rng(42)
    x, y, c = _data(rng, (24, 40), bf16.type), _data(rng, (40, 18), bf16.type), _data(rng, (24, 18), bf16.type)
    X, Y, C = (da.from_array(v, chunks=ch) for v, ch in ((x, (12, 10)), (y, (10, 9)), (c, (12, 9))))

    def void(a):
        return a.map_blocks(_as_void, dtype=bf16, meta=np.empty((0, 0), bf16))

    assert void(X).compute(scheduler="sync").dtype.kind == "V"              # the blocks are void indeed
    for group in (1, None):
        want = pbd.matmul(X, Y, k_group=group).compute(scheduler="threads")
        got = pbd.matmul(void(X), void(Y), k_group=group).compute(scheduler="threads")
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
        want = pbd.gemm("N", "N", X, Y, c=C, beta=-1, dtype=bf16, k_group=group).compute(scheduler="threads")
        got = pbd.gemm("N", "N", void(X), void(Y), c=void(C), beta=-1, dtype=bf16, k_group=group)
        np.testing.assert_array_equal(got.compute(scheduler="threads").view(np.uint16), want.view(np.uint16))


def test_the_scaling_benchmarks_operand_layout():
    """Operands with a panel a worker are spread by panels (A by rows, B by columns), others by
    K chunks in contiguous ranges, so that a long K's groups of chunks each sit on one worker."""
    from bench.dask_scaling import CASES, operand_layout

    def layout(case, workers):
        m, n, k, _, chunk, _ = CASES[case]
        own_x, own_y, what = operand_layout(m, n, k, chunk, workers)
        x = [[own_x(i, kk) for kk in range(k // chunk)] for i in range(m // chunk)]
        y = [[own_y(kk, j) for j in range(n // chunk)] for kk in range(k // chunk)]
        return x, y, what

    x, y, what = layout("32768^3 float16", 4)
    assert what == "A by row panels, B by column panels"
    assert x == [[i] * 4 for i in range(4)] and y == [[0, 1, 2, 3]] * 4
    x, y, what = layout("65536x65536x8192 float16", 4)
    assert [r[0] for r in x] == [0, 0, 1, 1, 2, 2, 3, 3] and y == [[0, 0, 1, 1, 2, 2, 3, 3]]
    x, y, what = layout("8192x8192x262144 float16", 4)
    assert what == "A by K chunks, B by K chunks"
    assert x == [[k // 8 for k in range(32)]] and y == [[k // 8] for k in range(32)]
    assert layout("8192x8192x262144 float16", 1)[0] == [[0] * 32]


def test_the_scaling_benchmark_runs_end_to_end_on_the_host(tmp_path):
    """bench/dask_scaling.py --smoke: the GPU run's code paths with NumPy chunks on a 1- and a
    2-worker LocalCluster (a transport's own process, the probe, fresh operands each run, the
    placement, transfer logs, digests, the threaded scheduler's bits), and the JSON it writes
    (dask.array.matmul left out for time: the same timing code with another product)."""
    import json
    import os
    import pathlib
    import subprocess
    import sys

    root = pathlib.Path(__file__).resolve().parents[1]
    out = tmp_path / "smoke.json"
    cases = ["smoke 128^3 bfloat16", "smoke 32x32x512 float16"]
    done = subprocess.run([sys.executable, str(root / "bench/dask_scaling.py"), "--smoke", "--cases", ",".join(cases),
                           "--no-dask-array", "--out", str(out)], cwd=root, capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, PYTHONPATH=str(root)))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["schema"] == "pyblasgemm-dask-scaling/2" and doc["smoke"] and doc["failures"] == []
    probe = doc["transports"]["tcp"]["probes"]["2"]
    assert probe["one_block"]["GBps_wall"] > 0 and probe["all_to_all"]["bytes"] == 2 * 2**20
    rows = {(r["case"], r["gpus"]): r for r in doc["cases"]}
    assert set(rows) == {(c, g) for c in cases for g in (1, 2)}
    for key, row in rows.items():
        ours = row["pyblasgemm.dask.matmul"]
        assert ours["placed"] and ours["repeated_receipts"] == 0 and ours["bitwise_all_runs"], key
        assert 0 < ours["error_sampled"] < 1e-3 and ours["efficiency"] > 0 and ours["tasks"] > 0, key
    # 4 x 4 blocks on 2 workers, A by rows, B by columns: each worker fetches the 8 of B's
    # 32 x 32 bfloat16 blocks it lacks, once
    square = rows["smoke 128^3 bfloat16", 2]["pyblasgemm.dask.matmul"]
    assert square["received_bytes_per_run"] == 16 * 32 * 32 * 2
    assert sorted(square["output_blocks_by_worker"].values()) == [8, 8]
    # the long K spread by K chunks: only one float32 partial sum moves
    long_k = rows["smoke 32x32x512 float16", 2]
    assert long_k["layout"] == "A by K chunks, B by K chunks"
    assert long_k["pyblasgemm.dask.matmul"]["received_bytes_per_run"] == 32 * 32 * 4
    assert doc["bitwise"] == {c: {"runs": ["1 GPU tcp start", "2 GPU tcp start"], "all_runs_equal": True,
                                  "threaded_equal": True}
                              for c in cases}


# ---------------------------------------------------------------------------------------------
# The CUDA IPC transport (issue #32): export tasks where a block crosses workers, one fetch a
# group and worker, no consumer depending on a remote block's key; on the host (NumPy chunks)
# the exports fall back to Dask's transfer
# ---------------------------------------------------------------------------------------------

def _annotated(z, what="workers"):
    """Each task's annotation ``what`` in z's graph (the placement's ``workers``: one address)."""
    out = {}
    for layer in z.__dask_graph__().layers.values():
        fn = (layer.annotations or {}).get(what)
        if fn is None:
            continue
        for key in layer:
            value = fn(key) if callable(fn) else fn
            if value is not None:
                out[key] = value[0] if what == "workers" else value
    return out


def _kind(key):
    name = key[0] if isinstance(key, tuple) else key
    for kind in ("export", "fetch", "partial", "sum", "matmul", "run"):
        if name.startswith(f"pyblasgemm-ipc-{kind}-") or name.startswith(f"pyblasgemm-{kind}-"):
            return kind
    return "operand"


def _nested_fetches(task):
    """The fetches folded into a task: the inline :func:`pyblasgemm._dask_ipc.fetch` nodes (a
    run task's: :func:`pyblasgemm.dask._fetch_later`) among its arguments, at any depth."""
    from dask.task_spec import Task

    from pyblasgemm import _dask_ipc

    found, work = [], list(task.args) + list(task.kwargs.values())
    while work:
        node = work.pop()
        if isinstance(node, Task):
            if node.func in (_dask_ipc.fetch, pbd._fetch_later):
                found.append(node)
            work.extend(node.args)
            work.extend(node.kwargs.values())
    return found


def _exported_blocks(export):
    """The keys of the blocks an export task exports, in its order (an export of blocks in
    memory has the engine's ticket and slot first: pyblasgemm.dask.START)."""
    from dask.task_spec import TaskRef

    return [a.key for a in export.args if isinstance(a, TaskRef)]


def _fetch_blocks(graph, fetch):
    """(export key, slot, the blocks it copies) of a fetch, a task of its own or folded."""
    export, slot = fetch.args[0].key, fetch.args[1]
    blocks = _exported_blocks(graph[export])
    indices = fetch.args[2] if len(fetch.args) > 2 else range(len(blocks))
    return export, slot, [blocks[i] for i in indices]


def _ipc_counts(z):
    """(products and sums, export tasks, fetch tasks, fetches folded into other tasks) of z's graph."""
    graph = dict(z.__dask_graph__())
    kinds = [_kind(k) for k in graph]
    folded = sum(len(_nested_fetches(t)) for k, t in graph.items() if _kind(k) not in ("operand", "fetch"))
    return (sum(k in ("partial", "sum", "matmul") for k in kinds), kinds.count("export"), kinds.count("fetch"), folded)


def _check_ipc_graph(z, holder):
    """The IPC graph's rules, given ``holder(key)``: the worker that holds an operand block.
    Returns {worker: [blocks it fetches]}."""
    graph = dict(z.__dask_graph__())
    where = _annotated(z)
    priority = _annotated(z, "priority")
    fetched, slots = {}, {}
    for key, task in graph.items():
        kind = _kind(key)
        if kind == "operand":
            continue
        w = where[key]
        deps = task.dependencies
        if kind == "export":
            assert priority[key] == 2, key
            assert all((holder(d) if _kind(d) == "operand" else where[d]) == w for d in deps), (key, w, deps)
            continue
        fetches = [task] if kind == "fetch" else _nested_fetches(task)
        if kind == "fetch":
            (export,) = deps
            assert _kind(export) == "export" and priority[key] == 1, (key, export)
        for f in fetches:
            export, slot, blocks = _fetch_blocks(graph, f)
            assert where[export] != w, (key, export)
            fetched.setdefault(w, []).extend(blocks)
            slots.setdefault(export, []).append(slot)
        if kind == "fetch":
            continue
        for d in deps:                      # a product or a sum: nothing of another worker's
            if _kind(d) == "operand":
                assert holder(d) == w, (key, d)
            elif _kind(d) == "export":      # read through a fetch folded into this task
                assert any(f.args[0].key == d for f in fetches), (key, d)
            else:                           # a fetch, or a partial sum computed here
                assert where[d] == w, (key, d)
    for w, blocks in fetched.items():
        assert len(blocks) == len(set(blocks)), (w, blocks)              # once per worker
    # each export knows its readers, and each of them records its own CUDA IPC done event
    for key, task in graph.items():
        if _kind(key) == "export":
            assert sorted(slots.get(key, [])) == list(range(task.kwargs["readers"])), (key, slots.get(key), task.kwargs)
    return fetched


@pytest.mark.parametrize("routine", ["matmul", "gemm"])
@pytest.mark.parametrize("transport", ["nvlink", "IPC", None, 1, ""])
def test_transport_is_checked_before_any_work(routine, transport):
    X = da.ones((3, 4), chunks=2)
    bad = da.ones((5, 6), chunks=2)         # the shapes' error would come later
    call = (lambda: pbd.matmul(X, bad, transport=transport)) if routine == "matmul" else \
        (lambda: pbd.gemm("N", "N", X, bad, transport=transport))
    with pytest.raises(ValueError, match=rf"pyblasgemm\.dask\.{routine}: transport={transport!r} must be one of "
                                         r"'auto', 'ipc', 'dask'"):
        call()


def test_without_a_cluster_every_transport_is_the_same_plain_graph():
    rng = np.random.default_rng(60)
    x, y = _data(rng, (20, 30), np.float16), _data(rng, (30, 10), np.float16)
    X, Y = da.from_array(x, chunks=(10, 6)), da.from_array(y, chunks=(6, 5))
    got = {}
    for t in pbd.TRANSPORTS:
        z = pbd.matmul(X, Y, transport=t)
        assert type(z) is da.Array and pbd.transport_of(z) == "dask"
        got[t] = z.compute(scheduler="sync").view(np.uint16)
    for t in pbd.TRANSPORTS:
        np.testing.assert_array_equal(got[t], got["auto"])


def test_the_ipc_graph_fetches_each_block_once_per_worker_and_falls_back_to_dasks_transfer(local_cluster,
                                                                                          monkeypatch):
    """The per-block schedule (pyblasgemm.dask.RUNS = False). A's row panels and B's column panels on worker i and j of 4, transport='ipc': one export
    per B column panel on its worker, shared by the 3 workers that need it, one fetch a worker
    and panel, folded into the one task there that reads it, no product depending on a block
    another worker holds. NumPy blocks cannot go
    through CUDA IPC: each export hands its blocks to Dask (counted in ipc_stats with the
    reason), each worker receives each export's blocks once, and the bits are the threaded
    scheduler's. 'auto' on NumPy chunks is Dask's own graph."""
    from distributed import wait

    monkeypatch.setattr(pbd, "RUNS", False)
    client = local_cluster
    workers = sorted(client.nthreads())
    x, y, X, Y = _panels_on_workers(client, 61)
    assert pbd.transport_of(pbd.matmul(X, Y)) == "dask" == pbd.transport_of(pbd.matmul(X, Y, transport="dask"))
    z = pbd.matmul(X, Y, transport="ipc")
    assert type(z).__name__ == "PlacedArray" and pbd.transport_of(z) == "ipc"

    def holder(key):
        return workers[key[1] if key[0] == X.name else key[2]]

    fetched = _check_ipc_graph(z, holder)
    # one export a B column panel; each worker's one task that reads a panel fetches it itself
    assert _ipc_counts(z) == (16, 4, 0, 12)
    for n, w in enumerate(workers):
        assert sorted(fetched[w]) == sorted((Y.name, k, j) for k in range(4) for j in range(4) if j != n)
    client.run(pbd.ipc_stats, True)
    before = client.run(_fetched)
    done = client.persist(z)
    wait(done)
    after = client.run(_fetched)
    for n, w in enumerate(workers):
        got = after[w][len(before[w]):]
        assert len(got) == 3 and len(set(got)) == 3 and all(k[0].startswith("pyblasgemm-ipc-export-") for k in got), got
    stats = client.run(pbd.ipc_stats)
    assert all(s["ipc_blocks"] == 0 and s["fallback_blocks"] == 4 and s["open_now"] == 0 for s in stats.values())
    assert all(s["fallback_reasons"] == {"export: not a CuPy array (numpy.ndarray)": 4} for s in stats.values())
    threaded = pbd.matmul(da.from_array(x, chunks=X.chunks), da.from_array(y, chunks=Y.chunks)).compute(scheduler="threads")
    np.testing.assert_array_equal(done.compute().view(np.uint8), threaded.view(np.uint8))


def test_the_ipc_graph_of_a_long_k_moves_partial_sums_through_exports(local_cluster):
    """One output block, K in 8 chunks on 4 workers: the partial products stay where their K
    chunks are; each add whose right input another worker computes reads it through an export
    there; the bits are the threaded scheduler's (and gemm with c, alpha and beta too)."""
    client = local_cluster
    workers = sorted(client.nthreads())
    rng = np.random.default_rng(62)
    x, y, c = _data(rng, (16, 64), np.float16), _data(rng, (64, 12), np.float16), _data(rng, (16, 12), np.float16)
    xc, yc = ((16,), (8,) * 8), ((8,) * 8, (12,))
    X = _on_workers(client, x, xc, lambda i, k: k // 2, "a")
    Y = _on_workers(client, y, yc, lambda k, j: k // 2, "b")
    C = _on_workers(client, c, ((16,), (12,)), lambda i, j: 3, "c")

    def holder(key):
        return workers[3] if key[0] == C.name else workers[key[2 if key[0] == X.name else 1] // 2]

    z = pbd.matmul(X, Y, transport="ipc")
    _check_ipc_graph(z, holder)
    assert _ipc_counts(z) == (8 + 6 + 1, 3, 0, 3)       # the 3 adds across workers, each fetching its input
    threaded = pbd.matmul(da.from_array(x, chunks=X.chunks), da.from_array(y, chunks=Y.chunks)).compute(scheduler="threads")
    np.testing.assert_array_equal(client.compute(z).result().view(np.uint16), threaded.view(np.uint16))
    g = pbd.gemm("N", "N", X, Y, c=C, alpha=0.5, beta=-2, transport="ipc")
    _check_ipc_graph(g, holder)
    want = pbd.gemm("N", "N", da.from_array(x, chunks=xc), da.from_array(y, chunks=yc),
                    c=da.from_array(c, chunks=(16, 12)), alpha=0.5, beta=-2).compute(scheduler="threads")
    np.testing.assert_array_equal(client.compute(g).result().view(np.uint16), want.view(np.uint16))


def test_ipc_rewrite_leaves_local_blocks_and_other_hosts_to_dask():
    """A block the task's worker holds (one of two replicas) is read there; one on another
    host is Dask's to move; the blocks a worker reads from another (in memory) are one export
    there and one fetch task here when two tasks read them, which each picks its blocks from."""
    from dask.task_spec import Task, TaskRef

    on = {("x", 0): {"w0", "w1"}, ("y", 0): {"w1"}, ("y", 1): {"w1"}, ("z", 0): {"w2"}}
    dsk = {("c", 0): Task(("c", 0), max, TaskRef(("x", 0)), TaskRef(("y", 0)), TaskRef(("z", 0))),
           ("c", 1): Task(("c", 1), max, TaskRef(("y", 0)), TaskRef(("y", 1)))}
    where, priority = {("c", 0): "w0", ("c", 1): "w0"}, {("c", 0): 0, ("c", 1): 0}
    pbd._ipc_rewrite(dsk, where, priority, lambda k: on.get(k, set()), {"w0": "h0", "w1": "h0", "w2": "h1"}, "t")
    exports = [k for k in dsk if _kind(k) == "export"]
    fetches = [k for k in dsk if _kind(k) == "fetch"]
    assert len(exports) == 1 and len(fetches) == 1 and where[exports[0]] == "w1" and where[fetches[0]] == "w0"
    assert _exported_blocks(dsk[exports[0]]) == [("y", 0), ("y", 1)] and dsk[exports[0]].kwargs == {"readers": 1}
    assert dsk[fetches[0]].args[1:] == (0,)                     # slot 0, all of the export's blocks
    assert {_kind(d) if _kind(d) != "operand" else d for d in dsk["c", 0].dependencies} == {("x", 0), ("z", 0), "fetch"}
    assert dsk["c", 1].dependencies == {fetches[0]}
    from dask.local import get_sync

    data = {("x", 0): 3, ("y", 0): 5, ("y", 1): 7, ("z", 0): 4}
    assert get_sync({**data, **dsk}, [("c", 0), ("c", 1)]) == (5, 7)      # max(3, 5, 4), max(5, 7)


def test_ipc_rewrite_folds_a_fetch_only_into_a_task_that_reads_its_blocks_once():
    """One task alone reads a remote block on its worker: folded into it (an inline fetch),
    unless the task refers to the block twice, where an inline fetch would run twice (each
    recording the same CUDA IPC done event): a fetch task then."""
    from dask.local import get_sync
    from dask.task_spec import Task, TaskRef

    on = {("y", 0): {"w1"}, ("y", 1): {"w1"}}
    dsk = {("c", 0): Task(("c", 0), max, TaskRef(("y", 0)), 1),
           ("c", 1): Task(("c", 1), max, TaskRef(("y", 1)), TaskRef(("y", 1)))}
    where, priority = {("c", 0): "w0", ("c", 1): "w2"}, {("c", 0): -1, ("c", 1): -1}
    pbd._ipc_rewrite(dsk, where, priority, lambda k: on.get(k, set()), dict.fromkeys(("w0", "w1", "w2"), "h"), "t")
    fetches = [k for k in dsk if _kind(k) == "fetch"]
    assert [where[k] for k in fetches] == ["w2"] and dsk["c", 1].dependencies == set(fetches)
    assert len(_nested_fetches(dsk["c", 0])) == 1 and {_kind(d) for d in dsk["c", 0].dependencies} == {"export"}
    (export,) = [k for k in dsk if _kind(k) == "export"]
    assert dsk[export].kwargs == {"readers": 2}
    assert sorted(_fetch_blocks(dsk, f)[1] for f in [dsk[fetches[0]]] + _nested_fetches(dsk["c", 0])) == [0, 1]
    assert get_sync({("y", 0): 3, ("y", 1): 5, **dsk}, [("c", 0), ("c", 1)]) == (3, 5)


def _as_if_on(monkeypatch, n, x_owner, y_owner):
    """pyblasgemm.dask placing products as on a cluster of ``n`` workers of one host whose
    memory holds x's block (i, k) on worker ``x_owner(i, k)`` and y's (k, j) on ``y_owner(k, j)``
    (the scheduler's who_has, without a cluster): the placed graph, IPC tasks included, is
    built as it is for the GPUs."""
    workers = [f"tcp://10.0.0.1:{4000 + w}" for w in range(n)]

    def holders_for(operands, dsk):
        x, y = operands[:2]

        def holders(key):
            if not isinstance(key, tuple) or len(key) != 3:
                return frozenset()
            if key[0] == x.name:
                return frozenset({workers[x_owner(key[1], key[2])]})
            if key[0] == y.name:
                return frozenset({workers[y_owner(key[1], key[2])]})
            return frozenset()

        return workers, holders, dict.fromkeys(workers, "10.0.0.1")

    monkeypatch.setattr(pbd, "_cluster_holders", holders_for)
    return workers


def _bench_graph_on(monkeypatch, n, seed):
    """The benchmark's product in miniature (32^2 float16 in 8^2 chunks, 4 x 4 x 4 blocks), A's
    row panels and B's column panels as if on n workers: (X, Y, the plain graph's result on the
    synchronous scheduler, the workers, the placed product over IPC)."""
    rng = np.random.default_rng(seed)
    x, y = _data(rng, (32, 32), np.float16), _data(rng, (32, 32), np.float16)
    X, Y = da.from_array(x, chunks=8), da.from_array(y, chunks=8)
    plain = pbd.matmul(X, Y).compute(scheduler="sync")
    workers = _as_if_on(monkeypatch, n, lambda i, k: i * n // 4, lambda k, j: j * n // 4)
    return X, Y, plain, workers, pbd.matmul(X, Y, transport="ipc")


@pytest.mark.parametrize("n, counts", [(1, (16, 0, 0, 0)), (2, (16, 2, 2, 0)), (4, (16, 4, 0, 12))])
def test_the_gpu_benchmarks_graph_has_one_task_per_block_and_few_ipc_tasks(monkeypatch, n, counts):
    """The per-block schedule (pyblasgemm.dask.RUNS = False), as before 2026-11-28: bench/dask_scaling.py's 32768^3 float16 in 8192^2 chunks (4 x 4 x 4 blocks; here 8^2 NumPy
    blocks), A's row panels and B's column panels spread over n workers in contiguous ranges:
    one task per output block, C[i, j] where A's row panel is; on 2 workers one export a worker
    (the 8 blocks of B the other reads) and one fetch task a worker (4 products read each block
    there); on 4, one export a B column panel and its fetches folded into the one product that
    reads it on each worker: 20 tasks on 2 and on 4 workers, where there were 24 and 32. Each
    worker copies each block it lacks once. The placed graph computes, on the synchronous
    scheduler, bitwise what the plain graph does."""
    monkeypatch.setattr(pbd, "RUNS", False)
    X, Y, plain, workers, z = _bench_graph_on(monkeypatch, n, seed=70)
    assert type(z).__name__ == "PlacedArray" and _ipc_counts(z) == counts
    assert pbd.transport_of(z) == ("ipc" if n > 1 else "dask")
    where = _annotated(z)
    assert {k: where[k] for k in where if _kind(k) == "matmul"} == {
        (z.name, i, j): workers[i * n // 4] for i in range(4) for j in range(4)}
    fetched = _check_ipc_graph(z, lambda k: workers[k[1] * n // 4 if k[0] == X.name else k[2] * n // 4])
    for w, blocks in fetched.items():
        mine = workers.index(w)
        assert sorted(blocks) == sorted((Y.name, k, j) for k in range(4) for j in range(4) if j * n // 4 != mine)
    assert len(dict(z.__dask_graph__())) - 32 == sum(counts[:3])
    got = z.compute(scheduler="sync")
    np.testing.assert_array_equal(got.view(np.uint16), plain.view(np.uint16))
    # nothing to cull: Dask gets the graph itself, placement annotations and all
    graph = z.__dask_graph__()
    assert z.__dask_optimize__(graph, z.__dask_keys__()) is graph


def _run_counts(z):
    """(run tasks, output blocks picked from a run, export tasks, fetch tasks, fetches folded) of z's graph
    (a run of one output block is that block's own task)."""
    from pyblasgemm.dask import _pick, _run_task

    graph = dict(z.__dask_graph__())
    kinds = [_kind(k) for k in graph]
    runs = [t for t in graph.values() if getattr(t, "func", None) is _run_task]
    picks = sum(_kind(k) == "matmul" and graph[k].func is _pick for k in graph)
    folded = sum(len(_nested_fetches(t)) for t in runs)
    return len(runs), picks, kinds.count("export"), kinds.count("fetch"), folded


@pytest.mark.parametrize("n, counts", [(1, (1, 16, 0, 0, 0)), (2, (4, 16, 2, 0, 2)), (4, (16, 0, 4, 0, 12))])
def test_the_gpu_benchmarks_graph_in_runs_has_a_run_a_worker_and_source(monkeypatch, n, counts):
    """The default schedule (pyblasgemm.dask.RUNS): bench/dask_scaling.py's 32768^3 float16 in
    8192^2 chunks (4 x 4 x 4 blocks; here 8^2), A's row panels and B's column panels over n
    workers of one host. A worker's products that read the same other workers' blocks are one
    run task (its own blocks first): on 1 worker one run of all 16, on 2 a run of the 4 local
    products and a run of the 4 that read the other's blocks, whose fetch folds into it, on 4
    one run a product (each reads one other worker's column panel), which is then the output
    block's own task; each other output block is a pick of its run, placed with it. The run's
    placement and priority (local first), one export
    a worker whose blocks others read, each block copied once per worker; on the synchronous
    scheduler the bits of the plain graph."""
    X, Y, plain, workers, z = _bench_graph_on(monkeypatch, n, seed=72)
    assert pbd.RUNS and type(z).__name__ == "PlacedArray" and _run_counts(z) == counts
    graph, where, priority = dict(z.__dask_graph__()), _annotated(z), _annotated(z, "priority")
    runs = [k for k, t in graph.items() if getattr(t, "func", None) is pbd._run_task]
    for i in range(4):
        for j in range(4):
            pick = graph[z.name, i, j]
            (run,) = pick.dependencies if pick.func is pbd._pick else [(z.name, i, j)]
            assert run in runs and where[z.name, i, j] == where[run] == workers[i * n // 4], (i, j)
    for key in runs:
        local = all(_kind(d) == "operand" and where[key] == workers[(d[1] if d[0] == X.name else d[2]) * n // 4]
                    for d in graph[key].dependencies)
        assert priority[key] == (0 if local else -1), key
    _check_ipc_graph_runs = {w: [] for w in workers}
    for key in runs:
        for f in _nested_fetches(graph[key]):
            exported = _exported_blocks(graph[f.args[0].key])
            _check_ipc_graph_runs[where[key]] += [exported[i] for i in
                                                  (f.args[2] if len(f.args) > 2 else range(len(exported)))]
    for w, blocks in _check_ipc_graph_runs.items():
        mine = workers.index(w)
        assert sorted(blocks) == sorted((Y.name, k, j) for k in range(4) for j in range(4) if j * n // 4 != mine), w
    got = z.compute(scheduler="sync")
    np.testing.assert_array_equal(got.view(np.uint16), plain.view(np.uint16))
    graph = z.__dask_graph__()
    assert z.__dask_optimize__(graph, z.__dask_keys__()) is graph


def test_runs_on_a_cluster_give_the_threaded_bits_and_move_each_block_once(local_cluster):
    """The run schedule on a distributed.LocalCluster of 4 workers (A's row panel i and B's
    column panel j on worker i and j), transport 'ipc' (NumPy blocks: each export hands its
    blocks to Dask) and 'dask', and gemm with c, alpha and beta: each output block lands on
    its row panel's worker, each worker receives each export once, and the bits are the
    threaded scheduler's."""
    from distributed import wait

    client = local_cluster
    workers = sorted(client.nthreads())
    for transport, seed in (("ipc", 73), ("dask", 75)):      # fresh operands: the product's keys are new
        x, y, X, Y = _panels_on_workers(client, seed)
        threaded = pbd.matmul(da.from_array(x, chunks=X.chunks),
                              da.from_array(y, chunks=Y.chunks)).compute(scheduler="threads")
        z = pbd.matmul(X, Y, transport=transport)
        assert _run_counts(z)[0] == 16, transport
        done = client.persist(z)
        wait(done)
        assert {k: tuple(w) for k, w in client.who_has(done).items()} == {
            (z.name, i, j): (workers[i],) for i in range(4) for j in range(4)}
        np.testing.assert_array_equal(done.compute().view(np.uint8), threaded.view(np.uint8), transport)
    c = _data(np.random.default_rng(74), (64, 40), np.float16)
    C = da.from_array(c, chunks=(16, 10))
    ref = pbd.gemm("N", "N", da.from_array(x, chunks=X.chunks), da.from_array(y, chunks=Y.chunks), c=C, alpha=0.5,
                   beta=2).compute(scheduler="threads")
    got = client.compute(pbd.gemm("N", "N", X, Y, c=C, alpha=0.5, beta=2)).result()
    np.testing.assert_array_equal(got.view(np.uint8), ref.view(np.uint8))


def _engine_counts(client):
    """The engines' counts summed over the workers (pyblasgemm.dask.engine_stats, reset)."""
    got = client.run(pbd.engine_stats, True).values()
    return {k: sum(v[k] for v in got) for k in ("started", "taken", "computed_in_task", "skipped", "dropped",
                                                 "failed", "held")}


def _released(client, z, timeout=10.0):
    """Wait until the cluster holds none of z's blocks (Dask forgets released keys a little
    after the client lets go of them)."""
    import time

    keys = {k for row in z.__dask_keys__() for k in row}
    deadline = time.monotonic() + timeout
    while keys & set(client.who_has()) and time.monotonic() < deadline:
        time.sleep(0.02)


def test_persist_starts_each_workers_own_runs_and_exports_through_its_engine(local_cluster):
    """pyblasgemm.dask.START: ``z.persist()`` hands each worker's engine (a Dask actor there)
    its exports and its runs of its own blocks before the graph reaches the scheduler, and the
    tasks take them: on 4 workers with A's row panel i and B's column panel j on worker i and j
    (transport 'ipc', NumPy blocks), 4 exports, 4 local runs and the 12 runs that read other
    workers' blocks (their engines ask the holders' engines for the exports, worker to worker)
    started and taken (or, where a task reached its worker first, computed by it); work started for keys the cluster already holds is dropped once
    newer work came; another scheduler starts nothing. Every path gives the threaded
    scheduler's bits (``client.persist(z)``: the next test)."""
    from distributed import wait

    client = local_cluster
    assert pbd.START
    x, y, X, Y = _panels_on_workers(client, 76)
    threaded = _threaded_here(x, y, X.chunks, Y.chunks, k_group=None)
    z = pbd.matmul(X, Y, transport="ipc")
    assert _run_counts(z)[0] == 16
    _engine_counts(client)
    done = z.persist()
    wait(done)
    np.testing.assert_array_equal(done.compute().view(np.uint8), threaded.view(np.uint8))
    counts = _engine_counts(client)      # a task that reaches its worker before the engine's call computes its slot
    assert counts["started"] == counts["taken"] and counts["taken"] + counts["computed_in_task"] == 20, counts
    assert counts["taken"] >= 1 and (counts["held"], counts["failed"], counts["dropped"]) == (0, 0, 0), counts
    # while the cluster holds z's keys, Dask reads them and no task runs: the started work is
    # held, then dropped once KEEP_TICKETS newer products were started
    np.testing.assert_array_equal(z.compute().view(np.uint8), threaded.view(np.uint8))
    counts = _engine_counts(client)
    assert (counts["taken"], counts["computed_in_task"]) == (0, 0) and counts["held"] == counts["started"], counts
    del done
    for _ in range(pbd.KEEP_TICKETS):
        _released(client, z)
        np.testing.assert_array_equal(z.compute().view(np.uint8), threaded.view(np.uint8))
    counts = _engine_counts(client)
    assert counts["taken"] + counts["computed_in_task"] == 20 * pbd.KEEP_TICKETS and counts["held"] == 0, counts
    assert counts["taken"] >= 1 and counts["dropped"] == 20, counts
    assert pbd._started_graph(z, {"scheduler": "threads"}) is z


@pytest.mark.parametrize("persist", ["client.persist", "dask.persist"])
def test_client_persist_starts_the_work_once_per_product(local_cluster, persist):
    """``client.persist(z)`` and ``dask.persist(z)`` (Dask's own calls, not z.persist()): the
    graph carries the product's name as the ticket of the work its engines can start, and
    ``__dask_postpersist__``'s rebuild, which Dask calls once the graph is queued, hands that
    work out: the 4 exports and the 16 runs started and taken (or computed by a task that came
    first). A second persist of the same product once the first is released starts nothing
    (its tasks compute everything); ``z.persist()`` starts its own under a fresh ticket, and its
    rebuild starts nothing more. The threaded scheduler's bits every time."""
    from distributed import wait

    client = local_cluster
    again = {"client.persist": client.persist, "dask.persist": lambda z: dask.persist(z)[0]}[persist]
    x, y, X, Y = _panels_on_workers(client, 77)
    threaded = _threaded_here(x, y, X.chunks, Y.chunks, k_group=None)
    z = pbd.matmul(X, Y, transport="ipc")
    _engine_counts(client)
    done = again(z)
    wait(done)
    np.testing.assert_array_equal(done.compute().view(np.uint8), threaded.view(np.uint8))
    counts = _engine_counts(client)
    assert counts["started"] == counts["taken"] and counts["taken"] + counts["computed_in_task"] == 20, counts
    assert counts["taken"] >= 1 and (counts["held"], counts["failed"], counts["dropped"]) == (0, 0, 0), counts
    del done
    _released(client, z)
    done = again(z)                      # the same product again: its tasks compute everything
    wait(done)
    np.testing.assert_array_equal(done.compute().view(np.uint8), threaded.view(np.uint8))
    counts = _engine_counts(client)
    assert (counts["started"], counts["taken"], counts["computed_in_task"]) == (0, 0, 20), counts
    del done
    _released(client, z)
    done = z.persist()                   # a fresh ticket, started once (not again by its rebuild)
    wait(done)
    np.testing.assert_array_equal(done.compute().view(np.uint8), threaded.view(np.uint8))
    counts = _engine_counts(client)
    assert counts["started"] == counts["taken"] and counts["taken"] + counts["computed_in_task"] == 20, counts
    assert (counts["held"], counts["skipped"]) == (0, 0), counts


def test_started_work_is_taken_once_dropped_when_old_and_skipped_once_taken():
    """The engine's store in a worker process: a task takes its slot's started value once (a
    second task of the same slot computes its own), work no task took is dropped once
    KEEP_TICKETS newer persists came, and an engine that arrives after its task skips."""
    a = np.ones((2, 2), np.float32)
    args = ([([(0, 0)], [(0, 0)], None)], (a.dtype, a.dtype), a.dtype, None, None, a.dtype, 1, 0, None)
    pbd.engine_stats(True)
    assert pbd._start_work("s1", [("run", 0, ["a"], args)], {"a": a}) == 1
    assert pbd._take("s1", 0)[0].tolist() == [[2.0, 2.0], [2.0, 2.0]] and pbd._take("s1", 0) is None
    assert pbd._take("s2", 0) is None                                   # the task first: the engine skips
    assert pbd._start_work("s2", [("run", 0, ["a"], args)], {"a": a}) == 0
    for n in range(pbd.KEEP_TICKETS + 1):
        pbd._start_work(f"old{n}", [("run", 0, ["a"], args)], {"a": a})
    assert pbd._take("old0", 0) is None and pbd._take(f"old{pbd.KEEP_TICKETS}", 0) is not None
    counts = pbd.engine_stats(True)
    assert (counts["started"], counts["taken"], counts["skipped"], counts["dropped"]) == (
        pbd.KEEP_TICKETS + 2, 2, 1, 1), counts
    for n in range(1, pbd.KEEP_TICKETS):                                # leave nothing held
        pbd._take(f"old{n}", 0)
    assert pbd.engine_stats()["held"] == 0


def test_an_engine_runs_remote_work_from_published_exports_and_leaves_what_does_not_come():
    """A ``"remote"`` job (pyblasgemm.dask._start_work): the engine asks for each source's
    export through ``ask``, fetches it, and runs over its own blocks and the fetched ones, the
    run's own function on the same blocks (the bits its task would give); an export published
    as None (its holder could not make it), or never asked for, leaves the run to its task, and
    the engine's other work goes on. Exports it makes itself are published for other engines,
    as the metadata that travels."""
    import asyncio
    import concurrent.futures

    a, b = np.ones((2, 3), np.float32), np.full((3, 2), 2, np.float32)
    args = ([([(0, 0)], [(1, 0)], None)], (a.dtype, b.dtype), np.dtype(np.float32), None, None, np.float32, 1, 0,
            None)
    made = {}

    def ask(address, engine, ticket, slot):
        done = concurrent.futures.Future()
        done.set_result(made.get(slot))
        return done

    made["e0"] = (b,)                   # NumPy blocks: the export is the blocks themselves
    source = ("w1", "engine-w1", "e0", 0, None)
    jobs = [("export", "mine", ["a"], 1), ("remote", 0, ["a"], (args, (source,))),
            ("remote", 1, ["a"], (args, (("w1", "engine-w1", "gone", 0, None),))),
            ("run", 2, ["a", "b"], ([([(0, 0)], [(0, 1)], None)],) + args[1:])]
    pbd.engine_stats(True)
    assert pbd._start_work("r1", jobs, {"a": a, "b": b}, ask) == 3
    assert pbd._take("r1", 0)[0].tolist() == pbd._run(*args, [a], [b])[0].tolist() == [[6.0, 6.0], [6.0, 6.0]]
    assert pbd._take("r1", 1) is None                                   # its task computes it
    assert pbd._take("r1", 2) is not None and pbd._take("r1", "mine") is not None
    counts = pbd.engine_stats(True)
    assert (counts["started"], counts["failed"]) == (3, 1), counts
    # the export made here is published for other engines, found by their coroutine
    got = asyncio.run(pbd._exported("r1", "mine", wait_s=0.01))
    assert [x.tolist() for x in got] == [a.tolist()]
    assert asyncio.run(pbd._exported("r1", "never", wait_s=0.01)) is None
    # without ``ask`` (no engine to ask) a remote job is left to its task
    assert pbd._start_work("r2", jobs[1:2], {"a": a}) == 0 and pbd._take("r2", 0) is None
    assert pbd.engine_stats()["held"] == 0


def test_a_placed_graph_with_more_than_its_keys_need_is_culled(monkeypatch):
    """An operand whose graph holds more than the product reads (a slice of a larger array):
    the placed product's optimization culls it, with Dask's array optimization, placement kept."""
    rng = np.random.default_rng(71)
    big, y = _data(rng, (16, 24), np.float32), _data(rng, (16, 8), np.float32)
    X = da.from_array(big, chunks=8)[:, :16]
    Y = da.from_array(y, chunks=8)
    _as_if_on(monkeypatch, 2, lambda i, k: i, lambda k, j: 0)
    z = pbd.matmul(X, Y, transport="dask")
    assert type(z).__name__ == "PlacedArray"
    graph = z.__dask_graph__()
    optimized = z.__dask_optimize__(graph, z.__dask_keys__())
    assert optimized is not graph and len(dict(optimized)) < len(dict(graph))
    assert _annotated(z) and all(k in dict(optimized) for k in _annotated(z))
    np.testing.assert_array_equal(z.compute(scheduler="sync"), pbd.matmul(da.from_array(big[:, :16], chunks=8), Y)
                                  .compute(scheduler="sync"))


def test_an_ipc_handle_pickles_to_its_metadata_alone():
    """The export's object keeps the producer's arrays alive and pickles to ~300 bytes, never
    the data; a block carried as data (mixed groups) travels with it; the same process reads
    its own arrays; a handle from another host is refused with the way out."""
    import pickle
    import socket

    from pyblasgemm import _dask_ipc as ipc

    block = np.zeros((1024, 1024), np.float32)                     # 4 MiB
    entry = (bytes(range(64)), 4096, block.shape, block.dtype, block.strides, "0000:18:00.0", None)
    h = ipc.IpcBlocks([entry, entry], host=socket.gethostname(), pid=99, arrays=[block, block])
    data = pickle.dumps(h)
    assert len(data) < 1000 and block.tobytes()[:64] not in data
    back = pickle.loads(data)
    assert back.arrays is None and back.entries == h.entries and (back.host, back.pid) == (h.host, 99)
    assert ipc.fetch(h)[0] is block                                 # never pickled: the arrays themselves
    carried = ipc.IpcBlocks([entry, (None, 0, (2,), np.dtype(np.float64), None, None, np.ones(2))], "elsewhere", 99)
    assert pickle.loads(pickle.dumps(carried)).entries[1][6].tolist() == [1.0, 1.0]
    with pytest.raises(RuntimeError, match="from host 'elsewhere'.*transport='dask'"):
        ipc.fetch(pickle.loads(pickle.dumps(carried)))
    assert ipc.export(np.ones(3), np.ones(2))[1].tolist() == [1.0, 1.0]         # NumPy: the blocks themselves


def test_the_scaling_benchmarks_ipc_transport_on_the_host(tmp_path):
    """bench/dask_scaling.py's ipc transport with NumPy chunks on 2 workers: the probe reads
    through export and fetch tasks, the product's graph is the IPC one (data path 'ipc'), every
    export falls back to Dask's transfer (NumPy blocks, with the reason) and the bits are the
    threaded scheduler's; --quick's preset names the 8-minute plan."""
    import json
    import os
    import pathlib
    import subprocess
    import sys

    root = pathlib.Path(__file__).resolve().parents[1]
    out = tmp_path / "smoke.json"
    case = "smoke 128^3 bfloat16"
    done = subprocess.run([sys.executable, str(root / "bench/dask_scaling.py"), "--smoke", "--gpus", "2",
                           "--cases", case, "--probe", "ipc", "--transport", "ipc", "--no-dask-array", "--trace",
                           "--out", str(out)], cwd=root,
                          capture_output=True, text=True, timeout=600, env=dict(os.environ, PYTHONPATH=str(root)))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["failures"] == [], doc["failures"]
    probe = doc["transports"]["ipc"]["probes"]["2"]
    assert probe["transport"] == "ipc" and probe["one_block"]["GBps_wall"] > 0
    (row,) = doc["cases"]
    ours = row["pyblasgemm.dask.matmul"]
    assert row["pyblasgemm_transport"] == "ipc" and ours["data_path"] == ["ipc"] and ours["bitwise_all_runs"]
    assert ours["ipc_bytes_per_run"] == 0 and ours["ipc_fallback_blocks"] > 0
    assert ours["ipc_fallback_reasons"] == ["export: not a CuPy array (numpy.ndarray)"]
    assert doc["bitwise"][case]["threaded_equal"] is True
    # --trace: every timed run's entries per worker, each task's kind, host times and Dask key
    for run in ours["trace"]["timed"]:
        entries = [e for w in run["entries"].values() for e in w]
        assert {e[0] for e in entries} >= {"export", "fetch", "product"}, {e[0] for e in entries}
        assert all(len(e) == 6 and e[1] <= e[2] and e[3] is None for e in entries)
        exports = [e for e in entries if e[0] == "export"]
        # an export runs in its task, or in its worker's engine (pyblasgemm.dask.START)
        assert exports and all("pyblasgemm-ipc-export-" in e[5] or e[5].startswith("pyblasgemm-engine")
                               for e in exports), exports
    from bench.dask_scaling import QUICK

    assert QUICK["probe"] == "tcp,ipc" and QUICK["transport"] == "ipc" and QUICK["gpus"] == "1,2,4"
    assert QUICK["budget_s"] <= 450


def test_ipc_handles_are_opened_once_bounded_and_closed(monkeypatch):
    """With a stand-in for the driver: a handle is opened once per (producer pid, handle,
    device) however often it is read (opening one the context holds fails on older drivers:
    CUDA_ERROR_ALREADY_MAPPED), at most OPEN_MAX stay open (the oldest is closed first), and
    close_handles closes the rest; ipc_stats counts them."""
    import types

    from pyblasgemm import _dask_ipc as ipc
    from pyblasgemm.kernels import driver as real

    calls = []

    class Bindings:
        class CUipcMem_flags:
            CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 1

        @staticmethod
        def CUipcMemHandle(ptr):
            return ptr

        @staticmethod
        def CUdeviceptr(ptr):
            return int(ptr)

        @staticmethod
        def cuIpcOpenMemHandle(handle, flags):
            calls.append(("open", flags))
            return (0, 0x1000 * (len(calls) + 1))

        @staticmethod
        def cuIpcCloseMemHandle(ptr):
            calls.append(("close", ptr))
            return (0,)

        @staticmethod
        def cuCtxSynchronize():
            calls.append(("synchronize",))
            return (0,)

    fake = types.SimpleNamespace(bindings=lambda: Bindings, check=real.check,
                                 call_in_context=lambda dev, name, fn, *args: real.check(fn(*args), name))
    monkeypatch.setattr(ipc, "_driver", lambda: fake)
    monkeypatch.setattr(ipc, "OPEN_MAX", 3)
    monkeypatch.setattr(ipc, "_OPENED", type(ipc._OPENED)())
    ipc.stats(reset=True)
    with ipc._LOCK:
        first = ipc._open(10, b"a" * 64, 0)
        assert ipc._open(10, b"a" * 64, 0) == first and len(calls) == 1          # cached
        assert ipc._open(11, b"a" * 64, 0) != first                               # another producer
        ipc._open(10, b"b" * 64, 0)
        ipc._open(10, b"c" * 64, 0)                                               # the 4th: the oldest goes
    # a fetch no longer waits for its copy: the device's queued work ends before a mapping closes
    assert calls[-3:-1] == [("synchronize",), ("close", first)] and [c[0] for c in calls].count("open") == 4
    s = ipc.stats()
    assert (s["opened"], s["closed"], s["open_now"]) == (4, 1, 3)
    assert pbd.close_ipc_handles() == 3 and pbd.ipc_stats()["open_now"] == 0
    assert [c[0] for c in calls].count("close") == 4 and pbd.close_ipc_handles() == 0
    assert [c[0] for c in calls][-4:] == ["synchronize", "close", "close", "close"]
    ipc.stats(reset=True)


def test_ipc_events_order_the_copies_and_the_release_with_a_stand_in_driver(monkeypatch):
    """With a stand-in for the driver, the producer's side of the CUDA IPC events: the export
    creates interprocess events without timing (ready + one done a reader) and records ready on
    its stream; when the export is let go (its finalizer), that stream waits for every reader's
    done event before the events are destroyed, once; a fetch of an export whose producer
    synchronized (no events) is refused nothing: it waits for its copy on the host instead."""
    import gc
    import types

    from pyblasgemm import _dask_ipc as ipc
    from pyblasgemm.kernels import driver as real

    calls = []

    class Bindings:
        class CUevent_flags:
            CU_EVENT_DISABLE_TIMING = 2
            CU_EVENT_INTERPROCESS = 4

        class _Handle:
            def __init__(self, event):
                self.raw = bytes([event]) * 64

            def getPtr(self):
                import ctypes
                self.buf = ctypes.create_string_buffer(self.raw, 64)
                return ctypes.addressof(self.buf)

        @staticmethod
        def cuEventCreate(flags):
            calls.append(("create", flags))
            return (0, len([c for c in calls if c[0] == "create"]))

        @staticmethod
        def cuEventRecord(event, stream):
            calls.append(("record", event, stream))
            return (0,)

        @staticmethod
        def cuIpcGetEventHandle(event):
            return (0, Bindings._Handle(event))

        @staticmethod
        def cuStreamWaitEvent(stream, event, flags):
            calls.append(("wait", stream, event))
            return (0,)

        @staticmethod
        def cuEventDestroy(event):
            calls.append(("destroy", event))
            return (0,)

    fake = types.SimpleNamespace(bindings=lambda: Bindings, check=real.check, stream=lambda h: f"stream{h}",
                                 call_in_context=lambda dev, name, fn, *args: real.check(fn(*args), name))
    monkeypatch.setattr(ipc, "_driver", lambda: fake)
    owner = ipc._Exported(0, 0, readers=2)
    assert calls == [("create", 6), ("create", 6), ("create", 6), ("record", 1, "stream0")]
    ready, done = owner.handles()
    assert ready == bytes([1]) * 64 and done == (bytes([2]) * 64, bytes([3]) * 64)
    h = ipc.IpcBlocks([], host="h", pid=1, arrays=[], events=(ready, done), owner=owner)
    del calls[:]
    del h, owner
    gc.collect()
    assert calls == [("wait", "stream0", 2), ("wait", "stream0", 3), ("destroy", 1), ("destroy", 2), ("destroy", 3)]
    kept = ipc._Exported(0, 3, readers=0, arrays=[np.ones(1)])      # the arrays go after the waits
    assert len(kept.arrays) == 1
    kept.release()
    assert kept.arrays is None
    # a failure half-way destroys what was made
    del calls[:]
    monkeypatch.setattr(Bindings, "cuEventRecord", staticmethod(lambda event, stream: (1,)))
    with pytest.raises(real.CudaDriverError, match="cuEventRecord"):
        ipc._Exported(0, 7, readers=1)
    gc.collect()
    assert [c[0] for c in calls] == ["create", "create", "wait", "destroy", "destroy"]
    with pytest.raises(ValueError, match=r"readers=-1 must be an integer >= 0"):
        ipc.export(np.ones(2), readers=-1)


def test_the_guide_shows_the_ipc_scaling_run():
    """docs/guide/dask.rst's CUDA IPC table is the results file's rows (one 4-GPU H200 run)."""
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    name = "bench/results/dask_scaling_h200x4_2026-11-27_733e96d.json"
    doc = json.loads((root / name).read_text())
    guide = (root / "docs" / "guide" / "dask.rst").read_text()
    assert name in guide and doc["gpu_count"] == 4 and doc["device"]["name"] == "NVIDIA H200"
    assert all(b["all_runs_equal"] for b in doc["bitwise"].values())
    for case in doc["cases"]:
        run = case["pyblasgemm.dask.matmul"]
        row = (f"   * - {case['case']}\n     - {case['gpus']}\n     - {run['median_s'] * 1e3:.1f} ms\n"
               f"     - {run['speedup_vs_one_call']:.2f}x ({run['efficiency']:.2f})")
        assert row in guide, row


def test_the_guide_shows_the_2_gpu_ipc_event_run():
    """docs/guide/dask.rst's 2-GPU table is the results file's rows (2 H200, IPC events and the
    synchronizing transport, same machine), and what the trace says of it is that file's."""
    import json
    import statistics
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    name = "bench/results/dask_scaling_h200x2_2026-11-27_72e11dc.json"
    doc = json.loads((root / name).read_text())
    guide = (root / "docs" / "guide" / "dask.rst").read_text()
    assert name in guide and doc["gpu_count"] == 2 and doc["device"]["name"] == "NVIDIA H200"
    assert "NV18" in doc["nvidia_smi"]["topology"] and doc["failures"] == []
    assert all(b["all_runs_equal"] for b in doc["bitwise"].values())
    assert doc["bitwise"]["32768^3 float16"]["threaded_equal"] is True
    for case in doc["cases"]:
        run = case["pyblasgemm.dask.matmul"]
        assert case["ipc_events"] == [case["transport"] == "ipc"]
        row = (f"   * - {case['case']}\n     - {case['gpus']}\n     - {case['transport']}\n"
               f"     - {run['median_s'] * 1e3:.1f} ms\n     - {run['speedup_vs_one_call']:.2f}x ({run['efficiency']:.2f})")
        assert row in guide, row
        if case["case"] == "32768^3 float16" and case["gpus"] == 2:
            workers = [w for r in run["trace"]["timed"] for w in r["workers"].values()]
            first, busy, idle = (statistics.median(w[k] for w in workers)
                                 for k in ("first_task_ms", "gpu_busy_ms", "gpu_idle_ms"))
            row = f"   * - {case['transport']}\n     - {first:.1f}\n     - {busy:.1f}\n     - {idle:.2f}"
            assert row in guide, row


def test_the_guide_shows_the_h100_runs_of_the_20_task_schedule():
    """docs/guide/dask.rst's H100 table is the results files' 2- and 4-GPU rows (the 24-task
    schedule and this one on one 2-GPU machine, this one on 4 GPUs), every run bitwise equal."""
    import json
    import statistics
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    guide = (root / "docs" / "guide" / "dask.rst").read_text()
    for name, label, gpus, tasks in (
            ("dask_scaling_h100x2_2026-11-28_9f40e58_before.json", "24-task (9f40e58)", 2, 24),
            ("dask_scaling_h100x2_2026-11-28_1d6aa90.json", "this one", 2, 20),
            ("dask_scaling_h100x4_2026-11-28_235a76b.json", "this one", 4, 20),
            ("dask_scaling_h100x4_2026-11-28_235a76b_switch.json", "this one, 0.5 ms switch", 4, 20)):
        doc = json.loads((root / "bench" / "results" / name).read_text())
        assert name in guide or name.replace("_switch", "") in guide
        assert doc["gpu_count"] == gpus and doc["device"]["name"].startswith("NVIDIA H100")
        assert doc["failures"] == [] and all(b["all_runs_equal"] for b in doc["bitwise"].values())
        assert doc["bitwise"]["32768^3 float16"]["threaded_equal"] is True
        for case in doc["cases"]:
            run = case["pyblasgemm.dask.matmul"]
            if case["gpus"] == 1:
                continue
            assert run["tasks"] == tasks
            workers = [w for r in run["trace"]["timed"] for w in r["workers"].values()]
            first, idle = (statistics.median(w[k] for w in workers) for k in ("first_task_ms", "gpu_idle_ms"))
            row = (f"   * - {case['case']}\n     - {case['gpus']}\n     - {label}\n     - {tasks}\n"
                   f"     - {run['median_s'] * 1e3:.1f} ms\n     - {run['speedup_vs_one_call']:.2f}x "
                   f"({run['efficiency']:.2f})\n     - {first:.1f}\n     - {idle:.2f}\n")
            assert row in guide, row


def test_the_guide_shows_the_host_overhead_run():
    """docs/guide/dask.rst's table of where Dask's time goes is the results file's medians
    (bench/dask_overhead.py, main against this schedule, 2 and 4 workers), with the task counts
    this schedule gives the benchmark's graph."""
    import json
    import statistics
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    name = "bench/results/dask_overhead_host_2026-11-28_1b26854.json"
    doc = json.loads((root / name).read_text())
    guide = " ".join((root / "docs" / "guide" / "dask.rst").read_text().split())
    assert name in guide

    def med(src, n, key):
        return statistics.median(run[key] for r in doc["results"] if r["name"] == src
                                 for run in r["by_workers"][n]["runs"] if run.get(key) is not None)

    for src, tasks in (("before", (24, 32)), ("after", (20, 20))):
        assert (med(src, "2", "tasks"), med(src, "4", "tasks")) == tasks
        assert len([r for r in doc["results"] if r["name"] == src]) == 3
        for key in ("first_processing_ms", "worker_received_ms", "first_start_ms"):
            cell = f"- {med(src, '2', key):.1f} ({med(src, '4', key):.1f})"
            assert cell in guide, (src, key, cell)
        cell = (f"- {med(src, '2', 'update_graph_ms'):.1f} ({med(src, '4', 'update_graph_ms'):.1f}): "
                f"{med(src, '2', 'materialize_ms'):.1f}, {med(src, '2', 'order_ms'):.1f}, "
                f"{med(src, '2', 'task_states_ms'):.1f}")
        assert cell in guide, (src, cell)
    assert "main: 24 (32) tasks" in guide and "now: 20 (20) tasks" in guide


def test_the_guide_shows_where_the_first_milliseconds_go_on_2_h200():
    """docs/guide/dask.rst's table of the first milliseconds on 2 H200 is the four results files'
    medians over runs and workers (main and the reverted trial, alternately on one machine),
    every product bitwise equal across runs, and on 1 and 2 GPUs and the threaded scheduler's
    where the file has them."""
    import json
    import statistics
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    guide = (root / "docs" / "guide" / "dask.rst").read_text()
    for tag, label in (("1a7cefb_main", "main 1a7cefb"), ("1a7cefb_main_r2", "main 1a7cefb"),
                       ("c994cf5", "c994cf5"), ("c994cf5_r2", "c994cf5")):
        name = f"dask_scaling_h200x2_2026-11-28_{tag}.json"
        doc = json.loads((root / "bench" / "results" / name).read_text())
        assert name in guide or f"..._{tag}.json" in guide
        assert doc["device"]["name"] == "NVIDIA H200" and doc["gpu_count"] == 2 and doc["failures"] == []
        assert all(b["all_runs_equal"] for b in doc["bitwise"].values())
        if "1 GPU ipc" in doc["bitwise"]["32768^3 float16"]["runs"]:
            assert doc["bitwise"]["32768^3 float16"]["threaded_equal"] is True
        (case,) = [c for c in doc["cases"] if c["case"] == "32768^3 float16" and c["gpus"] == 2]
        run = case["pyblasgemm.dask.matmul"]
        timed = run["trace"]["timed"]
        workers = [w for r in timed for w in r["workers"].values()]

        def med(values):
            return statistics.median(values)

        row = (f"   * - {label} ({len(timed)})\n"
               f"     - {med(w['arrive_ms']['product'][0] for w in workers):.2f}\n"
               f"     - {med(w['first_task_ms'] for w in workers):.2f}\n"
               f"     - {med(w['gpu_busy_ms'] for w in workers):.2f} / {med(w['gpu_idle_ms'] for w in workers):.2f}\n"
               f"     - {med(w['gpu_last_ms'] for w in workers):.2f}\n"
               f"     - {med(r['elapsed_ms'] for r in timed):.2f}\n"
               f"     - {run['speedup_vs_one_call']:.3f}x ({doc['baselines_s']['32768^3 float16'] * 1e3:.2f} ms)\n")
        assert row in guide, row


def _two_schedule_run(name: str, schedules: set):
    """(repository root, the Dask guide's text, results file ``name``) of a run of two schedules
    alternately on 2 H200, the guide naming the file: no failure, every product's four runs
    (two a schedule) bitwise equal, 32768^3 float16 the threaded scheduler's too."""
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    guide = (root / "docs" / "guide" / "dask.rst").read_text()
    doc = json.loads((root / "bench" / "results" / name).read_text())
    assert name in guide
    assert doc["device"]["name"] == "NVIDIA H200" and doc["gpu_count"] == 2 and doc["failures"] == []
    for case, bits in doc["bitwise"].items():
        assert bits["all_runs_equal"] and len(bits["runs"]) == 4, case
        assert {r.split()[-1] for r in bits["runs"]} == schedules
    assert doc["bitwise"]["32768^3 float16"]["threaded_equal"] is True
    return root, guide, doc


def test_the_guide_shows_the_run_schedule_against_one_task_a_block_on_2_h200():
    """docs/guide/dask.rst's table of runs against the per-block schedule is the results file's
    (both schedules alternately in one run on 2 H200): medians of the timed runs, and of the
    trace over runs and workers; every product bitwise equal across runs, GPU counts and
    schedules, 32768^3 float16 the threaded scheduler's too; the latency probe's figures quoted."""
    import statistics

    root, guide, doc = _two_schedule_run("dask_scaling_h200x2_2026-11-28_2712161_runs.json", {"runs", "blocks"})
    med = statistics.median
    for case in doc["cases"]:
        run = case["pyblasgemm.dask.matmul"]
        timed = run["trace"]["timed"]
        workers = [w for r in timed for w in r["workers"].values()]
        arrive = med(min(v[0] for v in w["arrive_ms"].values()) for w in workers)
        row = (f"   * - {case['case']}\n     - {case['gpus']}\n     - {case['schedule']}\n     - {run['tasks']}\n"
               f"     - {run['median_s'] * 1e3:.1f} ms\n"
               f"     - {run['speedup_vs_one_call']:.3f}x ({run['efficiency']:.3f})\n"
               f"     - {arrive:.2f}\n     - {med(w['first_task_ms'] for w in workers):.2f}\n"
               f"     - {med(w['gpu_first_ms'] for w in workers):.2f}\n"
               f"     - {med(w['gpu_last_ms'] for w in workers):.2f}\n")
        assert row in guide, row
    latency = doc["transports"]["ipc"]["latency"]
    for n, persist, submit in (("2", "7.26", "4.60"), ("1", "7.00", "4.13")):
        assert f"{latency[n]['persist_one_task']['start_ms']:.2f}" == persist
        assert f"{latency[n]['submit_one_task']['start_ms']:.2f}" == submit
        assert persist in guide and submit in guide


def test_the_guide_shows_the_started_work_against_the_graph_alone_on_2_h200():
    """docs/guide/dask.rst's table of the started work (pyblasgemm.dask.START) against the graph
    alone is the results file's (both alternately in one run on 2 H200): medians of the timed
    runs, and of the trace over runs and workers; the engines started and took every slot (2
    exports and 2 runs on 2 GPUs, the run on one) and no task computed one; every product
    bitwise equal across runs, GPU counts and schedules, 32768^3 float16 the threaded
    scheduler's too; the figure is drawn from it; the earlier run's dask.array.matmul quoted."""
    import json
    import statistics

    root, guide, doc = _two_schedule_run("dask_scaling_h200x2_2026-11-28_ef0b596_start.json", {"start", "runs"})
    assert "dask_scaling_2026-11-28_start.png" in guide
    assert (root / "docs" / "_static" / "perf" / "dask_scaling_2026-11-28_start.png").is_file()
    assert doc["device_kind"] == "nvidia-h200-x2" and doc["git_sha"] == "ef0b596"
    med = statistics.median
    for case in doc["cases"]:
        run = case["pyblasgemm.dask.matmul"]
        slots = {1: 1, 2: 4}[case["gpus"]] if case["schedule"] == "start" else 0
        assert all((e["started"], e["taken"], e["computed_in_task"], e["held"]) == (slots, slots, 0, 0)
                   for e in run["engine_per_run"]), case["case"]
        timed = run["trace"]["timed"]
        workers = [w for r in timed for w in r["workers"].values()]
        arrive = med(min(v[0] for v in w["arrive_ms"].values()) for w in workers)
        theirs = case.get("dask.array.matmul", {})
        mine = (f"{theirs['median_s'] * 1e3:.1f} ms ({case['ratio_vs_dask_array']:.2f}x)" if "median_s" in theirs
                else "not run")
        row = (f"   * - {case['case']}\n     - {case['gpus']}\n     - {case['schedule']}\n     - {run['tasks']}\n"
               f"     - {run['median_s'] * 1e3:.1f} ms\n"
               f"     - {run['speedup_vs_one_call']:.3f}x ({run['efficiency']:.3f})\n"
               f"     - {arrive:.2f}\n     - {med(w['first_task_ms'] for w in workers):.2f}\n"
               f"     - {med(w['gpu_first_ms'] for w in workers):.2f}\n"
               f"     - {med(w['gpu_last_ms'] for w in workers):.2f}\n     - {mine}\n")
        assert row in guide, row
    latency = doc["transports"]["ipc"]["latency"]["2"]
    assert (f"{latency['persist_one_task']['start_ms']:.2f}", f"{latency['submit_one_task']['start_ms']:.2f}") == \
        ("5.92", "3.42")
    earlier = json.loads((root / "bench" / "results" / "dask_scaling_h200x2_2026-11-28_7725cb0_start.json").read_text())
    (two,) = [c for c in earlier["cases"] if c["gpus"] == 2 and "dask.array.matmul" in c]
    assert f"{two['dask.array.matmul']['median_s'] * 1e3:.1f} ms" == "3834.2 ms"
    assert f"{two['ratio_vs_dask_array']:.1f}x" == "62.7x" and "62.7x" in guide and "3834.2 ms" in guide


def test_the_guide_shows_tcp_against_ucx_on_1_2_and_4_h200():
    """docs/guide/dask.rst's TCP-or-UCX table is bench/dask_scaling.py's transport_table of the
    results file (one run on 4 H200: TCP and UCX for Dask's messages, CUDA IPC or Dask's
    transfer for the blocks, z.persist() and client.persist(z)); both figures are drawn from it;
    every product bitwise equal across runs, GPU counts, transports and calls, 32768^3 float16
    the threaded scheduler's; client.persist(z) started and took each worker's own work in every
    run; the numbers the text quotes are the file's."""
    import json
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root))
    from bench.dask_scaling import transport_table

    name = "dask_scaling_h200x4_2026-11-28_8287f93.json"
    path = root / "bench" / "results" / name
    guide = (root / "docs" / "guide" / "dask.rst").read_text()
    assert name in guide and transport_table(path) in guide
    for png in ("dask_transports_2026-11-28_2gpu.png", "dask_scaling_2026-11-28_4gpu.png"):
        assert png in guide and (root / "docs" / "_static" / "perf" / png).is_file()
    doc = json.loads(path.read_text())
    assert doc["device_kind"] == "nvidia-h200-x4" and doc["git_sha"] == "8287f93" and doc["gpu_count"] == 4
    assert doc["failures"] == [{"transport": "tcp", "cases": "stopped after 30 s (--budget-s)"}]
    for case, bits in doc["bitwise"].items():
        assert bits["all_runs_equal"], case
    assert doc["bitwise"]["32768^3 float16"]["threaded_equal"] is True
    slots = {1: 1, 2: 4, 4: 8}
    rows = {}
    for c in doc["cases"]:
        run = c["pyblasgemm.dask.matmul"]
        rows[c["case"], c["gpus"], c["transport"], c["schedule"]] = run
        if c["transport"] in ("ipc", "ucx-ipc"):   # the runs that read only their worker's blocks, and the exports
            assert all((e["started"], e["taken"], e["computed_in_task"], e["held"]) == (slots[c["gpus"]],) * 2 + (0, 0)
                       for e in run["engine_per_run"]), (c["case"], c["gpus"], c["transport"], c["schedule"])
    flat = " ".join(guide.split())

    def ms(case, gpus, transport, schedule="start"):
        return f"{rows[case, gpus, transport, schedule]['median_s'] * 1e3:.1f} ms"

    f16, f64 = "32768^3 float16", "16384^3 float64"
    assert f"{ms(f16, 2, 'ipc')[:-3]} against {ms(f16, 2, 'ucx-ipc')}" in flat
    assert f"{ms(f16, 4, 'ipc')[:-3]} against {ms(f16, 4, 'ucx-ipc')}" in flat
    assert f"over UCX {ms(f16, 2, 'ucx-nvlink')} on 2 GPUs" in flat and f"over TCP {ms(f16, 2, 'tcp')}" in flat
    assert f"TCP: {ms(f16, 2, 'ipc', 'client')[:-3]} against {ms(f16, 2, 'ipc')}" in flat
    assert f"{rows[f16, 4, 'ipc', 'start']['speedup_vs_one_call']:.3f}x one call on 4 GPUs" in flat
    assert f"{rows[f64, 4, 'ipc', 'start']['speedup_vs_one_call']:.3f}x" in flat
    lat = {t: doc["transports"][t]["latency"]["2"]["persist_one_task"]["start_ms"] for t in ("ipc", "ucx-ipc")}
    assert f"{lat['ipc']:.2f} ms over TCP and {lat['ucx-ipc']:.2f} ms over UCX" in flat



def test_the_guide_shows_the_4_gpu_run_with_every_run_started():
    """docs/guide/dask.rst's table of the run where the engines start every run (4 H200, every
    issue case on 4, 2 and 1 GPUs) is the results file's, drawn by bench/dask_scaling.py, with
    its figure; the ratios the text quotes are that file's, and every product's bits agreed."""
    import json
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root / "bench"))
    import dask_scaling

    name = "bench/results/dask_scaling_h200x4_2026-11-28_27c52ef.json"
    doc = json.loads((root / name).read_text())
    guide = (root / "docs" / "guide" / "dask.rst").read_text()
    assert name in guide and doc["gpu_count"] == 4 and doc["device"]["name"] == "NVIDIA H200"
    assert dask_scaling.transport_table(root / name) in guide
    assert (root / "docs/_static/perf/dask_scaling_2026-11-28_engines.png").is_file()
    assert all(b["all_runs_equal"] for b in doc["bitwise"].values())
    row = {(c["case"], c["gpus"]): c["pyblasgemm.dask.matmul"] for c in doc["cases"]}
    assert f"**{row['32768^3 float16', 2]['speedup_vs_one_call']:.3f}x** one call" in guide
    assert f"**{row['32768^3 float16', 4]['speedup_vs_one_call']:.2f}x** (bfloat16 " \
           f"{row['32768^3 bfloat16', 4]['speedup_vs_one_call']:.2f}x)" in guide
    assert f"float64 **{row['16384^3 float64', 4]['efficiency']:.2f}** efficiency on 4 GPUs" in guide
    for case in doc["cases"]:           # every engine's work was started and taken
        for counts in case["pyblasgemm.dask.matmul"].get("engine_per_run", []):
            assert counts["failed"] == counts["held"] == 0, (case["case"], case["gpus"], counts)
