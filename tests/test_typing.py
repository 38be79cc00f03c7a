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


def test_every_public_form_documents_stream_and_foreign_arrays():
    """Item 7: every public form with a stream= says where it enqueues and that it takes the
    frameworks' arrays (matmul's said neither PyTorch's route nor JAX's)."""
    import inspect

    def takes_stream(f):
        try:
            return "stream" in inspect.signature(f).parameters
        except (TypeError, ValueError):      # classes without a Python signature (warnings)
            return False

    public = [getattr(pyblasgemm, name) for name in pyblasgemm.__all__]
    forms = [f for f in public if callable(f) and takes_stream(f)]
    assert {"sgemm", "zgemm", "shgemm", "gemm", "matmul", "grouped_matmul", "fused_mlp",
            "Matmul"} <= {f.__name__ for f in forms}
    for f in forms:
        doc = " ".join(f.__doc__.split())
        for word in ("stream", "PyTorch", "JAX", "DLPack"):
            assert word in doc, (f.__name__, word)


# --- types (item 4): mypy on a user's file -----------------------------------------------------

_USER = '''\
import cupy
import dask.array
import jax
import numpy as np
import torch

import pyblasgemm
import pyblasgemm.dask as pbd
import pyblasgemm.jax as pbj
import pyblasgemm.torch as pbt
from pyblasgemm import scipy as blas

x = np.ones((2, 2), np.float32)
reveal_type(pyblasgemm.matmul(x, x))  # R: numpy.ndarray
reveal_type(pyblasgemm.gemm("N", "T", x, x))  # R: numpy.ndarray
reveal_type(pyblasgemm.sgemm("N", "N", 2, 2, 2, 1.0, x, 2, x, 2, 0.0, x, 2))  # R: numpy.ndarray
pyblasgemm.matmul(x, x, compute="int8-ozaki-40", backend="pyblasgemm")
pyblasgemm.gemm(1, "n", x, x, compute="tf32x3")
pyblasgemm.matmul(x, x, compute=3)  # E: compute
pyblasgemm.gemm("X", "N", x, x)  # E: transa
pyblasgemm.sgemm("X", "N", 2, 2, 2, 1.0, x, 2, x, 2, 0.0, x, 2)  # E: transa
pyblasgemm.matmul(x, x, backend="gpu")  # E: backend
reveal_type(pyblasgemm.fused_mlp(x, x, x))  # R: numpy.ndarray
pyblasgemm.fused_mlp(x, x, x, compute=3)  # E: compute
pyblasgemm.grouped_matmul([x], [x], compute="fp32", group_sizes=None)
pyblasgemm.grouped_matmul([x], [x], compute=3)  # E: compute
pyblasgemm.Matmul(x, x, backend="gpu")  # E: backend
pyblasgemm.Matmul(x, x, compute="ieee", backend="auto")
reveal_type(pyblasgemm.grouped_matmul([x, x], [x, x]))  # R: list[numpy.ndarray
reveal_type(pyblasgemm.grouped_matmul(x, x, offsets=[2]))  # R: numpy.ndarray
reveal_type(pyblasgemm.grouped_matmul(x, x, group_sizes=[2], compute="tf32x3"))  # R: numpy.ndarray
pyblasgemm.grouped_matmul(x, x, offsets=[2], backend="gpu")  # E: backend
pyblasgemm.matmul(x, x, bias=x[0], activation="gelu_tanh")
pyblasgemm.matmul(x, x, activation="tanh")  # E: activation
pyblasgemm.gemm("N", "N", x, x, activation="RELU")  # E: activation (the check is exact)
pyblasgemm.grouped_matmul([x], [x], activation="swish")  # E: activation
pyblasgemm.fused_mlp(x, x, x, activation="silu", method="on_chip")
pyblasgemm.fused_mlp(x, x, x, activation="elu")  # E: activation
pyblasgemm.fused_mlp(x, x, x, method="fast")  # E: method
reveal_type(pyblasgemm.sgemm("N", "N", 2, 2, 2, 1.0, x, 2, x, 2, 0.0, x, 2, invariant=True))  # R: numpy.ndarray
reveal_type(blas.sgemm(1.0, x, x, trans_a=1))  # R: numpy.ndarray
reveal_type(blas.zgemm(1.0, [[1j]], [[1j]], 0.5, [[0j]]))  # R: numpy.ndarray
blas.dgemm(1.0, x, x, compute=3)  # E: compute
blas.dgemm(1.0, x, x, backend="gpu")  # E: backend
reveal_type(pyblasgemm.plan(64, 64, 64, "f16", transa="T", compute="fp32"))  # R: pyblasgemm.planner.plan.Plan
pyblasgemm.plan(64, 64, 64, "f16", compute=3)  # E: compute
pyblasgemm.plan(64, 64, 64, "f16", transa="X")  # E: transa
pyblasgemm.plan(64, 64, 64, "f16", backend="gpu")  # E: backend
pyblasgemm.plan(64, 64, 64, "f16", activation="relu", bias="k")  # E: bias is 'm' or 'n'
pyblasgemm.tune(64, 64, 64, "f16", compute="fast")  # E: compute
reveal_type(pyblasgemm.explain(x, x, compute="ieee"))  # R: str
pyblasgemm.explain(x, x, backend="gpu")  # E: backend
reveal_type(pyblasgemm.precompile([(64, 64, 64, "f16"), {"m": 64, "n": 64, "k": 64}]))  # R: list[pyblasgemm.planner.plan.Plan]
pyblasgemm.precompile([(64, 64)])  # E: a problem is (m, n, k, dtype) or plan()'s keywords
pyblasgemm.set_default_compute("high")
pyblasgemm.set_default_compute("fp64")  # E: float32's modes only


def frameworks(t: torch.Tensor, j: jax.Array, g: cupy.ndarray) -> None:
    reveal_type(pyblasgemm.matmul(t, t))  # R: torch.Tensor
    reveal_type(pyblasgemm.matmul(j, j))  # R: jax.Array
    reveal_type(pyblasgemm.matmul(g, g, compute="tf32"))  # R: cupy.ndarray
    reveal_type(pyblasgemm.gemm("N", "T", t, t))  # R: torch.Tensor
    reveal_type(pyblasgemm.gemm("N", "T", g, g, out=g))  # R: cupy.ndarray
    reveal_type(pyblasgemm.fused_mlp(t, t, t))  # R: torch.Tensor
    reveal_type(pyblasgemm.fused_mlp(g, g, g))  # R: cupy.ndarray
    reveal_type(pyblasgemm.sgemm("N", "N", 2, 2, 2, 1.0, g, 2, g, 2, 0.0, g, 2))  # R: cupy.ndarray
    reveal_type(pyblasgemm.hgemm("N", "N", 2, 2, 2, 1.0, t, 2, t, 2, 0.0, t, 2))  # R: torch.Tensor
    reveal_type(blas.sgemm(1.0, g, g))  # R: cupy.ndarray
    reveal_type(pyblasgemm.grouped_matmul([g], [g]))  # R: list[cupy.ndarray]
    reveal_type(pyblasgemm.Matmul(g, g).execute())  # R: cupy.ndarray
    pyblasgemm.matmul(g, g, compute=3)  # E: compute
    reveal_type(pyblasgemm.grouped_matmul([t], [t]))  # R: list[torch.Tensor]
    reveal_type(pyblasgemm.grouped_matmul(t, t, offsets=[2]))  # R: torch.Tensor
    reveal_type(pyblasgemm.grouped_matmul([j], [j], compute="high"))  # R: list[jax.Array]
    reveal_type(pyblasgemm.grouped_matmul(j, j, group_sizes=[2]))  # R: jax.Array
    reveal_type(pyblasgemm.Matmul(t, t))  # R: pyblasgemm.stateful.Matmul[torch.Tensor]
    reveal_type(pyblasgemm.Matmul(t, t, out=t).execute())  # R: torch.Tensor
    reveal_type(pyblasgemm.Matmul(j, j, compute="highest").execute())  # R: jax.Array
    reveal_type(pyblasgemm.Matmul(t, t).execute(a=t, c=t))  # R: torch.Tensor
    pyblasgemm.Matmul(t, t).execute(a=j)  # E: a JAX array into a torch Matmul
    pyblasgemm.Matmul(j, j, compute=3)  # E: compute
    pyblasgemm.Matmul(t, t, activation="sigmoid")
    pyblasgemm.Matmul(t, t, activation="softmax")  # E: activation
    with pyblasgemm.Matmul(t, t) as mm:
        reveal_type(mm.execute())  # R: torch.Tensor
    reveal_type(pbt.linear(t, t, t, "silu"))  # R: torch.Tensor
    reveal_type(pbt.matmul(t, t))  # R: torch.Tensor
    pbt.linear(t, t, activation="tanh")  # E: activation
    pbt.linear(t, t, invariant="yes")  # E: invariant
    reveal_type(pbj.matmul(j, j, bias=j, activation="gelu"))  # R: jax.Array
    pbj.matmul(j, j, compute=3)  # E: compute
    pbj.matmul(j, j, backend="gpu")  # E: backend


def dask_arrays(d: dask.array.Array) -> None:
    reveal_type(pbd.matmul(d, d, compute="tf32x3", transport="ipc"))  # R: dask.array.Array
    reveal_type(pbd.gemm("N", "T", d, d, d, 1.0, 0.5, k_group=2))  # R: dask.array.Array
    pbd.matmul(d, d, compute=3)  # E: compute
    pbd.matmul(d, d, backend="gpu")  # E: backend
    pbd.matmul(d, d, transport="ucx")  # E: transport
    pbd.gemm("X", "N", d, d)  # E: transa
'''

