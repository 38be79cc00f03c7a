"""The public interface's words (issue 35, items 4 and 7): the ecosystem's aliases for compute
modes and backends."""
import numpy as np
import pytest

import pyblasgemm
from pyblasgemm._types import COMPUTE_ALIASES, TYPE_ROWS, resolve_compute
from pyblasgemm.desc import BACKEND_ALIASES, check_backend


# --- aliases (item 7): one table row each, resolved where the names are checked -------------

@pytest.mark.parametrize("alias,prefix,mode", [
    ("tf32x3", "s", "3xtf32"), ("TF32X3", "c", "3xtf32"), ("ieee", "s", "fp32"),
    ("ieee", "d", "fp64"), ("highest", "z", "fp64"), ("highest", "h", "fp32"),
    ("high", "s", "3xtf32"), ("high", "c", "3xtf32")])
def test_compute_aliases_name_the_rows_modes(alias, prefix, mode):
    assert resolve_compute(TYPE_ROWS[prefix], alias, "sgemm") == mode


@pytest.mark.parametrize("alias,prefix", [("high", "d"), ("tf32x3", "d"), ("ieee", "i")])
def test_an_alias_without_a_mode_for_the_type_is_refused(alias, prefix):
    with pytest.raises(ValueError, match=f"compute={alias!r} is not available"):
        resolve_compute(TYPE_ROWS[prefix], alias, "gemm")


def test_every_existing_name_still_resolves_to_itself():
    for row in TYPE_ROWS.values():
        for mode in row.computes:
            assert resolve_compute(row, mode.upper(), "gemm") == mode
    assert all(target in {m for r in TYPE_ROWS.values() for m in r.computes}
               for row in COMPUTE_ALIASES.values() for target in row.values())


def test_compute_aliases_reach_the_public_forms():
    a = np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32)
    want = a @ a
    np.testing.assert_allclose(pyblasgemm.matmul(a, a, compute="tf32x3"), want, rtol=1e-6)
    np.testing.assert_allclose(pyblasgemm.gemm("N", "N", a, a, compute="ieee"), want, rtol=1e-6)
    c = np.zeros(4, np.float32)
    pyblasgemm.sgemm("N", "N", 2, 2, 2, 1.0, a.ravel("F"), 2, a.ravel("F"), 2, 0.0, c, 2,
                     compute="highest")
    np.testing.assert_allclose(c.reshape(2, 2, order="F"), want, rtol=1e-6)


def test_backend_alias_pyblasgemm_is_our_kernels():
    assert BACKEND_ALIASES == {"pyblasgemm": "tensorcore"}
    assert check_backend("gemm", "PyBlasGemm") == "tensorcore"
    for name in ("auto", "tensorcore", "cublas", "host"):
        assert check_backend("gemm", name.upper()) == name
    a = np.ones((2, 2), np.float32)
    # our kernels run on CuPy arrays: the alias is refused on NumPy arrays as 'tensorcore' is
    with pytest.raises(ValueError, match="'tensorcore' runs on CuPy arrays"):
        pyblasgemm.gemm("N", "N", a, a, backend="pyblasgemm")
