"""The call path: the plan cache, streams, call signatures, the stateful Matmul, CUDA-graph
capture and other frameworks' arrays. Host tests run in CI; ``gpu`` tests on a GPU machine
(PyTorch and JAX tests need those installed there, as on the device used for the numbers)."""
import io
import threading
from contextlib import redirect_stdout

import types

import numpy as np
import pytest

import pyblasgemm
from pyblasgemm import arrays, streams
from pyblasgemm.plancache import PlanCache

gpu = pytest.mark.gpu


# ---------------------------------------------------------------------------------------------
# host: the plan cache, stream handles, the array door
# ---------------------------------------------------------------------------------------------

def test_plan_cache_is_lru_and_bounded():
    cache = PlanCache(size=3)
    for i in range(3):
        cache.put(("t", i), i)
    assert cache.get(("t", 0)) == 0          # 0 is now the most recent
    cache.put(("t", 3), 3)                   # evicts 1, the least recently used
    assert cache.get(("t", 1)) is None and cache.get(("t", 0)) == 0 and len(cache) == 3
    assert cache.evictions == 1
    cache.set_size(1)
    assert len(cache) == 1 and cache.get(("t", 3)) is None   # 0 was used after 3
    cache.set_size(0)
    cache.put(("t", 9), 9)
    assert len(cache) == 0


def test_plan_cache_info_free_and_bad_size():
    cache = PlanCache(size=8)

    class Owner:
        workspace_nbytes = 4096

    cache.put(("launch", 1), Owner())
    cache.put(("plan", 1), "p")
    info = cache.info()
    assert info["by_kind"] == {"launch": 1, "plan": 1} and info["workspace_bytes"] == 4096
    buf = io.StringIO()
    with redirect_stdout(buf):
        cache.show_info()
    assert "2 / 8 entries" in buf.getvalue() and "4096 B" in buf.getvalue()
    cache.free()
    assert len(cache) == 0 and cache.info()["hits"] == 0
    for bad in (-1, 2.0, "3", True):
        with pytest.raises(ValueError, match="plan cache size"):
            cache.set_size(bad)


def test_a_signature_lives_and_dies_with_the_launch_it_refers_to():
    """A call signature refers to its launch's entry: the signature is evicted first, the launch
    only when nothing refers to it, and removing the launch removes its signatures (their
    memory is the launch's: evicting one entry of two holding it freed nothing)."""
    cache = PlanCache(size=3)

    class Launch:
        workspace_nbytes = 4096

    launch = Launch()
    cache.put(("launch", 1), launch)
    cache.put(("call", "x"), ("sig x", launch), refers_to=launch)
    cache.put(("call", "y"), ("sig y", launch), refers_to=launch)
    cache.put(("plan", 2), "p2")                 # full: the oldest signature goes, not the launch
    assert cache.get(("launch", 1)) is launch and cache.get(("call", "x")) is None
    assert cache.get(("call", "y")) is not None and cache.evictions == 1
    cache.pop(("launch", 1))                     # the launch takes its signature with it
    assert len(cache) == 1 and cache.info()["workspace_bytes"] == 0
    cache.put(("launch", 1), launch)
    cache.put(("call", "y"), ("sig y", launch), refers_to=launch)
    cache.discard_where(lambda k: k[0] == "launch")
    assert cache.get(("call", "y")) is None
    cache.put(("call", "z"), "no launch stored", refers_to=object())   # nothing to refer to: plain
    assert cache.get(("call", "z")) == "no launch stored"


def test_execute_binds_each_launch_once_under_one_key(monkeypatch):
    """execute.launch_for is the one owner of a bound launch: one bind and one cache entry per
    (problem, plan), whatever asks for it again (bind itself keeps nothing)."""
    from types import SimpleNamespace

    from pyblasgemm import execute
    from pyblasgemm.planner.problem import make_desc

    bound = []

    class Launch:
        workspace_nbytes = 512

    def bind(desc, plan):
        bound.append(desc)
        return Launch()

    monkeypatch.setattr(execute, "get_backend", lambda name: SimpleNamespace(bind=bind))
    pyblasgemm.clear_plan_cache()
    desc = make_desc(64, 48, 32, "float16", xp="cupy")
    plan = SimpleNamespace(backend="tensorcore", config=None, pack=())
    first = execute.launch_for(desc, plan)
    assert execute.launch_for(desc, plan) is first and len(bound) == 1
    info = pyblasgemm.get_plan_cache().info()
    assert info["by_kind"] == {"launch": 1} and info["workspace_bytes"] == 512
    pyblasgemm.clear_plan_cache()


def test_plan_cache_size_from_environment(monkeypatch):
    monkeypatch.setenv("PYBLASGEMM_PLAN_CACHE_SIZE", "7")
    assert PlanCache().get_size() == 7
    monkeypatch.setenv("PYBLASGEMM_PLAN_CACHE_SIZE", "-2")
    with pytest.raises(pyblasgemm.settings.SettingError, match="PLAN_CACHE_SIZE"):
        PlanCache().get_size()