_CONFIG = '''\
[mypy]
follow_imports = silent
mypy_path = {stubs}
'''


def test_mypy_on_a_user_file(tmp_path):
    """NumPy in gives numpy.ndarray out (not Any: what mypy revealed before the overloads), PyTorch
    torch.Tensor, JAX jax.Array, CuPy cupy.ndarray, Dask dask.array.Array (pyblasgemm.dask),
    in every form (the BLAS routines, pyblasgemm.scipy's too); compute=3, transa='X',
    backend='gpu', an activation or fused_mlp method= not in the tables are errors, in
    plan(), tune(), explain() and set_default_compute() too (they took anything); the dial,
    the aliases and cuBLAS's int flags are not."""
    api = pytest.importorskip("mypy.api")
    import os

    user = tmp_path / "user.py"
    user.write_text(_USER)
    # the frameworks as one-class stubs: their own types are not what is checked here (and
    # analysing torch takes ~30 s); a skipped import would make them Any, and Any overloads
    # blur NumPy's answer to Any too. CuPy ships no types: without a stub (or with CuPy's
    # untyped package) a CuPy array is Any to a checker, and so is the answer
    stubs = tmp_path / "stubs"
    for name, cls in (("torch", "Tensor"), ("jax", "Array"), ("cupy", "ndarray"), ("dask/array", "Array")):
        (stubs / name).mkdir(parents=True)
        (stubs / name / "__init__.pyi").write_text(f"class {cls}: ...\n")
    (stubs / "dask" / "__init__.pyi").write_text("")
    config = tmp_path / "mypy.ini"
    config.write_text(_CONFIG.format(stubs=stubs))
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cwd = os.getcwd()
    os.chdir(repo)           # the package as the checkout has it
    try:
        out, err, _ = api.run(["--config-file", str(config), "--cache-dir", str(tmp_path / "cache"),
                               "--no-error-summary", "--hide-error-context", str(user)])
    finally:
        os.chdir(cwd)
    errors = {int(line.split(":")[1]) for line in out.splitlines() if ": error:" in line}
    expected = {i + 1 for i, line in enumerate(_USER.splitlines()) if "# E:" in line}
    assert errors == expected, out + err
    revealed = {int(line.split(":")[1]): line.split('Revealed type is "')[1]
                for line in out.splitlines() if "Revealed type is" in line}
    wanted = {i + 1: line.split("# R: ")[1] for i, line in enumerate(_USER.splitlines())
              if "# R: " in line}
    assert set(revealed) == set(wanted), out
    for line, text in wanted.items():
        assert revealed[line].startswith(text), (line, revealed[line])   # not "Any"


