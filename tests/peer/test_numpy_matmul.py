"""NumPy's own matmul tests, run against ``pyblasgemm.matmul`` on the host.

The tests ship inside the numpy wheel (``numpy/_core/tests/test_multiarray.py``): nothing is
copied or fetched. Their classes read the function under test from a ``matmul`` attribute, so
subclasses with ``matmul = pyblasgemm.matmul`` run every one of them on our function, NumPy's
own results as the reference. Tests that exercise the ``@`` operator or in-place ``@=`` of
ndarray (not a function we provide) are not collected.
"""
import numpy as np
import pytest

import pyblasgemm

_upstream = pytest.importorskip("numpy._core.tests.test_multiarray",
                                reason="this NumPy wheel ships no tests")


class TestNumpyMatmul(_upstream.TestMatmul):
    """Every test of ``numpy.matmul`` (MatmulCommon's shapes, dtypes, out=, errors, empty,
    object/bool delegation) with pyblasgemm.matmul in its place."""

    matmul = staticmethod(pyblasgemm.matmul)


class _NumpyWithOurMatmul:
    """NumPy as the upstream module sees it, but ``np.matmul`` is ours (numpy itself is left
    alone: our matmul hands what it does not accelerate to the real numpy.matmul)."""

    matmul = staticmethod(pyblasgemm.matmul)

    def __getattr__(self, name):
        return getattr(np, name)


def test_matmul_axes_keyword(monkeypatch):
    """NumPy's ``axes=`` test (a module-level function upstream), on our matmul."""
    monkeypatch.setattr(_upstream, "np", _NumpyWithOurMatmul())
    _upstream.test_matmul_axes()


def test_upstream_suite_is_collected():
    """The peer suite is not silently empty: NumPy's class still has its tests."""
    names = [n for n in dir(_upstream.TestMatmul) if n.startswith("test_")]
    assert len(names) >= 15, names