def test_plan_cache_threads_never_exceed_the_bound():
    cache = PlanCache(size=50)

    def work(t):
        for i in range(2000):
            cache.put((t, i), i)
            cache.get((t, i // 2))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert len(cache) <= 50


def test_clear_plan_cache_empties_the_shared_cache():
    cache = pyblasgemm.get_plan_cache()
    cache.put(("doc-test", 1), "x")
    pyblasgemm.clear_plan_cache()
    assert cache.get(("doc-test", 1)) is None


class _TorchLikeStream:
    cuda_stream = 1234


class _CoreStream:
    def __cuda_stream__(self):
        return (0, 77)


def test_stream_handles():
    assert streams.handle(None) is None
    assert streams.handle(5) == 5
    assert streams.handle(_TorchLikeStream()) == 1234
    assert streams.handle(_CoreStream()) == 77
    with pytest.raises(ValueError, match="stream=-1"):
        streams.handle(-1)
    with pytest.raises(TypeError, match="stream="):
        streams.handle(3.5)


def test_a_raw_handle_as_a_cupy_stream_without_the_deprecated_class():
    """streams.cupy_stream (streams.on's, the GEMV and float8 launches' stream, bench's events):
    CuPy 14's Stream.from_external, no ExternalStream DeprecationWarning; made without a GPU."""
    cupy = pytest.importorskip("cupy")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        s = streams.cupy_stream(0x1234)
    assert s.ptr == 0x1234 and isinstance(s, cupy.cuda.Stream)


@pytest.mark.parametrize("stream", [None, 0, 7, _CoreStream()])
def test_stream_is_ignored_only_where_nothing_runs_on_a_gpu(stream):
    """NumPy arrays run on the host: a stream changes nothing there, and needs no GPU (a
    stream given with NumPy arrays asked CuPy for its current stream: a CUDARuntimeError on
    a machine without a GPU driver)."""
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    want = a @ a.T
    np.testing.assert_array_equal(pyblasgemm.matmul(a, a.T, stream=stream), want)
    np.testing.assert_array_equal(pyblasgemm.matmul(a, a.T, bias=np.zeros(2, np.float32),
                                                    stream=stream), want)
    np.testing.assert_array_equal(pyblasgemm.gemm("N", "T", a, a, stream=stream), want)
    c = np.full(4, np.nan, np.float32)
    pyblasgemm.sgemm("T", "N", 2, 2, 3, 1.0, a.ravel(), 3, a.ravel(), 3, 0.0, c, 2, stream=stream)
    np.testing.assert_allclose(c.reshape(2, 2, order="F"), want)
    got = pyblasgemm.grouped_matmul([a], [a.T.copy()], stream=stream)[0]
    np.testing.assert_array_equal(got, want)


def test_the_array_door_leaves_numpy_lists_and_scalars_alone():
    assert arrays.framework(np.ones(2)) is None
    assert arrays.framework([1, 2]) is None
    assert arrays.framework(3.0) is None
    assert not arrays.is_foreign(np.ones(2), None, [1.0])


class _HostDLPack:
    """A minimal foreign host array: DLPack only (NumPy's own protocol underneath)."""

    def __init__(self, arr):
        self._arr = arr

    def __dlpack__(self, **kw):
        return self._arr.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self._arr.__dlpack_device__()


def test_dlpack_host_arrays_run_on_the_host():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    got = pyblasgemm.matmul(_HostDLPack(a), _HostDLPack(a.T.copy()))
    np.testing.assert_array_equal(got, a @ a.T)
    got = pyblasgemm.gemm("N", "T", _HostDLPack(a), _HostDLPack(a))
    np.testing.assert_array_equal(got, a @ a.T)


def test_matmul_class_wants_gpu_arrays():
    a = np.ones((4, 4), np.float32)
    with pytest.raises(TypeError, match="CuPy arrays"):
        pyblasgemm.Matmul(a, a)


# ---------------------------------------------------------------------------------------------
# GPU: call signatures
# ---------------------------------------------------------------------------------------------

def _rand(cp, shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    if np.dtype(dtype) == np.int8:
        return cp.asarray(rng.integers(-8, 8, shape).astype(np.int8))
    return cp.asarray(rng.uniform(-1, 1, shape).astype(dtype))


def _ref(a, b):
    return np.matmul(a.get().astype(np.float64), b.get().astype(np.float64))


_TOL = {np.float16: 2e-2, np.float32: 1e-4, np.float64: 1e-12}


def _calls_cached():
    return pyblasgemm.get_plan_cache().info()["by_kind"].get("call", 0)


@gpu
@pytest.mark.parametrize("backend, dtype", [
    (backend, dtype) for backend in (None, "tensorcore", "cublas")
    for dtype in (np.float16, np.float32, np.float64)
    if not (backend == "tensorcore" and dtype == np.float64)])   # no float64 kernels of ours
def test_repeated_matmul_hits_its_signature_and_stays_right(backend, dtype):
    import cupy as cp

    pyblasgemm.clear_plan_cache()
    compute = "tf32" if backend == "tensorcore" and dtype == np.float32 else None
    for shape_a, shape_b in (((64, 96), (96, 40)), ((8, 33, 17), (8, 17, 31)),
                             ((5, 70), (70, 3))):
        for trial in range(3):       # the first call plans, the next two take the signature
            a = _rand(cp, shape_a, dtype, trial)
            b = _rand(cp, shape_b, dtype, trial + 10)
            out = cp.full(np.broadcast_shapes(shape_a[:-2], shape_b[:-2]) + (shape_a[-2], shape_b[-1]),
                          np.nan, dtype)
            got = pyblasgemm.matmul(a, b, backend=backend, compute=compute)
            pyblasgemm.matmul(a, b, out=out, backend=backend, compute=compute)
            tol = 2e-3 if compute == "tf32" else _TOL[dtype]
            np.testing.assert_allclose(got.get(), _ref(a, b), rtol=tol, atol=tol * 8)
            np.testing.assert_array_equal(out.get(), got.get())
    if backend is None:
        assert _calls_cached() >= 2


@gpu
@pytest.mark.parametrize("order", ["C", "F"])
def test_repeated_gemm_replays_its_launch_in_the_order_it_ran(order, monkeypatch):
    """C-ordered operands with a fresh result run as Cᵀ = Bᵀ·Aᵀ (the launch takes (b, a):
    calls.ordered binds that order into Call.run when the call is recorded), F-ordered ones as
    C = A·B (Call.run is the launch itself, or the replay function a launch makes of itself:
    the mma.sync kernel's BoundLaunch.replay, its operand cells bound in the order the problem
    ran): the replays, which enter no full path, give the first call's bits, fresh and into
    out=."""
    import importlib

    import cupy as cp

    from pyblasgemm import calls

    # (the module: the package's attribute ``gemm`` is the function)
    gemm_module = importlib.import_module("pyblasgemm.gemm")
    pyblasgemm.clear_plan_cache()
    a = cp.array(_rand(cp, (64, 96), np.float32, 1), order=order)
    b = cp.array(_rand(cp, (96, 40), np.float32, 2), order=order)
    first = pyblasgemm.gemm("N", "N", a, b)
    np.testing.assert_allclose(first.get(), _ref(a, b), rtol=1e-4, atol=1e-4)
    recorded = calls.last_recorded()
    assert recorded is not None and recorded.swap == (order == "C")
    make_own = getattr(recorded.launch, "replay", None)
    if make_own is not None and make_own(False) is not None:
        assert recorded.run is not recorded.launch and recorded.run.__qualname__ == "BoundLaunch.replay.<locals>.run"
    else:
        assert (recorded.run is recorded.launch) == (order == "F")
    full = []
    real = gemm_module.check_operands

    def counting(*args, **kw):
        full.append(args)
        return real(*args, **kw)

    monkeypatch.setattr(gemm_module, "check_operands", counting)
    outs = []
    for _ in range(3):
        np.testing.assert_array_equal(pyblasgemm.gemm("N", "N", a, b).get(), first.get())
        out = cp.full((64, 40), np.nan, np.float32, order=order)
        assert pyblasgemm.gemm("N", "N", a, b, out=out) is out
        outs.append(out.get())
    assert len(full) == 1                   # the first call with out=; every other one replayed
    np.testing.assert_allclose(outs[0], _ref(a, b), rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(outs[1], outs[0])
    np.testing.assert_array_equal(outs[2], outs[0])


@gpu
def test_each_bound_launch_is_held_under_one_key():
    """After plain, batched and split-k calls of ours and cuBLAS's: every bound launch in the
    plan cache is the value of exactly one entry (a call signature refers to it), and clearing
    the launches leaves no signature holding one."""
    import cupy as cp

    cache = pyblasgemm.get_plan_cache()
    pyblasgemm.clear_plan_cache()
    for backend in ("tensorcore", "cublas"):
        for shape_a, shape_b in (((64, 96), (96, 40)), ((4, 33, 17), (4, 17, 31)), ((32, 8192), (8192, 32))):
            a, b = _rand(cp, shape_a, np.float16), _rand(cp, shape_b, np.float16, 1)
            for _ in range(2):
                pyblasgemm.matmul(a, b, backend=backend)
    launches = [v for k, v in cache._entries.items() if k[0] == "launch"]
    assert launches and "bind" not in cache.info()["by_kind"]
    held = [id(v) for v in cache._entries.values()]
    assert all(held.count(id(v)) == 1 for v in launches)
    cache.discard_where(lambda k: k[0] == "launch")
    assert cache.info()["by_kind"].get("call", 0) == 0 and cache.info()["workspace_bytes"] == 0


@gpu
@pytest.mark.parametrize("word", [np.int32, np.dtype(np.int32), "int32"])
def test_matmul_dtype_keyword_takes_the_signature_path(word, monkeypatch):
    """``matmul(int8, int8, dtype=int32)`` (torch._int_mm's contract) is recorded under its
    dtype word like any call: the next calls go straight to the launch (the planning path is
    not entered again), and stay right."""
    import sys

    import cupy as cp

    pyblasgemm.clear_plan_cache()
    rng = np.random.default_rng(4)
    a_h = rng.integers(-128, 128, (96, 200)).astype(np.int8)
    b_h = rng.integers(-128, 128, (200, 40)).astype(np.int8)
    a, b = cp.asarray(a_h), cp.asarray(b_h)
    want = (a_h.astype(np.int64) @ b_h.astype(np.int64)).astype(np.int32)
    got = pyblasgemm.matmul(a, b, dtype=word)
    assert got.dtype == np.int32 and _calls_cached() == 1
    np.testing.assert_array_equal(got.get(), want)

    def planned_again(*args, **kwargs):
        raise AssertionError("the call left its signature")

    monkeypatch.setattr(sys.modules["pyblasgemm.matmul"], "_batched", planned_again)
    for trial in range(2):
        got = pyblasgemm.matmul(a, b, dtype=word)
        np.testing.assert_array_equal(got.get(), want)


@gpu
def test_signature_path_rechecks_what_the_key_cannot_prove():
    import cupy as cp

    pyblasgemm.clear_plan_cache()
    a = _rand(cp, (64, 64), np.float32)
    b = _rand(cp, (64, 64), np.float32, 1)
    c = cp.empty((64, 64), np.float32)
    pyblasgemm.matmul(a, b, out=c)
    pyblasgemm.matmul(a, b, out=c)                 # cached now
    # out= overlapping an input: NumPy's answer is computed as if from copies
    a2 = a.copy()
    expect = _ref(a2, b)
    pyblasgemm.matmul(a2, b, out=a2)
    np.testing.assert_allclose(a2.get(), expect, rtol=1e-4, atol=1e-4)
    # the raw form: a cached signature, then C overlapping A is refused before any work
    buf = _rand(cp, 64 * 64 * 2, np.float32, 2)
    x, y = buf[: 64 * 64], buf[64 * 64:]
    cbuf = cp.zeros(64 * 64, np.float32)
    for _ in range(2):
        pyblasgemm.sgemm("N", "N", 64, 64, 64, 1.0, x, 64, y, 64, 0.0, cbuf, 64)
    with pytest.raises(ValueError, match="overlaps"):
        pyblasgemm.sgemm("N", "N", 64, 64, 64, 1.0, buf[: 64 * 64], 64, y, 64, 0.0,
                         buf[: 64 * 64], 64)
    # alpha = 0 and NaN scalars leave the signature path for the full one
    cbuf[:] = cp.nan
    pyblasgemm.sgemm("N", "N", 64, 64, 64, 0.0, x, 64, y, 64, 0.0, cbuf, 64)
    assert not cp.isnan(cbuf).any() and float(abs(cbuf).max()) == 0
    cbuf[:] = cp.nan
    pyblasgemm.sgemm("N", "N", 64, 64, 64, 1.0, x, 64, y, 64, -0.0, cbuf, 64)
    assert not cp.isnan(cbuf).any()
    # a float size with a cached int signature is still refused
    with pytest.raises(TypeError, match="integer"):
        pyblasgemm.sgemm("N", "N", 64.0, 64, 64, 1.0, x, 64, y, 64, 0.0, cbuf, 64)
    with pytest.raises(pyblasgemm.BlasArgumentError):
        pyblasgemm.sgemm("N", "N", 64, 64, 64, 1e39, x, 64, y, 64, 0.0, cbuf, 64)
    # gemm: beta is honoured on the cached path too
    out = cp.ones((64, 64), np.float32)
    for _ in range(2):
        out[:] = 1
        pyblasgemm.gemm("N", "N", a, b, out=out, alpha=2.0, beta=3.0)
    np.testing.assert_allclose(out.get(), 2 * _ref(a, b) + 3, rtol=1e-4, atol=1e-3)


@gpu
def test_no_plan_cache_means_no_signatures(monkeypatch):
    import cupy as cp

    monkeypatch.setenv("PYBLASGEMM_NO_PLAN_CACHE", "1")
    pyblasgemm.clear_plan_cache()
    a = _rand(cp, (32, 32), np.float16)
    for _ in range(2):
        pyblasgemm.matmul(a, a)
    assert _calls_cached() == 0
    monkeypatch.delenv("PYBLASGEMM_NO_PLAN_CACHE")
    pyblasgemm.clear_plan_cache()


@gpu
def test_a_small_plan_cache_still_computes_right():
    import cupy as cp

    cache = pyblasgemm.get_plan_cache()
    old = cache.get_size()
    cache.set_size(2)
    try:
        for n in (16, 24, 40, 16, 24, 40):
            a = _rand(cp, (n, n), np.float32, n)
            np.testing.assert_allclose(pyblasgemm.matmul(a, a).get(), _ref(a, a), rtol=1e-4,
                                       atol=1e-4)
        assert len(cache) <= 2
    finally:
        cache.set_size(old)


# ---------------------------------------------------------------------------------------------
# GPU: streams
# ---------------------------------------------------------------------------------------------

@gpu
@pytest.mark.parametrize("backend", ["tensorcore", "cublas"])
def test_stream_argument_orders_the_work_on_that_stream(backend):
    import cupy as cp

    s = cp.cuda.Stream(non_blocking=True)
    a = _rand(cp, (256, 256), np.float16)
    b = _rand(cp, (256, 256), np.float16, 1)
    cp.cuda.Device().synchronize()
    outs = []
    for how in (s, s.ptr):
        c = cp.empty((256, 256), np.float16)
        for _ in range(2):
            pyblasgemm.matmul(a, b, out=c, backend=backend, stream=how)
            r = pyblasgemm.gemm("N", "N", a, b, backend=backend, stream=how)
        s.synchronize()
        outs += [c, r]
    for c in outs:
        np.testing.assert_allclose(c.get().astype(np.float64), _ref(a, b), rtol=2e-2, atol=5e-2)
    with s:     # the default is CuPy's current stream
        d = pyblasgemm.matmul(a, b, backend=backend)
    s.synchronize()
    np.testing.assert_array_equal(d.get(), outs[0].get())


# ---------------------------------------------------------------------------------------------
# GPU: the stateful form
# ---------------------------------------------------------------------------------------------

@gpu
@pytest.mark.parametrize("backend", [None, "tensorcore", "cublas"])
def test_matmul_object_runs_new_arrays_of_the_same_layout(backend):
    import cupy as cp

    a = _rand(cp, (4, 96, 64), np.float16)
    b = _rand(cp, (4, 64, 80), np.float16, 1)
    c = cp.full((4, 96, 80), np.nan, np.float16)
    with pyblasgemm.Matmul(a, b, out=c, backend=backend) as mm:
        assert mm.execute() is c
        np.testing.assert_allclose(c.get().astype(np.float64), _ref(a, b), rtol=2e-2, atol=5e-2)
        a2 = _rand(cp, (4, 96, 64), np.float16, 7)
        c2 = cp.empty_like(c)
        assert mm.execute(a=a2, c=c2) is c2
        np.testing.assert_allclose(c2.get().astype(np.float64), _ref(a2, b), rtol=2e-2,
                                   atol=5e-2)
        with pytest.raises(ValueError, match="strides"):
            mm.execute(a=cp.asfortranarray(a2))
        big = cp.empty(4 * 96 * 80, np.float16)        # a3 and c3 share their first bytes
        a3, c3 = big[: 4 * 96 * 64].reshape(4, 96, 64), big.reshape(4, 96, 80)
        with pytest.raises(ValueError, match="overlaps"):
            mm.execute(a=a3, c=c3)
    assert mm.a is None
    with pytest.raises(ValueError, match="dtype"):
        pyblasgemm.Matmul(a, b, out=cp.empty((4, 96, 80), np.float32))


@gpu
def test_matmul_object_refuses_what_needs_copies():
    import cupy as cp

    a = _rand(cp, (64, 64), np.float32)[:, ::2]       # columns two apart: no BLAS layout
    b = _rand(cp, (32, 64), np.float32, 1)
    with pytest.raises(ValueError, match="one launch"):
        pyblasgemm.Matmul(a, b)


# ---------------------------------------------------------------------------------------------
# GPU: CUDA-graph capture
# ---------------------------------------------------------------------------------------------

@gpu
@pytest.mark.parametrize("n", [64, 4096])
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("backend", [None, "tensorcore", "cublas"])
def test_cupy_graph_capture_replays_the_eager_bits(n, dtype, backend):
    import cupy as cp

    compute = "tf32" if backend == "tensorcore" and dtype == np.float32 else None
    a = _rand(cp, (n, n), dtype)
    b = _rand(cp, (n, n), dtype, 1)
    s = cp.cuda.Stream(non_blocking=True)
    c = cp.empty((n, n), dtype)
    d = cp.empty((n, n), dtype)
    with s:
        eager = pyblasgemm.matmul(a, b, backend=backend, compute=compute)      # warm-up
        pyblasgemm.gemm("N", "T", a, b, out=d, backend=backend, compute=compute)
        eager_d = d.copy()
        s.synchronize()
        c[:] = cp.nan
        d[:] = cp.nan
        s.begin_capture()
        pyblasgemm.matmul(a, b, out=c, backend=backend, compute=compute)
        pyblasgemm.gemm("N", "T", a, b, out=d, backend=backend, compute=compute)
        graph = s.end_capture()
        assert bool(cp.isnan(c[0, 0]))          # captured, not run
        graph.launch(s)
        s.synchronize()
    np.testing.assert_array_equal(c.get(), eager.get())
    np.testing.assert_array_equal(d.get(), eager_d.get())


@gpu
def test_torch_graph_capture_of_torch_tensors():
    torch = pytest.importorskip("torch")
    a = torch.randn(256, 256, device="cuda", dtype=torch.float16)
    b = torch.randn(256, 256, device="cuda", dtype=torch.float16)
    c = torch.empty(256, 256, device="cuda", dtype=torch.float16)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        for _ in range(2):
            pyblasgemm.matmul(a, b, out=c)
    torch.cuda.synchronize()
    eager = c.clone()
    c.fill_(float("nan"))
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=side):
        pyblasgemm.matmul(a, b, out=c)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(c, eager)


# ---------------------------------------------------------------------------------------------
# GPU: other frameworks' arrays
# ---------------------------------------------------------------------------------------------

@gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_torch_cuda_tensors_in_torch_out(dtype):
    torch = pytest.importorskip("torch")
    td = getattr(torch, dtype)
    a = torch.randn(4, 48, 32, device="cuda", dtype=td)
    b = torch.randn(4, 32, 40, device="cuda", dtype=td)
    ref = torch.matmul(a.double(), b.double())
    tol = 1e-4 if dtype == "float32" else 5e-2
    for _ in range(2):
        got = pyblasgemm.matmul(a, b)
        assert type(got) is torch.Tensor and got.is_cuda and got.dtype == td
        torch.testing.assert_close(got.double(), ref, rtol=tol, atol=tol * 4)
    out = torch.empty(4, 48, 40, device="cuda", dtype=td)
    assert pyblasgemm.matmul(a, b, out=out) is out
    torch.testing.assert_close(out.double(), ref, rtol=tol, atol=tol * 4)
    g = pyblasgemm.gemm("N", "T", a[0], b[0].T.contiguous())
    assert type(g) is torch.Tensor
    torch.testing.assert_close(g.double(), ref[0], rtol=tol, atol=tol * 4)


@gpu
def test_torch_raw_form_and_requires_grad_and_cpu():
    torch = pytest.importorskip("torch")
    a = torch.randn(16 * 8, device="cuda", dtype=torch.float16, requires_grad=True)
    b = torch.randn(8 * 12, device="cuda", dtype=torch.float16)
    c = torch.zeros(16 * 12, device="cuda", dtype=torch.float16)
    assert pyblasgemm.hgemm("N", "N", 16, 12, 8, 1.0, a, 16, b, 8, 0.0, c, 16) is c
    ref = a.detach().double().reshape(8, 16).T @ b.double().reshape(12, 8).T
    torch.testing.assert_close(c.double().reshape(12, 16).T, ref, rtol=5e-2, atol=5e-2)
    x = torch.randn(5, 7)                                  # CPU tensors run on the host
    y = pyblasgemm.matmul(x, x.T)
    assert type(y) is torch.Tensor and not y.is_cuda
    torch.testing.assert_close(y, x @ x.T, rtol=1e-5, atol=1e-5)
    with pytest.raises(TypeError, match="host and on the GPU"):
        pyblasgemm.matmul(x, x.cuda())


@gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_torch_fused_call_replays_its_launch_on_torch_memory(dtype, monkeypatch):
    """A repeated bias+activation call on CUDA tensors skips the array door (its launch on the
    tensors' pointers, the result from torch's allocator) and gives the first call's bits."""
    torch = pytest.importorskip("torch")
    td = getattr(torch, dtype)
    x = torch.randn(33, 64, device="cuda", dtype=td)
    w = torch.randn(40, 64, device="cuda", dtype=td)
    bias = torch.randn(40, device="cuda", dtype=td)
    first = pyblasgemm.matmul(x, w.T, bias=bias, activation="gelu")
    ref = torch.nn.functional.gelu(x.double() @ w.double().T + bias.double())
    torch.testing.assert_close(first.double(), ref, rtol=3e-2, atol=3e-2)
    assert "not fused" not in pyblasgemm.epilogue.last_route()     # fp16/bf16 fuse on sm_80+

    def no_door(*args, **kwargs):
        raise AssertionError("the repeated fused call went through the array door")

    monkeypatch.setattr(arrays, "convert", no_door)
    before = torch.cuda.memory_allocated()
    again = pyblasgemm.matmul(x, w.T, bias=bias, activation="gelu")
    assert type(again) is torch.Tensor and again.dtype == td and again.shape == first.shape
    assert torch.cuda.memory_allocated() > before        # torch's allocator made the result
    assert torch.equal(again, first)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):                         # on torch's current stream
        on_side = pyblasgemm.matmul(x, w.T, bias=bias, activation="gelu")
    side.synchronize()
    assert torch.equal(on_side, first)


@gpu
def test_matmul_object_on_tensors_launches_on_torchs_current_stream(monkeypatch):
    torch = pytest.importorskip("torch")
    a = torch.randn(48, 64, device="cuda", dtype=torch.float16)
    b = torch.randn(64, 40, device="cuda", dtype=torch.float16)
    mm = pyblasgemm.Matmul(a, b)
    out = mm.execute()
    torch.cuda.synchronize()
    first = out.clone()
    torch.testing.assert_close(first.double(), a.double() @ b.double(), rtol=2e-2, atol=5e-2)

    def no_door(*args, **kwargs):
        raise AssertionError("execute() went through the array door")

    monkeypatch.setattr(arrays, "convert", no_door)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out.zero_()
        assert mm.execute() is out            # queued behind the zeroing, on the same stream
    side.synchronize()
    assert torch.equal(out, first)


@gpu
def test_a_replay_recorded_under_no_grad_never_detaches_a_later_grad_call():
    torch = pytest.importorskip("torch")
    x = torch.randn(8, 16, device="cuda", dtype=torch.float32)
    w = torch.randn(16, 16, device="cuda", dtype=torch.float32, requires_grad=True)
    b = torch.randn(16, device="cuda", dtype=torch.float32)
    with torch.no_grad():
        for _ in range(2):                               # recorded, and replayed
            pyblasgemm.matmul(x, w)
            pyblasgemm.matmul(x, w, bias=b, activation="relu")
    y = pyblasgemm.matmul(x, w)
    z = pyblasgemm.matmul(x, w, bias=b, activation="relu")
    assert y.grad_fn is not None and z.grad_fn is not None
    (y.sum() + z.sum()).backward()
    want = x.T @ torch.ones(8, 16, device="cuda")       # d(sum(x @ w))/dw
    relu_part = x.T @ (x @ w.detach() + b > 0).float()
    torch.testing.assert_close(w.grad, want + relu_part, rtol=1e-4, atol=1e-3)


@gpu
def test_jax_gpu_arrays_in_jax_out():
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    gpus = [d for d in jax.devices() if d.platform == "gpu"]
    if not gpus:
        pytest.skip("JAX sees no GPU here")
    a = jax.device_put(jnp.asarray(np.random.default_rng(0).uniform(-1, 1, (64, 48)),
                                   dtype=jnp.float32), gpus[0])
    b = jax.device_put(jnp.asarray(np.random.default_rng(1).uniform(-1, 1, (48, 40)),
                                   dtype=jnp.float32), gpus[0])
    got = pyblasgemm.matmul(a, b)
    assert isinstance(got, jax.Array) and list(got.devices())[0].platform == "gpu"
    np.testing.assert_allclose(np.asarray(got), np.asarray(a, np.float64) @ np.asarray(b, np.float64),
                               rtol=1e-4, atol=1e-4)
    with pytest.raises(TypeError, match="immutable"):
        pyblasgemm.matmul(a, b, out=a)
    h = pyblasgemm.matmul(a.astype(jnp.bfloat16), b.astype(jnp.bfloat16))
    assert h.dtype == jnp.bfloat16 and isinstance(h, jax.Array)
    np.testing.assert_allclose(np.asarray(h, np.float32), np.asarray(got), rtol=3e-2, atol=3e-2)
    # matmul runs inside XLA (pyblasgemm.jax); the forms on views give their results back
    # through jaxlib's import called directly (arrays._JaxImport), not retired
    g = pyblasgemm.gemm("N", "N", a, b)
    assert isinstance(g, jax.Array)
    np.testing.assert_allclose(np.asarray(g), np.asarray(got), rtol=1e-5, atol=1e-5)
    assert arrays._JAX_IMPORT.usable is True and "float32" not in arrays._JAX_IMPORT.retired


@gpu
def test_a_jax_result_owns_its_memory_after_cupy_lets_go():
    """The array JAX gets holds the CuPy buffer (the DLPack capsule's reference): CuPy's pool,
    emptied and refilled, must not change it; float16 / float32 results keep their bits."""
    jax = pytest.importorskip("jax")
    cp = pytest.importorskip("cupy")
    import gc

    jnp = jax.numpy
    gpus = [d for d in jax.devices() if d.platform == "gpu"]
    if not gpus:
        pytest.skip("JAX sees no GPU here")
    for dtype in (jnp.float16, jnp.float32):
        a = jax.device_put(jnp.arange(64 * 32, dtype=jnp.float32).reshape(64, 32) / 1000, gpus[0]).astype(dtype)
        b = jax.device_put(jnp.eye(32, dtype=dtype), gpus[0])
        got = pyblasgemm.matmul(a, b)
        want = np.asarray(a)
        gc.collect()
        cp.get_default_memory_pool().free_all_blocks()
        junk = [cp.full((64, 32), 7, dtype=np.dtype(dtype)) for _ in range(64)]   # reuse the pool
        cp.cuda.Device().synchronize()
        assert got.dtype == dtype and np.array_equal(np.asarray(got), want), dtype
        del junk


def test_jax_import_retires_on_anything_unexpected(monkeypatch):
    """_JaxImport.take returns None (the public route) for a dtype JAX may narrow, for a jaxlib
    without the import, after the import raised, and when it made the wrong array; a dtype
    once retired is never tried again, the others still are."""
    class FakeResult:
        def __init__(self, dtype):
            self.dtype, self.shape = np.dtype(dtype), (2, 2)
            self.device = types.SimpleNamespace(id=0)

        def __dlpack__(self, stream=None):
            return ("capsule", stream)

    class FakeArray:
        def __init__(self, dtype, shape):
            self.dtype, self.shape = np.dtype(dtype), shape

    def fresh(import_fn, setup_ok=True):
        imp = arrays._JaxImport()

        def setup():
            imp._import, imp._array_type = import_fn, FakeArray
            return setup_ok
        monkeypatch.setattr(imp, "_setup", setup)
        monkeypatch.setattr(imp, "_device", lambda ordinal: ("dev", 77))
        return imp

    ok = fresh(lambda capsule, dev, stream, copy, kind: FakeArray("float32", (2, 2)))
    assert isinstance(ok.take(FakeResult("float32")), FakeArray) and ok.usable is True
    assert ok.take(FakeResult("float64")) is None and ok.usable is True      # public route, not retired
    assert fresh(None, setup_ok=False).take(FakeResult("float32")) is None

    def boom(*args):
        raise TypeError("a new signature")
    bad = fresh(boom)
    assert bad.take(FakeResult("bfloat16")) is None and bad.retired == {"bfloat16"}
    bad._import = lambda *args: FakeArray("float16", (2, 2))
    assert bad.take(FakeResult("bfloat16")) is None                          # retired for good
    assert isinstance(bad.take(FakeResult("float16")), FakeArray)            # the others still go
    wrong = fresh(lambda *args: FakeArray("float16", (2, 2)))
    assert wrong.take(FakeResult("float32")) is None and wrong.retired == {"float32"}


# ---------------------------------------------------------------------------------------------
# the plan carries its launch (kernels/spec.py)
# ---------------------------------------------------------------------------------------------

_SPEC_CASES = [  # (m, n, k, dtype, compute, trans, batch, align, arch): every family and decomposition
    (1000, 1000, 4096, "float16", None, "NN", 1, 16, "sm_80"),
    (64, 64, 65536, "bfloat16", None, "TN", 1, 16, "sm_80"),        # long K: split or stream
    (333, 517, 129, "float16", None, "NT", 3, 2, "sm_80"),          # unaligned, batched
    (8192, 8192, 8192, "float32", "3xtf32", "NN", 1, 16, "sm_90"),  # Hopper prep kind
    (4096, 4096, 4096, "int8", None, "TN", 1, 16, "sm_90"),
    (2048, 96, 8192, "float16", None, "NN", 1, 16, "sm_90"),
]


@pytest.mark.parametrize("m, n, k, dtype, compute, trans, batch, align, arch", _SPEC_CASES)
def test_plan_carries_the_launch_spec_its_numbers_come_from(m, n, k, dtype, compute, trans, batch,
                                                            align, arch):
    from pyblasgemm.kernels.geometry import launch_geometry
    from pyblasgemm.kernels.spec import problem_class
    from pyblasgemm.planner.candidates import kernel_problem_for

    p = pyblasgemm.plan(m, n, k, dtype, compute=compute, transa=trans[0], transb=trans[1],
                        batch=batch, align=align, backend="tensorcore", arch=arch)
    spec = p.launch
    assert spec is not None and spec.config == p.config
    assert (p.grid, p.splits, p.workspace_bytes) == (spec.grid, spec.splits, spec.workspace_bytes)
    prob = kernel_problem_for(p.problem)
    winner = next(c for c in p.candidates if c.config == p.config and c.score is not None)
    assert spec.sm_count == p.arch.sm_count
    assert spec.occupancy == (1 if p.config.family == "sm90a" else winner.score.occupancy)
    assert dict(spec.geometry) == launch_geometry(prob, p.config, spec.sm_count, spec.occupancy)
    assert spec.problem_class == problem_class(prob)
    assert spec.smem == p.config.smem_bytes(prob.kind) and spec.block == p.config.threads
    args = spec.args
    assert args["splits"] == spec.splits and args["sk_tiles"] == spec.geometry["sk_tiles"]
    assert args["alpha"] == args["beta"] == 0 and args["c"] == 0          # per call, not planned
    if p.config.family == "sm90a":         # the Hopper kernel's tiles run over (n, m)
        assert (args["mt"], args["nt"], args["batch"]) == (n, m, batch)
    else:
        assert (args["m"], args["n"], args["k"], args["lda"]) == (m, n, k, prob.lda)
    assert (spec.red_args is not None) == (p.config.decomposition == "splitk_parallel")
    from dataclasses import replace
    from types import MappingProxyType

    moved = replace(spec, geometry=MappingProxyType(dict(spec.geometry, grid=(1, 1, 1))))
    assert spec.same_as(spec) and not spec.same_as(moved)


def test_cublas_and_host_plans_carry_no_kernel_spec():
    assert pyblasgemm.plan(64, 64, 64, "float64").launch is None
    assert pyblasgemm.plan(4096, 4096, 4096, "float16", backend="cublas").launch is None


@gpu
@pytest.mark.parametrize("m, n, k, dtype, compute, trans, batch, align, decomposition", [
    (1000, 1000, 4096, "float16", None, "NN", 1, 2, None),            # mma.sync split-k
    (64, 64, 65536, "bfloat16", None, "TN", 1, 2, None),
    (333, 517, 129, "float16", None, "NT", 3, 2, None),               # mma.sync sliced, batched
    (1000, 1000, 4096, "float16", None, "NN", 1, 2, "streamk"),       # occupancy from the driver
    (1000, 1000, 4096, "float16", None, "NN", 1, 16, "streamk"),      # Hopper stream-k
    (8192, 8192, 8192, "float32", "3xtf32", "NN", 1, 16, None),       # Hopper prep kind
    (4096, 4096, 4096, "int8", None, "TN", 1, 16, None),
    (2048, 96, 8192, "float16", None, "NN", 1, 16, None)])
def test_the_bound_launch_runs_the_plans_spec(monkeypatch, m, n, k, dtype, compute, trans, batch,
                                              align, decomposition):
    from pyblasgemm.execute import launch_for

    if decomposition:
        monkeypatch.setenv("PYBLASGEMM_DECOMPOSITION", decomposition)
    p = pyblasgemm.plan(m, n, k, dtype, compute=compute, transa=trans[0], transb=trans[1],
                        batch=batch, align=align, backend="tensorcore")
    launch = launch_for(p.problem, p)
    if p.config.decomposition in ("streamk", "hybrid") or p.config.cluster > 1:
        # only fewer co-resident CTAs than planned may change it (kernels/spec.py)
        assert launch.spec.config == p.config
        assert launch.spec.grid[0] <= p.launch.grid[0]
        assert launch.spec.occupancy <= p.launch.occupancy
    else:
        assert launch.spec.same_as(p.launch)
    assert launch.geometry == dict(launch.spec.geometry)


@gpu
def test_bind_refuses_a_spec_of_another_class():
    from pyblasgemm.kernels.launch import bind
    from pyblasgemm.planner.candidates import kernel_problem_for

    p = pyblasgemm.plan(256, 256, 256, "float16", backend="tensorcore")
    q = pyblasgemm.plan(256, 256, 512, "float16", backend="tensorcore")
    with pytest.raises(ValueError, match="problem class"):
        bind(kernel_problem_for(q.problem), spec=p.launch)


@gpu
@pytest.mark.parametrize("case", ["float16", "float16 -> float32 on cuBLASLt", "float32", "float16 unaligned"])
def test_a_fresh_thread_without_a_cuda_context_runs_every_launch(case):
    """A new thread that has made no CUDA runtime call has no current context, and CuPy serves
    its output from the pool without making one: our driver-API launches failed there with
    CUDA_ERROR_INVALID_CONTEXT (H100, Dask's threaded scheduler). Each route, warmed on this
    thread, then called from a fresh one, gives this thread's bits."""
    cupy = pytest.importorskip("cupy")
    rng = cupy.random.RandomState(3)
    dtype = cupy.float32 if case == "float32" else cupy.float16
    a = rng.standard_normal((301, 520), dtype=cupy.float32).astype(dtype)
    b = rng.standard_normal((520, 260), dtype=cupy.float32).astype(dtype)
    if case.endswith("unaligned"):          # 2-byte offsets: the packed route
        a, b = a[1:, 1:], b[1:, 1:]
    kw = {"dtype": cupy.float32, "backend": "cublas"} if "cuBLASLt" in case else {}
    first = pyblasgemm.matmul(a, b, **kw)
    want = cupy.asnumpy(first)
    del first                               # its block returns to the pool for the thread's output
    got = {}

    def fresh_thread():
        try:
            got["z"] = cupy.asnumpy(pyblasgemm.matmul(a, b, **kw))
        except Exception as e:              # reported below, on the test's thread
            got["error"] = e

    worker = threading.Thread(target=fresh_thread)
    worker.start()
    worker.join()
    assert "error" not in got, repr(got.get("error"))
    np.testing.assert_array_equal(got["z"], want)


@gpu
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_concurrent_first_calls_from_many_threads_give_the_serial_bits(dtype):
    """Eight threads making the first calls of four problem classes at once, with an empty plan
    cache (so the launches and their per-stream workspace are made under contention): every
    result is the serial one. cuBLASLt's workspace was once made twice, and the loser's, freed
    to CuPy's pool before its matmul was queued, became another call's output (wrong float32
    blocks under Dask's threaded scheduler, H100)."""
    cupy = pytest.importorskip("cupy")
    from concurrent.futures import ThreadPoolExecutor

    from pyblasgemm.plancache import get_plan_cache

    rng = cupy.random.RandomState(5)
    shapes = [(100, 125, 64), (200, 125, 136), (100, 125, 136), (200, 125, 64)]
    pairs = [(rng.standard_normal((m, k), dtype=cupy.float32).astype(dtype),
              rng.standard_normal((k, n), dtype=cupy.float32).astype(dtype)) for m, k, n in shapes]
    serial = [cupy.asnumpy(pyblasgemm.matmul(a, b)) for a, b in pairs]
    get_plan_cache().free()
    work = [i % len(pairs) for i in range(64)]
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda i: pyblasgemm.matmul(*pairs[i]), work))
    cupy.cuda.Device().synchronize()
    for i, z in zip(work, results):
        np.testing.assert_array_equal(cupy.asnumpy(z), serial[i])