# --- group_sizes= (item 7: JAX's ragged_dot word for the expert form) -------------------------

def test_group_sizes_is_offsets_by_counts():
    rng = np.random.default_rng(3)
    a = rng.standard_normal((5, 3)).astype(np.float32)
    b = rng.standard_normal((3, 3, 2)).astype(np.float32)
    want = pyblasgemm.grouped_matmul(a, b, offsets=[2, 2, 5])
    np.testing.assert_array_equal(pyblasgemm.grouped_matmul(a, b, group_sizes=[2, 0, 3]), want)
    np.testing.assert_array_equal(pyblasgemm.grouped_matmul(a, b, group_sizes=np.array([2, 0, 3])),
                                  want)


@pytest.mark.parametrize("kw,err,match", [
    (dict(group_sizes=[2, 0, 3], offsets=[2, 2, 5]), TypeError, "not both"),
    (dict(group_sizes=[2, 3]), ValueError, "group_sizes has 2 entries; b holds 3 groups"),
    (dict(group_sizes=[2, -1, 4]), ValueError, r"group_sizes\[1\]=-1 must be >= 0"),
    (dict(group_sizes=[2, 0, 2]), ValueError, "group_sizes sums to 4; it must equal a's row count 5"),
    (dict(group_sizes="abc"), TypeError, "group_sizes must be a sequence of ints")])
