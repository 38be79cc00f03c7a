"""CuPy's own matmul and ``cupy.cublas.gemm`` tests, run against pyblasgemm on the GPU.

CuPy's test files (``tests/cupy_tests/math_tests/test_matmul.py`` and
``tests/cupy_tests/test_cublas.py`` of the installed CuPy's release) are not in the CuPy wheel
and not copied here: ``python tools/fetch_peer_tests.py`` puts them under
``tests/peer/_upstream/cupy-<version>/`` (git-ignored). This module loads them and runs every
in-scope test with ``cupy.matmul`` routed to :func:`pyblasgemm.matmul` and ``cupy.cublas.gemm``
to :func:`pyblasgemm.gemm`; NumPy, the reference side of CuPy's tests, is untouched.

Out of scope, excluded by name (``test_out_of_scope`` lists each, skipped with its reason): the
other cuBLAS routines of ``test_cublas.py`` (batched gesv, level-1, gemv, sbmv, ger, syrk,
dgmm) and ``geam`` (matrix addition, not a product).
"""
import importlib.util
import sys
import threading
from pathlib import Path

import pytest

import pyblasgemm

pytestmark = pytest.mark.gpu

UPSTREAM = Path(__file__).resolve().parent / "_upstream"

#: test classes of test_cublas.py that test other cuBLAS routines than gemm
OUT_OF_SCOPE_CLASSES = {
    "TestBatchedGesv": "batched gesv (a solver, not a GEMM)",
    "TestLevel1Functions": "cuBLAS level-1 routines (iamax, dot, axpy...)",
    "TestGemv": "gemv (matrix-vector, not routed)",
    "TestSbmv": "sbmv (banded matrix-vector)",
    "TestGer": "ger (rank-1 update)",
    "TestSyrk": "syrk (symmetric rank-k update)",
    "TestDgmm": "dgmm (diagonal scaling)",
}
#: test methods, in the gemm test class, of other routines
OUT_OF_SCOPE_METHODS = {"test_geam": "geam (matrix addition)",
                        "test_geam_out": "geam (matrix addition)"}


def _upstream_dir():
    try:
        import cupy
    except ImportError:
        return None
    return UPSTREAM / f"cupy-{cupy.__version__}"


def _load(path: Path):
    name = f"_cupy_peer_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module        # CuPy's parameterize registers classes in the module
    spec.loader.exec_module(module)
    return module


def _export(module) -> list:
    """Put the module's in-scope test classes into this module's namespace (pytest collects
    them); out-of-scope classes are left out and out-of-scope methods set to None (pytest
    collects no attribute that is not callable). Both are listed by test_out_of_scope."""
    names = []
    for name, obj in list(vars(module).items()):
        if not (name.startswith("Test") and isinstance(obj, type)):
            continue
        if name.split("_param_")[0] in OUT_OF_SCOPE_CLASSES:
            continue
        dropped = {m: None for m in OUT_OF_SCOPE_METHODS if hasattr(obj, m)}
        exported = type(name, (obj,), dropped) if dropped else obj
        if name in globals():
            raise RuntimeError(f"two upstream test classes named {name}")
        globals()[name] = exported      # pytest collects classes named Test*
        names.append(name)
    return names


_DIR = _upstream_dir()
_FOUND = _DIR is not None and all((_DIR / f).exists() for f in ("test_matmul.py", "test_cublas.py"))
_EXPORTED = []
if _FOUND:
    _EXPORTED = _export(_load(_DIR / "test_matmul.py")) + _export(_load(_DIR / "test_cublas.py"))


def test_upstream_files_present():
    """On a GPU machine the peer suite must run: fail (not skip) when its files are missing."""
    assert _FOUND, (f"CuPy's test files are not in {_DIR}: run `python tools/fetch_peer_tests.py`"
                    f" (or with --git <cupy clone>) first")
    assert len(_EXPORTED) >= 10, _EXPORTED


@pytest.mark.parametrize("name, reason", sorted({**OUT_OF_SCOPE_CLASSES,
                                                **OUT_OF_SCOPE_METHODS}.items()))
def test_out_of_scope(name, reason):
    """The upstream tests not run here, each named with the reason (shown under -ra)."""
    pytest.skip(f"CuPy's {name}: out of scope for pyblasgemm: {reason}")


class _Router:
    """Routes calls of a CuPy function to pyblasgemm's; calls made while pyblasgemm is already
    running (it hands dtypes it does not accelerate to cupy.matmul) go to CuPy's original."""

    def __init__(self, original, ours):
        self.original, self.ours, self.local = original, ours, threading.local()
        self.calls = 0

    def __call__(self, *args, **kwargs):
        if getattr(self.local, "inside", False):
            return self.original(*args, **kwargs)
        self.local.inside = True
        self.calls += 1
        try:
            return self.ours(*args, **kwargs)
        finally:
            self.local.inside = False


@pytest.fixture(autouse=True)
def route_cupy_to_pyblasgemm(monkeypatch):
    import cupy
    import cupy.cublas

    matmul = _Router(cupy.matmul, pyblasgemm.matmul)
    gemm = _Router(cupy.cublas.gemm, pyblasgemm.gemm)
    monkeypatch.setattr(cupy, "matmul", matmul)
    monkeypatch.setattr(cupy.cublas, "gemm", gemm)
    yield matmul, gemm


def test_routing_reaches_pyblasgemm(route_cupy_to_pyblasgemm):
    """The routing is real: a cupy.matmul call in this module runs pyblasgemm.matmul."""
    import cupy

    matmul, gemm = route_cupy_to_pyblasgemm
    a = cupy.ones((3, 4), dtype=cupy.float16)
    cupy.matmul(a, a.T)
    cupy.cublas.gemm("N", "H", a.astype(cupy.float32), a.astype(cupy.float32))
    assert matmul.calls == 1 and gemm.calls == 1
