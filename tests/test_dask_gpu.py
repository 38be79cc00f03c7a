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


def _gpu_count():
    try:
        return cupy.cuda.runtime.getDeviceCount()
    except Exception:  # pragma: no cover - no driver
        return 0


def _fetched(dask_worker):
    return [tuple(k) if isinstance(k, list) else k for e in dask_worker.transfer_incoming_log for k in e["keys"]]


def _on_gpus(client, data, chunk, owner, prefix):
    """A Dask array of CuPy blocks of ``data`` (chunk x chunk), block (i, j) put on worker
    ``owner(i, j)`` (an index into the sorted addresses)."""
    import uuid

    import distributed

    workers = sorted(client.nthreads())
    name = f"{prefix}-{uuid.uuid4().hex}"
    rows, cols = data.shape[0] // chunk, data.shape[1] // chunk
    futures = {(name, i, j): client.submit(cupy.asarray, data[i * chunk:(i + 1) * chunk, j * chunk:(j + 1) * chunk],
                                           key=(name, i, j), workers=[workers[owner(i, j)]],
                                           allow_other_workers=False, pure=False)
               for i in range(rows) for j in range(cols)}
    meta = cupy.empty((0, 0), cupy.uint16).view(data.dtype) if data.dtype.itemsize == 2 else \
        cupy.empty((0, 0), data.dtype)
    arr = da.Array(futures, name, ((chunk,) * rows, (chunk,) * cols), meta=meta)
    distributed.wait(arr)
    return arr


