"""Shared fixtures: the array modules under test, and the GPU marker's skip rule.

Tests marked ``gpu`` (or parametrized with a ``gpu``-marked param) run only where CuPy sees a
CUDA device; everywhere else they are skipped with the reason, never silently passed.
"""
import functools
import os
import threading

import numpy as np
import pytest

# JAX takes 75% of the GPU at its first device use; with pytest-xdist workers, CuPy and torch on
# the same card that starves every other process (seen: 105 GiB held by one worker on an H200)
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")


# CuPy's test files fetched into peer/_upstream/ are loaded by peer/test_cupy_peer.py, not
# collected on their own (a conftest there would shadow this one for `from conftest import`)
collect_ignore_glob = ["peer/_upstream/*"]


@functools.lru_cache(maxsize=None)
def gpu_available() -> bool:
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def gpu_cupy():
    """CuPy where a CUDA device is there; otherwise the calling test is skipped."""
    if not gpu_available():
        pytest.skip("needs CuPy and a CUDA device")
    import cupy
    return cupy


def pytest_collection_modifyitems(config, items):
    if gpu_available():
        return
    skip = pytest.mark.skip(reason="needs CuPy and a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_collection_finish(session):
    """Queue the compile checks' NVRTC work (compile_pool.py) now, so that it runs on every core
    beside the other tests; under pytest-xdist each test compiles on demand instead."""
    if hasattr(session.config, "workerinput"):
        return
    import compile_pool

    modules = dict.fromkeys(m for m in (getattr(i, "module", None) for i in session.items)
                            if m is not None and hasattr(m, "compile_jobs"))
    for module in sorted(modules, key=lambda m: m.__name__):   # the order the tests run in
        compile_pool.start(module.compile_jobs(session.items))


def pytest_sessionfinish(session):
    import compile_pool

    compile_pool.stop()


#: the array modules every API test runs on: NumPy always, CuPy on a GPU machine
XP_PARAMS = [pytest.param("numpy", id="numpy"),
             pytest.param("cupy", id="cupy", marks=pytest.mark.gpu)]


@pytest.fixture(params=XP_PARAMS)
def xp(request):
    if request.param == "cupy":
        import cupy
        return cupy
    return np


def to_host(x):
    """NumPy copy of a NumPy or CuPy array."""
    return x.get() if hasattr(x, "get") and not isinstance(x, np.ndarray) else np.asarray(x)


#: the package's environment variables (settings.py's table): planner tests start with none set
PLANNER_KNOBS = tuple(v for v in __import__("pyblasgemm.settings").settings.VARIABLES
                      if v != "PYBLASGEMM_CACHE_DIR")


@pytest.fixture
def patch_this_thread(monkeypatch):
    """``patch_this_thread(module, name, replacement)``: ``module.name`` is ``replacement`` for
    calls from the test's own thread only. The compile checks' NVRTC work runs in compile_pool's
    threads through the same module functions while other tests run: a plain monkeypatch of
    ``jit._nvrtc`` handed those threads the stand-in (CI with NVRTC 13.5, whose compiles are
    slower, failed 215 compile checks on it)."""
    def patch(module, name, replacement):
        original, owner = getattr(module, name), threading.get_ident()

        @functools.wraps(original)
        def routed(*args, **kwargs):
            chosen = replacement if threading.get_ident() == owner else original
            return chosen(*args, **kwargs)
        monkeypatch.setattr(module, name, routed)
    return patch


@pytest.fixture
def fresh_planner(monkeypatch, tmp_path):
    """The environment's defaults (no PYBLASGEMM_* knob), a private autotune cache directory and
    an empty plan cache; planner test modules use it for every test."""
    import pyblasgemm

    for var in PLANNER_KNOBS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PYBLASGEMM_CACHE_DIR", str(tmp_path / "tune"))
    pyblasgemm.clear_plan_cache()
    yield
    monkeypatch.undo()
    pyblasgemm.clear_plan_cache()