def test_group_sizes_refusals(kw, err, match):
    a = np.ones((5, 3), np.float32)
    b = np.ones((3, 3, 2), np.float32)
    with pytest.raises(err, match=match):
        pyblasgemm.grouped_matmul(a, b, **kw)


def test_the_literal_types_name_exactly_what_the_tables_accept():
    """_typing's Compute, Backend, Activation and MlpMethod are a second spelling of the tables'
    names (typing needs the words written out): a mode, alias, dial, backend, activation or
    method added to the tables without the Literal (or the reverse) fails here."""
    from typing import get_args

    from pyblasgemm import _typing
    from pyblasgemm._types import COMPUTE_ALIASES
    from pyblasgemm.desc import BACKEND_ALIASES, BACKEND_NAMES
    from pyblasgemm.epilogue import ACTIVATIONS
    from pyblasgemm.kinds import OZAKI, OZAKI_FAST, ROUTES
    from pyblasgemm.mlp import METHODS
    from pyblasgemm.ozaki import MAX_BITS

    modes = {compute for _, compute in ROUTES} | set(COMPUTE_ALIASES)
    dials = {f"{OZAKI}-{bits}" for bits in range(1, MAX_BITS + 1)}
    dials |= {f"{d}-{OZAKI_FAST}" for d in dials} | {f"{OZAKI}-{OZAKI_FAST}"}
    assert set(get_args(_typing.Compute)) == modes | dials
    assert set(get_args(_typing.Backend)) == set(BACKEND_NAMES) | set(BACKEND_ALIASES)
    assert set(get_args(_typing.Activation)) == set(ACTIVATIONS)
    assert set(get_args(_typing.MlpMethod)) == set(METHODS) - {None}
    from pyblasgemm.dask import TRANSPORTS
    assert set(get_args(_typing.DaskTransport)) == set(TRANSPORTS)
    from pyblasgemm._types import FP32_DEFAULTS, compute_aliases
    assert set(get_args(_typing.Fp32Compute)) == set(FP32_DEFAULTS) | set(compute_aliases("s"))