def _split_product(client, x, y, transport=None):
    """``pbd.matmul`` of x (rows of 128-blocks split over the two workers by pairs: block row i
    on worker i // 2) and y (block column j on worker j), the product's placement checked
    (transport 'ipc' by default on two GPUs, or the one asked)."""
    X = _on_gpus(client, x, 128, lambda i, k: i // 2, "a")
    Y = _on_gpus(client, y, 128, lambda k, j: j, "b")
    z = pbd.matmul(X, Y) if transport is None else pbd.matmul(X, Y, transport=transport)
    assert type(z).__name__ == "PlacedArray" and pbd.transport_of(z) == (transport or "ipc")
    return z


@pytest.fixture(scope="module")
def two_gpu_cluster():
    if _gpu_count() < 2:
        pytest.skip("needs 2 GPUs")
    dask_cuda = pytest.importorskip("dask_cuda")
    distributed = pytest.importorskip("distributed")
    with dask_cuda.LocalCUDACluster(n_workers=2, CUDA_VISIBLE_DEVICES="0,1", dashboard_address=None,
                                    silence_logs=logging.ERROR) as cluster, distributed.Client(cluster) as client:
        yield client


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16], ids=lambda d: np.dtype(d).name)
def test_two_gpus_compute_each_block_where_its_row_panel_is_with_the_threaded_bits(two_gpu_cluster, dtype):
    """A's row panels and B's column panels split over 2 GPUs (TCP, Dask's transfer:
    transport='dask'): C[i, j] runs on A's row panel's GPU, which fetches the half of B it
    lacks once; bfloat16 blocks
    arrive as '|V2' (Dask's CuPy serializer) and are read as bfloat16; the bits are the
    threaded scheduler's on one GPU."""
    from distributed import wait

    client = two_gpu_cluster
    workers = sorted(client.nthreads())
    rng = np.random.default_rng(50)
    x, y = _data(rng, (512, 384), dtype), _data(rng, (384, 256), dtype)
    z = _split_product(client, x, y, "dask")
    before = client.run(_fetched)
    done = client.persist(z)
    wait(done)
    assert {k: tuple(w) for k, w in client.who_has(done).items()} == \
        {(z.name, i, j): (workers[i // 2],) for i in range(4) for j in range(2)}
    after = client.run(_fetched)
    for n, w in enumerate(workers):
        got = after[w][len(before[w]):]
        assert sorted(got) == sorted((Y.name, k, j) for k in range(3) for j in range(2) if j != n), (w, got)
    got = cupy.asnumpy(done.compute())
    threaded = pbd.matmul(da.from_array(cupy.asarray(x), chunks=128, asarray=False),
                          da.from_array(cupy.asarray(y), chunks=128, asarray=False)).compute(scheduler="threads")
    np.testing.assert_array_equal(got.view(np.uint8), cupy.asnumpy(threaded).view(np.uint8))
    _check(got, x, y, dtype)


def test_two_gpus_split_a_long_k_where_its_chunks_are(two_gpu_cluster):
    """One output block, K in 16 chunks, chunks 0-7 on GPU 0 and 8-15 on GPU 1: the default's 8
    partial products run where their chunks are, and the only transfer (Dask's:
    transport='dask') is one float32 partial sum; the bits are the threaded scheduler's."""
    from distributed import wait

    client = two_gpu_cluster
    rng = np.random.default_rng(51)
    x, y = _data(rng, (128, 2048), np.float16), _data(rng, (2048, 128), np.float16)
    X = _on_gpus(client, x, 128, lambda i, k: k // 8, "a")
    Y = _on_gpus(client, y, 128, lambda k, j: k // 8, "b")
    z = pbd.matmul(X, Y, transport="dask")
    before = client.run(_fetched)
    done = client.persist(z)
    wait(done)
    after = client.run(_fetched)
    moved = [k for w in after for k in after[w][len(before[w]):]]
    assert len(moved) == 1 and moved[0][0].startswith("pyblasgemm-sum-"), moved
    got = cupy.asnumpy(done.compute())
    threaded = pbd.matmul(da.from_array(cupy.asarray(x), chunks=128, asarray=False),
                          da.from_array(cupy.asarray(y), chunks=128, asarray=False)).compute(scheduler="threads")
    np.testing.assert_array_equal(got.view(np.uint16), cupy.asnumpy(threaded).view(np.uint16))
    _check(got, x, y, np.float16)


def _received(dask_worker):
    """(key, bytes) of every transfer this worker received through Dask."""
    return [(tuple(k) if isinstance(k, list) else k, int(e["total"]))
            for e in dask_worker.transfer_incoming_log for k in e["keys"]]


def _threaded(x, y, chunk=128, **kw):
    return cupy.asnumpy(pbd.matmul(da.from_array(cupy.asarray(x), chunks=chunk, asarray=False),
                                   da.from_array(cupy.asarray(y), chunks=chunk, asarray=False),
                                   **kw).compute(scheduler="threads"))


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float64], ids=lambda d: np.dtype(d).name)
def test_two_gpus_move_blocks_through_cuda_ipc_with_the_threaded_bits(two_gpu_cluster, dtype):
    """The default transport ('auto': CuPy chunks on one host) moves B's blocks between the 2
    GPUs through CUDA IPC: Dask moves only the exports' handles (a few hundred bytes each),
    each worker copies the 3 blocks of B it lacks once (ipc_stats), nothing falls back; three
    runs on fresh operands (the fetched blocks' memory reused) give the threaded scheduler's
    bits on one GPU; closing the handles closes every one opened."""
    from distributed import wait

    client = two_gpu_cluster
    workers = sorted(client.nthreads())
    rng = np.random.default_rng(52)
    x, y = _data(rng, (512, 384), dtype), _data(rng, (384, 256), dtype)
    threaded = _threaded(x, y)
    client.run(pbd.close_ipc_handles)
    client.run(pbd.ipc_stats, True)
    for run in range(3):
        z = _split_product(client, x, y)
        before = client.run(_received)
        done = client.persist(z)
        wait(done)
        after = client.run(_received)
        for w in workers:
            got = after[w][len(before[w]):]
            assert all(k[0].startswith("pyblasgemm-ipc-export-") and n < 4096 for k, n in got), (w, got)
        assert {k: tuple(v) for k, v in client.who_has(done).items()} == \
            {(z.name, i, j): (workers[i // 2],) for i in range(4) for j in range(2)}
        got = cupy.asnumpy(done.compute())
        np.testing.assert_array_equal(got.view(np.uint8), threaded.view(np.uint8), f"run {run}")
        del X, Y, z, done
    stats = client.run(pbd.ipc_stats)
    itemsize = np.dtype(dtype).itemsize
    for w, s in stats.items():
        assert s["ipc_blocks"] == 9 and s["ipc_bytes"] == 9 * 128 * 128 * itemsize, (w, s)
        assert s["fallback_blocks"] == 0 and s["same_process_blocks"] == 0 and s["exported_blocks"] == 9, (w, s)
        assert s["open_now"] >= 1, (w, s)
        # CUDA IPC events: no export synchronized its device, no fetch waited for its copy
        assert s["event_exports"] >= 1 and s["synchronized_exports"] == 0 and s["synchronized_fetches"] == 0, (w, s)
    closed = client.run(pbd.close_ipc_handles)
    after = client.run(pbd.ipc_stats)
    for w in workers:
        assert closed[w] == stats[w]["open_now"] and after[w]["open_now"] == 0, (w, closed, after)
        assert after[w]["opened"] == after[w]["closed"], after[w]
    _check(got, x, y, dtype)


def test_two_gpus_long_k_and_gemm_through_cuda_ipc(two_gpu_cluster):
    """A long K split over 2 GPUs: the one partial sum that crosses goes through an export
    (float32, 128 x 128); gemm with c, alpha and beta too; the threaded scheduler's bits."""
    from distributed import wait

    client = two_gpu_cluster
    rng = np.random.default_rng(53)
    x, y = _data(rng, (128, 2048), np.float16), _data(rng, (2048, 128), np.float16)
    c = _data(rng, (128, 128), np.float16)
    X = _on_gpus(client, x, 128, lambda i, k: k // 8, "a")
    Y = _on_gpus(client, y, 128, lambda k, j: k // 8, "b")
    C = _on_gpus(client, c, 128, lambda i, j: 1, "c")
    client.run(pbd.ipc_stats, True)
    z = pbd.matmul(X, Y, transport="ipc")
    done = client.persist(z)
    wait(done)
    stats = client.run(pbd.ipc_stats)
    assert sorted(s["ipc_bytes"] for s in stats.values()) == [0, 128 * 128 * 4], stats
    np.testing.assert_array_equal(cupy.asnumpy(done.compute()).view(np.uint16), _threaded(x, y).view(np.uint16))
    g = pbd.gemm("N", "N", X, Y, c=C, alpha=0.5, beta=-2)
    assert pbd.transport_of(g) == "ipc"
    want = pbd.gemm("N", "N", da.from_array(cupy.asarray(x), chunks=128, asarray=False),
                    da.from_array(cupy.asarray(y), chunks=128, asarray=False),
                    c=da.from_array(cupy.asarray(c), chunks=128, asarray=False), alpha=0.5, beta=-2)
    np.testing.assert_array_equal(cupy.asnumpy(client.compute(g).result()).view(np.uint16),
                                  cupy.asnumpy(want.compute(scheduler="threads")).view(np.uint16))
    client.run(pbd.close_ipc_handles)


def _late_block(n, value, seed):
    """A float32 block whose final value is queued behind ~3 large products (tens of ms on an
    H100): the task ends long before its GPU has written it."""
    a = cupy.random.RandomState(seed).standard_normal((n, n), dtype=cupy.float32)
    out = cupy.zeros((n, n), cupy.float32)
    for _ in range(3):
        out += a @ a
    out.fill(value)
    return out


def _fetch_and_count(group, value):
    """Fetch an export and count, on this GPU, the elements equal to ``value`` (queued after the
    copy: the fetch returned once its copy was queued); a 0-d CuPy array, not synchronized."""
    from pyblasgemm import _dask_ipc

    (block,) = _dask_ipc.fetch(group)
    return (block == value).sum()


def _overwrite(n, value):
    """A block of the same size as _late_block's, filled with ``value``: CuPy's pool hands it the
    memory of the block freed last, on the same stream."""
    out = cupy.empty((n, n), cupy.float32)
    out.fill(value)
    return out


def test_two_gpus_ipc_events_order_a_copy_after_the_producers_writes_and_before_its_reuse(two_gpu_cluster):
    """The CUDA IPC events on 2 GPUs: a block exported while its writes are still queued (its
    task ended long before) is copied only after them (the ready event); and once the reader's
    task has ended, its copy may still be queued, yet the producer frees the block and fills the
    same memory with something else: the fill waits for the copy (the done event). Both without
    a thread waiting for a GPU (ipc_stats)."""
    from distributed import wait

    from pyblasgemm import _dask_ipc

    client = two_gpu_cluster
    w0, w1 = sorted(client.nthreads())
    n = 8192
    client.run(pbd.ipc_stats, True)
    for rep in range(3):
        blk = client.submit(_late_block, n, 7.0, rep, workers=[w0], allow_other_workers=False, pure=False)
        exp = client.submit(_dask_ipc.export, blk, readers=1, workers=[w0], allow_other_workers=False, pure=False)
        got = client.submit(_fetch_and_count, exp, 7.0, workers=[w1], allow_other_workers=False, pure=False)
        del blk, exp                    # the producer lets the block go once the fetch task has ended
        wait(got)
        junk = client.submit(_overwrite, n, -1.0, workers=[w0], allow_other_workers=False, pure=False)
        wait(junk)
        assert int(got.result()) == n * n, rep
        del got, junk
    stats = client.run(pbd.ipc_stats)
    assert stats[w0]["event_exports"] == 3 and stats[w0]["synchronized_exports"] == 0, stats
    assert stats[w1]["ipc_blocks"] == 3 and stats[w1]["synchronized_fetches"] == 0, stats
    client.run(pbd.close_ipc_handles)


@pytest.mark.parametrize("call", ["z.persist", "client.persist"])
@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float64], ids=lambda d: np.dtype(d).name)
def test_two_gpus_persist_starts_each_workers_own_work_with_the_threaded_bits(two_gpu_cluster, dtype, call):
    """pyblasgemm.dask.START on 2 GPUs over CUDA IPC: ``z.persist()`` hands each worker's
    engine its export (the B blocks the other reads) and its run of its own blocks before the
    graph reaches the scheduler (``client.persist(z)``: once the graph is queued), and its run
    of the other GPU's blocks, whose export it asks the other engine for (worker to worker) and
    copies itself; the tasks take them (or, where a task came first, compute them);
    three runs on fresh operands give the threaded scheduler's bits on one GPU, nothing falls
    back to Dask's transfer, and no started work is left held."""
    from distributed import wait

    client = two_gpu_cluster
    assert pbd.START
    rng = np.random.default_rng(53)
    x, y = _data(rng, (512, 384), dtype), _data(rng, (384, 256), dtype)
    threaded = _threaded(x, y)
    client.run(pbd.ipc_stats, True)
    client.run(pbd.engine_stats, True)
    for run in range(3):
        z = _split_product(client, x, y)
        done = z.persist() if call == "z.persist" else client.persist(z)
        wait(done)
        got = cupy.asnumpy(done.compute())
        np.testing.assert_array_equal(got.view(np.uint8), threaded.view(np.uint8), f"run {run}")
        del X, Y, z, done
    counts = client.run(pbd.engine_stats)
    for w, c in counts.items():           # a worker: one export, one run of its own, one of the other's blocks a product
        assert c["started"] == c["taken"] and c["taken"] + c["computed_in_task"] == 9, (w, c)
        assert (c["held"], c["failed"]) == (0, 0), (w, c)
    assert sum(c["taken"] for c in counts.values()) >= 1, counts
    for w, s in client.run(pbd.ipc_stats).items():
        assert s["ipc_blocks"] == 9 and s["fallback_blocks"] == 0 and s["synchronized_fetches"] == 0, (w, s)
    client.run(pbd.close_ipc_handles)
    _check(got, x, y, dtype)