def test_jax_host_arrays_make_no_replay_key():
    """A JAX CPU array runs on the host: the key builder gives none (no launch to replay, and
    no CUDA device to ask for)."""
    jax = pytest.importorskip("jax")
    from pyblasgemm import calls

    a = jax.numpy.ones((4, 4), jax.numpy.float32)
    if list(a.devices())[0].platform == "gpu":
        pytest.skip("JAX's default device is a GPU here")
    assert arrays.jax_type() is type(a)
    assert calls.key(("doc",), a, a) is None
    assert calls.key(("doc",), a, a, np.ones((4, 4))) is None


@gpu
def test_a_repeated_jax_call_replays_its_launch(monkeypatch):
    """matmul on JAX GPU arrays is an XLA operation (pyblasgemm.jax): the second call with the
    same signature replays the launch its first run recorded (no full path, no array door),
    gives the first call's bits, and new arrays of the same signature replay too."""
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    from pyblasgemm import jax as pbj

    gpus = [d for d in jax.devices() if d.platform == "gpu"]
    if not gpus:
        pytest.skip("JAX sees no GPU here")
    rng = np.random.default_rng(3)
    for dtype in (jnp.float16, jnp.bfloat16, jnp.float32):
        a = jax.device_put(jnp.asarray(rng.uniform(-1, 1, (96, 80)), dtype=dtype), gpus[0])
        b = jax.device_put(jnp.asarray(rng.uniform(-1, 1, (80, 72)), dtype=dtype), gpus[0])
        first = pyblasgemm.matmul(a, b)

        def no_door(*args, **kwargs):
            raise AssertionError("the replay went through the array door")
        full_runs = []
        full = pbj._Callback._full

        def counting(self, *args):
            full_runs.append(args)
            return full(self, *args)
        with monkeypatch.context() as m:
            m.setattr(arrays, "convert", no_door)
            m.setattr(pbj._Callback, "_full", counting)
            again = [pyblasgemm.matmul(a, b) for _ in range(3)]
            # new arrays of the same signature (other buffers) replay too
            a2 = jax.device_put(jnp.asarray(rng.uniform(-1, 1, (96, 80)), dtype=dtype), gpus[0])
            other = pyblasgemm.matmul(a2, b)
            jax.block_until_ready(other)
        assert not full_runs, dtype
        for x in again:
            assert isinstance(x, jax.Array) and x.dtype == first.dtype
            assert np.array_equal(np.asarray(x), np.asarray(first)), dtype
        ref = np.asarray(a2, np.float64) @ np.asarray(b, np.float64)
        tol = 1e-4 if dtype == jnp.float32 else 3e-2
        np.testing.assert_allclose(np.asarray(other, np.float64), ref, rtol=tol, atol=tol)
        # another shape: a new trace and its own first run (and right)
        c = pyblasgemm.matmul(a[:50], b)
        np.testing.assert_allclose(np.asarray(c, np.float64), np.asarray(a[:50], np.float64)
                                   @ np.asarray(b, np.float64), rtol=tol, atol=tol)
